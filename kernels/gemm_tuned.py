"""Measured one-chain launches: per GPU model, the products of few rows whose fastest launch with the
strict bits is a Triton tile the plan does not choose (a swapped one, or a tiles one of few weight rows).

Why a table and not a rule: a one-chain product (every GEMM under contract v6) cannot split K, so at a
few rows which launch fills the SMs depends on the GPU's SM count and memory bandwidth: narrow weight
tiles (many programs, each streaming K x 16 weights) on one GPU model, cuBLAS without split-K (the route
of kernels/gemm_cublas.py) or the plan's own tile on another. That is decided by timing them on that GPU,
as vLLM keeps its fused-MoE tiles in a JSON file per device. The tables are built from the rows of
lab/chained_gemm_h200.py, which compares each launch's bits with the plan's before it times it
(rlkit/bench/gemm_tables.py; the probe writes OUT/tuned/), and live in kernels/tuned/, one file per
model (`torch.cuda.get_device_name`, "NVIDIA H200" -> NVIDIA_H200.json).

A launch never moves a bit (the chain is the same k16 MMAs in K order whatever the tile:
tests/gpu/test_kernels_gpu.py), and `gemm._one_chain` still compares each entry with the plan's launch
on seeded inputs at its first use in a process (as the cuBLAS route checks a shape), so a wrong entry
costs speed, never bits.

File format:
    {"device": "NVIDIA H200", "arch": "sm_90", "measured": "<commit> <date>",
     "entries": [{"k": 6144, "n": 2048, "rows": [1, 4], "dtype": "bfloat16",
                  "launch": {"kind": "swapped", "BN": 16, "BT": 16, "BK": 256, "num_warps": 4, "num_stages": 5},
                  "us": 7.9, "route_us": 10.8}]}
`rows` is the inclusive range of M the entry covers (one of ROW_RANGES: the plan's own thresholds);
`us` / `route_us` what the launch and rlkit's strict call without the table measured, for the record.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

TABLE_DIR = Path(__file__).resolve().parent / "tuned"
"""Where the tables are (installed with the package: pyproject's package-data)."""

ROW_RANGES = ((1, 4), (5, 16), (17, 64))
"""The M ranges an entry may cover: those of `gemm.plan`'s small-M launches (at most 4, 16 and 64 rows),
within each of which the weights stream once, so one measured M stands for the range."""

LAUNCH_KEYS = {"swapped": {"kind", "BN", "BT", "BK", "num_warps", "num_stages"},
               "tiles": {"kind", "BM", "BN", "BK", "GROUP_M", "split", "num_warps", "num_stages"}}
"""What an entry's launch may set, by kernel: a swapped launch (weights the MMA's row operand), or a
tiles launch without split (the tokens the row operand, one program over a tile's whole K: one chain)."""


class TableError(ValueError):
    """A table file that cannot be used: which file, and what is wrong with it."""


@dataclass(frozen=True)
class Entry:
    k: int
    n: int
    rows: tuple[int, int]
    dtype: str
    launch: tuple[tuple[str, object], ...]
    """The launch as sorted (key, value) pairs (hashable: checks are cached per entry)."""

    def config(self) -> dict:
        """The launch as `gemm.plan`'s override."""
        return dict(self.launch)

    def covers(self, m: int, k: int, n: int, dtype: torch.dtype) -> bool:
        return self.k == k and self.n == n and self.rows[0] <= m <= self.rows[1] and self.dtype == _dtype_name(dtype)


@dataclass(frozen=True)
class Table:
    device: str
    arch: str
    measured: str
    entries: tuple[Entry, ...]
    path: Path


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def file_name(device: str) -> str:
    """The table file of a GPU model: its name with every character but letters, digits, "-" and "."
    as "_" ("NVIDIA H100 80GB HBM3" -> NVIDIA_H100_80GB_HBM3.json)."""
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in device) + ".json"


def _entry(raw: dict, where: str) -> Entry:
    try:
        k, n, rows, dtype, launch = raw["k"], raw["n"], tuple(raw["rows"]), raw["dtype"], raw["launch"]
    except (KeyError, TypeError) as e:
        raise TableError(f"{where}: an entry needs k, n, rows, dtype and launch ({e!r} missing or malformed)") from None
    if rows not in ROW_RANGES:
        raise TableError(f"{where}: rows {list(rows)} is not one of {[list(r) for r in ROW_RANGES]}")
    if not (isinstance(k, int) and isinstance(n, int) and k > 0 and n > 0):
        raise TableError(f"{where}: k and n must be positive integers, got {k!r}, {n!r}")
    if dtype not in ("bfloat16", "float16"):
        raise TableError(f"{where}: dtype {dtype!r} (the tables cover bfloat16 and float16 products)")
    keys = LAUNCH_KEYS.get(launch.get("kind")) if isinstance(launch, dict) else None
    if keys is None or not set(launch) <= keys or launch.get("split", False):
        raise TableError(f"{where}: launch {launch!r} must be a swapped or an unsplit tiles launch, with keys from "
                         + "; ".join(f"{kind}: {sorted(k)}" for kind, k in LAUNCH_KEYS.items()))
    return Entry(k, n, rows, dtype, tuple(sorted(launch.items())))


def load(path: Path) -> Table:
    """A table file, checked: TableError naming the file and the problem when it is not usable."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TableError(f"{path}: not a readable JSON table ({e})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise TableError(f"{path}: expected an object with an \"entries\" list")
    for key in ("device", "arch"):
        if not isinstance(raw.get(key), str):
            raise TableError(f"{path}: missing \"{key}\"")
    entries = tuple(_entry(e, f"{path} entry {i}") for i, e in enumerate(raw["entries"]))
    seen: set = set()
    for e in entries:
        key = (e.k, e.n, e.rows, e.dtype)
        if key in seen:
            raise TableError(f"{path}: two entries for k={e.k} n={e.n} rows={list(e.rows)} {e.dtype}")
        seen.add(key)
    return Table(raw["device"], raw["arch"], str(raw.get("measured", "")), entries, Path(path))


def table(device: str, directory: Path | None = None) -> Table | None:
    """The table of a GPU model (by `torch.cuda.get_device_name`), None where none was measured; read
    once a process (`directory`: TABLE_DIR unless given)."""
    return _cached_table(device, TABLE_DIR if directory is None else Path(directory))


@functools.cache
def _cached_table(device: str, directory: Path) -> Table | None:
    path = directory / file_name(device)
    return load(path) if path.exists() else None


def tables(directory: Path | None = None) -> list[Table]:
    """Every table there is (the compile check compiles their launches for their arch)."""
    return [load(p) for p in sorted(Path(directory or TABLE_DIR).glob("*.json"))]


def entry(device: str, m: int, k: int, n: int, dtype: torch.dtype, directory: Path | None = None) -> Entry | None:
    """The entry covering an [m, k] x [n, k]^T product on this GPU model, if its table has one."""
    t = table(device, directory)
    if t is None:
        return None
    return next((e for e in t.entries if e.covers(m, k, n, dtype)), None)


def row_range(m: int) -> tuple[int, int] | None:
    """The ROW_RANGES range holding m (None above the last)."""
    return next((r for r in ROW_RANGES if r[0] <= m <= r[1]), None)
