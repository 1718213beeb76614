"""RL tasks: which problems a step uses (deterministic in seed and step), their reward, default lengths,
and a fixed held-out set to measure the policy on."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Callable

from rlkit.data.arith import addition_problems, arith_problems, column_addition_problems, worked_addition_problems
from rlkit.data.datasets import Problem, load_dapo, load_gsm8k
from rlkit.data.rewards import arith_reward, dapo_reward, final_answer_reward, gsm8k_reward, working_sum_reward

HELDOUT_SEED = 2_718_281
"""The seed of every task's held-out set: the same problems for every run and every arm."""


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
    generate: Callable[[int, int, str], list[Problem]] | None = None
    """A synthetic task's problems: (n, seed, split "train" | "heldout") -> problems; None for a dataset."""

    def prepare(self, seed: int) -> None:
        """Load and check the task's data now (DataError naming the file and what is wrong), so a run
        refuses bad data before it creates anything; problems() then reads the cached pool."""
        if self.generate is None:
            _shuffled(self.name, seed)

    def problems(self, step: int, n: int, seed: int) -> list[Problem]:
        """The n problems of `step`: the same on every run with this seed (resume relies on it)."""
        if self.generate is not None:
            return self.generate(n, seed * 1_000_003 + step, "train")
        pool = _shuffled(self.name, seed)
        return [pool[(step * n + i) % len(pool)] for i in range(n)]

    def heldout(self, n: int) -> list[Problem]:
        """A fixed held-out set of n problems (never drawn by `problems()` for the addition tasks and
        GSM8K; for "arith", whose 25 operand pairs all occur in training, a fixed set of them)."""
        if self.generate is not None:
            return self.generate(n, HELDOUT_SEED, "heldout")
        if self.name == "gsm8k":
            test = load_gsm8k("test")
            return list(test[:n])
        raise ValueError(f"task {self.name!r} has no held-out split (choose "
                         f"{', '.join(k for k, t in TASKS.items() if t.generate)} or gsm8k)")


def _arith(n: int, seed: int, split: str) -> list[Problem]:
    return arith_problems(n, seed=seed)  # 25 pairs: no split to hold out


TASKS = {
    "arith": Task("arith", arith_reward, 6, _arith),
    "add2": Task("add2", arith_reward, 6, functools.partial(addition_problems, digits=2)),
    "add3": Task("add3", arith_reward, 8, functools.partial(addition_problems, digits=3)),
    "add8w": Task("add8w", final_answer_reward, 192, functools.partial(worked_addition_problems, digits=8)),
    "add9c": Task("add9c", working_sum_reward, 192, functools.partial(column_addition_problems, digits=9)),
    "gsm8k": Task("gsm8k", gsm8k_reward, 256),
    "dapo": Task("dapo", dapo_reward, 512),
}
"""arith: single-digit sums (the tiny CPU lab); add2 / add3: two- and three-digit addition with carries,
answered by the bare sum; add8w: eight-digit addition answered with its column-by-column working (141-157
tokens; 192 leaves 35 tokens of margin); add9c: nine-digit addition worked from the prompt's labelled
column pairs (153-162 tokens), the learning runs' task (rlkit/data/arith.py says why);
gsm8k and dapo: the datasets."""


def task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]
