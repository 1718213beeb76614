"""Benchmarks (not tests): long-format rows (op, impl, shape, metric, median, device, commit) and the
tables rendered from them. `rlkit.bench.kernels` times the strict Triton kernels against native torch;
`rlkit.bench.targets` judges rows against the speed targets; `rlkit.bench.rows` reads row files back."""
