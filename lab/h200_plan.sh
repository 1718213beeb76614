#!/bin/bash
# Session 29 item 9's plan for an H200, one phase per device call, each branching on the card it finds so
# that an H100 start is spent on what the H100 can still tell (the full GPU suite, the source shape).
#   RLKIT_COMMIT=<full sha> bash lab/h200_plan.sh a|c|b|k      (run through the device tool; carry
#   .thirdparty/device and .thirdparty/tm; H200_ONLY=1 runs nothing on another card)
# a: the GPU suite, the chained-GEMM launch table, the kernel rows and the targets they meet  (H100: the GPU suite and the source strict run)
# c: validation and trainer-heavy, strict then native              (H100: the source native run)
# b: the source shape, strict then native
# k: the kernel rows and the targets alone (about 300 s with the start, for a budget too small for a):
#    the short parts first, then the GEMM cells, each part's rows kept as its step ends   (H100: nothing)
# Each step keeps its log and rows under $W (/tmp/w), packed into $OUT/all.tgz by lab/device_call.sh.
set -u
R="python3 lab/rl_step_ratio_h200.py"
NATIVE="RLKIT_GEMM_CUBLAS=0 $R"
SOURCE_STRICT="srcstrict:290:$R --out \$W/rl-ss --shapes source --paths strict --steps 2 --minutes 6.0"
SOURCE_NATIVE="srcnative:290:$NATIVE --out \$W/rl-sn --shapes source --paths native --steps 2 --minutes 6.0"
SUITE="gputests:200:python3 lab/gpu_tests_parallel.py --workers 6 --out \$W/gputests"
# the kernel rows in two steps (the short parts, then the GEMM cells), so a call cut short keeps the first;
# both run under the H200 launch table phase a's chained step wrote (logprob and the engine step run GEMMs too)
USE_TABLE="if ls \$W/chained/tuned/*.json >/dev/null 2>&1; then cp \$W/chained/tuned/*.json kernels/tuned/; export RLKIT_COMMIT=\$RLKIT_COMMIT+table; fi; "
SHORT_PARTS="parts:60:${USE_TABLE}python3 -m rlkit.bench.kernels --parts attention,logprob,rowwise,engine --out \$W/bench-parts"
GEMM_CELLS="bench:200:${USE_TABLE}python3 -m rlkit.bench.kernels --parts gemm --out \$W/bench"
TARGETS="targets:30:python3 -m rlkit.bench.targets \$W/bench*/bench.jsonl"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then card=h200; else card=other; fi
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader) -> phase ${1:-} for $card"
# H200_ONLY=1: on any other card do nothing (a start that found an H100 costs its start alone).
if [ "${H200_ONLY:-0}" = 1 ] && [ $card != h200 ]; then echo "not an H200: nothing run"; exit 0; fi
case "${1:-}/$card" in
  a/h200) steps=("$SUITE"
                 "chained:100:python3 lab/chained_gemm_h200.py --out \$W/chained --m 1,8,64"
                 "$SHORT_PARTS" "$GEMM_CELLS" "$TARGETS") ;;
  a/other) steps=("$SUITE" "$SOURCE_STRICT") ;;
  c/h200) steps=("vs:70:$R --out \$W/rl-vs --shapes validation --paths strict --steps 10 --warmup 2 --minutes 1.3"
                 "vn:70:$NATIVE --out \$W/rl-vn --shapes validation --paths native --steps 10 --warmup 2 --minutes 1.3"
                 "ts:120:$R --out \$W/rl-ts --shapes trainer-heavy --paths strict --steps 6 --warmup 2 --minutes 1.9"
                 "tn:120:$NATIVE --out \$W/rl-tn --shapes trainer-heavy --paths native --steps 6 --warmup 2 --minutes 1.9") ;;
  c/other) steps=("$SOURCE_NATIVE") ;;
  k/h200) steps=("$SHORT_PARTS" "$GEMM_CELLS" "$TARGETS") ;;
  k/other) echo "phase k measures only what an H200 can tell: nothing run"; exit 0 ;;
  b/*) steps=("$SOURCE_STRICT" "$SOURCE_NATIVE") ;;
  *) echo "usage: bash lab/h200_plan.sh a|c|b|k"; exit 2 ;;
esac
exec bash lab/device_call.sh "${steps[@]}"
