"""Loaders for the real data in the data folder: DAPO-Math-17k, GSM8K, MATH-500.

Every loader returns `Problem(prompt_id, question, answer, source)` items in file order, read offline
from the data folder (`rlkit.model.config.data_dir()`: $RLKIT_DATA). The prompt templates turn a question into the user message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlkit.model.config import data_dir

DAPO_TEMPLATE = ("Solve the following math problem step by step. The last line of your response should be of "
                 "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
                 "{problem}\n\nRemember to put your answer on its own line after \"Answer:\".")
GSM8K_TEMPLATE = ("{problem}\nLet's think step by step and output the final answer after \"####\".")


@dataclass(frozen=True)
class Problem:
    prompt_id: str
    question: str
    answer: str
    """What the reward checks the response against."""
    source: str
    demonstration: str = ""
    """The response a supervised warm start trains on (rlkit/train/warm_start.py; <|im_end|> follows it):
    a worked task's full working (rlkit.data.arith.worked_solution); empty: the answer."""

    def __post_init__(self) -> None:
        if not self.demonstration:
            object.__setattr__(self, "demonstration", self.answer)

    def user_message(self) -> str:
        if self.source == "dapo":
            return DAPO_TEMPLATE.format(problem=self.question)
        if self.source == "gsm8k":
            return GSM8K_TEMPLATE.format(problem=self.question)
        return self.question


class DataError(FileNotFoundError):
    """A data file that is missing, unreadable or not what its loader expects; one line naming the file."""


def _path(*parts: str) -> Path:
    p = data_dir().joinpath(*parts)
    if not p.is_file():
        raise DataError(f"data file not found: {p} (set RLKIT_DATA to the data folder)")
    return p


def _one_line(e: Exception) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


DAPO_COLUMNS = ("prompt", "reward_model", "extra_info")


def load_dapo(limit: int | None = None) -> list[Problem]:
    """DAPO-Math-17k (unique prompts): the bare problem and its integer answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _path("dapo-math-17k", "dapo_math_17k.parquet")
    try:
        names = pq.read_schema(path).names
        missing = [c for c in DAPO_COLUMNS if c not in names]
        if missing:
            raise DataError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names) or 'none'})")
        table = pq.read_table(path, columns=list(DAPO_COLUMNS))
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: not a readable parquet file ({_one_line(e)})") from None
    rows = table.slice(0, limit).to_pylist() if limit else table.to_pylist()
    out = []
    for i, row in enumerate(rows):
        try:
            content = row["prompt"][0]["content"]
            index = (row.get("extra_info") or {}).get("index", i)
            answer = row["reward_model"]["ground_truth"]
        except (KeyError, IndexError, TypeError) as e:
            raise DataError(f"{path}: row {i} is not a DAPO problem (prompt[0].content, "
                            f"reward_model.ground_truth): {_one_line(e)}") from None
        if not isinstance(content, str) or answer is None:
            raise DataError(f"{path}: row {i} has no problem text or no ground truth")
        out.append(Problem(f"dapo-{index}", content, str(answer), "dapo"))
    if not out:
        raise DataError(f"{path}: no problems in the file")
    return out


def _jsonl(path: Path, limit: int | None, fields: tuple[str, ...]) -> list[dict]:
    """The objects of a JSON-lines file, each with `fields` (strings); DataError names the line otherwise."""
    out = []
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if limit is not None and len(out) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise DataError(f"{path}: line {n} is not JSON ({e})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}: line {n} is not a JSON object")
                for name in fields:
                    if not isinstance(row.get(name), str):
                        raise DataError(f"{path}: line {n} has no {name!r} text field")
                out.append(row)
    except (OSError, UnicodeDecodeError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: cannot read the file ({_one_line(e)})") from None
    if not out:
        raise DataError(f"{path}: no problems in the file (it is empty)")
    return out


def load_gsm8k(split: str = "train", limit: int | None = None) -> list[Problem]:
    if split not in ("train", "test"):
        raise ValueError(f"gsm8k split {split!r}; expected train or test")
    rows = _jsonl(_path("gsm8k", f"{split}.jsonl"), limit, ("question", "answer"))
    return [Problem(f"gsm8k-{split}-{i}", r["question"], r["answer"].split("####")[-1].strip().replace(",", ""),
                    "gsm8k") for i, r in enumerate(rows)]


def load_math500(limit: int | None = None) -> list[Problem]:
    rows = _jsonl(_path("math500", "test.jsonl"), limit, ("problem", "answer"))
    return [Problem(f"math500-{i}", r["problem"], r["answer"], "math500") for i, r in enumerate(rows)]
