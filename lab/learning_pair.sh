#!/bin/bash
# Both learning arms side by side on one GPU (issue 17): strict and native from the same checkpoint, each in
# its own process with its own local Ray instance (trainer and engine actors), started together, the GPU's
# memory and utilisation sampled every half second while they run. Each arm resumes from its run folder
# under WORK when it exists (lab/learning_h200.py arm), so the pair spans device calls like one arm does.
#   bash lab/learning_pair.sh CKPT WORK MINUTES OUT [more `learning_h200.py arm` options, e.g. --micro-batch-tokens 16384]
# Writes OUT/arm-{strict,native}.log (every step's line), OUT/gpu.csv, OUT/learning-{strict,native}/run.sqlite.
# Run from the repository root; the exit status is the first failing arm's.
set -u
if [ $# -lt 4 ]; then echo "usage: bash lab/learning_pair.sh CKPT WORK MINUTES OUT [arm options]" >&2; exit 2; fi
ckpt=$1 work=$2 minutes=$3 out=$4; shift 4
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 500 > "$out/gpu.csv" 2>&1 &
sampler=$!
pids=()
for path in strict native; do
  python3 lab/learning_h200.py arm --runner ray --path $path --ckpt "$ckpt" --work "$work/$path" \
    --minutes "$minutes" --out "$out" "$@" > "$out/arm-$path.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || { s=$?; [ $rc -eq 0 ] && rc=$s; }; done
kill $sampler 2>/dev/null
peak=$(awk -F", " '{v = $2 + 0; if (v > m) m = v} END {print m + 0}' "$out/gpu.csv")
echo "pair: arms exited with $rc; GPU memory peak $peak MiB over $(wc -l < "$out/gpu.csv") samples"
for path in strict native; do grep -E "^$path: " "$out/arm-$path.log"; done
exit $rc
