"""Long-format benchmark rows (op, impl, shape, metric, median, device, commit) read back from the files
the benchmarks write: `.jsonl`, or `.jsonl.gz` as lab/bench keeps the large ones."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

KEYS = ("op", "impl", "shape", "metric", "median", "device", "commit")


class RowsError(ValueError):
    """A row file that cannot be read as rows, said with its path (and line)."""


def read_text(path: Path) -> str:
    """A row file's text, a `.gz` one unpacked."""
    try:
        data = path.read_bytes()
        return (gzip.decompress(data) if path.suffix == ".gz" else data).decode()
    except FileNotFoundError:
        raise RowsError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise RowsError(f"{path}: cannot be read as rows ({exc})") from None


def read_rows(paths: list[Path]) -> list[dict]:
    """Every row of the files, in the order given (a later row of the same cell supersedes an earlier one
    wherever a table keeps one)."""
    rows: list[dict] = []
    for path in paths:
        for n, line in enumerate(read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RowsError(f"{path}:{n}: not a JSON row ({exc.msg})") from None
            lacking = [k for k in KEYS if not isinstance(row, dict) or k not in row]
            if lacking:
                raise RowsError(f"{path}:{n}: a row without {', '.join(lacking)}")
            rows.append(row)
    if not rows:
        raise RowsError("no rows in " + ", ".join(map(str, paths)))
    return rows


def single_device(rows: list[dict]) -> str:
    """The one device the rows were measured on; rows of several devices are refused (a table that mixed
    them would compare timings no single run took)."""
    devices: dict[str, int] = {}
    for r in rows:
        devices[r["device"]] = devices.get(r["device"], 0) + 1
    if len(devices) > 1:
        raise RowsError("rows of several devices, render each apart: "
                        + "; ".join(f"{d} ({n} rows)" for d, n in devices.items()))
    return next(iter(devices))
