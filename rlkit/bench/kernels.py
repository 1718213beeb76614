"""Kernel benchmarks on a CUDA device: the strict Triton kernels against what frameworks run natively.

Writes long-format rows (op, impl, shape, metric, median, device, commit) to `bench.jsonl` and
`bench.csv`, and renders BENCHMARKS.md from them (tables only read rows). Benchmarks are not tests:
nothing here asserts, except that a candidate launch configuration timed with `tune=True` gives the
same bits as the default one (a configuration that did not would be a bug, not a speed).

    python -m rlkit.bench.kernels --out DIR [--quick] [--tune] [--parts gemm,...] [--gemm-layers o,down]
                                  [--gemm-m 1,8,64] [--markdown BENCHMARKS.md]
    from rlkit.bench.kernels import main; main(["--out", "DIR"])   # what `rlkit bench kernels` calls

Timing: triton.testing.do_bench medians (CUDA events; the L2 is flushed before every call, so the
weights stream from HBM as in a real forward), or for the launch-bound GEMM cells a CUDA graph whose calls
take rotating copies of the weight, three L2s' worth (cold_graph_ms: the weights again from HBM, with no
host launch gap in the time); inputs are random normal, never zeros (zeros draw less power, so the clocks
stay higher and the timings flatter the kernel).
Ratios are native time / strict time, so 1.0 means "as fast as native" and the targets read >= 0.9.
The GEMM and logprob cells time strict and native in turn, a few rounds, the ratio taken round by round;
native there is cuBLAS at torch's defaults, timed by a peer process (rlkit.bench.native_peer) where this
one runs cuBLAS without a workspace for the strict route.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rlkit.bench.gemm_candidates import NARROW_ONE_CHAIN, TUNE_CONFIGS
from rlkit.bench.native_peer import NativePeer, PeerError, environment_at_defaults, serve
from rlkit.bench.provenance import commit, short
from rlkit.bench.rows import RowsError, read_rows, single_device
from rlkit.bench.targets import (DECODE_BATCHES, DECODE_CONTEXTS, ENGINE_STEPS, GEMM_LAYERS, GEMM_M, GEMM_MODELS,
                                 LOGPROB_M, PREFILL_S)
from rlkit.bench.targets import judge as judge_targets
from rlkit.bench.targets import render as render_targets

GEMM_ROUNDS = 3
"""Rounds a GEMM cell's strict, native and batch_invariant_ops are timed in turn (bench_gemm)."""
HBM_BYTES_PER_S = 4.3e12  # measured device-to-device copy on the H200 (lab/KERNELS_NOTES.md)


class Recorder:
    def __init__(self, device: str, commit: str):
        self.rows: list[dict] = []
        self.device, self.commit = device, commit

    def add(self, op: str, impl: str, shape: str, metric: str, value: float) -> None:
        self.rows.append(dict(op=op, impl=impl, shape=shape, metric=metric, median=float(value),
                              device=self.device, commit=self.commit))


def _bench(fn, rep: int = 100) -> float:
    """Median milliseconds."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def _bench_interleaved(fns: dict, rounds: int = 5, rep: int = 40) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Launch-bound calls timed in turn, `rounds` times (a b c a b c ...): each one's median milliseconds
    over the rounds, and the rounds themselves, so a ratio can be taken round by round. Why: on the lent
    H200's hosts the same launch took either ~45 or ~105 us, the state holding for seconds whatever ran
    (lab/LOG.md 2026-12-04 session 21); calls timed seconds apart then compare two host states, calls
    timed in one round the same one."""
    return _in_turn({name: functools.partial(_bench, fn, rep) for name, fn in fns.items()}, rounds)


def _in_turn(timers: dict, rounds: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Each timer (no arguments, returns milliseconds) called in turn, `rounds` times: the medians over the
    rounds and the rounds themselves (see _bench_interleaved)."""
    per_round = [{name: timer() for name, timer in timers.items()} for _ in range(rounds)]
    return {name: statistics.median(r[name] for r in per_round) for name in timers}, per_round


def _round_ratio(per_round: list[dict[str, float]], num: str, den: str) -> float:
    """Median over rounds of per_round[num] / per_round[den]."""
    return statistics.median(r[num] / r[den] for r in per_round)


def _randn(*shape, scale=1.0, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


# -- GEMM ---------------------------------------------------------------------------------------------
def gemm_shapes(model: str) -> dict[str, tuple[int, int, bool]]:
    """name -> (K, N, row_parallel) of each projection of one layer of a model preset (y = x @ w.T)."""
    from rlkit.model.config import preset

    cfg = preset(model)
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = ((h, q + 2 * kv, False), (q, h, True), (h, 2 * i, False), (i, h, True), (h, cfg.vocab_size, False))
    return dict(zip(GEMM_LAYERS, shapes, strict=True))




def _graph_ms(fn, rep: int = 10) -> float:
    """Median milliseconds of one call replayed from a CUDA graph (no host launch cost in the time)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


L2_ROTATION = 3
"""Cold-weight timing keeps this many L2s' worth of weight copies in rotation (cold_weights)."""


def cold_weights(w: torch.Tensor) -> list[torch.Tensor]:
    """`w` and copies of it, together at least L2_ROTATION times the device's L2, to be called on in turn
    (cold_graph_ms): each call then finds its weights out of the L2, as a layer's projection does in a
    forward pass, where the other layers' weights went through the L2 since. A replayed call on one
    weight would find up to the whole L2 (50 MB on Hopper) still holding it: the 0.6b-8b o and down
    weights (4-100 MB) partly or wholly, faster than HBM (lab/LOG.md 2026-12-06 session 27)."""
    l2 = getattr(torch.cuda.get_device_properties(w.device), "L2_cache_size", 50 * 2**20)
    nbytes = w.numel() * w.element_size()
    copies = max(1, -(-L2_ROTATION * l2 // nbytes))
    return [w] + [w.clone() for _ in range(copies - 1)]


def cold_graph_ms(call, weights: list[torch.Tensor], rep: int = 10) -> float:
    """Median milliseconds of call(w) from a CUDA graph whose calls take `weights` in turn (see
    cold_weights): weights from HBM, as in a forward pass, not from the L2 the previous replay filled."""
    turn = itertools.cycle(weights)
    return _graph_ms(lambda: call(next(turn)), rep)


def batch_invariant_ops_matmul():
    """Thinking Machines' batch-invariant persistent matmul (github thinking-machines-lab/
    batch_invariant_ops), timed beside rlkit's when its package is importable (not a dependency: put it on
    PYTHONPATH, or at $RLKIT_BATCH_INVARIANT_OPS). Returns f(x, w) = x @ w.T, or None."""
    import sys

    extra = os.environ.get("RLKIT_BATCH_INVARIANT_OPS")
    if extra and extra not in sys.path:
        sys.path.insert(0, extra)
    try:
        from batch_invariant_ops import matmul_persistent
    except Exception:  # noqa: BLE001 - absent or broken: the column is left out
        return None
    return lambda x, w: matmul_persistent(x, w.t())


BESIDE = ("qwen3-dense-strict-v6", "qwen3-dense-strict-v5")
"""Contracts whose GEMM is timed beside the default's (the default itself is left out)."""
BESIDE_IMPLS = {"strict_v6": "v6", "strict_v5": "v5", "strict_narrow": "narrow"}
"""Their rows' impl -> the label their cells get in BENCHMARKS.md (strict_narrow: the default contract's
one chain on NARROW_ONE_CHAIN's launch instead of the plan's)."""


def narrow_launch(m: int) -> dict | None:
    """NARROW_ONE_CHAIN's launch for M rows, None above its largest M."""
    return next((cfg for top, cfg in NARROW_ONE_CHAIN if m <= top), None)


def bench_gemm(rec: Recorder, ms=GEMM_M, models=GEMM_MODELS, tune: bool = False, layers=None,
               peer: NativePeer | None = None, rounds: int = GEMM_ROUNDS) -> None:
    """Every projection of each model at every M (or the `layers` named): cuBLAS, rlkit strict (what
    rlkit.ops.linear runs: the cuBLAS route where kernels/gemm_cublas.py admits it, else the Triton
    kernel), the Triton kernel alone (strict_triton), rlkit under contract v4 (the pairwise tree in the
    row-parallel layers) and Thinking Machines' batch-invariant matmul, CUDA-graph replay. With `tune`,
    candidate launch configurations too (each checked bit for bit).
    Strict, native and batch_invariant_ops are timed in turn, `rounds` times a cell, and their ratios taken
    round by round (medians); the rest once. Native is cuBLAS at torch's defaults: timed by `peer` (a
    process at the defaults, start_native_peer) where this process runs cuBLAS without a workspace for the
    strict route, this process's cuBLAS then recorded as native_no_workspace; else timed here."""
    from rlkit import NumericsContract
    from rlkit.kernels import gemm, gemm_cublas

    c, v4 = NumericsContract.default(), NumericsContract.named("qwen3-dense-strict-v4")
    # v5 (the ordered merge of from-zero chunks) and v6 (the chunks chain), whichever is not the default,
    # timed beside it: what the row-parallel layers gain or lose between the two
    beside = {f"strict_v{other.version}": other for other in map(NumericsContract.named, BESIDE) if other.name != c.name}
    rec.add("gemm", "strict", "contract", f"name:{c.name}", 1.0)
    tm = batch_invariant_ops_matmul()
    print(f"bench gemm: batch_invariant_ops {'found' if tm else 'not importable (column left out)'}", flush=True)
    compiled: dict = {}  # kernel kind -> the last Launch of that kind (registers, spills)
    for model in models:
        for name, (k, n, row_par) in gemm_shapes(model).items():
            if layers and name not in layers:
                continue
            w = _randn(n, k, scale=0.02, seed=1)
            for m in ms:
                x = _randn(m, k, seed=2)
                shape = f"{model}.{name} M={m} K={k} N={n}"
                flops = 2.0 * m * n * k
                y, launches = gemm.triton_launch(x, w, c, 1, torch.bfloat16, row_parallel=row_par)
                compiled.update((ln.kernel, ln) for ln in launches)
                routed = gemm.strict(x, w, c, torch.bfloat16, row_parallel=row_par)  # eager first: the route's check
                route = gemm_cublas.status(x.device)
                one_chain = not row_par or gemm.chained(c, True)
                on_cublas = one_chain and route is not None and route.on_cublas(k, n)
                measured = one_chain and gemm.measured_launch(x, w, c, torch.bfloat16) is not None
                rec.add("gemm", "strict", shape, "on_cublas", float(on_cublas and not measured))
                rec.add("gemm", "strict", shape, "measured_launch", float(measured))  # kernels/gemm_tuned.py
                rec.add("gemm", "strict", shape, "same_bits_as_triton", float(torch.equal(routed, y)))
                # every call below takes the weight as an argument: timed on rotating copies (cold_weights)
                in_turn = {
                    "strict": lambda wi: gemm.strict(x, wi, c, torch.bfloat16, row_parallel=row_par),
                    "native_no_workspace" if peer else "native": lambda wi: F.linear(x, wi),
                }
                if tm is not None:
                    in_turn["batch_invariant_ops"] = lambda wi: tm(x, wi)
                impls = {
                    "strict_triton": lambda wi: gemm.triton_partial(x, wi, c, 1, torch.bfloat16, row_parallel=row_par),
                    "strict_v4": lambda wi: gemm.triton_partial(x, wi, v4, 1, torch.bfloat16, row_parallel=row_par),
                }
                impls.update({impl: (lambda wi, o=other: gemm.strict(x, wi, o, torch.bfloat16, row_parallel=row_par))
                              for impl, other in beside.items()})
                narrow = narrow_launch(m) if one_chain else None
                if narrow is not None:  # timed only with the plan's bits
                    same = torch.equal(gemm.triton_partial(x, w, c, 1, torch.bfloat16, config=narrow,
                                                           row_parallel=row_par), y)
                    rec.add("gemm", "strict_narrow", shape, "same_bits_as_triton", float(same))
                    if same:
                        impls["strict_narrow"] = lambda wi: gemm.triton_partial(x, wi, c, 1, torch.bfloat16,
                                                                                config=narrow, row_parallel=row_par)
                    else:
                        print(f"  {shape} strict_narrow {narrow}: other bits than the plan (not timed)", flush=True)
                weights = cold_weights(w)
                timers = {impl: functools.partial(cold_graph_ms, fn, weights) for impl, fn in in_turn.items()}
                if peer:
                    timers["native"] = functools.partial(_peer_ms, peer, "gemm", m=m, k=k, n=n)
                times, per_round = _in_turn(timers, rounds)
                times.update({impl: cold_graph_ms(fn, weights) for impl, fn in impls.items()})
                # the same calls with the weight replayed from the L2 (how these cells were timed before
                # session 27): recorded beside, not the ratio
                rec.add("gemm", "strict", shape, "ms_l2_warm", _graph_ms(lambda: in_turn["strict"](w)))
                rec.add("gemm", "native", shape, "ms_l2_warm",
                        _peer_ms(peer, "gemm", m=m, k=k, n=n, warm=True) if peer else _graph_ms(lambda: F.linear(x, w)))
                del weights
                rec.add("gemm", "native", shape, "at_torch_defaults", float(
                    peer is not None or gemm_cublas.environment_problem() is not None))
                rec.add("gemm", "strict", shape, "rounds_in_turn", float(rounds))
                for impl, t in times.items():
                    rec.add("gemm", impl, shape, "ms", t)
                    rec.add("gemm", impl, shape, "TFLOP/s", flops / t / 1e9)
                    if impl != "native":
                        rec.add("gemm", impl, shape, "ratio_vs_native",
                                _round_ratio(per_round, "native", impl) if impl in timers else times["native"] / t)
                if tm is not None:
                    rec.add("gemm", "strict", shape, "ratio_vs_batch_invariant_ops",
                            _round_ratio(per_round, "batch_invariant_ops", "strict"))
                rec.add("gemm", "strict", shape, "GB/s_weights", n * k * 2 / times["strict"] / 1e6)
                plan = launches[0].plan if launches else {}
                rec.add("gemm", "strict", shape, "plan:" + ",".join(
                    f"{key}={plan[key]}" for key in ("kind", "BM", "BN", "BT", "split", "num_warps", "num_stages")
                    if key in plan), 1.0)
                if tune:
                    group = "small" if m <= gemm.SMALL_M else "row_parallel" if row_par else "large"
                    for i, cfg in enumerate(TUNE_CONFIGS[group]):
                        try:
                            same = torch.equal(gemm.triton_partial(x, w, c, 1, torch.bfloat16, config=cfg,
                                                                   row_parallel=row_par), y)
                            t = cold_graph_ms(lambda wi: gemm.triton_partial(x, wi, c, 1, torch.bfloat16, config=cfg,
                                                                             row_parallel=row_par), cold_weights(w), rep=5)
                        except Exception as exc:  # noqa: BLE001 - a candidate that does not run is a row
                            print(f"  {shape} cfg{i} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                            continue
                        rec.add("gemm", f"cfg{i}", shape, "ratio_vs_native", times["native"] / t)
                        rec.add("gemm", f"cfg{i}", shape, "same_bits", float(same))
                del x
            del w
    tiny_x, tiny_w = _randn(1, 256, seed=20), _randn(64, 256, seed=21)
    rec.add("gemm", "strict", "launch floor M=1 K=256 N=64", "ms",
            _bench(lambda: gemm.triton_partial(tiny_x, tiny_w, c, 1, torch.bfloat16)))
    rec.add("gemm", "native", "launch floor M=1 K=256 N=64", "ms", _bench(lambda: F.linear(tiny_x, tiny_w)))
    for kind, ln in compiled.items():
        rec.add("gemm", f"strict_{kind}", "last compiled", "registers", ln.registers)
        rec.add("gemm", f"strict_{kind}", "last compiled", "spills", ln.spills)


# -- attention ----------------------------------------------------------------------------------------
ATTENTION_PREFILL_TILES = ((64, 4), (64, 8), (128, 4), (128, 8))
"""Prefill tiles (rows, warps) timed with --tune under v4, where the tile is a plan (every one gives the
default's bits: tests/gpu/test_kernels_gpu.py::test_attention_every_decode_position_equals_prefill)."""


DECODE_TUNE = (((16, 4), 2), ((16, 4), 3), ((16, 4), 4), ((16, 4), 5), ((16, 2), 3), ((16, 8), 3), ((32, 4), 3))
"""Decode plans (tile, pipeline stages) timed with --tune beside the default plan: under v4 neither moves a
bit (tests/gpu/test_kernels_gpu.py::test_attention_every_decode_position_equals_prefill)."""


NATIVE_DECODE_TUNE = ((16, 2), (16, 4), (16, 8))
"""The native control's paged decode timed at these tiles with --tune beside its own (an honest control is
at its fastest too)."""


def _tune_attention_plan(rec: Recorder, name: str, shape: str, metric: str, t_ref: float, plan: dict,
                         other: dict, q, k, v, contract) -> None:
    """--tune: `other`, a plan of the same contract (tile, stages, masking, tile order: none moves a bit),
    timed against `t_ref` (the ratio as `metric`) and checked bit for bit against `plan`."""
    from rlkit.kernels import attention

    same = torch.equal(attention.launch(other, q, k, v, contract)[0], attention.launch(plan, q, k, v, contract)[0])
    t = _bench(lambda: attention.launch(other, q, k, v, contract))
    rec.add("attention_tune", name, shape, metric, t_ref / t)
    rec.add("attention_tune", name, shape, "same_bits", float(same))


def _attention_contracts():
    """Contracts timed beside the default with --tune: v3 (one 64-row tile, the pairwise merge, 32-key
    blocks), v4 with 32-key blocks (what v4's 64-key blocks gain) and with longer splits (fewer restarts of
    the online softmax in prefill, fewer parallel programs in a small decode batch)."""
    import dataclasses

    from rlkit import NumericsContract
    c = NumericsContract.default()
    return {"strict_v3": NumericsContract.named("qwen3-dense-strict-v3"),
            "strict_v4_block32": c.replace(attention=dataclasses.replace(c.attention, block_size=32)),
            "strict_v4_split512": c.replace(attention=dataclasses.replace(c.attention, split_size=512)),
            "strict_v4_split1024": c.replace(attention=dataclasses.replace(c.attention, split_size=1024))}


def bench_attention(rec: Recorder, seqlens=PREFILL_S, batches=DECODE_BATCHES, contexts=DECODE_CONTEXTS,
                    tune: bool = False) -> None:
    from rlkit import NumericsContract
    from rlkit.kernels import attention
    from rlkit.types import AttentionLayout

    c = NumericsContract.default()
    others = _attention_contracts() if tune else {}
    compiled: dict = {}  # attention mode -> the last Launch of that mode (registers, spills)
    h, g, d = 32, 8, 128
    for s in seqlens:
        q, k, v = _randn(s, h, d, seed=3), _randn(s, g, d, seed=4), _randn(s, g, d, seed=5)
        qs = q.transpose(0, 1).unsqueeze(0)
        ks = k.transpose(0, 1).repeat_interleave(h // g, 0).unsqueeze(0).contiguous()
        vs = v.transpose(0, 1).repeat_interleave(h // g, 0).unsqueeze(0).contiguous()
        flops = 4.0 * s * s * d * h / 2
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            t_nat = _bench(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
        lay = AttentionLayout.prefill(torch.tensor([0, s], device="cuda"))
        plan = attention.attention_plan(q.shape, k, lay, c)
        compiled.update((ln.kernel, ln) for ln in attention.launch(plan, q, k, v, c)[1])
        t_str = _bench(lambda: attention.launch(plan, q, k, v, c))
        shape = f"prefill S={s} H={h} G={g} D={d}"
        for impl, t in (("native_sdpa_flash", t_nat), ("strict", t_str)):
            rec.add("attention", impl, shape, "ms", t)
            rec.add("attention", impl, shape, "TFLOP/s", flops / t / 1e9)
        rec.add("attention", "strict", shape, "ratio_vs_native", t_nat / t_str)
        for tile in ATTENTION_PREFILL_TILES if tune else ():
            for name, tc in (("", c), ("_block32", others.get("strict_v4_block32"))):
                tplan = attention.attention_plan(q.shape, k, lay, tc, tile=tile)
                t = _bench(lambda: attention.launch(tplan, q, k, v, tc))
                rec.add("attention_tune", f"tile{tile[0]}x{tile[1]}{name}", shape, "ratio_vs_native", t_nat / t)
        for stages in (2, 3, 4) if tune else ():
            splan = attention.attention_plan(q.shape, k, lay, c, stages=stages)
            t = _bench(lambda: attention.launch(splan, q, k, v, c))
            rec.add("attention_tune", f"stages{stages}", shape, "ratio_vs_native", t_nat / t)
        if tune:  # the other masking form of the whole key blocks, and the tiles in the other order
            uplan = attention.attention_plan(q.shape, k, lay, c, plan["mode"], unmasked_full=not plan["unmasked_full"])
            _tune_attention_plan(rec, "unmasked" if uplan["unmasked_full"] else "masked", shape, "ratio_vs_native",
                                 t_nat, plan, uplan, q, k, v, c)
            oplan = attention.attention_plan(q.shape, k, lay, c, longest_first=not plan["longest_first"])
            _tune_attention_plan(rec, "longest_first" if oplan["longest_first"] else "in_order", shape,
                                 "ratio_vs_native", t_nat, plan, oplan, q, k, v, c)
        for name, oc in others.items():
            oplan = attention.attention_plan(q.shape, k, lay, oc)
            t = _bench(lambda: attention.launch(oplan, q, k, v, oc))
            rec.add("attention_tune", name, shape, "ratio_vs_native", t_nat / t)
    page = 16
    for b in batches:
        for ctx in contexts:
            pages_per = ctx // page
            kc = _randn(b * pages_per, page, g, d, seed=6)
            vc = _randn(b * pages_per, page, g, d, seed=7)
            perm = torch.randperm(b * pages_per, device="cuda").view(b, pages_per)
            q = _randn(b, h, d, seed=8)
            lay = AttentionLayout.paged(torch.ones(b, dtype=torch.int64, device="cuda"),
                                        torch.full((b,), ctx, dtype=torch.int64, device="cuda"), perm)
            plan = attention.attention_plan(q.shape, kc, lay, c)
            compiled.update((ln.kernel, ln) for ln in attention.launch(plan, q, kc, vc, c)[1])
            # native: SDPA over the same KV, already gathered contiguous per sequence (gather not timed)
            kg = kc[perm].reshape(b, ctx, g, d).transpose(1, 2).contiguous()
            vg = vc[perm].reshape(b, ctx, g, d).transpose(1, 2).contiguous()
            qn = q.unsqueeze(2)
            sdpa, impl = (lambda: F.scaled_dot_product_attention(qn, kg, vg, enable_gqa=True)), "native_sdpa_gqa"
            try:
                sdpa()
            except Exception:  # noqa: BLE001 - older torch: expand the heads
                kx, vx = kg.repeat_interleave(h // g, 1), vg.repeat_interleave(h // g, 1)
                sdpa, impl = (lambda: F.scaled_dot_product_attention(qn, kx, vx)), "native_sdpa_expanded"
            # strict, SDPA and the native control's own paged decode (split-K flash-decoding off the page
            # table) in turn: at small batches all three are launch-bound (`_bench_interleaved`)
            times, per_round = _bench_interleaved({
                "strict": lambda: attention.launch(plan, q, kc, vc, c), "sdpa": sdpa,
                "paged": lambda: attention.native_paged_decode(q, kc, vc, lay)})
            t_str, t_nat, t_paged = times["strict"], times["sdpa"], times["paged"]
            kv_bytes = 2.0 * b * ctx * g * d * 2
            shape = f"decode B={b} ctx={ctx} page={page} mode={plan['mode']}"
            for name, t in ((impl, t_nat), ("native_paged", t_paged), ("strict", t_str)):
                rec.add("paged_decode", name, shape, "ms", t)
                rec.add("paged_decode", name, shape, "GB/s_kv", kv_bytes / t / 1e6)
                rec.add("paged_decode", name, shape, "fraction_of_hbm_limit", kv_bytes / HBM_BYTES_PER_S / (t / 1e3))
            rec.add("paged_decode", "strict", shape, "ratio_vs_native", _round_ratio(per_round, "sdpa", "strict"))
            rec.add("paged_decode", "strict", shape, "ratio_vs_native_paged",
                    _round_ratio(per_round, "paged", "strict"))
            for name, oc in others.items():
                oplan = attention.attention_plan(q.shape, kc, lay, oc)
                t = _bench(lambda: attention.launch(oplan, q, kc, vc, oc))
                rec.add("attention_tune", name, shape, "ratio_vs_native_paged", t_paged / t)
            if tune:
                uplan = attention.attention_plan(q.shape, kc, lay, c, plan["mode"],
                                                 unmasked_full=not plan["unmasked_full"])
                _tune_attention_plan(rec, "unmasked" if uplan["unmasked_full"] else "masked", shape,
                                     "ratio_vs_native_paged", t_paged, plan, uplan, q, kc, vc, c)
            for tile in NATIVE_DECODE_TUNE if tune else ():  # is the native control at its fastest tile?
                t = _bench(lambda: attention.native_paged_decode(q, kc, vc, lay, tile=tile))
                rec.add("attention_tune", f"native_paged_tile{tile[0]}x{tile[1]}", shape, "ms", t)
                rec.add("attention_tune", f"native_paged_tile{tile[0]}x{tile[1]}", shape, "speed_vs_native_paged",
                        t_paged / t)
            for tile, stages in DECODE_TUNE if tune else ():
                dplan = attention.attention_plan(q.shape, kc, lay, c, plan["mode"], tile=tile, stages=stages)
                _tune_attention_plan(rec, f"tile{tile[0]}x{tile[1]}_stages{stages}", shape, "ratio_vs_native_paged",
                                     t_paged, plan, dplan, q, kc, vc, c)
            del kc, vc, kg, vg
    for mode, ln in compiled.items():
        rec.add("attention", f"strict_{mode}", "last compiled", "registers", ln.registers)
        rec.add("attention", f"strict_{mode}", "last compiled", "spills", ln.spills)


ATTENTION_BACKWARD_SHAPES = {"0.6b validation 16 x 655": [655] * 16, "1.7b trainer-heavy 16 x 2,191": [2191] * 16,
                             "0.6b source 64 x 3,600": [3600] * 64}
"""A trainer's packed batches (Qwen3 0.6b and 1.7b share 16 q / 8 kv heads of 128): the RL-step shapes'
prompt + response lengths (the source shape's responses average about half their 6,912-token cap)."""


def bench_attention_backward(rec: Recorder, shapes=ATTENTION_BACKWARD_SHAPES) -> None:
    """Attention forward + backward as the trainer runs it: torch's varlen flash with its own backward
    (atomic dQ sums: `native_forward`), native as rlkit runs it (the same, its backward under
    deterministic algorithms: kernels/determinism.py) and strict (the Triton forward, native's
    deterministic backward after a recompute). What the repeatable backward costs each path."""
    from rlkit import NumericsContract
    from rlkit.kernels import attention
    from rlkit.types import AttentionLayout

    c = NumericsContract.default()
    impls = {"torch_atomic": attention.native_forward, "native": attention.native,
             "strict": lambda q, k, v, lay: attention.strict(q, k, v, lay, c)}
    for name, lens in shapes.items():
        t = sum(lens)
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), device="cuda")
        layout = AttentionLayout.prefill(cu)
        q, k, v, g = (_randn(t, n, 128, seed=40 + i) for i, n in enumerate((16, 8, 8, 16)))
        leaves = [x.requires_grad_(True) for x in (q, k, v)]
        times = {}
        for impl, fn in impls.items():
            def step():
                for x in leaves:
                    x.grad = None
                fn(*leaves, layout).backward(g)
            times[impl] = _bench(step, rep=50)
            rec.add("attention_backward", impl, name, "ms", times[impl])
        for impl in ("native", "strict"):
            rec.add("attention_backward", impl, name, "ratio_vs_torch_atomic", times["torch_atomic"] / times[impl])


# -- logprob and the row-wise ops ---------------------------------------------------------------------
def native_logprob(h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The native control of the logprob cells: torch.mm + log_softmax, the ids' values gathered."""
    return torch.log_softmax(F.linear(h, w).float(), -1).gather(-1, ids[:, None])


def bench_logprob(rec: Recorder, ms=LOGPROB_M, peer: NativePeer | None = None,
                  rounds: int = 5) -> None:
    """Strict logprob (lm_head GEMM + the contract's LSE) against torch.mm + log_softmax, the two timed in
    turn `rounds` times, the ratio taken round by round; native at torch's defaults from `peer` where given
    (see bench_gemm), this process's cuBLAS then recorded as native_no_workspace."""
    from rlkit import NumericsContract
    from rlkit.kernels import gemm, logprob

    c = NumericsContract.default()
    k, n, _ = gemm_shapes("qwen3-8b")["lm_head"]
    w = _randn(n, k, scale=0.02, seed=9)
    for m in ms:
        h = _randn(m, k, seed=10)
        ids = torch.randint(0, n, (m,), device="cuda")
        shape = f"lm_head M={m} K={k} V={n}"
        timers = {"strict": functools.partial(_bench, lambda: logprob.triton_logprob(h, w, ids, c), 40),
                  "native_no_workspace" if peer else "native": functools.partial(
                      _bench, lambda: native_logprob(h, w, ids), 40)}
        if peer:
            timers["native"] = functools.partial(_peer_ms, peer, "logprob", m=m, k=k, n=n)
        times, per_round = _in_turn(timers, rounds)
        t_nat, t_str = times["native"], times["strict"]
        if peer:
            rec.add("logprob", "native_no_workspace", shape, "ms", times["native_no_workspace"])
        # the chunk-parallel form (logprob.PARALLEL_CHUNKS decides whether plans take it), its bits checked
        other = not logprob.chunks_in_parallel(m, h.device)
        same = torch.equal(logprob.triton_logprob(h, w, ids, c, parallel=other), logprob.triton_logprob(h, w, ids, c))
        t_other = _bench(lambda: logprob.triton_logprob(h, w, ids, c, parallel=other))
        # rlkit's own native path checks the ids as strict does (one device sync a call): like for like
        t_rlkit_nat = _bench(lambda: logprob.native(h, w, ids, c))
        rec.add("logprob", "native_mm_log_softmax", shape, "ms", t_nat)
        rec.add("logprob", "native_rlkit", shape, "ms", t_rlkit_nat)
        rec.add("logprob", "strict", shape, "ratio_vs_native_rlkit", t_rlkit_nat / t_str)
        form = "strict_parallel_chunks" if other else "strict_row_programs"
        rec.add("logprob", form, shape, "ratio_vs_native", t_nat / t_other)
        rec.add("logprob", form, shape, "same_bits", float(same))
        rec.add("logprob", "strict", shape, "ms", t_str)
        rec.add("logprob", "strict", shape, "ratio_vs_native", _round_ratio(per_round, "native", "strict"))
        # the same kernels without the ids' range check (a device sync the native mm + log_softmax does not
        # make): how much of the gap at few rows is that read, not the kernels
        t_unchecked = _bench(lambda: logprob._triton_from_checked_logits(
            gemm.strict(h, w, c, torch.float32), ids, c, None, None))
        rec.add("logprob", "strict_kernels_without_id_check", shape, "ms", t_unchecked)
        rec.add("logprob", "strict_kernels_without_id_check", shape, "ratio_vs_native", t_nat / t_unchecked)
        # the same rounds against torch's mm + log_softmax in this process (no cuBLAS workspace where the
        # route is on: at the lm_head's N the same cuBLAS kernels as at the defaults, lab/LOG.md 2026-12-03
        # session 16), so the launch-bound cells read against a native in the very same host state
        here = "native_no_workspace" if peer else "native"
        rec.add("logprob", "strict_interleaved", shape, "ms", times["strict"])
        rec.add("logprob", "native_interleaved", shape, "ms", times[here])
        rec.add("logprob", "strict", shape, "ratio_vs_native_interleaved", _round_ratio(per_round, here, "strict"))


def bench_rowwise(rec: Recorder, rows: int = 4096) -> None:
    from rlkit import NumericsContract
    from rlkit.kernels import rms_norm, rope, swiglu

    c = NumericsContract.default()
    x, r = _randn(rows, 4096, seed=11), _randn(rows, 4096, seed=12)
    w = (1 + 0.1 * _randn(4096, dtype=torch.float32, seed=13)).bfloat16()
    cases = {  # (op: the kernel's name, shape) -> (native, strict)
        ("rms_norm", f"rms_norm+residual {rows}x4096"): (lambda: rms_norm.native(x, w, 1e-6, r),
                                                         lambda: rms_norm.triton_rms_norm(x, w, 1e-6, c, r)),
    }
    gte, up = _randn(rows, 12288, seed=14), _randn(rows, 12288, seed=15)
    cases[("swiglu", f"swiglu {rows}x12288")] = (lambda: swiglu.native(gte, up),
                                                  lambda: swiglu.triton_swiglu(gte, up, c))
    qr = _randn(rows, 32, 128, seed=16)
    pos = torch.arange(rows, device="cuda")
    rope.tables(rows, 128, 1e6, qr.device)
    cases[("rope", f"rope {rows}x32x128")] = (lambda: rope.native(qr, pos, 1e6),
                                              lambda: rope.triton_rope(qr, pos, 1e6, c))
    for (op, shape), (nat, strict) in cases.items():
        # Tens of microseconds each: in turn, round by round (see _bench_interleaved). Timed once apiece,
        # the H100 read RoPE's unchanged kernel at 0.98 one session and 0.79 the next (lab/LOG.md session 37).
        times, per_round = _bench_interleaved({"native": nat, "strict": strict})
        rec.add(op, "native", shape, "ms", times["native"])
        rec.add(op, "strict", shape, "ms", times["strict"])
        rec.add(op, "strict", shape, "ratio_vs_native", _round_ratio(per_round, "native", "strict"))


# -- the embedded engine's decode step (ENGINE_STEPS: rlkit.bench.targets) ---------------------------
def bench_engine_steps(rec: Recorder, batch: int = 64, steps=ENGINE_STEPS) -> None:
    for model, ctx in steps:
        bench_engine_step(rec, batch, ctx, model)
        torch.cuda.empty_cache()


def bench_engine_step(rec: Recorder, batch: int = 64, ctx: int = 512, model_name: str = "qwen3-0.6b") -> None:
    """One decode step of a model preset (random bf16 weights) for `batch` sequences at context `ctx`:
    the forward and the fp32 logits of every row, strict and native, run eagerly and replayed from a CUDA
    graph (rlkit.rollout.decode_graphs, host work included: the step's metadata copy), and its fraction
    of the HBM limit (weights + KV bytes read once / 4.3 TB/s, over the measured time)."""
    from rlkit import NumericsContract
    from rlkit.model.config import preset
    from rlkit.model.qwen3 import Qwen3ForCausalLM
    from rlkit.rollout.decode_graphs import DecodeGraphs
    from rlkit.rollout.kv_cache import PagedKVCache

    cfg = preset(model_name)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight")
                    else (torch.randn(p.shape, generator=gen, device="cuda") * 0.02).to(p.dtype))
    page = 16
    per = -(-(ctx + 1) // page)
    cache = PagedKVCache(cfg.num_hidden_layers, batch * per, page, cfg.num_key_value_heads, cfg.head_dim,
                         torch.bfloat16, "cuda")
    for kk, vv in zip(cache.k, cache.v):
        kk.normal_(generator=gen)
        vv.normal_(generator=gen)
    tables = [list(range(i * per, (i + 1) * per)) for i in range(batch)]
    ids = torch.randint(0, cfg.vocab_size, (batch,), generator=gen, device="cuda").tolist()
    args = (ids, [ctx] * batch, [t[ctx // page] * page + ctx % page for t in tables], [ctx + 1] * batch, tables,
            [per * page] * batch)  # limits: every row may run to its last page
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = 2.0 * batch * (ctx + 1) * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    shape = f"{model_name} decode step B={batch} ctx={ctx}"
    for mode in ("eager", "graph"):
        steps = DecodeGraphs(model, cache, batch, per * page, capture=mode == "graph")
        for impl, contract in (("strict", NumericsContract.default()), ("native", NumericsContract.native())):
            for _ in range(3):
                steps.run(contract, *args)
            torch.cuda.synchronize()
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                steps.run(contract, *args)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            t = sorted(times)[len(times) // 2]
            rec.add("engine_step", impl, f"{shape} {mode}", "ms", t)
            rec.add("engine_step", impl, f"{shape} {mode}", "fraction_of_hbm_limit",
                    (weight_bytes + kv_bytes) / HBM_BYTES_PER_S / (t / 1e3))
    rec.add("engine_step", "bytes", shape, "GB_read", (weight_bytes + kv_bytes) / 1e9)


# -- output -------------------------------------------------------------------------------------------
def write_rows(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(out / "bench.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["op", "impl", "shape", "metric", "median", "device", "commit"])
        wr.writeheader()
        wr.writerows(rows)


def _get(rows, op, impl, shape, metric):
    for r in rows:
        if (r["op"], r["impl"], r["shape"], r["metric"]) == (op, impl, shape, metric):
            return r["median"]
    return None


ROW_PARALLEL_NOTES = {
    "qwen3-dense-strict-v6": "o and down are row-parallel: under v6 their 4 K chunks chain (each starts from the "
                             "running sum of those before it), so they are one chain over K like the rest",
    "qwen3-dense-strict-v5": "o and down are row-parallel: under v5 4 K chunks, each from zero, added in order (the "
                             "Triton kernel, or on sm_90 with many tiles and chunks <= 1536 the Gluon kernel of "
                             "kernels/gemm_gluon.py: the same bits); the rest one chain over K",
}
"""What the row-parallel cells ran under each default contract the benchmark has been run at."""


def _gemm_contract(rows: list[dict]) -> str:
    """The contract the GEMM rows' "strict" ran under (its `contract:` row; rows from before it: v5)."""
    named = [r["metric"].split(":", 1)[1] for r in rows
             if r["op"] == "gemm" and r["shape"] == "contract" and r["metric"].startswith("name:")]
    return named[-1] if named else "qwen3-dense-strict-v5"


def _beside_note(impl: str) -> str:
    """What a cell's extra ratio (BESIDE_IMPLS) timed."""
    if impl == "strict_narrow":
        return ("the same product on narrow weight tiles (rlkit.bench.gemm_candidates.NARROW_ONE_CHAIN; its bits "
                "checked equal to the plan's first), timed beside.")
    return f"the same cell under qwen3-dense-strict-{BESIDE_IMPLS[impl]}, timed beside."


def _rounds_note(rows: list[dict], model: str) -> str:
    """How a model's GEMM cells were timed: in turn over rounds (rows since a8908db), else one each."""
    rounds = {int(r["median"]) for r in rows if r["op"] == "gemm" and r["metric"] == "rounds_in_turn"
              and r["shape"].startswith(model + ".")}
    if not rounds:
        return ""
    cold = any(r["op"] == "gemm" and r["metric"] == "ms_l2_warm" and r["shape"].startswith(model + ".") for r in rows)
    return (f", in turn with strict and batch_invariant_ops ({'/'.join(map(str, sorted(rounds)))} rounds a cell, "
            "the ratios taken round by round, medians; the native in a peer process at the defaults)"
            + ("; every call on rotating weight copies, three L2s' worth, so the weights come from HBM as in a "
               "forward pass (the L2-warm times are rows beside, metric ms_l2_warm)" if cold else ""))


def _render_gemm(rows: list[dict]) -> list[str]:
    """One table per model: strict / cuBLAS speed ratio, strict / batch_invariant_ops where timed, and the
    other contract's GEMM (strict_v5 or strict_v6, whichever the default was not) where timed."""
    sel = [r for r in rows if r["op"] == "gemm" and r["impl"] == "strict" and r["metric"] == "ratio_vs_native"]
    contract = _gemm_contract(rows)
    out: list[str] = []
    models = list(dict.fromkeys(r["shape"].split()[0].rsplit(".", 1)[0] for r in sel if "." in r["shape"].split()[0]))
    for model in models:
        cells = [r for r in sel if r["shape"].startswith(model + ".")]
        names = list(dict.fromkeys(r["shape"].split()[0].rsplit(".", 1)[1] for r in cells))
        ms = list(dict.fromkeys(int(r["shape"].split()[1][2:]) for r in cells))
        ratios = [r["median"] for r in cells]
        vs_tm = [x["median"] for x in rows if x["op"] == "gemm" and x["metric"] == "ratio_vs_batch_invariant_ops"
                 and x["shape"].startswith(model + ".")]
        beside = sorted({x["impl"] for x in rows if x["op"] == "gemm" and x["impl"] in BESIDE_IMPLS
                         and x["shape"].startswith(model + ".")})
        out += [f"## GEMM, {model} projections (bf16): strict / cuBLAS speed ratio"
                + (" · strict / batch_invariant_ops" if vs_tm else ""), "",
                f"Lowest vs cuBLAS: {min(ratios):.2f} (target >= 0.90)"
                + (f"; lowest vs batch_invariant_ops: {min(vs_tm):.2f} (target >= 1.0)" if vs_tm else "")
                + f". Contract {contract}. {ROW_PARALLEL_NOTES.get(contract, '')} (on cuBLAS without split-K where "
                "the route admits the shape: the Triton kernel's bits, checked; kernels/gemm_cublas.py). cuBLAS is "
                "timed at torch's defaults" + _rounds_note(rows, model) + "."
                + "".join(f" \"{BESIDE_IMPLS[b]}\": {_beside_note(b)}" for b in beside), "",
                "| M | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for m in ms:
            line = []
            for nm in names:
                shape = next((r["shape"] for r in cells if r["shape"].startswith(f"{model}.{nm} M={m} ")), None)
                v = _get(rows, "gemm", "strict", shape, "ratio_vs_native") if shape else None
                t = _get(rows, "gemm", "strict", shape, "ratio_vs_batch_invariant_ops") if shape else None
                others = [(BESIDE_IMPLS[b], _get(rows, "gemm", b, shape, "ratio_vs_native") if shape else None)
                          for b in beside]
                line.append("-" if v is None else f"{v:.2f}" + (f" · {t:.2f}" if t is not None else "")
                            + "".join(f" · {label} {o:.2f}" for label, o in others if o is not None))
            out.append(f"| {m} | " + " | ".join(line) + " |")
        out.append("")
    return out


RL_STEP_PARTS = ("step_s", "rollout_s", "train_s", "sync_s")


def _render_rl_step(rows: list[dict]) -> list[str]:
    """The RL step, strict against native (lab/rl_step_ratio_h200.py's rows, op "rl_step")."""
    mine = [r for r in rows if r["op"] == "rl_step"]
    if not mine:
        return []
    out = ["## RL step: strict / native (target <= 1.10)", "",
           "Median seconds, the same seed and data order on both paths; ratio = strict / native (lower is "
           "faster). Design *two runs*: a strict run, then a native run, step 0 of each left out (it compiles "
           "and captures); the ratio is of the two medians. Design *alternating*: one run whose steps switch "
           "every op between strict and native (s s n | s n s n ...), the warm-up left out; the ratio is "
           "the median over pairs (a strict step / the native step right after it), with their range. "
           "Timed: steps a path, or pairs.", "",
           "| shape | design | path | step s | rollout s | train s | sync s | timed | mismatches / compared tokens | commit |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    # one block of lines per measurement: a shape measured again (another commit, another design) keeps both
    for shape, design, sha in dict.fromkeys((r["shape"], r.get("design", "two runs"), r["commit"]) for r in mine):
        for path in ("strict", "native", "strict/native"):
            cells = {r["metric"]: r for r in mine if r["shape"] == shape and r["impl"] == path
                     and r.get("design", "two runs") == design and r["commit"] == sha}
            if not cells:
                continue
            fmt = "{:.2f}" if path == "strict/native" else "{:.3f}"
            parts = [fmt.format(cells[p]["median"]) if p in cells else "-" for p in RL_STEP_PARTS]
            tokens = (f"{cells['mismatch_count']['median']:,.0f} / {cells['compared_tokens']['median']:,.0f}"
                      if "mismatch_count" in cells else "")
            if path == "strict/native":  # an alternating run's ratio row keeps every pair's value
                pairs = cells.get("step_s", {}).get("values") if design == "alternating" else None
                timed = f"{len(pairs)} pairs, {min(pairs):.2f}-{max(pairs):.2f}" if pairs else ""
            else:
                timed = f"{cells['steps_timed']['median']:.0f}" if "steps_timed" in cells else ""
            label = f"**{path}**" if path == "strict/native" else path
            out.append(f"| {shape} | {design} | {label} | " + " | ".join(parts) + f" | {timed} | {tokens} | "
                       f"{sha} |")
    return out + [""]


def _render_attention_backward(rows: list[dict]) -> list[str]:
    sel = [r for r in rows if r["op"] == "attention_backward"]
    shapes = list(dict.fromkeys(r["shape"] for r in sel))
    if not shapes:
        return []
    out = ["## Attention forward + backward as the trainer runs it (GQA 16 / 8, D = 128)", "",
           "torch: varlen flash with its own backward (atomic dQ sums, not repeatable); native and strict: "
           "the backward under deterministic algorithms (kernels/determinism.py), strict's after recomputing "
           "native's forward. Ratio = torch's time / this one's.", "",
           "| shape | torch ms | native ms | strict ms | native ratio | strict ratio |", "|---|---|---|---|---|---|"]
    for shape in shapes:
        cell = lambda impl, metric: next((f"{r['median']:.3f}" for r in sel if r["shape"] == shape  # noqa: E731
                                          and r["impl"] == impl and r["metric"] == metric), "-")
        out.append(f"| {shape} | {cell('torch_atomic', 'ms')} | {cell('native', 'ms')} | {cell('strict', 'ms')} | "
                   f"{cell('native', 'ratio_vs_torch_atomic')} | {cell('strict', 'ratio_vs_torch_atomic')} |")
    return out + [""]


RENAMED_OPS = {"rms_norm+residual": "rms_norm"}
"""Op names older row files carry -> today's (rows up to 92b9c6a named RMSNorm's op after its shape)."""


def render(rows: list[dict]) -> str:
    """BENCHMARKS.md from the rows of one device (RowsError for several): each table only reads them; the
    targets table (rlkit.bench.targets) opens it wherever a target has a cell."""
    if not rows:
        return "# Benchmarks\n\nNo rows.\n"
    rows = [dict(r, op=RENAMED_OPS.get(r["op"], r["op"]), commit=short(r["commit"])) for r in rows]
    dev = single_device(rows)
    by_commit: dict[str, list[str]] = {}
    for r in rows:  # rows of several runs (a part re-run after its kernels changed) name their commits
        ops = by_commit.setdefault(r["commit"], [])
        if r["op"] not in ops:
            ops.append(r["op"])
    commits = (f"Commit: {rows[0]['commit']}" if len(by_commit) == 1 else
               "Commits: " + "; ".join(f"{c} ({', '.join(ops)})" for c, ops in by_commit.items()))
    out = ["# Benchmarks: strict kernels vs native", "",
           f"Device: {dev}. {commits}. Ratio = native time / strict time (>= 0.9 is the target; "
           "higher is faster). Rendered by `rlkit.bench.kernels.render` from bench.jsonl.", ""]
    verdicts = judge_targets(rows)
    if any(v.cells for v in verdicts):
        out += render_targets(verdicts)
    out += _render_rl_step(rows)
    out += _render_gemm(rows)
    for op, title in (("attention", "Attention prefill (causal, D=128, 32 q / 8 kv heads) vs SDPA flash"),
                      ("paged_decode", "Paged decode vs native: SDPA over the same KV gathered contiguous "
                                       "(ratio_vs_native), the native control's paged flash-decoding "
                                       "(ratio_vs_native_paged); fraction of the HBM limit for each"),
                      ("logprob", "Strict logprob vs torch.mm + log_softmax (lm_head 4096 -> 151,936)"),
                      ("rms_norm", "RMSNorm"), ("swiglu", "SwiGLU"), ("rope", "RoPE"),
                      ("engine_step", "Embedded engine decode step")):
        sel = [r for r in rows if r["op"] == op and r["metric"] in ("ratio_vs_native", "ratio_vs_native_paged",
                                                                     "ratio_vs_native_interleaved",
                                                                     "fraction_of_hbm_limit")]
        if not sel:
            continue
        out += [f"## {title}", "", "| shape | impl | metric | value | strict ms | native ms |", "|---|---|---|---|---|---|"]
        for r in sel:
            # a strict variant's row (strict_row_programs, strict_kernels_without_id_check, ...) shows its own
            # time in the strict column ("-" where it recorded none) and the native baseline beside it
            # (an interleaved ratio: both times from the rounds it was taken over)
            variant = r["impl"].startswith("strict_")
            interleaved = r["metric"] == "ratio_vs_native_interleaved"
            ms_s = _get(rows, op, "strict_interleaved" if interleaved else r["impl"] if variant else "strict",
                        r["shape"], "ms")
            want = ("native_paged" if r["metric"] == "ratio_vs_native_paged" else "native_interleaved" if interleaved
                    else r["impl"] if r["impl"] != "strict" and not variant else None)
            ms_n = next((x["median"] for x in rows if x["op"] == op and x["shape"] == r["shape"]
                         and x["metric"] == "ms" and x["impl"] not in ("strict", "native_no_workspace")
                         and (x["impl"] == want or (want is None and x["impl"] not in ("native_paged",
                                                                                        "native_interleaved")))), None)
            fmt = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
            out.append(f"| {r['shape']} | {r['impl']} | {r['metric']} | {r['median']:.3f} | {fmt(ms_s)} | {fmt(ms_n)} |")
        out.append("")
    out += _render_attention_backward(rows)
    tuned = [r for r in rows if r["op"] == "attention_tune" and r["impl"] in ("unmasked", "masked")]
    if tuned:  # the form the default plan does not take, timed and checked bit for bit beside it
        out += ["## Attention: the other masking form, timed beside the plan's (`--tune`; the tables above are the "
                "form the plan took when the rows were measured: full key blocks with or without masks)", "",
                "| shape | impl | metric | value |", "|---|---|---|---|"]
        out += [f"| {r['shape']} | {r['impl']} | {r['metric']} | {r['median']:.3f} |" for r in tuned]
        out.append("")
    regs = [r for r in rows if r["shape"] == "last compiled"]
    if regs:
        out += ["## Compiled kernels (last launch of each kind)", "", "| op | kernel | metric | value |", "|---|---|---|---|"]
        out += [f"| {r['op']} | {r['impl']} | {r['metric']} | {r['median']:.0f} |" for r in regs]
        out.append("")
    return "\n".join(out)


def start_native_peer(out: Path, parts) -> NativePeer | None:
    """A native peer (rlkit.bench.native_peer) at torch's cuBLAS defaults, for the GEMM and logprob parts,
    where this process runs cuBLAS without a workspace for the strict route. None where this process is at
    the defaults already (the native control is timed here), no part needs it, or it failed to start (said
    so: the ratios then use this process's cuBLAS, and the rows' at_torch_defaults says which)."""
    from rlkit.kernels import gemm_cublas

    if not any(p in ("gemm", "logprob") for p in parts) or gemm_cublas.environment_problem() is not None:
        return None
    try:
        return NativePeer([sys.executable, "-m", "rlkit.bench.kernels", "--peer"], environment_at_defaults(),
                          out / "native_peer.log")
    except (PeerError, OSError) as e:
        print(f"bench: no native peer at torch's defaults ({e}); ratios use this process's cuBLAS (no workspace)",
              flush=True)
        return None


def _peer_ms(peer: NativePeer, op: str, **shape) -> float:
    return float(peer.ask(dict(op=op, **shape))["ms"])


_PEER_OPERANDS: dict = {}
"""The peer's operands of the last shape asked for (op, M, K, N) -> tensors: rounds ask one shape in turn."""


def _peer_request(request: dict) -> dict:
    """The peer's answer to one timing request: the native call on the operands and seeds bench_gemm /
    bench_logprob use, timed as they time theirs."""
    op, m, k, n = request["op"], int(request["m"]), int(request["k"]), int(request["n"])
    key = (op, m, k, n)
    if key not in _PEER_OPERANDS:
        _PEER_OPERANDS.clear()
        if op == "gemm":
            _PEER_OPERANDS[key] = (_randn(m, k, seed=2), cold_weights(_randn(n, k, scale=0.02, seed=1)), None)
        elif op == "logprob":
            _PEER_OPERANDS[key] = (_randn(m, k, seed=10), _randn(n, k, scale=0.02, seed=9),
                                   torch.randint(0, n, (m,), device="cuda"))
        else:
            raise ValueError(f"unknown op {op!r} (gemm or logprob)")
    x, w, ids = _PEER_OPERANDS[key]
    if op == "gemm":  # weights is a rotation (cold_weights); warm: the first replayed from the L2
        if request.get("warm"):
            return {"ms": _graph_ms(lambda: F.linear(x, w[0]))}
        return {"ms": cold_graph_ms(lambda wi: F.linear(x, wi), w)}
    return {"ms": _bench(lambda: native_logprob(x, w, ids), 40)}


def _serve_peer() -> int:
    from rlkit.kernels import gemm_cublas

    if not torch.cuda.is_available():
        print("rlkit bench kernels --peer needs a CUDA device", file=sys.stderr)
        return 2
    return serve(_peer_request, ready=dict(device=torch.cuda.get_device_name(), pid=os.getpid(),
                                           at_torch_defaults=gemm_cublas.environment_problem() is not None))


def run(out_dir: str | Path, quick: bool = False, tune: bool = False, parts=("gemm", "attention", "logprob",
        "rowwise", "engine"), gemm_layers=None, gemm_ms=None) -> list[dict]:
    """Run the benchmarks, write bench.jsonl / bench.csv / BENCHMARKS.md under out_dir, return the rows.
    `gemm_layers` / `gemm_ms`: only those projections (qkv, o, gate_up, down, lm_head) / token counts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(torch.cuda.get_device_name(), commit())
    started = time.time()
    peer = start_native_peer(out, parts)
    steps = {
        "gemm": lambda: bench_gemm(rec, ms=gemm_ms or ((1, 64, 1024) if quick else GEMM_M), tune=tune,
                                   layers=gemm_layers, peer=peer),
        "attention": lambda: bench_attention(rec, seqlens=PREFILL_S[:1] if quick else PREFILL_S, tune=tune),
        "logprob": lambda: bench_logprob(rec, ms=(1, 1024) if quick else LOGPROB_M, peer=peer),
        "attention_backward": lambda: bench_attention_backward(rec),
        "rowwise": lambda: bench_rowwise(rec),
        "engine": lambda: bench_engine_steps(rec, steps=ENGINE_STEPS[:1] if quick else ENGINE_STEPS),
    }
    try:
        for part in parts:
            t0 = time.time()
            try:
                steps[part]()
            except Exception as exc:  # noqa: BLE001 - one broken part must not lose the others' rows
                rec.add(part, "error", repr(exc)[:200], "failed", 1.0)
                print(f"bench {part} failed: {exc!r}", flush=True)
            print(f"bench {part}: {time.time() - t0:.1f} s", flush=True)
            write_rows(rec.rows, out)
    finally:
        if peer is not None:
            peer.close()
    (out / "BENCHMARKS.md").write_text(render(rec.rows))
    print(f"benchmarks: {len(rec.rows)} rows in {time.time() - started:.0f} s", flush=True)
    return rec.rows


def main(argv: list[str] | None = None) -> int:
    from rlkit.cli_args import Parser

    ap = Parser(prog="rlkit bench kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out", help="folder for bench.jsonl, bench.csv, BENCHMARKS.md")
    ap.add_argument("--quick", action="store_true", help="a few sizes only")
    ap.add_argument("--tune", action="store_true", help="also time candidate GEMM launch configurations")
    ap.add_argument("--parts", default="gemm,attention,logprob,rowwise,engine")
    ap.add_argument("--peer", action="store_true",
                    help="serve native timings on stdin/stdout (the native peer a run starts at torch's defaults)")
    ap.add_argument("--gemm-layers", default=None, metavar="L1,L2",
                    help=f"GEMM part: only these projections ({','.join(GEMM_LAYERS)}); default all")
    ap.add_argument("--gemm-m", default=None, metavar="M1,M2",
                    help=f"GEMM part: only these token counts; default {','.join(map(str, GEMM_M))}")
    ap.add_argument("--markdown", default=None, help="also copy the rendered tables to this path")
    ap.add_argument("--render", nargs="+", metavar="ROWS.jsonl",
                    help="no GPU: render --markdown from these row files (committed runs, .jsonl or .jsonl.gz), in order")
    a = ap.parse_args(argv)
    gemm_layers = gemm_ms = None
    if a.gemm_layers:
        gemm_layers = tuple(a.gemm_layers.split(","))
        unknown = sorted(set(gemm_layers) - set(GEMM_LAYERS))
        if unknown:
            ap.error(f"--gemm-layers: unknown projection(s) {', '.join(unknown)}; choose from {', '.join(GEMM_LAYERS)}")
    if a.gemm_m:
        try:
            gemm_ms = tuple(int(v) for v in a.gemm_m.split(","))
        except ValueError:
            gemm_ms = ()
        if not gemm_ms or min(gemm_ms) < 1:
            ap.error(f"--gemm-m: expected positive integers separated by commas, got {a.gemm_m!r}")
    if a.render:
        try:
            rows = read_rows([Path(f) for f in a.render])
            rows = [r for r in rows if r["op"] != "gemm" or not r["metric"].startswith(("plan", "same_bits"))]
            text = render(rows)
        except RowsError as exc:
            print(f"rlkit bench kernels --render: {exc}", file=sys.stderr)
            return 2
        if a.markdown:
            from rlkit.bench.compile_targets import keep_compile_report

            md = Path(a.markdown)
            text = keep_compile_report(md.read_text() if md.exists() else "", text)
            md.write_text(text)
        else:
            print(text)
        return 0
    if a.peer:
        return _serve_peer()
    if not torch.cuda.is_available():
        print("rlkit bench kernels needs a CUDA device")
        return 2
    rows = run(a.out, quick=a.quick, tune=a.tune, parts=tuple(a.parts.split(",")), gemm_layers=gemm_layers,
               gemm_ms=gemm_ms)
    if a.markdown:  # the compile report (rlkit.bench.compile_targets) in the same file stays
        from rlkit.bench.compile_targets import keep_compile_report

        md = Path(a.markdown)
        md.write_text(keep_compile_report(md.read_text() if md.exists() else "", render(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
