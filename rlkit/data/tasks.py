"""RL tasks: which problems a step uses (deterministic in seed and step), their reward, default lengths."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Callable

from rlkit.data.arith import arith_problems
from rlkit.data.datasets import Problem, load_dapo, load_gsm8k
from rlkit.data.rewards import arith_reward, dapo_reward, gsm8k_reward


@functools.lru_cache(maxsize=4)
def _shuffled(name: str, seed: int) -> tuple[Problem, ...]:
    items = load_dapo() if name == "dapo" else load_gsm8k("train")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return tuple(items[i] for i in order)


@dataclass(frozen=True)
class Task:
    name: str
    reward: Callable[[str, str], float]
    default_max_tokens: int

    def prepare(self, seed: int) -> None:
        """Load and check the task's data now (DataError naming the file and what is wrong), so a run
        refuses bad data before it creates anything; problems() then reads the cached pool."""
        if self.name != "arith":
            _shuffled(self.name, seed)

    def problems(self, step: int, n: int, seed: int) -> list[Problem]:
        """The n problems of `step`: the same on every run with this seed (resume relies on it)."""
        if self.name == "arith":
            return arith_problems(n, seed=seed * 1_000_003 + step)
        pool = _shuffled(self.name, seed)
        return [pool[(step * n + i) % len(pool)] for i in range(n)]


TASKS = {
    "arith": Task("arith", arith_reward, 6),
    "gsm8k": Task("gsm8k", gsm8k_reward, 256),
    "dapo": Task("dapo", dapo_reward, 512),
}


def task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]
