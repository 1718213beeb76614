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
    source: str

    def user_message(self) -> str:
        if self.source == "dapo":
            return DAPO_TEMPLATE.format(problem=self.question)
        if self.source == "gsm8k":
            return GSM8K_TEMPLATE.format(problem=self.question)
        return self.question


class DataError(FileNotFoundError):
    pass


def _path(*parts: str) -> Path:
    p = data_dir().joinpath(*parts)
    if not p.is_file():
        raise DataError(f"data file not found: {p} (set RLKIT_DATA to the data folder)")
    return p


def load_dapo(limit: int | None = None) -> list[Problem]:
    """DAPO-Math-17k (unique prompts): the bare problem and its integer answer."""
    import pyarrow.parquet as pq

    table = pq.read_table(_path("dapo-math-17k", "dapo_math_17k.parquet"),
                          columns=["prompt", "reward_model", "extra_info"])
    rows = table.slice(0, limit).to_pylist() if limit else table.to_pylist()
    out = []
    for i, row in enumerate(rows):
        content = row["prompt"][0]["content"]
        index = (row.get("extra_info") or {}).get("index", i)
        out.append(Problem(f"dapo-{index}", content, str(row["reward_model"]["ground_truth"]), "dapo"))
    return out


def _jsonl(path: Path, limit: int | None):
    out = []
    with path.open() as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            if line.strip():
                out.append(json.loads(line))
    return out


def load_gsm8k(split: str = "train", limit: int | None = None) -> list[Problem]:
    if split not in ("train", "test"):
        raise ValueError(f"gsm8k split {split!r}; expected train or test")
    rows = _jsonl(_path("gsm8k", f"{split}.jsonl"), limit)
    return [Problem(f"gsm8k-{split}-{i}", r["question"], r["answer"].split("####")[-1].strip().replace(",", ""),
                    "gsm8k") for i, r in enumerate(rows)]


def load_math500(limit: int | None = None) -> list[Problem]:
    rows = _jsonl(_path("math500", "test.jsonl"), limit)
    return [Problem(f"math500-{i}", r["problem"], str(r["answer"]), "math500") for i, r in enumerate(rows)]
