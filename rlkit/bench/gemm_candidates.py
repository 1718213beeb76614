"""GEMM launch configurations the benchmarks time beside the default plan (`rlkit.kernels.gemm.plan`).

Each must give the default plan's bits (`rlkit bench kernels --tune` checks every one with torch.equal);
the compile check (rlkit/bench/compile_plans.py) compiles one of each kernel variant the plan itself never
picks, so a candidate that stops compiling on a target shows up in CI.
"""

TUNE_CONFIGS = {  # candidates timed beside the default plan (gemm.plan); each must give the same bits
    "small": [dict(kind="swapped", BN=32, BT=16, num_warps=4, num_stages=4),
              dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=5),
              dict(kind="swapped", BN=128, BT=16, num_warps=4, num_stages=4),
              dict(kind="swapped", BN=32, BT=64, num_warps=4, num_stages=4),
              dict(kind="swapped", BN=128, BT=64, num_warps=8, num_stages=3)],
    "large": [dict(kind="tiles", BM=128, BN=256, GROUP_M=8, split=True, num_warps=8, num_stages=3),
              dict(kind="tma", BM=128, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=3),
              dict(kind="tma", BM=128, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=4),
              dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=4),
              dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=3, programs_per_sm=2),
              dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=4, num_stages=4),
              dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=False, num_warps=4, num_stages=4),
              dict(kind="tma", BM=64, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=5),
              dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=5),
              dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=4),
              dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=True, num_warps=4, num_stages=4),
              dict(kind="tma", BM=64, BN=64, GROUP_M=8, split=True, num_warps=4, num_stages=5),
              dict(kind="tma", flat=True, BM=128, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=3)],
    "row_parallel": [dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, stash=1, num_warps=8, num_stages=4),
                     dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, stash=2, num_warps=8, num_stages=4),
                     dict(kind="tma", BM=128, BN=256, GROUP_M=8, split=False, stash=2, num_warps=8, num_stages=3),
                     dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, stash=1, num_warps=8, num_stages=3,
                          programs_per_sm=2),
                     dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, stash=1, num_warps=4, num_stages=5),
                     dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, stash=2, num_warps=4, num_stages=5),
                     dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=False, stash=1, num_warps=4, num_stages=4),
                     dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=5),
                     dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=4),
                     dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=True, num_warps=4, num_stages=4),
                     dict(kind="tma", BM=64, BN=64, GROUP_M=8, split=True, num_warps=4, num_stages=5),
                     # the flat loop (no pipeline drain at chunk ends); sm_90 registers / spills compiled
                     # on the CPU: 187 / 0, 189 / 0, 187 / 0, 255 / 28, 128 (16 warps) / 40, 248 / 0 (the
                     # slot barriers keep this last one from being pipelined)
                     dict(kind="tma", flat=True, BM=64, BN=128, GROUP_M=8, split=False, stash=0, num_warps=8,
                          num_stages=4),
                     dict(kind="tma", flat=True, BM=64, BN=128, GROUP_M=8, split=False, stash=0, num_warps=8,
                          num_stages=5),
                     dict(kind="tma", flat=True, BM=128, BN=64, GROUP_M=8, split=False, stash=0, num_warps=8,
                          num_stages=4),
                     dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, stash=1, num_warps=8,
                          num_stages=4),
                     dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, stash=0, num_warps=16,
                          num_stages=4),
                     dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, stash=2, num_warps=8,
                          num_stages=4)],
}
