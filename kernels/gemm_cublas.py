"""The cuBLAS route of the strict one-chain GEMM: a launch choice, not a contract version.

What it is: under contract v3+ every column- and vocab-parallel GEMM (q/k/v, gate/up, the lm_head) sums
K in one fp32 chain from zero, in K order, rounded once (kernels/gemm.py). On Hopper that chain is a
sequence of wgmma k16 steps whatever the tile, so any kernel that does not split K computes it: cuBLAS
without split-K gives rlkit's Triton kernel's bits exactly. Measured on the H200 (lab/LOG.md, 2026-12-03;
lab/cublas_probe_h200.py, lab/cublas_env_h200.py): with no cuBLAS workspace, 105 of 105 (shape, M) cells
row- and TP-invariant, all 63 column-layer cells equal to the strict bits, and a dense sweep (147 row
counts, four column shapes; the lm_head with bf16 and with fp32 out) equal too; with torch's default
workspace, cuBLAS splits K at row-parallel shapes (rows alone differ from rows in a batch), which is why
the route needs the workspace off. Only the bits matter to a contract, so the kernel that makes them is
the launcher's to choose, as it chooses tiles.

What guards it (`admitted`; any "no" runs the Triton kernel, which gives the same bits by definition):
- RLKIT_GEMM_CUBLAS is not "0" (read with the rest of the environment when a device's decision is made,
  once a process);
- an NVIDIA GPU of compute capability 9.0, the only kind measured (vLLM reports cuBLAS's batch
  invariance failing on Ada), bf16 or fp16 operands, contiguous and 16-byte aligned, out dtype the
  operands' or fp32, and one chain (gemm.chunk_count == 1);
- this process runs cuBLAS without a workspace: `prepare_process` (called when rlkit.ops is imported)
  sets CUBLAS_WORKSPACE_CONFIG=:0:0 and CUBLASLT_WORKSPACE_SIZE=0 where they are unset; torch reads them
  when it first sizes a workspace, so they must be set before the process's first cuBLAS call. The
  canary checks that they took effect: three row-parallel shapes whose rows split K under torch's
  defaults (measured) must give a row alone the bits it has inside a batch;
- the shape itself: the first use of each (device, K, N, dtype, out dtype, GEMM contract) outside CUDA
  graph capture compares cuBLAS with the Triton kernel on seeded inputs and the layer's own weight, at
  CHECK_ROWS row counts (both sides of every tile threshold of both; up to 257 for the widest layers,
  CHECK_BYTES); one differing element refuses that
  shape for the process, with a warning naming it. During capture an unchecked shape runs Triton.

Cost of the setting to the native path of the same process: its cuBLAS calls run without a workspace
too (measured on the H200: median 1.01x of the default, 0.46x at the worst cell, a row-parallel shape at
M = 1). A native run that should be the control at torch's defaults sets RLKIT_GEMM_CUBLAS=0; the
benchmarks time their native GEMMs in such a process.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rlkit.bitwise import differs

SWITCH = "RLKIT_GEMM_CUBLAS"
NO_WORKSPACE = {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}
CANARY_SHAPES = ((3072, 1024), (6144, 2048), (12288, 4096))
"""(K, N) where cuBLAS with torch's default workspace gave rows of M = 1, 8, 64 other bits than the
same rows in a batch of 1024 (H200, 2026-12-03: 2-87, 5-422 and 26-1644 elements differing)."""
CANARY_ROWS = (1, 8, 64)
CANARY_BATCH = 1024
CHECK_ROWS = (1, 2, 7, 8, 16, 17, 64, 65, 128, 129, 200, 256, 257, 1000)
"""Row counts a shape is compared at: the Triton plan's thresholds (4, 16, 64) and cuBLAS's tile rows
(64, 128, 256) from both sides."""
CHECK_BYTES = 256 << 20
"""A check's fp32-sized output at most (the lm_head's 151,936 columns: row counts up to 257, so the
first strict logprob of a run does not ask for gigabytes)."""
CAPABILITIES = ((9, 0),)
"""Compute capabilities the route was measured on (H200)."""


@dataclass
class RouteState:
    """What the route decided in this process (one per CUDA device)."""

    device: str
    admitted: bool
    reason: str
    shapes: dict = field(default_factory=dict)
    """(K, N, dtype, out dtype) -> None when cuBLAS gave the strict bits there, else why not."""

    def on_cublas(self, k: int, n: int, dtype: str = "bfloat16", out: str = "bfloat16") -> bool:
        """Whether products of this (K, N, dtype, out dtype) run on cuBLAS here: checked equal, route on."""
        return self.admitted and (k, n, dtype, out) in self.shapes and self.shapes[(k, n, dtype, out)] is None

    def summary(self) -> str:
        refused = {k: v for k, v in self.shapes.items() if v}
        return (f"cuBLAS route on {self.device}: {'on' if self.admitted else 'off'} ({self.reason}); "
                f"{len(self.shapes) - len(refused)} shapes checked equal, {len(refused)} refused"
                + "".join(f"\n  refused {k}: {v}" for k, v in refused.items()))


_STATE: dict[int, RouteState] = {}
_CHECKED: dict[tuple, bool] = {}


def prepare_process() -> dict[str, str]:
    """Set the no-workspace variables where unset (the route's precondition; harmless without CUDA).
    Returns what it set. Leaves everything alone when RLKIT_GEMM_CUBLAS=0."""
    if os.environ.get(SWITCH, "1") == "0":
        return {}
    set_now = {name: value for name, value in NO_WORKSPACE.items() if name not in os.environ}
    os.environ.update(set_now)
    return set_now


def environment_problem() -> str | None:
    """Why the process environment rules the route out, or None."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    wrong = {name: os.environ.get(name) for name, value in NO_WORKSPACE.items() if os.environ.get(name) != value}
    if wrong:
        return ("the route needs " + ", ".join(f"{n}={v}" for n, v in NO_WORKSPACE.items()) + " before CUDA "
                "starts; this process has " + ", ".join(f"{n}={v!r}" for n, v in wrong.items()))
    return None


def rows_split(linear, x: torch.Tensor, w: torch.Tensor, rows=CANARY_ROWS) -> list[tuple[int, int]]:
    """(M, elements differing) for each row count whose product `linear(x[:M], w)` differs from the
    first M rows of `linear(x, w)`: a backend that splits K by batch size shows up here."""
    whole = linear(x, w)
    out = []
    for m in rows:
        count = int(differs(linear(x[:m], w), whole[:m]).sum())
        if count:
            out.append((m, count))
    return out


def first_difference(fast, reference, x: torch.Tensor, w: torch.Tensor, rows=CHECK_ROWS) -> str | None:
    """None when `fast(x[:M], w)` equals `reference(x[:M], w)` bit for bit at every M in `rows`; else
    where the first difference is (M, how many elements, the largest |difference|)."""
    for m in rows:
        if m > x.shape[0]:
            continue
        a, b = fast(x[:m], w), reference(x[:m], w)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"M={m}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}"
        mask = differs(a, b)
        count = int(mask.sum())
        if count:
            delta = float((a.float() - b.float()).abs()[mask].max())
            return f"M={m}: {count} of {a.numel()} elements differ (max |d| {delta:.3g})"
    return None


def seeded(rows: int, k: int, dtype: torch.dtype, device, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Seeded normal [rows, k] inputs for a first-use comparison (any other order of a chain shows in them)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(rows, k, generator=g, device=device) * scale).to(dtype)


def linear(x2: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """x2 @ w.T on cuBLAS: bf16/fp16 out (F.linear) or fp32 out from the same operands (one cuBLAS call,
    no rounding to the operand dtype first)."""
    if out_dtype == x2.dtype:
        return F.linear(x2, w)
    return torch.mm(x2, w.t(), out_dtype=torch.float32)


def device_state(device: torch.device) -> RouteState:
    """The route's decision for `device`, made once per process: the environment, the GPU kind, then
    the canary."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    state = _STATE.get(idx)
    if state is not None:
        return state
    name = f"cuda:{idx}"
    problem = environment_problem()
    if problem is None:
        if torch.version.hip is not None:
            problem = "a ROCm device (not measured)"
        elif torch.cuda.get_device_capability(idx) not in CAPABILITIES:
            problem = (f"compute capability {torch.cuda.get_device_capability(idx)}: measured on "
                       f"{CAPABILITIES} only")
    if problem is None:
        with torch.cuda.device(idx):
            for k, n in CANARY_SHAPES:
                x = seeded(CANARY_BATCH, k, torch.bfloat16, name, seed=101)
                w = seeded(n, k, torch.bfloat16, name, seed=102, scale=0.02)
                split = rows_split(F.linear, x, w)
                if split:
                    problem = (f"cuBLAS split K at K={k} N={n} (rows alone differ from rows in a batch: "
                               f"{split}); the no-workspace setting was not in effect when CUDA started")
                    break
    state = RouteState(name, problem is None, problem or "no split-K in this process (canary)")
    _STATE[idx] = state
    if problem is not None and os.environ.get(SWITCH, "1") != "0":
        warnings.warn(f"rlkit: strict column GEMMs run the Triton kernel on {name}: {problem}", stacklevel=3)
    return state


def admitted(x2: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, contract, triton_fn) -> bool:
    """May this product run on cuBLAS? `triton_fn(x, w)` is the Triton one-chain kernel for the same
    contract and out dtype (the reference the shape is checked against)."""
    if not (x2.is_cuda and w.is_cuda) or x2.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x2.dtype:
        return False
    if out_dtype not in (x2.dtype, torch.float32) or not (x2.is_contiguous() and w.is_contiguous()):
        return False
    if x2.data_ptr() % 16 or w.data_ptr() % 16 or x2.shape[1] % 8:
        return False
    key = (x2.device.index, w.shape[1], w.shape[0], x2.dtype, out_dtype, contract.gemm)
    verdict = _CHECKED.get(key)
    if verdict is not None:
        return verdict
    if torch.cuda.is_current_stream_capturing():
        return False  # checked on the first eager call; Triton gives the same bits meanwhile
    state = device_state(x2.device)
    if not state.admitted:
        _CHECKED[key] = False
        return False
    rows = [m for m in CHECK_ROWS if m * w.shape[0] * 4 <= CHECK_BYTES] or [CHECK_ROWS[0]]
    x = seeded(max(rows), w.shape[1], x2.dtype, x2.device, seed=103)
    problem = first_difference(lambda a, b: linear(a, b, out_dtype), triton_fn, x, w, rows)
    shape = (w.shape[1], w.shape[0], str(x2.dtype).removeprefix("torch."), str(out_dtype).removeprefix("torch."))
    state.shapes[shape] = problem
    if problem is not None:
        warnings.warn(f"rlkit: the cuBLAS route is refused for K={shape[0]} N={shape[1]} on {state.device} "
                      f"({problem}); the Triton kernel runs it", stacklevel=3)
    _CHECKED[key] = problem is None
    return problem is None


def status(device: torch.device | str | None = None) -> RouteState | None:
    """What the route decided on `device` so far (None before its first strict GEMM there)."""
    if device is None:
        return next(iter(_STATE.values()), None)
    device = torch.device(device)
    return _STATE.get(device.index if device.index is not None else 0)


def forget() -> None:
    """Drop every decision (tests; a decision is otherwise kept for the process's life)."""
    _STATE.clear()
    _CHECKED.clear()
