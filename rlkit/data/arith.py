"""Synthetic arithmetic tasks with a checked answer, drawn from seeded generators.

- `arith_problems`: "a+b" with operands 0..4 by default (sums 0..8, one answer token). The tiny model
  learns it on the CPU in minutes; rlkit/train/warm_start.py gives it a brief supervised start first.
- `addition_problems`: "a+b" with `digits`-digit operands (0..10**digits - 1), the warm-started
  learning runs' task (tasks "add2", "add3"). Qwen3's tokenizer splits numbers into single digits, so
  the answer is digits + 1 tokens at most, written most significant digit first: the model must carry
  before it writes the digit the carry lands in. With 2 digits about 45 % of problems carry out of the
  units and the answer has 1-3 digits; a model learns the units digit (a function of two tokens) long
  before the carried tens and hundreds, so its exact-answer reward climbs through 0.2-0.6 on the way
  up rather than jumping from 0 to 1 (the supervised phase stops inside that band).

The user message is "What is a+b? Reply with the number only." and the reward is 1 when the response's
first number is the sum (rlkit.data.rewards.arith_reward).

Held-out split: one operand pair in HELDOUT_EVERY (by a CRC of "a+b") is held out. `split="train"` never
draws a held-out pair and `split="heldout"` draws only those, so a held-out reward measures answers to
problems the model never trained on, however long it trains (2 digits: 10,000 pairs, ~500 held out).
"""

from __future__ import annotations

import random
import zlib

from rlkit.data.datasets import Problem

HELDOUT_EVERY = 20
"""One operand pair in this many is held out of training (addition_problems)."""
SPLITS = ("train", "heldout")


def arith_problems(n: int, seed: int, max_operand: int = 4) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append(Problem(f"arith-{seed}-{i}", _question(a, b), str(a + b), "arith"))
    return out


def is_heldout(a: int, b: int) -> bool:
    """Whether the pair (a, b) belongs to the held-out split (the same answer on every machine)."""
    return zlib.crc32(f"{a}+{b}".encode()) % HELDOUT_EVERY == 0


def addition_problems(n: int, seed: int, split: str = "train", *, digits: int) -> list[Problem]:
    """n problems "a+b" with a, b uniform in 0..10**digits - 1, from the given split (seeded)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    if not 1 <= digits <= 9:
        raise ValueError(f"digits {digits}: expected 1..9")
    rng = random.Random(seed)
    top = 10**digits - 1
    want_heldout = split == "heldout"
    out = []
    while len(out) < n:
        a, b = rng.randint(0, top), rng.randint(0, top)
        if is_heldout(a, b) == want_heldout:
            out.append(Problem(f"add{digits}-{split}-{seed}-{len(out)}", _question(a, b), str(a + b),
                               f"add{digits}"))
    return out


def _question(a: int, b: int) -> str:
    return f"What is {a}+{b}? Reply with the number only."
