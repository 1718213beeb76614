"""Strict token logprobs: lm_head GEMM + vocab-chunked log-sum-exp, raw and processed.

Contract (LogprobSpec: vocab_chunk, row_block, top_p_scan_block; GemmSpec): logits = hidden @ lm_head.T by the strict GEMM, rounded once to fp32
(never to the model dtype). The vocabulary is cut into chunks of `vocab_chunk` entries; each chunk gives
(max, sum of exp(x - max)) with the canonical pairwise tree; chunks merge by the pairwise LSE tree.
logprob(t) = logit[t] - lse.

Two semantics, both defined here and used by the rollout engine and the trainer alike:
- raw: the model's distribution, logits as they are;
- processed: the sampling distribution: logits / temperature (fp32 division), then top-k (keep logits >=
  the k-th largest), then top-p (sort descending by value, ties by token id; keep the shortest prefix whose
  exclusive cumulative probability is below top_p, so the token that crosses top_p stays), renormalized
  over what is kept. A token outside the kept set has logprob -inf.

Rows are processed `row_block` at a time, so raw logprobs never hold a [tokens x vocab] fp32 tensor.

GPU: the Triton path at the end of this file (strict GEMM to fp32 logits + a vocab-chunk LSE kernel, and
the top-p scan in blocks of `top_p_scan_block`); it covers a power-of-two vocab_chunk up to 65536, other
chunk sizes run the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlkit.contract import NumericsContract
from rlkit.kernels import gemm
from rlkit.kernels.errors import OpInputError, check_float, check_same
from rlkit.kernels.tree import pairwise_reduce, pairwise_sum_dim
from rlkit.types import SamplingParams

OP = "logprob"


class IdRangeCheck:
    """That every id lies in [0, vocab), read on the host without leaving the GPU idle: the ids' min and
    max are queued (one reduction), copied to pinned memory behind it and an event recorded; `wait`
    waits for that event only. A caller queues its kernels between the two, so while the host waits the
    stream has work: read first, the check left the GPU idle through the whole call's launch overhead
    (0.15 ms of 0.47 at M = 1 on the H200, lab/LOG.md). The kernels queued meanwhile must read no id
    out of bounds (the Triton kernels write NaN for one); a torch gather must come after `wait`."""

    def __init__(self, token_ids: torch.Tensor, vocab: int):
        self.vocab, self._event = vocab, None
        lo_hi = torch.stack(torch.aminmax(token_ids))
        if token_ids.is_cuda:
            self._host = torch.empty(2, dtype=lo_hi.dtype, pin_memory=True)
            self._host.copy_(lo_hi, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = lo_hi

    def wait(self) -> None:
        """Raise OpInputError (the ids' range in the message) if an id lies outside [0, vocab)."""
        if self._event is not None:
            self._event.synchronize()
        lo, hi = self._host.tolist()
        if lo < 0 or hi >= self.vocab:
            raise OpInputError(OP, f"token ids must lie in [0, {self.vocab}); got ids from {lo} to {hi}")


class _NoIdCheck:
    """The ids the caller vouches for (sampled from these logits), or none at all: nothing to wait for."""

    @staticmethod
    def wait() -> None:
        return None


def check_ids(token_ids: torch.Tensor, rows: int, vocab: int, device, in_range: bool = False,
              defer: bool = False) -> IdRangeCheck | _NoIdCheck:
    """Shape, dtype and device of token_ids; and, unless the caller vouches for it (`in_range`: ids it
    sampled from the logits), that each lies in [0, vocab), which reads the ids on the host (a sync).
    `defer`: the range is read later, at the returned check's `wait()` (see IdRangeCheck); else now."""
    if token_ids.dim() != 1 or token_ids.shape[0] != rows:
        raise OpInputError(OP, f"token_ids has shape {tuple(token_ids.shape)}; expected [{rows}]")
    if token_ids.dtype not in (torch.int32, torch.int64):
        raise OpInputError(OP, f"token_ids has dtype {token_ids.dtype}; expected int64")
    if token_ids.device != device:
        raise OpInputError(OP, f"token_ids is on {token_ids.device}; expected {device}")
    if not rows or in_range:
        return _NoIdCheck()
    check = IdRangeCheck(token_ids, vocab)
    if not defer:
        check.wait()
    return check


def lse(logits: torch.Tensor, contract: NumericsContract) -> torch.Tensor:
    """Strict log-sum-exp over the last dim of fp32 logits ([rows, vocab] -> [rows])."""
    chunk = contract.logprob.vocab_chunk
    states = []
    for lo in range(0, logits.shape[-1], chunk):
        x = logits[:, lo : lo + chunk]
        m = x.amax(-1)
        # a row whose chunk is all -inf (masked) has m = -inf: its sum is 0 and it merges as empty
        safe_m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        s = pairwise_sum_dim(torch.exp(x - safe_m.unsqueeze(-1)), -1)
        states.append((m, s))

    def merge(a, b):
        (ma, sa), (mb, sb) = a, b
        m = torch.maximum(ma, mb)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        wa = torch.where(torch.isinf(ma), torch.zeros_like(ma), torch.exp(ma - safe))
        wb = torch.where(torch.isinf(mb), torch.zeros_like(mb), torch.exp(mb - safe))
        return m, sa * wa + sb * wb

    m, s = pairwise_reduce(states, merge)
    return torch.where(torch.isinf(m), m, m + torch.log(s))


def process_logits(logits: torch.Tensor, params: SamplingParams, contract: NumericsContract) -> torch.Tensor:
    """Apply temperature, top-k and top-p to fp32 logits; removed entries become -inf. Only the
    distribution fields of `params` are read; the top-p scan follows `logprob.top_p_scan_block`."""
    z = logits if params.temperature == 1.0 else logits / params.temperature
    neg_inf = float("-inf")  # a Python scalar: a 0-d CUDA tensor made from the host would sync the stream
    if params.top_k and params.top_k < z.shape[-1]:
        kth = torch.topk(z, params.top_k, dim=-1).values[:, -1:]
        z = torch.where(z >= kth, z, neg_inf)
    if params.top_p < 1.0:
        order = torch.sort(z, dim=-1, descending=True, stable=True)
        sorted_z = order.values
        probs = torch.exp(sorted_z - sorted_z[:, :1])  # unnormalized, max entry = 1
        # exclusive cumulative mass, compared against top_p * total mass: an fp32 scan of each row on its
        # own (`row_cumsum`: sequential on the CPU, a fixed blocked scan on the GPU)
        cum = row_cumsum(probs, contract)
        total = cum[:, -1:]
        exclusive = cum - probs
        keep_sorted = exclusive < params.top_p * total
        keep = torch.zeros_like(keep_sorted).scatter(-1, order.indices, keep_sorted)
        z = torch.where(keep, z, neg_inf)
    return z


def _check(hidden: torch.Tensor, weight: torch.Tensor) -> None:
    check_float(OP, "hidden", hidden)
    check_float(OP, "lm_head", weight)
    check_same(OP, hidden=hidden, lm_head=weight)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise OpInputError(OP, f"hidden {tuple(hidden.shape)} and lm_head {tuple(weight.shape)}; expected "
                               f"[tokens, H] and [vocab, H]")


def logits(hidden: torch.Tensor, weight: torch.Tensor, contract: NumericsContract) -> torch.Tensor:
    """Strict fp32 logits [tokens, vocab] (the engine needs them whole to sample)."""
    _check(hidden, weight)
    return gemm.reference(hidden, weight, contract, out_dtype=torch.float32)


def from_logits(logits_fp32: torch.Tensor, token_ids: torch.Tensor, contract: NumericsContract,
                params: SamplingParams | None = None, ids_in_range: bool = False) -> torch.Tensor:
    """Strict logprobs of token_ids under raw (params None) or processed semantics. `ids_in_range`: the
    caller knows every id lies in [0, vocab) (it sampled them from these logits), so the range check, a
    device sync, is skipped."""
    ids_ok = check_ids(token_ids, logits_fp32.shape[0], logits_fp32.shape[1], logits_fp32.device, ids_in_range,
                       defer=True)
    z = logits_fp32 if params is None or params.is_identity else process_logits(logits_fp32, params, contract)
    ids_ok.wait()  # before the gather: an id out of range must not reach it
    picked = z.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    total = lse(z, contract)
    return torch.where(torch.isinf(picked), picked, picked - total)


def reference(hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor,
              contract: NumericsContract, params: SamplingParams | None = None) -> torch.Tensor:
    """Strict logprobs [tokens] (fp32), `row_block` rows at a time."""
    _check(hidden, weight)
    check_ids(token_ids, hidden.shape[0], weight.shape[0], hidden.device)
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    step = contract.logprob.row_block
    for lo in range(0, hidden.shape[0], step):
        block = logits(hidden[lo : lo + step], weight, contract)
        out[lo : lo + step] = from_logits(block, token_ids[lo : lo + step], contract, params)
    return out


def native_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What frameworks do: the lm_head GEMM in the model dtype, then upcast."""
    _check(hidden, weight)
    return F.linear(hidden, weight).float()


def native_from_logits(logits_fp32: torch.Tensor, token_ids: torch.Tensor, contract: NumericsContract,
                       params: SamplingParams | None = None, ids_in_range: bool = False) -> torch.Tensor:
    """torch.log_softmax of the (processed) logits; the sampling transform is the one definition
    (`process_logits`, so the native path samples and scores the same distribution)."""
    ids_ok = check_ids(token_ids, logits_fp32.shape[0], logits_fp32.shape[1], logits_fp32.device, ids_in_range,
                       defer=True)
    z = logits_fp32 if params is None or params.is_identity else process_logits(logits_fp32, params, contract)
    lsm = torch.log_softmax(z, dim=-1)
    ids_ok.wait()  # before the gather: an id out of range must not reach it
    return lsm.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)


NATIVE_ROW_CHUNK = 4096
"""Rows per chunk of the native logprob above this many rows (`native_chunked`): 4096 x 151,936 fp32
logits are 2.5 GB, where the whole of a 16 x 2k-token trainer batch would be 20 GB (and as much again
for log_softmax, kept for autograd)."""


def native(hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor, contract: NumericsContract,
           params: SamplingParams | None = None) -> torch.Tensor:
    """The native control's logprobs: up to NATIVE_ROW_CHUNK rows, one lm_head GEMM and torch.log_softmax
    (what the CPU tests pin); beyond, `native_chunked`, as a real trainer fuses lm_head + cross-entropy."""
    if hidden.shape[0] > NATIVE_ROW_CHUNK:
        return native_chunked(hidden, weight, token_ids, contract, params, NATIVE_ROW_CHUNK)
    return native_from_logits(native_logits(hidden, weight), token_ids, contract, params)


def _chunk_logits(hidden, weight, contract, params):
    """One chunk's fp32 logits [rows, vocab], processed by `params` (removed entries -inf)."""
    z = native_logits(hidden, weight)
    if params is not None and not params.is_identity:
        z = process_logits(z, params, contract)
    return z


class _NativeChunkedLogprob(torch.autograd.Function):
    """Forward: logprobs `chunk` rows at a time, nothing kept but the inputs. Backward: each chunk's
    logits recomputed, d logp / d z = onehot(t) - softmax(z) (zero where sampling removed an entry; / T
    through the temperature), then d hidden = gz @ W per chunk and d W = sum over chunks of gz^T @ h
    (accumulated in fp32, rounded once). Peak memory: one chunk's logits and its gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, token_ids, contract, params, chunk):
        ctx.save_for_backward(hidden, weight, token_ids)
        ctx.contract, ctx.params, ctx.chunk = contract, params, chunk
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for lo in range(0, hidden.shape[0], chunk):
            z = _chunk_logits(hidden[lo : lo + chunk], weight, contract, params)
            picked = z.gather(-1, token_ids[lo : lo + chunk].long().unsqueeze(-1)).squeeze(-1)
            out[lo : lo + chunk] = picked - torch.logsumexp(z, dim=-1)
            del z
        return out

    @staticmethod
    def backward(ctx, g):
        hidden, weight, ids = ctx.saved_tensors
        gh, gw = chunked_backward(g, hidden, weight, ids, ctx.contract, ctx.params, ctx.chunk, *ctx.needs_input_grad[:2])
        return gh, gw, None, None, None, None


def chunked_backward(g, hidden, weight, ids, contract: NumericsContract, params: SamplingParams | None, chunk: int,
                     need_hidden: bool = True, need_weight: bool = True):
    """(d hidden, d lm_head) of logprobs whose upstream gradient is g, `chunk` rows at a time: each chunk's
    logits recomputed in the model dtype, d logp / d z = onehot(t) - softmax(z) (zero where sampling
    removed an entry; / T through the temperature), d hidden = gz @ W and d W the sum over chunks of
    gz^T @ h, accumulated in fp32 (on CUDA in the product's own epilogue, as a trainer's fused weight-
    gradient accumulation does) and rounded once. Both paths' autograd run it: gradients are not compared,
    so the strict/native price of a training step is the forwards'."""
    gh = torch.empty_like(hidden) if need_hidden else None
    gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    processed = params is not None and not params.is_identity
    for lo in range(0, hidden.shape[0], chunk):
        h, gc = hidden[lo : lo + chunk], g[lo : lo + chunk].float()
        z = _chunk_logits(h, weight, contract, params)
        gz = torch.softmax(z, dim=-1).mul_(-gc[:, None])
        gz.scatter_add_(-1, ids[lo : lo + chunk, None].long(), gc[:, None])
        if processed:
            gz.masked_fill_(torch.isinf(z), 0.0)
            if params.temperature != 1.0:
                gz.div_(params.temperature)
        del z
        gz = gz.to(hidden.dtype)
        if gh is not None:
            gh[lo : lo + chunk] = gz @ weight
        if gw is not None:
            accumulate_fp32(gw, gz.t(), h)
    return gh, (gw.to(weight.dtype) if gw is not None else None)


def accumulate_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b for half operands and an fp32 acc: on CUDA one cuBLAS call with beta = 1 writing acc
    (torch >= 2.8's out_dtype: a trainer's fused fp32 weight-gradient accumulation); elsewhere, or where
    this torch lacks it, the product in the operands' dtype, widened and added."""
    if acc.is_cuda and a.dtype != acc.dtype and _fp32_out_addmm(acc.device):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += (a @ b).float()


_FP32_OUT_ADDMM: dict[str, bool] = {}


def _fp32_out_addmm(device: torch.device) -> bool:
    """Whether this torch's addmm takes out_dtype=float32 for half operands on this device and accumulates
    into its own input: checked once on a small exact case."""
    key = str(device)
    if key not in _FP32_OUT_ADDMM:
        a = torch.ones(16, 16, dtype=torch.bfloat16, device=device)
        acc = torch.full((16, 16), 2.0, device=device)
        try:
            torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
            _FP32_OUT_ADDMM[key] = bool((acc == 18.0).all())
        except (RuntimeError, TypeError, NotImplementedError):
            _FP32_OUT_ADDMM[key] = False
    return _FP32_OUT_ADDMM[key]


def native_chunked(hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor,
                   contract: NumericsContract, params: SamplingParams | None = None,
                   chunk: int = NATIVE_ROW_CHUNK) -> torch.Tensor:
    """Native logprobs `chunk` rows at a time, on every device: logit[t] - logsumexp(logits) per chunk,
    with a backward that recomputes each chunk's logits, so no [tokens x vocab] tensor is ever whole."""
    _check(hidden, weight)
    check_ids(token_ids, hidden.shape[0], weight.shape[0], hidden.device)
    if chunk < 1:
        raise OpInputError(OP, f"chunk must be a positive row count, got {chunk}")
    return _NativeChunkedLogprob.apply(hidden, weight, token_ids, contract, params, chunk)


def log_softmax(logits_fp32: torch.Tensor, contract: NumericsContract) -> torch.Tensor:
    """Strict log-probabilities of every entry, [rows, vocab]: logits - lse (the contract's tree)."""
    if logits_fp32.dim() != 2 or logits_fp32.dtype != torch.float32:
        raise OpInputError(OP, f"logits {tuple(logits_fp32.shape)} {logits_fp32.dtype}; expected fp32 [rows, vocab]")
    total = lse(logits_fp32, contract).unsqueeze(-1)
    return torch.where(torch.isinf(logits_fp32), logits_fp32, logits_fp32 - total)


def native_log_softmax(logits_fp32: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits_fp32.float(), dim=-1)


# =====================================================================================================
# Triton (GPU). logits: the strict GEMM (kernels/gemm.py) with its single rounding to fp32. Logprobs:
# one program per row walks the vocabulary chunks of `vocab_chunk` entries in order; a chunk gives
# (max, sum of exp(x - max)), its sum a fixed reduction of the [vocab_chunk] tile (the layout depends
# on vocab_chunk and num_warps only, never on the number of rows); the chunk states merge by the
# pairwise LSE tree (adjacent pairs level by level: reshape + split, the reference's tree exactly, with
# trailing empty chunks as exact pass-throughs); logprob = logit[t] - lse. exp/log: Triton's fp32
# primitives (ex2/lg2 based). The fused path cuts the rows into blocks of
# max(row_block, GPU_ROW_BLOCK) rows: per block the fp32 logits [rows x vocab] are computed and
# reduced, never the whole [tokens x vocab]; the row block never changes a bit (rows are independent).
# =====================================================================================================
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels._triton import jit, tl  # noqa: E402

GPU_ROW_BLOCK = 1024
"""Rows per fused block on the GPU: the lm_head GEMM at 1024 rows is compute-bound on the H200 (at 256
it re-reads the 1.2 GB weight 4x as often); 1024 x 151,936 fp32 logits are 622 MB."""


@jit
def _lse_merge(ma, sa, mb, sb):
    """Merge two (max, sum) states as the reference's `lse.merge`; an all -inf state is empty."""
    m = tl.maximum(ma, mb)
    safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.where(ma == float("-inf"), 0.0, tl.exp(ma - safe))
    wb = tl.where(mb == float("-inf"), 0.0, tl.exp(mb - safe))
    return m, sa * wa + sb * wb


@jit
def _chunk_state(base, c, V, VC: tl.constexpr):
    """(max, sum of exp(x - max)) of vocab chunk c of one row: one [VC] tile, its layout a function of VC
    and num_warps only (every launch form below runs this same code with the same warps)."""
    offs = c * VC + tl.arange(0, VC)
    x = tl.load(base + offs, mask=offs < V, other=float("-inf"))
    m = tl.max(x, axis=0)
    safe = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(tl.exp(x - safe), axis=0)


@jit
def _merge_and_pick(ms, ss, base, ids_ptr, out_ptr, row, V, LOG_NC: tl.constexpr, NC: tl.constexpr):
    """The pairwise LSE tree over the NC chunk states, then logprob = logit[t] - lse. An id outside
    [0, V) is never read (NaN is written): the host check (`check_ids`) is skipped only for ids the caller
    vouches for, and a wrong voucher must not become an out-of-bounds read."""
    for lvl in tl.static_range(LOG_NC):  # the pairwise tree over chunk states
        ma, mb = tl.split(tl.reshape(ms, (NC >> (lvl + 1), 2)))
        sa, sb = tl.split(tl.reshape(ss, (NC >> (lvl + 1), 2)))
        ms, ss = _lse_merge(ma, sa, mb, sb)
    m_tot = tl.max(ms, axis=0)
    s_tot = tl.sum(ss, axis=0)
    lse = tl.where(m_tot == float("-inf"), m_tot, m_tot + tl.log(s_tot))
    t = tl.load(ids_ptr + row).to(tl.int64)
    picked = tl.load(base + t, mask=(t >= 0) & (t < V), other=float("nan"))
    out = tl.where(picked == float("-inf"), picked, picked - lse)
    tl.store(out_ptr + row, out)


@jit
def _logprob_rows_kernel(z_ptr, ids_ptr, out_ptr, ws_ptr, V, stride_z, VC: tl.constexpr, NC: tl.constexpr,
                         LOG_NC: tl.constexpr, MODE: tl.constexpr):
    """MODE 0: one program a row, its chunks in order, then the tree. MODE 1: program (row, chunk)
    stores its chunk's state (fp32, exact) in the workspace [rows, NC, 2]; MODE 2: one program a row
    loads the states and runs the same tree (few rows: the chunks of a row in parallel). The same
    states, the same tree: the same bits."""
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride_z
    cidx = tl.arange(0, NC)
    if MODE == 1:
        c = tl.program_id(1)
        m, s = _chunk_state(base, c, V, VC)
        ws = ws_ptr + (row.to(tl.int64) * NC + c) * 2
        tl.store(ws, m)
        tl.store(ws + 1, s)
    else:
        if MODE == 0:
            ms = tl.full((NC,), float("-inf"), tl.float32)
            ss = tl.zeros((NC,), tl.float32)
            for c in range(0, tl.cdiv(V, VC)):
                m, s = _chunk_state(base, c, V, VC)
                ms = tl.where(cidx == c, m, ms)
                ss = tl.where(cidx == c, s, ss)
        else:  # chunks past the vocabulary were never written: empty states
            have = cidx < tl.cdiv(V, VC)
            ws = ws_ptr + (row.to(tl.int64) * NC + cidx) * 2
            ms = tl.load(ws, mask=have, other=float("-inf"))
            ss = tl.load(ws + 1, mask=have, other=0.0)
        _merge_and_pick(ms, ss, base, ids_ptr, out_ptr, row, V, LOG_NC, NC)


@jit
def _row_cumsum_kernel(x_ptr, y_ptr, V, stride, BLOCK: tl.constexpr):
    """Inclusive fp32 prefix sum of one row: blocks of BLOCK in order, Triton's in-register scan within
    a block, the running total carried between blocks. Fixed order, one program per row."""
    base = tl.program_id(0).to(tl.int64) * stride
    carry = tl.sum(tl.zeros((BLOCK,), tl.float32), axis=0)
    for c in range(0, tl.cdiv(V, BLOCK)):
        offs = c * BLOCK + tl.arange(0, BLOCK)
        inside = offs < V
        x = tl.load(x_ptr + base + offs, mask=inside, other=0.0)
        tl.store(y_ptr + base + offs, tl.cumsum(x, axis=0) + carry, mask=inside)
        carry = carry + tl.sum(x, axis=0)


def row_cumsum(x: torch.Tensor, contract: NumericsContract) -> torch.Tensor:
    """Inclusive prefix sums along the last dim of fp32 [rows, n], each row scanned on its own in a fixed
    order, so a row's sums depend on nothing else: on the GPU the Triton scan above in blocks of the
    contract's `logprob.top_p_scan_block` (torch's CUDA
    cumsum reduces in an order that can change from run to run and with the number of rows, which once
    flipped a top-p boundary token between two identical decode runs); on the CPU torch's sequential
    scan. The two orders differ, so CPU and GPU may keep different tokens at an exact top-p tie."""
    if _tr.on_gpu(x) and x.dim() == 2:
        return triton_row_cumsum(x, contract)
    return torch.cumsum(x, dim=-1, dtype=torch.float32)


def triton_row_cumsum(x: torch.Tensor, contract: NumericsContract) -> torch.Tensor:
    x = x.float().contiguous()
    y = torch.empty_like(x)
    if x.numel():
        _row_cumsum_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=contract.logprob.top_p_scan_block,
                                          num_warps=4, **_tr.launch_options(contract))
    return y


def _gpu_ok(contract: NumericsContract) -> bool:
    vc = contract.logprob.vocab_chunk
    return _tr.HAVE_TRITON and vc & (vc - 1) == 0 and vc <= 65536


def triton_from_logits(logits_fp32: torch.Tensor, token_ids: torch.Tensor, contract: NumericsContract,
                       params: SamplingParams | None = None, parallel: bool | None = None,
                       ids_in_range: bool = False) -> torch.Tensor:
    """`parallel`: a row's vocab chunks in programs of their own (None: `chunks_in_parallel`). The ids'
    range is read once the kernels are queued (they read no id out of bounds; IdRangeCheck)."""
    ids_ok = check_ids(token_ids, logits_fp32.shape[0], logits_fp32.shape[1], logits_fp32.device, ids_in_range,
                       defer=True)
    out = _triton_from_checked_logits(logits_fp32, token_ids, contract, params, parallel)
    ids_ok.wait()
    return out


def _triton_from_checked_logits(logits_fp32, token_ids, contract, params, parallel):
    """`triton_from_logits` once the ids are known to be in range (their check syncs with the device:
    a caller that checked them already must not pay for it again, behind the GEMM it just queued)."""
    z = logits_fp32
    if params is not None and not params.is_identity:
        z = process_logits(z, params, contract)
    z = z if z.stride(-1) == 1 else z.contiguous()
    rows, vocab = z.shape
    out = torch.empty(rows, dtype=torch.float32, device=z.device)
    if rows:
        vc = contract.logprob.vocab_chunk
        nc = _tr.next_pow2(_tr.cdiv(vocab, vc))
        meta = dict(VC=vc, NC=nc, LOG_NC=nc.bit_length() - 1, num_warps=8, **_tr.launch_options(contract))
        if chunks_in_parallel(rows, z.device) if parallel is None else parallel:
            ws = torch.empty(rows * nc * 2, dtype=torch.float32, device=z.device)
            _logprob_rows_kernel[(rows, _tr.cdiv(vocab, vc))](z, token_ids, out, ws, vocab, z.stride(0), MODE=1,
                                                              **meta)
            _logprob_rows_kernel[(rows,)](z, token_ids, out, ws, vocab, z.stride(0), MODE=2, **meta)
        else:
            _logprob_rows_kernel[(rows,)](z, token_ids, out, out, vocab, z.stride(0), MODE=0, **meta)
    return out


PARALLEL_CHUNKS = True
"""Whether plans use the chunk-parallel form for fewer rows than the GPU has SMs: the engine's decode
rows then take it and the trainer's rows the one-program-a-row form, so the two must agree bit for bit
(tests/gpu/test_kernels_gpu.py compares them on 700 rows and on the first 1, 16 and 65 rows; the
benchmark's `strict_row_programs` rows time the other form and check its bits)."""


def chunks_in_parallel(rows: int, device: torch.device) -> bool:
    """Fewer rows than the GPU has SMs (and PARALLEL_CHUNKS): one program a (row, vocab chunk), then a
    merge per row (decode steps, the engine's samplers); else one program a row. The same states and the
    same tree either way."""
    return PARALLEL_CHUNKS and rows < _tr.sm_count(device)


def triton_logprob(hidden, weight, token_ids, contract, params=None, parallel: bool | None = None):
    """Strict logprobs on the GPU, `max(row_block, GPU_ROW_BLOCK)` rows a block; the ids' range is read
    once every kernel is queued (they read no id out of bounds; IdRangeCheck)."""
    _check(hidden, weight)
    ids_ok = check_ids(token_ids, hidden.shape[0], weight.shape[0], hidden.device, defer=True)
    step = max(contract.logprob.row_block, GPU_ROW_BLOCK)
    if hidden.shape[0] <= step:  # one block (every decode step): its result is the output, no copy launched
        out = _triton_from_checked_logits(gemm.strict(hidden, weight, contract, torch.float32), token_ids,
                                          contract, params, parallel)
    else:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for lo in range(0, hidden.shape[0], step):
            block = gemm.strict(hidden[lo : lo + step], weight, contract, torch.float32)  # cuBLAS where admitted
            out[lo : lo + step] = _triton_from_checked_logits(block, token_ids[lo : lo + step], contract, params,
                                                              parallel)
    ids_ok.wait()
    return out


class _StrictLogprob(torch.autograd.Function):
    """Forward: the strict Triton logprob. Backward: the native chunked logprob's (`chunked_backward`,
    NATIVE_ROW_CHUNK rows a chunk)."""

    @staticmethod
    def forward(ctx, hidden, weight, token_ids, contract, params):
        ctx.save_for_backward(hidden, weight, token_ids)
        ctx.contract, ctx.params = contract, params
        if _tr.on_gpu(hidden, weight) and _gpu_ok(contract) and gemm.supported(hidden, weight, contract):
            return triton_logprob(hidden, weight, token_ids, contract, params)
        return reference(hidden, weight, token_ids, contract, params)

    @staticmethod
    def backward(ctx, g):
        hidden, weight, ids = ctx.saved_tensors
        gh, gw = chunked_backward(g, hidden, weight, ids, ctx.contract, ctx.params, NATIVE_ROW_CHUNK,
                                  *ctx.needs_input_grad[:2])
        return gh, gw, None, None, None


def strict_logits(hidden, weight, contract):
    if _tr.on_gpu(hidden, weight) and gemm.supported(hidden, weight, contract):
        _check(hidden, weight)
        return gemm.strict(hidden, weight, contract, torch.float32)
    return logits(hidden, weight, contract)


def strict_from_logits(logits_fp32, token_ids, contract, params=None, ids_in_range: bool = False):
    if _tr.on_gpu(logits_fp32) and _gpu_ok(contract) and not (
            torch.is_grad_enabled() and logits_fp32.requires_grad):
        return triton_from_logits(logits_fp32, token_ids, contract, params, ids_in_range=ids_in_range)
    return from_logits(logits_fp32, token_ids, contract, params, ids_in_range)


def strict_log_softmax(logits_fp32, contract):
    """Strict log-probabilities of every entry (the reference's tree on every device)."""
    return log_softmax(logits_fp32, contract)


def strict(hidden, weight, token_ids, contract, params=None):
    """Strict logprobs: the Triton path for CUDA tensors, the reference otherwise; under autograd the
    same forward with a native backward."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _StrictLogprob.apply(hidden, weight, token_ids, contract, params)
    if _tr.on_gpu(hidden, weight) and _gpu_ok(contract) and gemm.supported(hidden, weight, contract):
        return triton_logprob(hidden, weight, token_ids, contract, params)
    return reference(hidden, weight, token_ids, contract, params)
