"""The strict trainer step's two backward costs a native trainer does not pay, timed apart (GPU):

1. The weight gradient without a cuBLAS workspace. A strict process runs cuBLAS without one (its cuBLAS
   route needs it), so the linear layers' dW = g^T x (K = the micro-batch's tokens) cannot split K.
   Timed per Qwen3 preset's layer shape at T tokens: the product in this process and in a child process
   with torch's default workspace (RLKIT_GEMM_CUBLAS=0: a native trainer's cuBLAS). (At 41f6217 this
   also timed dW split into 1-8 token slabs by hand: slower at every shape, lab/LOG.md session 36.)
2. Attention's backward: recomputing native's flash forward under autograd (the old form) against
   flash's varlen backward taking the strict forward's output and log-sum-exp, and native's own
   forward + backward; gradients compared (relative error), the log-sum-exp against flash's own, and the
   strict output with the log-sum-exp stored against without (bit for bit).

Prints a table; writes OUT/train_backward.jsonl (long format, device and commit) and OUT/train_backward.log.

    python3 lab/train_backward_h200.py --out $OUT [--tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

PRESETS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-8b")


def layer_shapes(preset: str) -> list[tuple[str, int, int]]:
    """(name, out features N, in features K) of a layer's linears, one per distinct shape."""
    from rlkit.model.config import MODEL_PRESETS

    c = MODEL_PRESETS[preset]()
    h, d = c.hidden_size, c.head_dim
    shapes = {}
    for name, n, k in (("q", c.num_attention_heads * d, h), ("k/v", c.num_key_value_heads * d, h),
                       ("o", h, c.num_attention_heads * d), ("gate/up", c.intermediate_size, h),
                       ("down", h, c.intermediate_size)):
        shapes.setdefault((n, k), name)
    return [(name, n, k) for (n, k), name in shapes.items()]


def _bench(fn) -> float:
    from rlkit.bench.kernels import _bench as bench

    return bench(fn)


def _inputs(t: int, n: int, k: int):
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    return (torch.randn(t, n, generator=g, device="cuda").to(torch.bfloat16),
            torch.randn(t, k, generator=g, device="cuda").to(torch.bfloat16) * 0.1)


def plain_times(tokens: int) -> dict[str, float]:
    """Milliseconds of g^T x for every preset's shapes in this process."""
    out = {}
    for preset in PRESETS:
        for name, n, k in layer_shapes(preset):
            g2, x2 = _inputs(tokens, n, k)
            out[f"{preset} {name} {n}x{k}"] = _bench(lambda: g2.t() @ x2)
    return out


def wgrad_rows(tokens: int, native_ms: dict[str, float]) -> list[dict]:
    from rlkit.kernels import gemm_cublas

    print(f"cuBLAS workspace off in this process: {gemm_cublas.environment_problem() is None}")
    rows = []
    print(f"{'layer':<34}{'default ws':>11}{'no ws':>8}{'ratio':>8}")
    for preset in PRESETS:
        for name, n, k in layer_shapes(preset):
            key = f"{preset} {name} {n}x{k}"
            g2, x2 = _inputs(tokens, n, k)
            here = _bench(lambda: g2.t() @ x2)
            nat = native_ms.get(key, float("nan"))
            print(f"{key:<34}{nat:11.3f}{here:8.3f}{here / nat:8.3f}")
            rows += [dict(op="wgrad", impl="native_default_workspace", shape=f"{key} T={tokens}", metric="ms", median=nat),
                     dict(op="wgrad", impl="no_workspace", shape=f"{key} T={tokens}", metric="ms", median=here)]
    return rows


def attention_rows() -> list[dict]:
    from rlkit import NumericsContract
    from rlkit.kernels import attention, attention_native
    from rlkit.types import AttentionLayout

    contract = NumericsContract.default()
    heads, kv_heads, d = 16, 8, 128
    rows = []
    print(f"\n{'attention layout':<26}{'native':>9}{'recompute':>11}{'from lse':>10}"
          f"{'rel dq':>9}{'rel dk':>9}{'rel dv':>9}{'lse max|d|':>12}  order")
    for name, lens in (("1 x 8192", [8192]), ("2 x 4096", [4096, 4096]), ("16 x 655", [655] * 16),
                       ("1 x 16384", [16384])):
        t = sum(lens)
        gen = torch.Generator(device="cuda").manual_seed(t)
        q, k, v, go = (torch.randn(t, h, d, generator=gen, device="cuda").to(torch.bfloat16)
                       for h in (heads, kv_heads, kv_heads, heads))
        cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], device="cuda")
        layout = AttentionLayout.prefill(cu)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]

        def grads(fn):
            for leaf in leaves:
                leaf.grad = None
            fn(*leaves, layout).backward(go)
            return [leaf.grad.clone() for leaf in leaves]

        def strict(*a):
            return attention.strict(*a, contract)

        real = attention.flash_stats_buffer
        attention.flash_stats_buffer = lambda *a: None  # the old form: native's forward recomputed
        try:
            g_old = grads(strict)
            t_old = _bench(lambda: grads(strict))
        finally:
            attention.flash_stats_buffer = real
        g_new = grads(strict)
        t_new = _bench(lambda: grads(strict))
        g_nat = grads(attention.native)
        t_nat = _bench(lambda: grads(attention.native))
        rel = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(g_new, g_old)]
        order = attention_native._flash_lse_order(q.device, q.dtype, heads, kv_heads, d)
        buffers = attention_native.flash_stats_buffer(q, k, layout)
        lse_diff, same_out = float("nan"), None
        if buffers is not None:
            out_lse, written = attention.triton_attention(q, k, v, layout, contract, lse=buffers[1])
            same_out = written and torch.equal(out_lse, attention.triton_attention(q, k, v, layout, contract))
            cu32 = cu.to(torch.int32)
            flash_lse = torch.ops.aten._flash_attention_forward(q, k, v, cu32, cu32, max(lens), max(lens), 0.0, True,
                                                                False, scale=d ** -0.5)[1]
            lse_diff = float((buffers[0] - flash_lse).abs().max())
        print(f"{name:<26}{t_nat:9.3f}{t_old:11.3f}{t_new:10.3f}" + "".join(f"{r:9.2e}" for r in rel)
              + f"{lse_diff:12.2e}  {order} out same with lse: {same_out}")
        rel_nat = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(g_new, g_nat)]
        shape = f"qwen3-0.6b heads {name}"
        rows += [dict(op="attention_fwd_bwd", impl=i, shape=shape, metric="ms", median=ms)
                 for i, ms in (("native", t_nat), ("strict_recompute", t_old), ("strict_from_lse", t_new))]
        rows += [dict(op="attention_fwd_bwd", impl="strict_from_lse", shape=shape, metric=f"rel_d{x}_vs_recompute",
                      median=r) for x, r in zip("qkv", rel)]
        rows += [dict(op="attention_fwd_bwd", impl="strict_from_lse", shape=shape, metric=f"rel_d{x}_vs_native",
                      median=r) for x, r in zip("qkv", rel_nat)]
        rows.append(dict(op="attention_fwd_bwd", impl="strict_from_lse", shape=shape, metric="lse_max_abs_diff",
                         median=lse_diff))
        rows.append(dict(op="attention_fwd_bwd", impl="strict_from_lse", shape=shape, metric="out_same_with_lse",
                         median=float(bool(same_out))))
    return rows


def logprob_rows(tokens: int) -> list[dict]:
    """The lm_head + logprob forward and backward at `tokens` rows (qwen3-0.6b: hidden 1,024, vocab
    151,936): strict against native's chunked form; both backwards are `logprob.chunked_backward`."""
    from rlkit import NumericsContract
    from rlkit.kernels import logprob

    gen = torch.Generator(device="cuda").manual_seed(3)
    h = torch.randn(tokens, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(151936, 1024, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    ids = torch.randint(0, 151936, (tokens,), generator=gen, device="cuda")
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    g = torch.randn(tokens, generator=gen, device="cuda")
    strict_c, native_c = NumericsContract.default(), NumericsContract.native()

    def run(fn):
        hh.grad = ww.grad = None
        fn().backward(g)

    t_s = _bench(lambda: run(lambda: logprob.strict(hh, ww, ids, strict_c)))
    t_n = _bench(lambda: run(lambda: logprob.native(hh, ww, ids, native_c)))
    print(f"\nlogprob fwd+bwd {tokens} x 151936: strict {t_s:.3f} ms, native {t_n:.3f} ms, strict/native {t_s / t_n:.3f}")
    shape = f"qwen3-0.6b lm_head T={tokens}"
    return [dict(op="logprob_fwd_bwd", impl="strict", shape=shape, metric="ms", median=t_s),
            dict(op="logprob_fwd_bwd", impl="native", shape=shape, metric="ms", median=t_n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=False)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--child-native", action="store_true", help="(internal) print plain g^T x times as JSON")
    args = ap.parse_args()
    if args.child_native:
        print("JSON " + json.dumps(plain_times(args.tokens)))
        return
    import rlkit.ops  # noqa: F401 - this process as a strict run has it: cuBLAS without a workspace
    from rlkit.bench.provenance import commit

    env = {k: v for k, v in os.environ.items() if k not in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE")}
    env["RLKIT_GEMM_CUBLAS"] = "0"
    child = subprocess.run([sys.executable, __file__, "--child-native", "--tokens", str(args.tokens)], env=env,
                           capture_output=True, text=True, check=True)
    native_ms = json.loads(next(ln[5:] for ln in child.stdout.splitlines() if ln.startswith("JSON ")))
    rows = wgrad_rows(args.tokens, native_ms) + attention_rows() + logprob_rows(args.tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), commit=commit())
    with open(args.out / "train_backward.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, **meta)) + "\n")


if __name__ == "__main__":
    main()
