"""Benchmarks (not tests): long-format rows (op, impl, shape, metric, median, device, commit) and the
tables rendered from them. `rlkit.bench.kernels` times the strict Triton kernels against native torch."""
