"""Does leaving run-varying sizes unspecialized cost time? One process, the two forms of each kernel
interleaved, on the H200.

tests/kernels/test_specialization.py lists the integer arguments rlkit's kernels no longer specialize
(a size divisible by 16 or equal to 1 compiled a new variant mid-run: lab/LOG.md 2026-12-04 session 21).
This builds, for each such kernel, a second JITFunction from the same source with Triton's default
specialization, and times the op that launches it with each form in turn (A B A B ...: the same process,
GPU and host state), twice: with launches (triton.testing.do_bench: what a launch-bound decode pays) and
from a CUDA graph (the kernels alone). Bits are compared too (torch.equal; they must not differ).

    RLKIT_COMMIT=<sha> python3 lab/specialization_ab_h200.py --out $W/spec [--rounds 6]

Writes OUT/specialization_ab.jsonl (op "specialization_ab", impl "specialized" / "unspecialized", shape,
metric "launch_us" / "graph_us" (medians over rounds), device, commit) and prints one line a case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()

    import torch
    import triton
    import triton.testing

    from rlkit import NumericsContract
    from rlkit.bench.kernels import _graph_ms, _randn
    from rlkit.kernels import attention, attention_kernel, gemm, gemm_kernels, rms_norm
    from rlkit.types import AttentionLayout

    c = NumericsContract.default()
    cases = []  # (name, module, kernel attribute, fn)
    h, g, d, page = 32, 8, 128, 16
    for b, ctx in ((1, 1024), (16, 1024), (1, 8192), (64, 1024)):
        pages = ctx // page
        kc, vc = _randn(b * pages, page, g, d, seed=6), _randn(b * pages, page, g, d, seed=7)
        perm = torch.randperm(b * pages, device="cuda").view(b, pages)
        q = _randn(b, h, d, seed=8)
        lay = AttentionLayout.paged(torch.ones(b, dtype=torch.int64, device="cuda"),
                                    torch.full((b,), ctx, dtype=torch.int64, device="cuda"), perm)
        plan = attention.attention_plan(q.shape, kc, lay, c)
        cases.append((f"paged decode B={b} ctx={ctx} ({plan['mode']}, max_splits {plan['max_splits']})",
                      attention_kernel, "_attn_kernel",
                      lambda plan=plan, q=q, kc=kc, vc=vc: attention.launch(plan, q, kc, vc, c)[0]))
    x, r = _randn(4096, 4096, seed=1), _randn(4096, 4096, seed=3)
    w = (1 + 0.1 * _randn(4096, dtype=torch.float32, seed=2)).bfloat16()
    cases.append(("rms_norm+residual 4096x4096", rms_norm, "_rms_norm_kernel",
                  lambda: rms_norm.triton_rms_norm(x, w, 1e-6, c, r)[0]))
    wo = _randn(4096, 4096, scale=0.02, seed=4)
    for m in (1, 64):
        xm = _randn(m, 4096, seed=5)
        cases.append((f"gemm 8b.o M={m} (swapped)", gemm_kernels, "_gemm_swapped_kernel",
                      lambda xm=xm: gemm.triton_partial(xm, wo, c, 1, torch.bfloat16, row_parallel=True)))

    device, commit = torch.cuda.get_device_name(), os.environ.get("RLKIT_COMMIT", "unknown")
    rows = []
    print(f"{'case':56s} {'launch us spec/unspec':>22s} {'graph us spec/unspec':>22s} same", flush=True)
    for name, module, attr, fn in cases:
        unspec = getattr(module, attr)
        forms = {"unspecialized": unspec, "specialized": triton.jit(unspec.fn)}
        outs, launch, graph = {}, {k: [] for k in forms}, {k: [] for k in forms}
        try:
            for _ in range(a.rounds):
                for form, kernel in forms.items():
                    setattr(module, attr, kernel)
                    outs[form] = fn()
                    launch[form].append(1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
                    graph[form].append(1e3 * _graph_ms(fn))
        finally:
            setattr(module, attr, unspec)
        same = torch.equal(outs["specialized"], outs["unspecialized"])
        med = {k: (statistics.median(launch[k]), statistics.median(graph[k])) for k in forms}
        for form, (lu, gu) in med.items():
            for metric, v, vals in (("launch_us", lu, launch[form]), ("graph_us", gu, graph[form])):
                rows.append(dict(op="specialization_ab", impl=form, shape=name, metric=metric, median=v,
                                 values=[round(t, 2) for t in vals], device=device, commit=commit))
        rows.append(dict(op="specialization_ab", impl="both", shape=name, metric="same_bits", median=float(same),
                         device=device, commit=commit))
        print(f"{name:56s} {med['specialized'][0]:10.1f}/{med['unspecialized'][0]:<10.1f} "
              f"{med['specialized'][1]:10.1f}/{med['unspecialized'][1]:<10.1f} {same}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "specialization_ab.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
