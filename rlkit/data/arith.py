"""A small synthetic arithmetic task that the tiny model can learn on the CPU in minutes.

Problems are "a+b" with operands 0..4 by default (sums 0..8, one answer token), drawn from a seeded
generator; the user message is
"What is a+b? Reply with the number only." and the reward is 1 when the response's first number is the
sum. rlkit/train/warm_start.py gives the model a brief supervised start on the same distribution, so
its reward begins above zero and RL has something to improve.
"""

from __future__ import annotations

import random

from rlkit.data.datasets import Problem


def arith_problems(n: int, seed: int, max_operand: int = 4) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append(Problem(f"arith-{seed}-{i}", f"What is {a}+{b}? Reply with the number only.", str(a + b),
                           "arith"))
    return out
