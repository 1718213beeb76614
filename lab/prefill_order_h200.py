"""The strict prefill's tile order, timed: position order, each sequence's tiles longest first (the plan's
`longest_first`), and every tile of a packed batch sorted longest first across sequences. Single
sequences (the benchmark's S = 1k / 4k / 16k, 32 q / 8 kv heads) and the trainers' packed batches of the
RL-step shapes (16 q / 8 kv heads; rlkit.bench.kernels.ATTENTION_BACKWARD_SHAPES), each against the
native prefill (one varlen flash call). The orders' outputs are compared bit for bit (they must agree:
only the order programs start in differs). Writes OUT/prefill_order.jsonl (long format, device and
commit) and prints a table. Nothing asserts.

    python3 lab/prefill_order_h200.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rlkit import NumericsContract
from rlkit.bench.kernels import ATTENTION_BACKWARD_SHAPES, _bench
from rlkit.bench.provenance import commit
from rlkit.kernels import attention
from rlkit.types import AttentionLayout

D = 128


def shapes() -> dict[str, tuple[list[int], int, int]]:
    """name -> (sequence lengths, query heads, kv heads)."""
    out = {f"single S={s}": ([s], 32, 8) for s in (1024, 4096, 16384)}
    out.update({f"packed {name}": (lens, 16, 8) for name, lens in ATTENTION_BACKWARD_SHAPES.items()})
    return out


def sorted_across_sequences(plan: dict, layout: AttentionLayout, group: int) -> dict:
    """`plan` with every tile of the batch sorted by its last position, descending, across sequences."""
    seq, q0 = plan["tile_seq"].tolist(), plan["tile_q0"].tolist()
    bq = plan["block_m"] // group
    starts = layout.query_start.tolist()
    lens = (layout.cu_seqlens_q[1:] - layout.cu_seqlens_q[:-1]).tolist()
    order = sorted(range(len(seq)), key=lambda i: -(starts[seq[i]] + min(q0[i] + bq, lens[seq[i]]) - 1))
    dev = plan["tile_seq"].device
    return dict(plan, tile_seq=torch.tensor([seq[i] for i in order], dtype=torch.int32, device=dev),
                tile_q0=torch.tensor([q0[i] for i in order], dtype=torch.int32, device=dev))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    c = NumericsContract.default()
    device, sha = torch.cuda.get_device_name(), commit()
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (lens, heads, kv_heads) in shapes().items():
        t = sum(lens)
        q = torch.randn(t, heads, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(t, kv_heads, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(t, kv_heads, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0)
        lay = AttentionLayout.prefill(cu)
        plans = {"in_order": attention.attention_plan(q.shape, k, lay, c, longest_first=False)}
        plans["longest_first_by_sequence"] = attention.attention_plan(q.shape, k, lay, c, longest_first=True)
        plans["longest_first_across_sequences"] = sorted_across_sequences(plans["in_order"], lay, heads // kv_heads)
        ref = attention.launch(plans["in_order"], q, k, v, c)[0]
        times = {"native_varlen_flash": _bench(lambda: attention.native(q, k, v, lay), rep=200)}
        for impl, plan in plans.items():
            same = torch.equal(attention.launch(plan, q, k, v, c)[0], ref)
            times[impl] = _bench(lambda: attention.launch(plan, q, k, v, c), rep=200)
            rows.append(dict(op="attention_order", impl=impl, shape=name, metric="same_bits", median=float(same)))
        for impl, ms in times.items():
            rows.append(dict(op="attention_order", impl=impl, shape=name, metric="ms", median=ms))
            if impl != "native_varlen_flash":
                rows.append(dict(op="attention_order", impl=impl, shape=name, metric="ratio_vs_native",
                                 median=times["native_varlen_flash"] / ms))
        print(f"{name:36s} native {times['native_varlen_flash']:8.3f} ms | " + " | ".join(
            f"{impl} {times['native_varlen_flash'] / times[impl]:.3f}" for impl in plans), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    with open(out / "prefill_order.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, device=device, commit=sha)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
