"""Every launch the strict Triton kernels can make, as compile requests for a GPU that is not here.

The compile check (rlkit/bench/compile_targets.py) compiles each request for MI300X (gfx942) and H200
(sm_90) on the CPU. The requests are not a hand-kept list of tiles: for representative shapes of every
Qwen3 preset (rlkit/model/config.py MODEL_PRESETS: each layer's GEMM at decode and prefill token counts,
attention in its prefill, chunked-prefill and paged-decode modes, the logprob, row-wise and top-p
kernels) the kernels' own plan functions are asked, under `assume_gpu(target)`, which launch they would
make on that target (`gemm.plan`, `attention.attention_plan`, `rms_norm._tile`, ...), and the request
carries the constexprs and launch options the launcher derives from that plan and the contract.

Adding a kernel: a GEMM plan kind is turned into its kernel call by one entry in `GEMM_KINDS` (an
unknown kind fails the check, naming it); a new `*_kernel` in kernels/ that no request compiles fails
the check too (`uncovered_kernels`). Launch overrides the benchmarks time (`rlkit.bench.gemm_candidates
.TUNE_CONFIGS`) add one request for each GEMM kind that `gemm.plan` itself never picks (so the stash
kernel is compiled on every target), marked `chosen=False`.

Tensors are `triton.runtime.jit.MockTensor`s (16-byte aligned, as the caching allocator's are); integer
arguments are the shape's real values, so Triton specializes them as a launch would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rlkit.contract import V1_NAME, V2_NAME, V3_NAME, V4_NAME, V5_NAME, V6_NAME, NumericsContract
from rlkit.kernels import _triton as _tr
from rlkit.kernels import attention, attention_kernel, gemm, gemm_kernels, logprob, rms_norm, rope, swiglu
from rlkit.model.config import MODEL_PRESETS, Qwen3Config
from rlkit.types import AttentionLayout

KERNEL_MODULES = {"gemm": gemm_kernels, "attention": attention, "logprob": logprob, "rms_norm": rms_norm,
                  "rope": rope, "swiglu": swiglu}
"""op -> the kernels/ module holding its Triton kernels (collectives and tree have none: torch only; the
GEMM's device code is kernels/gemm_kernels.py, its launcher kernels/gemm.py)."""

CONTRACTS = (V6_NAME, V5_NAME, V4_NAME, V3_NAME, V2_NAME, V1_NAME)
"""Released contracts whose strict kernels are compiled (identical requests are compiled once)."""

GEMM_TOKENS = tuple(2 ** i for i in range(14))
"""Token counts a GEMM is planned for: 1 (one decode row) to 8192 (a prefill batch), powers of two, so
every M threshold of `gemm.plan` (16, 64) is met on both sides."""
ATTENTION_CONTEXTS = (256, 4096)
"""Context lengths for attention (plus each preset's max_position_embeddings): one split, a typical
prompt, the longest context (the deepest split-tree stack the kernel unrolls)."""
DECODE_BATCHES = (1, 64)
"""Paged-decode batch sizes: 1 (the split-parallel launch: too few programs to fill the GPU) and 64."""
PAGE_SIZE = 16
"""The embedded engine's KV page size (rlkit/rollout/engine.py EngineConfig.page_size)."""

_DEVICE = torch.device("cuda", 0)
"""The device the plan functions are told about; under `assume_gpu` no driver is asked."""


@dataclass(frozen=True)
class KernelCall:
    """One compile request: a kernel, the arguments a launch would pass it, and where the plan came from."""

    op: str
    """The op (kernels/<op>.py)."""
    fn: object
    """The @jit kernel."""
    args: tuple
    """Positional arguments as the launcher passes them (MockTensor for tensors)."""
    kwargs: dict
    """Constexprs and launch options (num_warps, num_stages, enable_fp_fusion) as the launcher passes them."""
    plan: str
    """The plan's name: the launcher's role (swapped, tiles, fused, split, ...) and its constexprs."""
    source: str
    """The first shape that chose this plan, e.g. "qwen3-8b q_proj M=1 (gemm.plan)"."""
    chosen: bool = True
    """True: a plan function chose it; False: a launch override only the benchmarks use."""

    @property
    def kernel(self) -> str:
        return self.fn.__name__

    def key(self) -> tuple:
        """Identical requests (same kernel, constexprs, options, pointer dtypes) compile once, whichever op
        asked first (a second compile would hit Triton's cache, and ptxas would not report again)."""
        dtypes = tuple(str(getattr(a, "base", a).dtype) for a in self.args if hasattr(getattr(a, "base", a), "dtype"))
        return (self.kernel, dtypes, tuple(sorted((k, repr(v)) for k, v in self.kwargs.items())))


def _t(dtype: torch.dtype):
    from triton.runtime.jit import MockTensor

    return MockTensor(dtype)


def _label(role: str, kwargs: dict) -> str:
    """e.g. "tiles C=4 SPLIT=1 BM=128 BN=256 BK=64 GROUP_M=8 EVEN_K=1 IEEE=0 w8 s3"."""
    parts = [role]
    for k, v in kwargs.items():
        if k in ("num_warps", "num_stages", "enable_fp_fusion"):
            continue
        parts.append(f"{k}={int(v) if isinstance(v, bool) else v}")
    parts.append(f"w{kwargs.get('num_warps', 4)}")
    if "num_stages" in kwargs:
        parts.append(f"s{kwargs['num_stages']}")
    return " ".join(parts)


# -- GEMM: plan kind -> kernel call (one entry a kind) ----------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    """K of this launch (a row-parallel shard's K/tp)."""
    chunks: int
    """K chunks of this launch: gemm.k_chunks / shards."""
    x_dtype: torch.dtype
    out_dtype: torch.dtype


def _gemm_common(s: GemmShape, contract: NumericsContract) -> dict:
    """The constexprs every GEMM launcher derives from the contract and the shape (gemm.triton_launch)."""
    kc = s.k // s.chunks
    return dict(C=s.chunks, BK=contract.gemm.k_tile, EVEN_K=kc % contract.gemm.k_tile == 0,
                IEEE=s.x_dtype == torch.float32, FOLD=contract.gemm.chunk_merge == "sequential")


def _gemm_swapped(cfg: dict, s: GemmShape, contract: NumericsContract):
    c = _gemm_common(s, contract)
    kc = s.k // s.chunks
    step = gemm._chunk_step(cfg, c["BK"], kc)  # as gemm._launch
    args = (_t(s.x_dtype), _t(s.x_dtype), _t(s.out_dtype), _t(torch.float32), _t(torch.int32),
            s.m, s.n, kc, s.k, s.k, s.n)
    kw = dict(C=c["C"], BN=cfg["BN"], BT=cfg["BT"], BK=step, EVEN_K=kc % step == 0, IEEE=c["IEEE"],
              FOLD=c["FOLD"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_tr.launch_options(contract))
    return [("swapped", gemm._gemm_swapped_kernel, args, kw)]


def _gemm_tiles(cfg: dict, s: GemmShape, contract: NumericsContract):
    c = _gemm_common(s, contract)
    kc = s.k // s.chunks
    step = gemm._chunk_step(cfg, c["BK"], kc)  # as gemm._launch
    args = (_t(s.x_dtype), _t(s.x_dtype), _t(s.out_dtype), _t(torch.float32), _t(torch.int32),
            s.m, s.n, kc, s.k, s.k, s.n)
    kw = dict(C=c["C"], SPLIT=bool(cfg["split"]) and s.chunks > 1, BM=cfg["BM"], BN=cfg["BN"], BK=step,
              GROUP_M=cfg["GROUP_M"], EVEN_K=kc % step == 0, IEEE=c["IEEE"], FOLD=c["FOLD"], num_warps=cfg["num_warps"],
              num_stages=cfg["num_stages"], **_tr.launch_options(contract))
    return [("tiles", gemm._gemm_tiles_kernel, args, kw)]


def _desc(dtype: torch.dtype, rows: int, cols: int, block: list[int]):
    """A host TMA descriptor over a MockTensor [rows, cols] (row-major), as gemm._descriptor builds it."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(_t(dtype), [rows, cols], [cols, 1], block)


def _gemm_tma(cfg: dict, s: GemmShape, contract: NumericsContract):
    c = _gemm_common(s, contract)
    bm, bn, bk = cfg["BM"], cfg["BN"], c["BK"]
    split = bool(cfg["split"]) and s.chunks > 1
    args = (_desc(s.x_dtype, max(s.m, bm), s.k, [bm, bk]), _desc(s.x_dtype, s.n, s.k, [bn, bk]),
            _t(s.out_dtype), _t(torch.float32), _t(torch.int32 if split else torch.float32),
            s.m, s.n, s.k // s.chunks, s.n, 132)
    stash = 0 if split or s.chunks == 1 else cfg.get("stash", 0)
    if cfg.get("flat") and not split:
        args = (args[0], args[1], _desc(s.out_dtype, s.m, s.n, [bm, bn]), args[3], s.m, s.n, s.k // s.chunks, 132)
        kw = dict(C=c["C"], STASH=stash, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"],
                  WARP_SPECIALIZE=bool(cfg.get("warp_specialize")), FOLD=c["FOLD"], num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"], **_tr.launch_options(contract))
        return [("tma_flat", gemm._gemm_tma_flat_kernel, args, kw)]
    kw = dict(C=c["C"], SPLIT=split, STASH=stash, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"], FOLD=c["FOLD"],
              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_tr.launch_options(contract))
    return [("tma", gemm._gemm_tma_kernel, args, kw)]


def _gemm_gluon(cfg: dict, s: GemmShape, contract: NumericsContract):
    """The row-parallel ordered merge as kernels/gemm_gluon.py launches it (sm_90 only: gemm.plan never
    picks it elsewhere, so the kernel is not in KERNEL_MODULES' every-target coverage rule)."""
    from rlkit.kernels import gemm_gluon

    bm, bn, bk = cfg["BM"], cfg["BN"], gemm._k_step(cfg, contract.gemm.k_tile)
    descs = gemm_gluon.tile_descriptors(*((_t(dtype), [rows, cols], [cols, 1]) for dtype, rows, cols in (
        (s.x_dtype, s.m, s.k), (s.x_dtype, s.n, s.k), (s.out_dtype, s.m, s.n))), bm, bn, bk)
    kernel, args, kw = gemm_gluon.kernel_call(cfg, descs, s.m, s.n, 132 * cfg.get("programs_per_sm", 1), s.chunks,
                                              s.k // s.chunks, bk, _tr.launch_options(contract))
    return [("gluon", kernel, args, kw)]


def _gemm_continue(s: GemmShape, contract: NumericsContract):
    """The chained merge's TP continuation, as gemm.continue_launch launches it."""
    cfg = gemm.continue_plan(s.m, s.n, _DEVICE)
    bk = contract.gemm.k_tile
    args = (_t(s.x_dtype), _t(s.x_dtype), _t(torch.float32), _t(s.out_dtype), s.m, s.n, s.k, s.k, s.k, s.n)
    kw = dict(BN=cfg["BN"], BT=cfg["BT"], BK=bk, EVEN_K=s.k % bk == 0, IEEE=s.x_dtype == torch.float32,
              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_tr.launch_options(contract))
    return [("continue", gemm._gemm_continue_kernel, args, kw)]


GEMM_KINDS: dict[str, Callable] = {"swapped": _gemm_swapped, "tiles": _gemm_tiles, "tma": _gemm_tma,
                                   "gluon": _gemm_gluon}
"""gemm.plan's `kind` -> (plan, shape, contract) -> [(role, kernel, args, kwargs)], as gemm.triton_launch
launches it. A new kind needs one entry here."""


class UnknownPlan(LookupError):
    """A plan function returned a kind this module cannot turn into a kernel call."""


def _gemm_requests(cfg: dict, s: GemmShape, contract: NumericsContract):
    if cfg["kind"] not in GEMM_KINDS:
        raise UnknownPlan(f"gemm.plan chose kind {cfg['kind']!r} (M={s.m}, N={s.n}), which "
                          f"rlkit/bench/compile_plans.py GEMM_KINDS does not know; add its kernel call there")
    return GEMM_KINDS[cfg["kind"]](cfg, s, contract)


def gemm_layers(cfg: Qwen3Config, contract: NumericsContract) -> list[tuple[str, int, int, int]]:
    """(layer, N, K, shards, chunks) of one Qwen3 block's GEMMs (k/v and gate/up share a shape), each with
    its K chunk count (gemm.chunk_count: column-parallel or row-parallel); the row-parallel o/down
    projections also as TP shards (2, 4), whose K subtree has C = k_chunks / shards chunks."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    column = gemm.chunk_count(contract, row_parallel=False)
    row = gemm.chunk_count(contract, row_parallel=True)
    layers = [("q_proj", heads * d, h, 1, column), ("k_proj", kv * d, h, 1, column), ("gate_proj", i, h, 1, column)]
    for shards in (1, 2, 4):
        if row % shards == 0 and row // shards in gemm.TREE_CHUNKS:
            if gemm.chained(contract, True):  # chained merge: one chain over the shard's K
                layers += [("o_proj", h, heads * d // shards, shards, 1), ("down_proj", h, i // shards, shards, 1)]
                continue
            if gemm.pieces_per_shard(contract, shards) > 1:  # sequential merge: a chain a chunk
                layers += [("o_proj", h, heads * d // row, shards, 1), ("down_proj", h, i // row, shards, 1)]
                continue
            layers += [("o_proj", h, heads * d // shards, shards, row // shards),
                       ("down_proj", h, i // shards, shards, row // shards)]
    return layers


# -- enumeration --------------------------------------------------------------------------------------
class _Collector:
    def __init__(self, ops=None):
        self.calls: dict[tuple, KernelCall] = {}
        self.ops = set(ops) if ops else None

    def add(self, op: str, requests, source: str, chosen: bool = True) -> None:
        if self.ops is not None and op not in self.ops:
            return
        for role, fn, args, kwargs in requests:
            call = KernelCall(op, fn, args, kwargs, _label(role, kwargs), source, chosen)
            old = self.calls.get(call.key())
            if old is None or (chosen and not old.chosen):
                self.calls[call.key()] = call


def _plan(s: GemmShape, contract: NumericsContract, override: dict | None = None) -> dict:
    """gemm.plan for this launch, with the arguments gemm.triton_launch passes it."""
    return gemm.plan(s.m, s.n, _DEVICE, override, chunks=s.chunks, k_chunk=s.k // s.chunks,
                     bk=contract.gemm.k_tile, dtype=s.x_dtype, merge=contract.gemm.chunk_merge)


def _gemm(col: _Collector, cfg: Qwen3Config, contract: NumericsContract, dtype: torch.dtype) -> None:
    for layer, n, k, shards, chunks in gemm_layers(cfg, contract):
        out = torch.float32 if shards > 1 else dtype
        for m in GEMM_TOKENS:
            shape = GemmShape(m, n, k, chunks, dtype, out)
            col.add("gemm", _gemm_requests(_plan(shape, contract), shape, contract),
                    f"{cfg.name} {layer}{f' tp{shards}' if shards > 1 else ''} M={m} (gemm.plan)")
            if shards > 1 and gemm.chained(contract, True):  # the ranks after the first continue the chain
                col.add("gemm", _gemm_continue(shape, contract),
                        f"{cfg.name} {layer} tp{shards} M={m} (gemm.continue_plan)")
    # lm_head: fp32 logits, at most logprob.GPU_ROW_BLOCK rows a launch (logprob.triton_logprob)
    chunks = gemm.chunk_count(contract, row_parallel=False)
    for m in sorted({min(t, logprob.GPU_ROW_BLOCK) for t in GEMM_TOKENS}):
        shape = GemmShape(m, cfg.vocab_size, cfg.hidden_size, chunks, dtype, torch.float32)
        col.add("logprob", _gemm_requests(_plan(shape, contract), shape, contract),
                f"{cfg.name} lm_head M={m} (gemm.plan)")


def _gemm_overrides(col: _Collector, cfg: Qwen3Config, contract: NumericsContract, dtype: torch.dtype) -> None:
    """The benchmark overrides (TUNE_CONFIGS, NARROW_ONE_CHAIN) that reach a GEMM kernel variant gemm.plan
    never chose (another kernel, tiles without the split, another K step), at the q_proj shape: one each,
    at 4096 tokens in the contract's K chunks (the narrow launches one chain at their own largest M)."""
    from rlkit.bench.gemm_candidates import NARROW_ONE_CHAIN, TUNE_CONFIGS

    def variants(requests):
        return {(fn.__name__, kw.get("SPLIT"), kw.get("BK")) for _, fn, _, kw in requests}

    seen = {(c.kernel, c.kwargs.get("SPLIT"), c.kwargs.get("BK")) for c in col.calls.values() if c.op == "gemm"}
    overrides = ([(4096, contract.gemm.k_chunks, c) for configs in TUNE_CONFIGS.values() for c in configs]
                 + [(m, 1, c) for m, c in NARROW_ONE_CHAIN])  # the narrow launches: one chain, as timed
    for m, chunks, over in overrides:
        shape = GemmShape(m, cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, chunks, dtype, dtype)
        requests = _gemm_requests(_plan(shape, contract, over), shape, contract)
        if variants(requests) <= seen:
            continue
        seen |= variants(requests)
        col.add("gemm", requests, f"{cfg.name} q_proj M={shape.m} (override: rlkit.bench.gemm_candidates)",
                chosen=False)


def _attention(col: _Collector, cfg: Qwen3Config, contract: NumericsContract, dtype: torch.dtype) -> None:
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    contexts = sorted(set(ATTENTION_CONTEXTS) | {cfg.max_position_embeddings})
    for ctx in contexts:
        pages = -(-ctx // PAGE_SIZE)
        k_packed = torch.empty(ctx, kv, d, dtype=dtype, device="meta")
        k_paged = torch.empty(pages * max(DECODE_BATCHES), PAGE_SIZE, kv, d, dtype=dtype, device="meta")
        cases = [("prefill", (ctx, heads, d), k_packed,
                  AttentionLayout.prefill(torch.tensor([0, ctx])))]
        # chunked prefill: the last 512 queries of the context, keys in the paged cache
        chunk = min(512, ctx)
        table = torch.arange(pages, dtype=torch.int32)[None, :]
        cases.append(("chunked prefill", (chunk, heads, d), k_paged,
                      AttentionLayout.paged(torch.tensor([chunk]), torch.tensor([ctx]), table)))
        for batch in DECODE_BATCHES:
            tables = torch.arange(pages * batch, dtype=torch.int32).view(batch, pages)
            layout = AttentionLayout.paged_decode(torch.full((batch,), ctx), tables)
            cases.append((f"decode B={batch}", (batch, heads, d), k_paged, layout))
        for name, q_shape, k, layout in cases:
            plan = attention.attention_plan(q_shape, k, layout, contract)  # the plan function picks the mode
            if plan["nslots"] > attention.MAX_SLOTS:
                continue  # the launcher runs the reference for it
            col.add("attention", _attention_requests(plan, q_shape, k, contract, dtype),
                    f"{cfg.name} {name} ctx={ctx} (attention.attention_plan: {plan['mode']})")


def _attention_requests(plan: dict, q_shape, k, contract: NumericsContract, dtype: torch.dtype):
    """The kernel calls attention.launch makes for `plan`."""
    t, heads, d = q_shape
    page, stride_kt, stride_ks, stride_kh, stride_bt = plan["k_strides"]
    common = dict(attention.kernel_meta(plan, contract, dtype), STORE_LSE=False)
    i32, f32 = _t(torch.int32), _t(torch.float32)
    tensors = (_t(dtype), _t(dtype), _t(dtype), _t(dtype), f32, f32, f32)
    args = tensors + (i32,) * 7 + (heads * d, d, stride_kt, stride_ks, stride_kh, stride_bt, 0, 0, page, heads,
                                   plan["max_splits"], float(d ** -0.5))
    if plan["mode"] == "fused":
        requests = [("fused", attention_kernel._attn_kernel, args, dict(common, MODE=0))]
        if not plan["paged"]:  # a trainer's forward also leaves the log-sum-exp for flash's backward
            with_lse = args[:20] + (1, t) + args[22:]
            requests.append(("fused with log-sum-exp", attention_kernel._attn_kernel, with_lse,
                             dict(common, MODE=0, STORE_LSE=True)))
        return requests
    return [("split", attention_kernel._attn_kernel, args, dict(common, MODE=1)),
            ("merge", attention_kernel._attn_kernel, args, dict(common, MODE=2))]


def _rowwise(col: _Collector, cfg: Qwen3Config, contract: NumericsContract, dtype: torch.dtype) -> None:
    opts = _tr.launch_options(contract)
    t = _t(dtype)
    tokens = 4096
    for h, residual, where in ((cfg.hidden_size, True, "layernorm + residual"),
                               (cfg.hidden_size, False, "first layernorm"), (cfg.head_dim, False, "q/k norm")):
        rows, block_h, warps = rms_norm._tile(h)
        kw = dict(HAS_RES=residual, W_FP32=contract.rms_norm.weight_multiply == "float32", ROWS=rows,
                  BLOCK_H=block_h, num_warps=warps, **opts)
        col.add("rms_norm", [("rows", rms_norm._rms_norm_kernel, (t, t, t, t, t, tokens, h, cfg.rms_norm_eps), kw)],
                f"{cfg.name} {where} H={h} (rms_norm._tile)")
    for heads, which in ((cfg.num_attention_heads, "q"), (cfg.num_key_value_heads, "k")):
        d = cfg.head_dim
        kw = dict(D=d, BH=_tr.next_pow2(heads), num_warps=4, **opts)
        col.add("rope", [("tokens", rope._rope_kernel,
                          (t, _t(torch.int64), _t(torch.float32), _t(torch.float32), t, heads, heads * d, d), kw)],
                f"{cfg.name} rope {which} heads={heads} D={d} (rope.triton_rope)")
    n = tokens * cfg.intermediate_size
    col.add("swiglu", [("elementwise", swiglu._swiglu_kernel, (t, t, t, n),
                        dict(BLOCK=swiglu.BLOCK, num_warps=4, **opts))],
            f"{cfg.name} swiglu {tokens}x{cfg.intermediate_size} (swiglu.BLOCK)")
    vocab, vc = cfg.vocab_size, contract.logprob.vocab_chunk
    if vc & (vc - 1) == 0 and vc <= 65536:  # logprob._gpu_ok
        nc = _tr.next_pow2(_tr.cdiv(vocab, vc))
        f32 = _t(torch.float32)
        meta = dict(VC=vc, NC=nc, LOG_NC=nc.bit_length() - 1, num_warps=8, **opts)
        args = (f32, _t(torch.int64), f32, f32, vocab, vocab)
        col.add("logprob", [("rows", logprob._logprob_rows_kernel, args, dict(meta, MODE=0))],
                f"{cfg.name} logprob V={vocab} (logprob.triton_from_logits)")
        col.add("logprob", [("chunk states", logprob._logprob_rows_kernel, args, dict(meta, MODE=1)),
                            ("merge", logprob._logprob_rows_kernel, args, dict(meta, MODE=2))],
                f"{cfg.name} logprob V={vocab} (logprob.triton_from_logits, chunk-parallel form)",
                chosen=logprob.PARALLEL_CHUNKS)
        col.add("logprob", [("top-p scan", logprob._row_cumsum_kernel, (f32, f32, vocab, vocab),
                             dict(BLOCK=contract.logprob.top_p_scan_block, num_warps=4, **opts))],
                f"{cfg.name} top-p scan V={vocab} (logprob.triton_row_cumsum)")


def _native_rowwise(col: _Collector, cfg: Qwen3Config, dtype: torch.dtype) -> None:
    """The native control's fused kernels as their launchers call them (no contract: default launch
    options, the strict kernels' `rms_norm._tile`, one program per token for RoPE, swiglu.BLOCK)."""
    t, tokens = _t(dtype), 4096
    for h, residual, where in ((cfg.hidden_size, True, "layernorm + residual"),
                               (cfg.hidden_size, False, "first layernorm"), (cfg.head_dim, False, "q/k norm")):
        rows, block_h, warps = rms_norm._tile(h)
        col.add("rms_norm", [("native rows", rms_norm._native_rms_norm_kernel,
                              (t, t, t, t, t, tokens, h, 1.0 / h, cfg.rms_norm_eps),
                              dict(HAS_RES=residual, ROWS=rows, BLOCK_H=block_h, num_warps=warps))],
                f"{cfg.name} native {where} H={h} (rms_norm.triton_native_rms_norm)")
    for heads, which in ((cfg.num_attention_heads, "q"), (cfg.num_key_value_heads, "k")):
        d = cfg.head_dim
        col.add("rope", [("native tokens", rope._native_rope_kernel,
                          (t, _t(torch.int64), t, t, t, heads, heads * d, d),
                          dict(D=d, BH=_tr.next_pow2(heads), num_warps=4))],
                f"{cfg.name} native rope {which} heads={heads} D={d} (rope.triton_native_rope)")
    col.add("swiglu", [("native elementwise", swiglu._native_swiglu_kernel,
                        (t, t, t, tokens * cfg.intermediate_size), dict(BLOCK=swiglu.BLOCK, num_warps=4))],
            f"{cfg.name} native swiglu {tokens}x{cfg.intermediate_size} (swiglu.triton_native_swiglu)")


def _backward_rowwise(col: _Collector, cfg: Qwen3Config, dtype: torch.dtype) -> None:
    """The backward both paths share (no contract: default launch options) as its launchers call it: the
    fused RMSNorm backward (`rms_norm._tile`, at most BACKWARD_PROGRAMS programs), the native RoPE kernel
    rotating back, the SwiGLU backward (swiglu.BLOCK)."""
    t, tokens, f32 = _t(dtype), 4096, _t(torch.float32)
    for h, residual, where in ((cfg.hidden_size, True, "layernorm + residual"),
                               (cfg.hidden_size, False, "first layernorm"), (cfg.head_dim, False, "q/k norm")):
        rows, block_h, warps = rms_norm._tile(h)
        tiles = -(-tokens // rows)
        col.add("rms_norm", [("backward rows", rms_norm._rms_norm_backward_kernel,
                              (t, t, t, t, t, t, f32, tokens, h, tiles, cfg.rms_norm_eps),
                              dict(HAS_RES=residual, HAS_GS=residual, ROWS=rows, BLOCK_H=block_h, num_warps=warps))],
                f"{cfg.name} backward {where} H={h} (rms_norm.triton_backward)")
    for heads, which in ((cfg.num_attention_heads, "q"), (cfg.num_key_value_heads, "k")):
        d = cfg.head_dim
        col.add("rope", [("inverse tokens", rope._native_rope_kernel,
                          (t, _t(torch.int64), t, t, t, heads, heads * d, d),
                          dict(D=d, BH=_tr.next_pow2(heads), INVERSE=True, num_warps=4))],
                f"{cfg.name} backward rope {which} heads={heads} D={d} (rope.backward)")
    col.add("swiglu", [("backward elementwise", swiglu._swiglu_backward_kernel,
                        (t, t, t, t, t, tokens * cfg.intermediate_size), dict(BLOCK=swiglu.BLOCK, num_warps=4))],
            f"{cfg.name} backward swiglu {tokens}x{cfg.intermediate_size} (swiglu.triton_backward)")


def kernel_calls(traits: _tr.GpuTraits, presets=None, ops=None, contracts=CONTRACTS) -> list[KernelCall]:
    """Every distinct launch the plan functions choose on a GPU with `traits`, for the Qwen3 presets (all
    by default) under the released contracts, plus the benchmark-only GEMM kinds; one request each.
    `ops`: only these ops' requests (KERNEL_MODULES' names; the lm_head GEMM counts as logprob)."""
    col = _Collector(ops)
    with _tr.assume_gpu(traits):
        for name in contracts:
            contract = NumericsContract.named(name)
            for preset in presets or MODEL_PRESETS:
                cfg = MODEL_PRESETS[preset]()
                dtype = cfg.torch_dtype
                _gemm(col, cfg, contract, dtype)
                _attention(col, cfg, contract, dtype)
                _rowwise(col, cfg, contract, dtype)
                _native_rowwise(col, cfg, dtype)
                _backward_rowwise(col, cfg, dtype)
            first = MODEL_PRESETS[presets[0] if presets else "qwen3-8b"]()
            _gemm_overrides(col, first, contract, first.torch_dtype)
            _gemm_measured(col, traits, contract)
    return list(col.calls.values())


def _gemm_measured(col: _Collector, traits: _tr.GpuTraits, contract: NumericsContract) -> None:
    """The launches the measured tables of GPU models of this arch hold (kernels/gemm_tuned.py), at each
    entry's largest M, one chain: `gemm._one_chain` may take any of them on such a GPU."""
    from rlkit.kernels import gemm_tuned

    if gemm.chunk_count(contract, row_parallel=False) != 1:
        return  # the tables serve one-chain products, which this contract's layers are not
    for table in gemm_tuned.tables():
        if table.arch != traits.arch:
            continue
        for e in table.entries:
            dtype = getattr(torch, e.dtype)
            shape = GemmShape(e.rows[1], e.n, e.k, 1, dtype, dtype)
            col.add("gemm", _gemm_requests(_plan(shape, contract, e.config()), shape, contract),
                    f"{table.device} K={e.k} N={e.n} M={e.rows[0]}-{e.rows[1]} (gemm_tuned: {table.path.name})")


def launchable_kernels() -> dict[str, list[str]]:
    """op -> the names of its module's launchable kernels (the @jit functions named `*_kernel`)."""
    from triton.runtime.jit import JITFunction

    return {op: sorted(name for name, obj in vars(mod).items()
                       if isinstance(obj, JITFunction) and name.endswith("_kernel"))
            for op, mod in KERNEL_MODULES.items()}


def uncovered_kernels(calls: list[KernelCall], ops=None) -> list[str]:
    """`op.kernel` for every launchable kernel in kernels/ (of `ops`, default all) that no request compiles."""
    by_module = {mod.__name__: op for op, mod in KERNEL_MODULES.items()}
    # by the kernel's own module: the lm_head GEMM is requested under op "logprob" but lives in gemm
    compiled = {(by_module.get(c.fn.fn.__module__, c.op), c.kernel) for c in calls}
    return [f"{op}.{k}" for op, names in launchable_kernels().items() for k in names
            if (op, k) not in compiled and (not ops or op in ops)]

