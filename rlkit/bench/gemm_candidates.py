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
              dict(kind="swapped", BN=128, BT=64, num_warps=8, num_stages=3),
              # deeper pipelines: more weight bytes in flight a program, where N / BN programs are fewer
              # than the SMs (8b q/k/v at M = 1: 48 programs; sm_90: 48 registers, 110 / 147 KB at 6 / 8)
              dict(kind="swapped", BN=128, BT=16, num_warps=4, num_stages=6),
              dict(kind="swapped", BN=128, BT=16, num_warps=4, num_stages=8),
              dict(kind="swapped", BN=64, BT=64, num_warps=4, num_stages=6)],
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
              dict(kind="tma", flat=True, BM=128, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=3),
              # one warpgroup a 64 x 256 tile (sm_90: 176 / 215 registers at 3 / 4 stages, no spills):
              # twice the tiles of 128 x 256 at the same weight-tile width, for M = 256
              dict(kind="tma", BM=64, BN=256, GROUP_M=8, split=False, num_warps=4, num_stages=3),
              dict(kind="tma", BM=64, BN=256, GROUP_M=8, split=False, num_warps=4, num_stages=4),
              dict(kind="tma", BM=64, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=4)],
    "row_parallel": [  # contract v5's ordered merge: two accumulators at most in every form
        dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=3),
        dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=4, programs_per_sm=2),
        dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=5, programs_per_sm=2),
        dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=False, num_warps=4, num_stages=4, programs_per_sm=2),
        dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=4),
        # the flat loop over (tile, chunk, K step): no drain between tiles either, but each MMA waited for
        dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=4),
        dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=3),
        dict(kind="tma", flat=True, BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=4,
             programs_per_sm=2),
        # each chunk its own program, the last to arrive adds the four in order
        dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=4),
        dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=True, num_warps=4, num_stages=4),
        dict(kind="tma", BM=64, BN=64, GROUP_M=8, split=True, num_warps=4, num_stages=5)],
}

NARROW_ONE_CHAIN = (  # (largest M, launch): narrow weight tiles, timed beside the plan as `strict_narrow`
    (16, dict(kind="swapped", BN=16, BT=16, BK=256, num_warps=4, num_stages=5)),
    (64, dict(kind="swapped", BN=32, BT=64, BK=128, num_warps=4, num_stages=5)),
)
"""One chain over K cannot split K, so a product with few output tiles leaves SMs idle: at M <= 16 the
plan's 64- or 128-row weight tiles give N / 64 programs or fewer (1.7b down: 32 for 132 SMs), and cuBLAS
without a workspace, which the strict route runs, is slower there than at its split-K defaults (H100,
lab/LOG.md 2026-12-05 session 23: 1.7b down M = 1 / 8 0.86 / 0.80, 0.6b down M = 1 0.87, 8b o M = 64
0.78). Weight tiles of 16 / 32 rows give four / two times the programs, a K step of 256 / 128 more bytes
in flight each (`gemm._k_step`: the same k16 MMAs in K order). Compiled for sm_90 on the CPU: 40 / 72
registers, no spills, 64 / 96 KB of shared memory; they issue mma.sync where the plan's 64- and 128-row
tiles issue wgmma. The benchmark checks each against the plan bit for bit before timing it; whether a
plan rule takes them waits for those rows on the H200."""
