"""Probe for a v2 GEMM contract (issue 16): one fp32 accumulator over K, in K order, no split-K.

Hypothesis: with k_chunks = 1 and a fixed 64-wide K step, a row's output bits do not depend on the tile
shape (BLOCK_M / BLOCK_N), num_warps, num_stages, a persistent grid, TMA loads, warp specialization or
swap-AB: every variant runs the same chain of k16 tensor-core MMAs over K in K order from zero. If it
holds, the tile shape may follow M for speed while each row stays batch-invariant.

For the Qwen3-8B, 1.7B and 0.6B projection shapes and M in {1, 8, 64, 256, 1024, 4096, 8192} (bf16):
- times cuBLAS (F.linear), rlkit's strict GEMM with the default contract (k_chunks = 4, "v1"), the same
  launcher with k_chunks = 1 ("k1"), and this file's own single-accumulator kernels ("probe": swap-AB
  with TMA weight loads for M <= 64, a persistent TMA kernel for M > 64; "probe_ws": the same with
  `tl.range(..., warp_specialize=True)` over the tiles), CUDA-graph replay, median;
- checks bits with torch.equal: rows 0-7 of every product == the same rows of the M = 8 product (row 0 ==
  the M = 1 product), for every implementation; probe == k1 for every shape and M; at M = 200 every tile
  configuration in CROSS_CONFIGS (including rlkit's launcher under plan overrides) == k1.

    python3 -m pip install -q --no-deps --no-build-isolation -e .    # once per fresh machine, offline
    PROBE_COMMIT=<sha> python lab/gemm_probe_h200.py [--models 8b,1.7b,0.6b] [--budget-s 330]
    python lab/gemm_probe_h200.py --dry      # CPU, TRITON_INTERPRET=1, tiny shapes: the script's logic only

Writes $OUT/gemm_probe.jsonl and .csv (long format: op, implementation, shape, M, metric, median_us,
device, commit) and $OUT/gemm_probe.log; prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

DRY = "--dry" in sys.argv
if DRY:  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

IMPORT_ROUTE = "installed"  # `pip install --no-deps --no-build-isolation -e .` first (docs/VALIDATION.md)
from rlkit.bitwise import compare  # noqa: E402
from rlkit.contract import GemmSpec, NumericsContract  # noqa: E402
from rlkit.kernels import gemm  # noqa: E402

V1 = NumericsContract.default()
K1 = V1.replace(gemm=GemmSpec(k_chunks=1, chunk_merge="pairwise_tree"))
BK = V1.gemm.k_tile  # 64: the fixed K step of every variant below except the BK probes
DTYPE = torch.float16 if DRY else torch.bfloat16  # the interpreter (triton 3.7) computes bf16 dots wrongly


def _proj(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, vocab: int = 151936) -> dict:
    """(K, N) of each projection of one Qwen3 layer (y = x @ w.T, w [N, K])."""
    return {"qkv": (hidden, (heads + 2 * kv_heads) * head_dim), "o": (heads * head_dim, hidden),
            "gate_up": (hidden, 2 * inter), "down": (inter, hidden), "lm_head": (hidden, vocab)}


# From the Qwen3 configs (config.json / the project's qwen3_dense_configs_summary.json), vocab 151936:
MODELS = {
    "8b": _proj(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=12288),
    "1.7b": _proj(hidden=2048, heads=16, kv_heads=8, head_dim=128, inter=6144),
    "0.6b": _proj(hidden=1024, heads=16, kv_heads=8, head_dim=128, inter=3072),
}
MS = (1, 8, 64, 256, 1024, 4096, 8192)
CHECK_M = 200  # cross-configuration check: not a multiple of any tile, so every edge path runs
DRY_SHAPES = {"tiny": {"a": (256, 128), "b": (192, 320)}}
DRY_MS = (1, 8, 40, 130)


# ---------------------------------------------------------------------------------------------------
# The probe kernels: one fp32 accumulator per output tile, K steps of BK in K order from zero.
# ---------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M"])  # one compile for every M (M's value never enters the bits)
def _probe_swap_kernel(x_ptr, w_desc, y_ptr, M, N, K, stride_x, stride_y,
                       BN: tl.constexpr, BT: tl.constexpr, BKC: tl.constexpr):
    """Swap-AB (decode): weights are the MMA's row operand (TMA loads of [BN, BK]), tokens its columns."""
    off_n = tl.program_id(0) * BN
    offs_t = tl.program_id(1) * BT + tl.arange(0, BT)
    rows = offs_t % M  # out-of-range token columns reload valid rows; the store masks them
    offs_k = tl.arange(0, BKC)
    acc = tl.zeros((BN, BT), dtype=tl.float32)
    for k0 in range(0, K, BKC):
        w = w_desc.load([off_n, k0])                                           # [BN, BK]
        xt = tl.load(x_ptr + rows[None, :].to(tl.int64) * stride_x + (k0 + offs_k)[:, None])  # [BK, BT]
        acc = tl.dot(w, xt, acc)
    offs_n = off_n + tl.arange(0, BN)
    mask = (offs_n[:, None] < N) & (offs_t[None, :] < M)
    tl.store(y_ptr + offs_t[None, :].to(tl.int64) * stride_y + offs_n[:, None], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _probe_tiles_kernel(x_desc, w_desc, y_ptr, M, N, K, stride_y, programs,
                        BM: tl.constexpr, BN: tl.constexpr, BKC: tl.constexpr, GROUP_M: tl.constexpr,
                        WS: tl.constexpr):
    """Persistent [BM x BN] tiles in grouped order; x and w tiles by TMA (zero-filled past the edges)."""
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    width = GROUP_M * n_n
    for tile in tl.range(tl.program_id(0), n_m * n_n, programs, flatten=False, warp_specialize=WS):
        first_m = (tile // width) * GROUP_M
        group_rows = tl.minimum(n_m - first_m, GROUP_M)
        pid_m = first_m + (tile % width) % group_rows
        pid_n = (tile % width) // group_rows
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BKC):
            a = x_desc.load([pid_m * BM, k0])
            b = w_desc.load([pid_n * BN, k0])
            acc = tl.dot(a, b.T, acc)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mask)


COMPILED: dict[str, str] = {}
"""Registers / spills of each compiled probe configuration (for the log)."""


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def probe(x: torch.Tensor, w: torch.Tensor, cfg: dict) -> torch.Tensor:
    """y = x @ w.T (bf16) by a probe kernel under launch configuration `cfg`."""
    m, k = x.shape
    n = w.shape[0]
    bkc = cfg.get("BK", BK)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    name = cfg["name"]
    if cfg["kind"] == "swap":
        w_desc = TensorDescriptor.from_tensor(w, [cfg["BN"], bkc])
        grid = (triton.cdiv(n, cfg["BN"]), triton.cdiv(m, cfg["BT"]))
        ck = _probe_swap_kernel[grid](x, w_desc, y, m, n, k, x.stride(0), y.stride(0), BN=cfg["BN"],
                                      BT=cfg["BT"], BKC=bkc, num_warps=cfg["warps"], num_stages=cfg["stages"])
    else:
        bm, bn = cfg["BM"], cfg["BN"]
        xs = x if m >= bm else torch.cat([x, x.new_zeros(bm - m, k)])  # a TMA box never exceeds the tensor
        x_desc = TensorDescriptor.from_tensor(xs, [bm, bkc])
        w_desc = TensorDescriptor.from_tensor(w, [bn, bkc])
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        programs = min(tiles, cfg.get("per_sm", 1) * _sm_count(x.device))
        ck = _probe_tiles_kernel[(programs,)](x_desc, w_desc, y, m, n, k, y.stride(0), programs, BM=bm, BN=bn,
                                              BKC=bkc, GROUP_M=8, WS=cfg.get("ws", False),
                                              num_warps=cfg["warps"], num_stages=cfg["stages"])
    if name not in COMPILED and hasattr(ck, "n_regs"):
        COMPILED[name] = f"{ck.n_regs} regs, {ck.n_spills} spills"
    return y


def _swap(bn, bt, warps=4, stages=4, **kw):
    return dict(kind="swap", name=f"swap{bn}x{bt}w{warps}s{stages}", BN=bn, BT=bt, warps=warps,
                stages=stages, **kw)


def _tiles(bm, bn, warps, stages, ws=False, bk=BK, **kw):
    tag = (f"tma{bm}x{bn}w{warps}s{stages}" + ("_ws" if ws else "") + ("" if bk == BK else f"_bk{bk}")
           + (f"_{kw['per_sm']}persm" if kw.get("per_sm", 1) > 1 else ""))
    return dict(kind="tiles", name=tag, BM=bm, BN=bn, warps=warps, stages=stages, ws=ws, BK=bk, **kw)


def probe_plan(m: int, ws: bool = False) -> dict:
    """The M-dependent table of the probe (speed only; the hypothesis is that no entry moves a bit)."""
    if m <= 16:
        return _swap(64, 16, 4, 6)
    if m <= 64:
        return _swap(64, 64, 4, 4)
    if m <= 256:
        return _tiles(64, 128, 4, 4, ws)
    return _tiles(128, 256, 8, 3, ws)


# Every configuration below runs at M = CHECK_M on every shape and must equal rlkit's k1 launcher bit
# for bit. The BK variants ("_bk") change the K step: a failure there does not refute the hypothesis
# (which fixes BK) but says whether BK belongs in the contract.
CROSS_CONFIGS = [
    _swap(64, 16, 4, 6), _swap(128, 64, 4, 4), _swap(32, 16, 4, 4),        # 32 weight rows: mma.sync
    _tiles(16, 128, 4, 4),                                                   # small BM: mma.sync
    _tiles(64, 128, 4, 4), _tiles(128, 128, 8, 4), _tiles(128, 256, 8, 3), _tiles(128, 256, 8, 3, ws=True),
    _tiles(128, 128, 8, 4, per_sm=2),
    _tiles(128, 128, 8, 3, bk=128), _tiles(128, 128, 4, 5, bk=32),
]
RLKIT_OVERRIDES = {  # rlkit's own launcher (k1) under other plans
    "rlkit_tiles64x64": dict(kind="tiles", BM=64, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=3),
    "rlkit_swapped128x32": dict(kind="swapped", BN=128, BT=32, num_warps=4, num_stages=4),
}
DRY_CROSS = [_swap(64, 16, 4, 2), _swap(32, 16, 4, 2), _tiles(16, 64, 4, 2), _tiles(64, 64, 4, 2),
             _tiles(64, 128, 4, 2, ws=True), _tiles(64, 64, 4, 2, bk=32)]


# ---------------------------------------------------------------------------------------------------
def bench_us(fn, rep_ms: float) -> tuple[float, str]:
    """Median time of one call: CUDA-graph replay (no host launch cost), events as the fallback."""
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6, "wall"
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3, "graph"
    except Exception as exc:  # noqa: BLE001
        torch.cuda.synchronize()
        LOG(f"  graph timing failed ({type(exc).__name__}: {str(exc)[:120]}); events instead")
        return triton.testing.do_bench(fn, warmup=5, rep=rep_ms, return_mode="median") * 1e3, "events"


def same(a: torch.Tensor, b: torch.Tensor, label: str) -> bool:
    if torch.equal(a, b):
        return True
    LOG(f"  {'differ (control)' if 'cublas' in label else 'BITWISE FAIL'} {compare(a, b, label)}")
    return False


_LOG_FILE = None


def LOG(msg: str) -> None:  # noqa: N802
    print(msg, flush=True)
    if _LOG_FILE is not None:
        _LOG_FILE.write(msg + "\n")
        _LOG_FILE.flush()


def implementations() -> dict:
    strict = gemm.triton_partial  # the launcher strict() calls for CUDA tensors (asserted below)
    return {
        "cublas": lambda x, w: F.linear(x, w),
        "strict_v1": lambda x, w: strict(x, w, V1, 1, DTYPE),
        "strict_k1": lambda x, w: strict(x, w, K1, 1, DTYPE),
        "probe": lambda x, w: probe(x, w, probe_plan(x.shape[0])),
        "probe_ws": lambda x, w: probe(x, w, probe_plan(x.shape[0], ws=True)),
    }


def cross_check(shape: str, x: torch.Tensor, w: torch.Tensor, configs: list, device_ok: bool) -> dict:
    """Every configuration at one M against rlkit's k1 launcher; also how far v1 is from k1."""
    ref = gemm.triton_partial(x, w, K1, 1, DTYPE)
    exact = x.double() @ w.double().T
    rel = float((ref.double() - exact).norm() / exact.norm())
    LOG(f"  {shape} M={x.shape[0]}: k1 vs float64 reference: relative error {rel:.2e} (output rounding ~1e-3)")
    res = {"k1 close to float64": rel < 1e-2}
    if device_ok:  # strict() is the public entry; on CUDA it must be this same launcher
        res["strict()==triton_partial"] = same(gemm.strict(x, w, K1), ref, f"{shape} strict(k1) vs launcher")
    v1 = gemm.triton_partial(x, w, V1, 1, DTYPE)
    LOG(f"  {shape} M={x.shape[0]}: v1 (k_chunks=4) differs from k1 in {int((v1 != ref).sum())} of {v1.numel()}"
        " outputs (the launcher honours k_chunks)")
    for cfg in configs:
        try:
            res[cfg["name"]] = same(probe(x, w, cfg), ref, f"{shape} {cfg['name']} vs k1")
        except Exception as exc:  # noqa: BLE001
            res[cfg["name"]] = None
            LOG(f"  {cfg['name']}: did not run ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
    if device_ok:
        for name, override in RLKIT_OVERRIDES.items():
            y = gemm.triton_partial(x, w, K1, 1, DTYPE, config=override)
            res[name] = same(y, ref, f"{shape} {name} vs k1")
    return res


def main() -> int:
    global _LOG_FILE
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--models", default="8b,1.7b,0.6b")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--rep-ms", type=float, default=5.0)
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new shapes after this")
    a = ap.parse_args()
    out = Path(os.environ.get("OUT") or "/tmp/gemm_probe_out")
    out.mkdir(parents=True, exist_ok=True)
    _LOG_FILE = open(out / "gemm_probe.log", "w")
    device = torch.device("cpu" if DRY else "cuda")
    dev_name = "cpu (interpreter)" if DRY else torch.cuda.get_device_name()
    commit = os.environ.get("PROBE_COMMIT", "unknown")
    LOG(f"torch {torch.__version__} triton {triton.__version__} device {dev_name} commit {commit} "
        f"sms {_sm_count(device)}; rlkit.kernels {IMPORT_ROUTE}")
    models = DRY_SHAPES if DRY else {m: MODELS[m] for m in a.models.split(",")}
    ms = DRY_MS if DRY else tuple(int(v) for v in a.ms.split(","))
    cross = DRY_CROSS if DRY else CROSS_CONFIGS
    impls = implementations()
    if DRY:  # the interpreter has no warp specialization worth timing; keep the table's columns
        impls["probe_ws"] = impls["probe"]
    rows, table, cross_res = [], [], {}
    t_start = time.time()
    gen = torch.Generator(device=device).manual_seed(1234)
    for model, projs in models.items():
        for proj, (k, n) in projs.items():
            shape = f"{model}.{proj}"
            if time.time() - t_start > a.budget_s:
                LOG(f"budget: skipping {shape} (after {time.time() - t_start:.0f} s)")
                continue
            w = (torch.randn(n, k, device=device, generator=gen) * k ** -0.5).to(DTYPE)
            x_all = torch.randn(max(ms + (CHECK_M,)), k, device=device, generator=gen).to(DTYPE)
            LOG(f"== {shape}: K={k} N={n} (t={time.time() - t_start:.0f} s)")
            cross_res[shape] = cross_check(shape, x_all[:CHECK_M], w, cross, not DRY)
            ref_rows = {}
            for name, fn in impls.items():
                try:
                    ref_rows[name] = (fn(x_all[:8], w), fn(x_all[:1], w))
                except Exception as exc:  # noqa: BLE001  (the cells below then report ERROR for it)
                    LOG(f"  {shape} {name} at M=8/M=1: ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            for m in ms:
                x = x_all[:m]
                cell = {"shape": shape, "M": m, "K": k, "N": n}
                y_k1 = None
                for name, fn in impls.items():
                    if name == "probe_ws" and probe_plan(m)["kind"] == "swap":
                        cell[name] = (float("nan"), "same")  # the same swap-AB kernel as "probe"
                        continue
                    try:
                        y = fn(x, w)
                        r = min(m, 8)
                        ok = same(y[:r], ref_rows[name][0][:r], f"{shape} M={m} {name} rows0-7 vs M=8") and \
                            same(y[:1], ref_rows[name][1], f"{shape} M={m} {name} row0 vs M=1")
                        if name == "strict_k1":
                            y_k1 = y
                        if name.startswith("probe") and y_k1 is not None:
                            ok = same(y, y_k1, f"{shape} M={m} {name} vs k1") and ok
                        del y
                        us, method = bench_us(lambda: fn(x, w), a.rep_ms)
                    except Exception as exc:  # noqa: BLE001
                        LOG(f"  {shape} M={m} {name}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                        ok, us, method = None, float("nan"), "error"
                    cell[name] = (us, ok)
                    rows.append(dict(op="linear", implementation=name, shape=shape, K=k, N=n, M=m,
                                     metric="median_us", median_us=round(us, 3), timing=method, bitwise_rows=ok,
                                     device=dev_name, commit=commit))
                del y_k1
                table.append(cell)
                LOG(_fmt(cell))
            del w, x_all, ref_rows
            if not DRY:
                torch.cuda.empty_cache()
    for name, info in COMPILED.items():
        LOG(f"compiled {name}: {info}")
    if not DRY:  # what rlkit's launcher compiled for a decode and a training shape (its Launch records)
        w = torch.randn(4096, 4096, device="cuda", dtype=DTYPE)
        for m in (1, 1024):
            for launch in gemm.triton_launch(torch.randn(m, 4096, device="cuda", dtype=DTYPE), w, V1, 1, DTYPE)[1]:
                LOG(f"compiled rlkit {launch.kernel} (M={m}): {launch.registers} regs, {launch.spills} spills")
    _write(out, rows, cross_res)
    LOG(f"\nwall {time.time() - t_start:.0f} s")
    _summary(table, cross_res)
    return 0


HEAD = f"{'shape':14} {'M':>5} {'cuBLAS us':>10} {'v1':>5} {'k1':>5} {'probe':>5} {'p_ws':>5}  bits(v1/k1/probe/ws)  cuBLAS-rows"


def _fmt(cell: dict) -> str:
    base = cell["cublas"][0]
    ratios = " ".join(f"{base / cell[n][0]:5.2f}" if cell[n][0] == cell[n][0] else "  n/a"
                      for n in ("strict_v1", "strict_k1", "probe", "probe_ws"))
    bits = "/".join({True: "OK", False: "FAIL", None: "ERR", "same": "-"}[cell[n][1]]
                    for n in ("strict_v1", "strict_k1", "probe", "probe_ws"))
    ctl = {True: "same", False: "differ", None: "ERR"}[cell["cublas"][1]]
    return f"{cell['shape']:14} {cell['M']:>5} {base:10.1f} {ratios}  {bits:20} {ctl}"


def _summary(table: list, cross_res: dict) -> None:
    print("\nratio = cuBLAS time / kernel time (CUDA-graph replay, median)")
    print(HEAD)
    for cell in table:
        print(_fmt(cell))
    print("\ncross-config at M=%d vs rlkit k1 (True = identical bits):" % CHECK_M)
    for shape, res in cross_res.items():
        bad = [k for k, v in res.items() if v is not True]
        print(f"  {shape:14} {sum(v is True for v in res.values())}/{len(res)} equal"
              + (f"; not equal or not run: {', '.join(bad)}" if bad else ""))


def _write(out: Path, rows: list, cross_res: dict) -> None:
    with open(out / "gemm_probe.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for shape, res in cross_res.items():
            f.write(json.dumps({"op": "linear", "check": "cross_config", "shape": shape, "M": CHECK_M,
                                "equal_to_k1": res}) + "\n")
    if rows:
        with open(out / "gemm_probe.csv", "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
