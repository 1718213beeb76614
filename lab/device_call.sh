#!/bin/bash
# One device call's steps, each under its own time limit, with every log and row kept under $W and packed
# into $OUT/all.tgz after each step (a call returns at most 8 files; a killed step loses nothing before it).
#   RLKIT_COMMIT=<sha here> bash lab/device_call.sh STEP:SECONDS:COMMAND ...   (COMMAND runs with W, RLKIT_* set)
# RLKIT_COMMIT must come from this side: the device's copy of .git can name an older commit than the tree it
# holds (seen 2026-12-01: HEAD read the last landed commit while the tree was four commits newer).
set -u
# .thirdparty/data is a link here and links do not travel: point it at the carried copy (session 34).
[ -e .thirdparty/data ] || ln -sfn $PWD/.thirdparty/device/data2 .thirdparty/data
W=/tmp/w; mkdir -p $W; export W PYTHONUNBUFFERED=1 RLKIT_DATA=$PWD/.thirdparty/data
export RLKIT_BATCH_INVARIANT_OPS=$PWD/.thirdparty/tm RLKIT_COMMIT=${RLKIT_COMMIT:-unknown}
python3 -m pip install -q --no-deps --no-build-isolation -e . > $W/install.log 2>&1 || { echo "install failed"; tail $W/install.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > $W/smi.txt 2>&1
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; secs=${rest%%:*}; cmd=${rest#*:}
  t0=$(date +%s)
  timeout $secs bash -c "$cmd" > $W/$name.log 2>&1; rc=$?
  echo "== $name rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -E "^(tune|DIFFERENT|FAILED|ERROR|launch table|  K=|## Targets)|passed|failed|ratio|Error|\*\*(missed|partly measured)\*\*" $W/$name.log | grep -v "^SKIPPED" | tail -40
  (cd $W && find . -maxdepth 3 -type f \( -name '*.log' -o -name '*.txt' -o -name '*.jsonl' -o -name '*.json' -o -name '*.md' -o -name '*.csv' \) \
     -size -20M | tar czf $OUT/all.tgz -T - 2>/dev/null)
done
