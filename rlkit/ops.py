"""One dispatch point per op: the active numerics contract decides strict or native.

Every layer of rlkit's Qwen3 (and of the vLLM and Megatron adapters) calls these functions; nothing else
chooses kernels, and no module of rlkit other than this one (and the benchmarks) imports `rlkit.kernels`.
The adapters' own numerics go through here too: the vLLM sampler's `log_softmax` and `process_logits`,
the engines' sampling (`process_logits`), the Megatron trainer's gradient and norm reductions
(`reduce_sum`). The contract in effect is scoped, never global state patched into torch:

    from rlkit import ops, NumericsContract
    with ops.use_contract(NumericsContract.default().with_ops(attention="native")):
        y = ops.rms_norm(x, w, eps=1e-6)      # strict
        o = ops.attention(q, k, v, layout)    # native (torch SDPA)

`use_contract` restores the previous contract on exit (also on error), and is per thread / per asyncio
task (a ContextVar), so a dashboard thread and a training thread never see each other's contract.

Native paths are the control: HF's eager torch ops on the CPU; on CUDA what a serving engine and a
trainer's fused kernels run (fused Triton RMSNorm + residual, RoPE from a cached table, silu * up, with
or without a gradient; the paged flash-decoding; a packed prefill's attention as one varlen flash call),
and native logprobs above 4,096 rows in row chunks (kernels/logprob.py
`native_chunked`). `native_backend(device)` names the control they stand for on that device
(rlkit/native_backends.py: torch-cpu, torch-cuda, and on ROCm `amd-aiter`, which these ops do not call:
not exercised here).

Strict paths call `rlkit.kernels.<op>.strict(...)`: the Triton kernel when the tensors are on CUDA
(and the contract's parameters are ones the kernel implements), the torch reference otherwise. One
exception, which moves no bit: a one-chain GEMM (q/k/v, gate/up, the lm_head from contract v3; o/down
too under v6) runs on cuBLAS where kernels/gemm_cublas.py admits it (an H200-class GPU, cuBLAS without a
workspace in this process, the shape checked equal to the Triton kernel at first use); `gemm_route()` says
what it decided. Before that, a product of few rows takes the launch its GPU model's table measured
fastest (kernels/gemm_tuned.py), likewise checked at first use; `gemm_measured_launches()` lists them.
Importing rlkit.kernels sets CUBLAS_WORKSPACE_CONFIG=:0:0 and CUBLASLT_WORKSPACE_SIZE=0 where unset (the
native GEMMs of the process then run without split-K too); RLKIT_GEMM_CUBLAS=0 turns all of it off. Each
`strict` also wraps the kernel in an autograd Function (strict forward, native backward) when a
gradient is needed; on CUDA RMSNorm, SwiGLU and RoPE take the backward the native path takes (each
module's `backward`), so the paths differ in their forward only.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

import torch

from rlkit import native_backends as _native_backends
from rlkit.contract import NumericsContract
from rlkit.kernels import attention as _attention
from rlkit.kernels import collectives as _collectives
from rlkit.kernels import gemm as _gemm
from rlkit.kernels import gemm_cublas as _gemm_cublas
from rlkit.kernels import logprob as _logprob
from rlkit.kernels import rms_norm as _rms_norm
from rlkit.kernels import rope as _rope
from rlkit.kernels import swiglu as _swiglu
from rlkit.kernels.determinism import deterministic_algorithms as _deterministic_algorithms
from rlkit.kernels.errors import OpInputError
from rlkit.types import AttentionLayout, SamplingParams

__all__ = [
    "use_contract", "current_contract", "rms_norm", "linear", "swiglu", "rope", "attention",
    "logits", "logprob", "logprob_from_logits", "log_softmax", "process_logits", "all_reduce", "reduce_sum",
    "AttentionLayout", "SamplingParams", "OpInputError", "native_backend", "gemm_route", "gemm_measured_launches",
]

_ACTIVE: ContextVar[NumericsContract] = ContextVar("rlkit_numerics_contract",
                                                   default=NumericsContract.default())


@contextlib.contextmanager
def use_contract(contract: NumericsContract) -> Iterator[NumericsContract]:
    """Run the block under `contract`; the previous contract is back on exit."""
    if not isinstance(contract, NumericsContract):
        raise TypeError(f"use_contract needs a NumericsContract, got {type(contract).__name__}")
    token = _ACTIVE.set(contract)
    try:
        yield contract
    finally:
        _ACTIVE.reset(token)


def current_contract() -> NumericsContract:
    return _ACTIVE.get()


def _strict(op: str) -> bool:
    return _ACTIVE.get().path(op) == "strict"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm over the last dim; with `residual`, returns (norm(x + residual), x + residual)."""
    if _strict("rms_norm"):
        return _rms_norm.strict(x, weight, eps, _ACTIVE.get(), residual)
    return _rms_norm.native(x, weight, eps, residual)


def linear(x: torch.Tensor, weight: torch.Tensor, *, row_parallel: bool = False, tp_group=None,
           tp_size: int = 1, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x @ weight.T. `row_parallel`: the layer is one whose K tensor parallelism splits (o_proj,
    down_proj), so its strict K reduction is the contract's chunk tree (gemm.k_chunks) at every TP size,
    TP 1 included; every other layer sums K as gemm.column_k_chunks says. With `tp_size > 1` (row-parallel
    only) x and weight hold this rank's K slice and the result is summed over `tp_group`. Strict: each rank
    computes the fp32 pieces of the merge it can finish alone (kernels/gemm.py `shard_partials`: its chunk
    sums under v5's ordered merge, its subtree under the pairwise tree), the ranks gather them in rank
    order (strict all_reduce path) and the GEMM's own merge finishes the sum (`gemm.chunk_merge`), rounded
    once; with the all_reduce op native, each rank merges its pieces and the backend sums the ranks. Under
    the chained merge (v6) the ranks instead pass one running fp32 sum on in rank order (each continues
    the chain of the ranks before it: kernels/collectives.py `chain`, pipelined over row blocks, which
    moves no bit since rows are independent) and the last rank's, rounded once, is broadcast; with the all_reduce op native each rank's own chain from zero is summed by the backend.
    Native: a local GEMM plus the backend's all-reduce in the model dtype."""
    contract = _ACTIVE.get()
    if tp_size > 1 and not row_parallel:
        raise OpInputError("linear", f"tp_size={tp_size} splits K, which only a row-parallel layer does; "
                                     f"pass row_parallel=True")
    if tp_size == 1:
        if _strict("linear"):
            return _gemm.strict(x, weight, contract, out_dtype, row_parallel)
        return _gemm.native(x, weight, out_dtype)
    if not _strict("linear"):
        return all_reduce(_gemm.native(x, weight), group=tp_group).to(out_dtype or x.dtype)
    if _gemm.chained(contract, row_parallel):
        if not _strict("all_reduce"):
            own = _gemm.strict_chain_partial(x, weight, contract, None, shards=tp_size)
            return _collectives.native(own, tp_group).to(out_dtype or x.dtype)
        x2 = x.reshape(-1, x.shape[-1])
        out = _collectives.chain(lambda start, lo, hi: _gemm.strict_chain_partial(x2[lo:hi], weight, contract, start,
                                                                                  shards=tp_size),
                                 x2.shape[0], weight.shape[0], x.device, out_dtype or x.dtype, tp_group)
        return out.reshape(*x.shape[:-1], weight.shape[0])
    pieces = _gemm.strict_shard_partials(x, weight, contract, shards=tp_size)
    if _strict("all_reduce"):
        reduced = _gemm.merge(_collectives.gather(pieces, tp_group), contract)
    else:
        reduced = _collectives.native(_gemm.merge(pieces, contract), tp_group)
    return reduced.to(out_dtype or x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up."""
    if _strict("swiglu"):
        return _swiglu.strict(gate, up, _ACTIVE.get())
    return _swiglu.native(gate, up)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, max_position: int | None = None) -> torch.Tensor:
    """Rotary embedding of x [tokens, heads, head_dim] at absolute `positions` [tokens]. `max_position`
    (optional) bounds the positions, so no host code reads them (CUDA graphs)."""
    if _strict("rope"):
        return _rope.strict(x, positions, theta, _ACTIVE.get(), max_position)
    return _rope.native(x, positions, theta, max_position)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
    """Causal GQA attention; `layout` says whether this is a packed prefill, a chunked prefill or a
    paged decode (AttentionLayout.prefill / AttentionLayout.paged)."""
    if _strict("attention"):
        return _attention.strict(q, k, v, layout, _ACTIVE.get())
    return _attention.native(q, k, v, layout)


def logits(hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """fp32 logits [tokens, vocab] (the rollout engine samples from them)."""
    if _strict("logprob"):
        return _logprob.strict_logits(hidden, lm_head, _ACTIVE.get())
    return _logprob.native_logits(hidden, lm_head)


def logprob_from_logits(logits_fp32: torch.Tensor, token_ids: torch.Tensor,
                        params: SamplingParams | None = None, ids_in_range: bool = False) -> torch.Tensor:
    """Logprobs of token_ids given fp32 logits: raw (params None) or processed by `params`.
    `ids_in_range`: the caller sampled the ids from these logits, so they lie in [0, vocab) and the
    range check (a device sync: it would stall a decode step launched ahead) is skipped. No bit moves."""
    if _strict("logprob"):
        return _logprob.strict_from_logits(logits_fp32, token_ids, _ACTIVE.get(), params, ids_in_range)
    return _logprob.native_from_logits(logits_fp32, token_ids, _ACTIVE.get(), params, ids_in_range)


def log_softmax(logits_fp32: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of every vocabulary entry, [rows, vocab] fp32 (the vLLM sampler's
    `compute_logprobs`): strict, logits - the contract's vocab-chunked LSE; native, torch.log_softmax."""
    if _strict("logprob"):
        return _logprob.strict_log_softmax(logits_fp32, _ACTIVE.get())
    return _logprob.native_log_softmax(logits_fp32)


def process_logits(logits_fp32: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution's logits: / temperature, top-k, top-p (removed entries -inf). One
    definition for both paths (the rollout samples from it, processed logprobs renormalize it); its
    top-p scan follows the contract (`logprob.top_p_scan_block`)."""
    return _logprob.process_logits(logits_fp32, params, _ACTIVE.get())


def logprob(hidden: torch.Tensor, lm_head: torch.Tensor, token_ids: torch.Tensor,
            params: SamplingParams | None = None) -> torch.Tensor:
    """Logprobs of token_ids from the final hidden states, without a [tokens x vocab] tensor on the
    strict path (rows are done `logprob.row_block` at a time)."""
    if _strict("logprob"):
        return _logprob.strict(hidden, lm_head, token_ids, _ACTIVE.get(), params)
    return _logprob.native(hidden, lm_head, token_ids, _ACTIVE.get(), params)


def all_reduce(partial: torch.Tensor, group=None) -> torch.Tensor:
    """Sum over the ranks of `group`; returns a new tensor (strict: fp32, the canonical tree over the
    gathered per-rank partials; native: the backend's all-reduce in the tensor's dtype)."""
    if _strict("all_reduce"):
        return _collectives.reference(partial.float(), group)
    return _collectives.native(partial, group)


def reduce_sum(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """`all_reduce` rounded back to the tensor's dtype: the trainer's gradient and norm reductions over
    its model-parallel groups (every rank gets the same bits on the strict path, so TP-replicated
    parameters stay identical after an update)."""
    return all_reduce(tensor, group).to(tensor.dtype)


def native_backend(device: torch.device) -> _native_backends.NativeBackend:
    """The native control on `device`'s kind, by name, with what rlkit's native ops call there and where
    that was exercised (on a ROCm device: `amd-aiter`, not wired in and not exercised)."""
    return _native_backends.native_backend(device)


def gemm_route(device: torch.device | str | None = None):
    """What the strict GEMM's cuBLAS route decided on `device` in this process (kernels/gemm_cublas.py):
    on or off and why, and every one-chain shape it checked against the Triton kernel. None before the
    first strict column GEMM there. `print(ops.gemm_route().summary())` in a notebook."""
    return _gemm_cublas.status(device)


def gemm_measured_launches() -> list[dict]:
    """The measured GEMM launches (kernels/gemm_tuned.py: a GPU model's table of faster launches at a few
    rows) this process compared with the plan's bits, and whether each runs: [{device, K, N, rows, launch,
    out, taken}]. Empty where the GPU model has no table or no covered product ran yet."""
    return _gemm.measured_status()


def repeatable_backward():
    """A context in which training repeats bit for bit: torch's deterministic algorithms, the caller's
    settings restored after (kernels/determinism.py). Attention's backward runs under it on both paths;
    the supervised warm start runs its whole step under it (rlkit/train/warm_start.py)."""
    return _deterministic_algorithms()

