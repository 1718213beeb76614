"""The exchange schema: one row per sampled response, with both sides' per-token logprobs.

An open, documented format (docs/IMPORT.md describes every field) for bringing per-token rollout/trainer
records into rlkit from any framework, and for taking rlkit's out. Two spellings of the same rows:

- Parquet (`*.parquet`): the columns below, token ids as list<int32>, logprobs as list<float32>;
- JSONL (`*.jsonl`): one JSON object per line with the same keys; logprobs as JSON numbers that are fp32
  values (print `float(np.float32(x))`, whose repr reads back to the same fp32 bits), `null` for a
  missing optional value.

    rows = read_rows("dump.parquet")        # list[ExchangeRow], every row checked (ExchangeError otherwise)
    write_rows(rows, "copy.jsonl")

Why the checks: an import must never store something that only looks right. Every row is checked before
anything is written, and the first bad one is named in one line: a missing required field, token and
logprob lists of different lengths, a NaN or a +inf logprob, a value that is not an fp32 value, or a
logprob semantics that differs from the other rows' (raw and processed logprobs are never compared).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from rlkit.timeline.records import RecordError, fp32_values, int32_values

SEMANTICS = ("raw", "processed")
"""raw: log-softmax of the model's logits; processed: after temperature, top-k and top-p (renormalized)."""


class ExchangeError(ValueError):
    """Input an import refuses: one line naming the file and the record."""


@dataclass(frozen=True)
class ExchangeRow:
    """One sampled response (a rollout record) and, when the source has it, the trainer's logprobs."""

    step: int
    """The RL step whose rollout produced the response (>= 0)."""
    sample_id: str
    """Unique within the run: becomes the rlkit record id."""
    prompt_id: str
    """The prompt; rows of one prompt form a GRPO group."""
    sample_index: int
    """Index of the response within its prompt's group."""
    prompt_token_ids: list[int]
    """Prompt token ids (may be empty when the source did not keep them)."""
    response_token_ids: list[int]
    """Generated token ids, one per logprob."""
    rollout_logprobs: list[float]
    """The logprob of each generated token as the rollout engine recorded it (fp32 values)."""
    trainer_logprobs: list[float] | None
    """The trainer's recomputed logprob of each generated token (fp32 values); None when not recorded."""
    logprob_semantics: str
    """raw | processed: which distribution both logprob lists are taken from (the same for every row)."""
    run_id: str | None = None
    """The source's name for its run (informational)."""
    rollout_weight_version: int | None = None
    """The weight version that generated the response; None when the source did not record it."""
    trainer_weight_version: int | None = None
    """The weight version the trainer recomputed with; None: the rollout's (or not recorded)."""
    reward: float | None = None
    """The response's task reward."""
    finish_reason: str | None = None
    """stop | length | error (or the source's word)."""
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    engine_id: str | None = None
    """The rollout engine (server, replica) that generated the response."""
    contract_fingerprint: str | None = None
    """rlkit's numerics contract fingerprint (rlkit runs only)."""


REQUIRED = ("step", "sample_id", "prompt_id", "sample_index", "prompt_token_ids", "response_token_ids",
            "rollout_logprobs", "trainer_logprobs", "logprob_semantics")
"""Keys every row must carry (trainer_logprobs may be null; the key must be there)."""
COLUMNS = tuple(f.name for f in fields(ExchangeRow))
_INTS = ("step", "sample_index")
_OPT_INTS = ("rollout_weight_version", "trainer_weight_version", "top_k", "max_tokens", "seed")
_OPT_FLOATS = ("reward", "temperature", "top_p")
_OPT_STRS = ("run_id", "finish_reason", "engine_id", "contract_fingerprint")


def arrow_schema():
    """The Parquet columns (pyarrow schema), in COLUMNS order."""
    import pyarrow as pa

    types = {"step": pa.int64(), "sample_id": pa.string(), "prompt_id": pa.string(), "sample_index": pa.int64(),
             "prompt_token_ids": pa.list_(pa.int32()), "response_token_ids": pa.list_(pa.int32()),
             "rollout_logprobs": pa.list_(pa.float32()), "trainer_logprobs": pa.list_(pa.float32()),
             "logprob_semantics": pa.string(), "reward": pa.float64(), "temperature": pa.float64(),
             "top_p": pa.float64()}
    for name in _OPT_INTS:
        types[name] = pa.int64()
    for name in _OPT_STRS:
        types[name] = pa.string()
    return pa.schema([pa.field(c, types[c], nullable=c not in REQUIRED or c == "trainer_logprobs")
                      for c in COLUMNS])


# -- checking -------------------------------------------------------------------------------------------
def _where(source: str, position: str, data: Any) -> str:
    sid = data.get("sample_id") if isinstance(data, dict) else None
    return f"{source}: record {sid!r} ({position})" if isinstance(sid, str) and sid else f"{source}: {position}"


def _logprobs(where: str, name: str, values: Any) -> list[float]:
    try:
        out = fp32_values("row", name, values)
    except (RecordError, TypeError, ValueError) as e:  # ValueError: a nested or ragged list
        raise ExchangeError(f"{where}: {' '.join(str(e).split())}") from None
    bad = [i for i, v in enumerate(out) if math.isnan(v) or v == math.inf]
    if bad:
        raise ExchangeError(f"{where}: {name}[{bad[0]}] is {out[bad[0]]} ({len(bad)} NaN/+inf value(s)); a "
                            f"logprob is a finite number <= 0 or -inf")
    return out


def row_from_dict(data: dict, source: str, position: int | str) -> ExchangeRow:
    """One row, checked; ExchangeError names the record (its sample_id, and `position`: 'row 3',
    'line 4', or an int taken as a row number)."""
    where = _where(source, f"row {position}" if isinstance(position, int) else position, data)
    if not isinstance(data, dict):
        raise ExchangeError(f"{where}: expected an object, got {type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ExchangeError(f"{where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - set(COLUMNS))
    if unknown:
        raise ExchangeError(f"{where}: unknown field(s) {', '.join(unknown)} (the schema's fields: docs/IMPORT.md)")
    values = dict(data)
    for name in _INTS + _OPT_INTS:
        v = values.get(name)
        if v is None and name in _OPT_INTS:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise ExchangeError(f"{where}: {name} must be an integer, got {v!r}")
    if values["step"] < 0:
        raise ExchangeError(f"{where}: step must be >= 0, got {values['step']}")
    for name in _OPT_FLOATS:
        v = values.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ExchangeError(f"{where}: {name} must be a number, got {v!r}")
        if v is not None:
            values[name] = float(v)
    for name in ("sample_id", "prompt_id", "logprob_semantics") + _OPT_STRS:
        v = values.get(name)
        if (v is not None or name not in _OPT_STRS) and not isinstance(v, str):
            raise ExchangeError(f"{where}: {name} must be a string, got {v!r}")
    if not values["sample_id"]:
        raise ExchangeError(f"{where}: sample_id must not be empty")
    if values["logprob_semantics"] not in SEMANTICS:
        raise ExchangeError(f"{where}: logprob_semantics must be raw or processed, got "
                            f"{values['logprob_semantics']!r}")
    for name in ("prompt_token_ids", "response_token_ids", "rollout_logprobs", "trainer_logprobs"):
        v = values[name]
        if v is None and name == "trainer_logprobs":
            continue
        if isinstance(v, np.ndarray) and v.ndim == 1:  # a reader's fp32 array
            continue
        if not isinstance(v, (list, tuple)) or any(isinstance(x, (list, tuple, dict, str)) for x in v):
            raise ExchangeError(f"{where}: {name} must be a flat list of numbers, got {str(v)[:60]}")
    try:
        values["prompt_token_ids"] = int32_values("row", "prompt_token_ids", values["prompt_token_ids"])
        values["response_token_ids"] = int32_values("row", "response_token_ids", values["response_token_ids"])
    except (RecordError, TypeError, ValueError) as e:  # ValueError: a nested or ragged list
        raise ExchangeError(f"{where}: {' '.join(str(e).split())}") from None
    n = len(values["response_token_ids"])
    for name in ("rollout_logprobs", "trainer_logprobs"):
        if name == "trainer_logprobs" and values[name] is None:
            continue
        values[name] = _logprobs(where, name, values[name])
        if len(values[name]) != n:
            raise ExchangeError(f"{where}: {len(values[name])} {name} for {n} response tokens (ragged record)")
    return ExchangeRow(**{k: values.get(k) for k in COLUMNS})


def check_rows(rows: list[ExchangeRow], source: str, positions: list[str] | None = None) -> list[ExchangeRow]:
    """Checks across rows: unique sample ids, one logprob semantics; returns the rows. `positions` names
    each row in messages (default 'row i')."""
    if not rows:
        raise ExchangeError(f"{source}: no records")
    positions = positions or [f"row {i}" for i in range(len(rows))]
    seen: dict[str, int] = {}
    first = rows[0].logprob_semantics
    for i, r in enumerate(rows):
        if r.sample_id in seen:
            raise ExchangeError(f"{source}: record {r.sample_id!r} ({positions[i]}) repeats the sample_id of "
                                f"{positions[seen[r.sample_id]]}")
        seen[r.sample_id] = i
        if r.logprob_semantics != first:
            raise ExchangeError(f"{source}: record {r.sample_id!r} ({positions[i]}) has {r.logprob_semantics} "
                                f"logprobs, the records before it {first}: mixed logprob semantics are never "
                                f"compared")
    return rows


# -- files ----------------------------------------------------------------------------------------------
def _kind(path: Path) -> str:
    if path.suffix == ".parquet":
        return "parquet"
    if path.suffix in (".jsonl", ".json"):
        return "jsonl"
    raise ExchangeError(f"{path}: expected a .parquet or .jsonl file")


def read_rows(path: str | Path) -> list[ExchangeRow]:
    """Every row of a schema file, checked (ExchangeError names the first bad record)."""
    path = Path(path)
    if not path.is_file():
        raise ExchangeError(f"{path}: no such file")
    if _kind(path) == "jsonl":
        dicts, positions = [], []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    dicts.append(json.loads(line))
                except ValueError as e:
                    raise ExchangeError(f"{path}: line {lineno} is not JSON ({e})") from None
                positions.append(f"line {lineno}")
    else:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file is one line
            raise ExchangeError(f"{path}: not a readable Parquet file ({' '.join(str(e).split())})") from None
        missing = [c for c in REQUIRED if c not in table.column_names]
        if missing:
            raise ExchangeError(f"{path}: missing column(s) {', '.join(missing)} (every record needs them)")
        dicts = table.to_pylist()
        positions = [f"row {i}" for i in range(len(dicts))]
    return check_rows([row_from_dict(d, str(path), at) for d, at in zip(dicts, positions)], str(path), positions)


def write_rows(rows: list[ExchangeRow], path: str | Path) -> Path:
    """Write rows as Parquet or JSONL (by the file's suffix); the file appears complete or not at all."""
    path = Path(path)
    kind = _kind(path)
    if path.exists():
        raise ExchangeError(f"{path} exists; export into a new file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".writing")
    dicts = [{c: getattr(r, c) for c in COLUMNS} for r in rows]
    try:
        if kind == "jsonl":
            with open(tmp, "w", encoding="utf-8") as f:
                for d in dicts:  # Python floats of fp32 values: repr reads back to the same bits
                    f.write(json.dumps(d, allow_nan=True) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(dicts, schema=arrow_schema()), tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
