"""Synthetic arithmetic tasks with a checked answer, drawn from seeded generators.

- `arith_problems`: "a+b" with operands 0..4 by default (sums 0..8, one answer token). The tiny model
  learns it on the CPU in minutes; rlkit/train/warm_start.py gives it a brief supervised start first.
- `addition_problems`: "a+b" with `digits`-digit operands (0..10**digits - 1), the warm-started
  learning runs' task (tasks "add2", "add3"). Qwen3's tokenizer splits numbers into single digits, so
  the answer is digits + 1 tokens at most, written most significant digit first: the model must carry
  before it writes the digit the carry lands in. With 2 digits about 45 % of problems carry out of the
  units and the answer has 1-3 digits; a model learns the units digit (a function of two tokens) long
  before the carried tens and hundreds, so its exact-answer reward climbs through 0.2-0.6 on the way
  up rather than jumping from 0 to 1 (the supervised phase stops inside that band). The user message
  is "What is a+b? Reply with the number only." and the reward is 1 when the response's first number is
  the sum (rlkit.data.rewards.arith_reward).
- `worked_addition_problems`: the same draw of "a+b", answered with its working: task "add8w" (8-digit
  operands, "w" for worked), the learning runs' long-response task. Issue 17 asks the strict arm to
  compare >= 10 M response tokens in 300 steps; at 256 samples a step that needs > 130 tokens a
  response, which a bare sum (<= 10 tokens) is far from. The warm start trains on the working
  (`worked_solution`, the Problem's demonstration): one line per column from the units up,

      i: x+y+c=s write w carry k      (column i, 1 = units; digits x of a and y of b, 0 past a number's
                                       length; c the incoming carry; s = x+y+c; w = s mod 10; k = s div 10)

  then "Answer: a+b". Qwen3's tokenizer writes every digit as a token, so a column line is 16 tokens
  (its newline included) + the 1-2 digits of s, and the answer line 3 + the digits of the sum: with
  8 digits and <|im_end|>, 141 (0+0) to 157 tokens, 152 on average over uniform pairs (measured with
  the real tokenizer in tests/data/test_worked_addition.py). Each line depends on two prompt digits and
  the line before it, so a model can learn it column by column; the answer is the written digits read
  back in reverse, behind the last carry. The reward reads only the number after the last "Answer:"
  (rlkit.data.rewards.final_answer_reward), never the working: a wrong sum under a neat working scores 0,
  and RL is free to change the working.

- `column_addition_problems`: the same draw again, the prompt listing each column's digit pair under the
  label its working line starts with ("Add by columns, carrying, from the units up: 1: 9+2, 2: 0+0, ...")
  and the demonstration the column lines alone (`column_solution`): task "add9c", the learning runs'
  task. Why: on add8w a model must find column i's digits in "a+b" by counting positions back from the
  "+", which a 0.6b shape from its seeded init had not learnt after 151 supervised steps on the H200
  (loss 0.35, held-out reward 0.000: the working's form, not its digits). Here the line "i: x+y" finds
  "i:" in the prompt and copies what follows (a content match), the carry comes from the line above and
  the rest is the line's own arithmetic; on the H200 the held-out reward rose 0.000 -> 0.105 -> 0.531 at
  supervised steps 240, 260, 280 (lab/LOG.md). With 9 columns a response is 153-162 tokens (<|im_end|>
  included), ~157 on average, and the prompt 95. The reward is the sum the working writes
  (rlkit.data.rewards.working_sum_reward: the last carry, then the written digits from the last column
  up), so there is no read-back line to learn and nothing else is scored.

Held-out split: one operand pair in HELDOUT_EVERY (by a CRC of "a+b") is held out. `split="train"` never
draws a held-out pair and `split="heldout"` draws only those, so a held-out reward measures answers to
problems the model never trained on, however long it trains (2 digits: 10,000 pairs, ~500 held out;
the worked tasks split their pairs the same way).
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


def _pairs(n: int, seed: int, split: str, digits: int) -> list[tuple[int, int]]:
    """n operand pairs uniform in 0..10**digits - 1 from the given split (seeded)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    if not 1 <= digits <= 9:  # worked solutions: a column number stays one token
        raise ValueError(f"digits {digits}: expected 1..9")
    rng = random.Random(seed)
    top = 10**digits - 1
    want_heldout = split == "heldout"
    out = []
    while len(out) < n:
        a, b = rng.randint(0, top), rng.randint(0, top)
        if is_heldout(a, b) == want_heldout:
            out.append((a, b))
    return out


def addition_problems(n: int, seed: int, split: str = "train", *, digits: int) -> list[Problem]:
    """n problems "a+b" with a, b uniform in 0..10**digits - 1, from the given split (seeded)."""
    return [Problem(f"add{digits}-{split}-{seed}-{i}", _question(a, b), str(a + b), f"add{digits}")
            for i, (a, b) in enumerate(_pairs(n, seed, split, digits))]


def column_lines(a: int, b: int, digits: int) -> list[str]:
    """One line "i: x+y+c=s write w carry k" a column of a+b, from the units up, over `digits` columns."""
    if not (0 <= a < 10**digits and 0 <= b < 10**digits):
        raise ValueError(f"{a}+{b}: operands must lie in 0..{10**digits - 1}")
    lines, carry = [], 0
    for i in range(digits):
        x, y = a // 10**i % 10, b // 10**i % 10
        s = x + y + carry
        lines.append(f"{i + 1}: {x}+{y}+{carry}={s} write {s % 10} carry {s // 10}")
        carry = s // 10
    return lines


def worked_solution(a: int, b: int, digits: int) -> str:
    """The column-by-column solution of a+b over `digits` columns, ending with the line "Answer: a+b"."""
    return "\n".join(column_lines(a, b, digits) + [f"Answer: {a + b}"])


def column_solution(a: int, b: int, digits: int) -> str:
    """The column lines alone: the sum is what they write (rlkit.data.rewards.working_sum_reward)."""
    return "\n".join(column_lines(a, b, digits))


def worked_addition_problems(n: int, seed: int, split: str = "train", *, digits: int) -> list[Problem]:
    """As addition_problems (the same pairs for the same seed and split), asking for the working; the
    Problem's demonstration is `worked_solution`."""
    return [Problem(f"add{digits}w-{split}-{seed}-{i}", _worked_question(a, b), str(a + b), f"add{digits}w",
                    demonstration=worked_solution(a, b, digits))
            for i, (a, b) in enumerate(_pairs(n, seed, split, digits))]


def column_addition_problems(n: int, seed: int, split: str = "train", *, digits: int) -> list[Problem]:
    """As addition_problems (the same pairs for the same seed and split), the prompt listing each column's
    digit pair under the label its working line starts with; the Problem's demonstration is
    `column_solution` and the answer is the sum."""
    return [Problem(f"add{digits}c-{split}-{seed}-{i}", _columns_question(a, b, digits), str(a + b),
                    f"add{digits}c", demonstration=column_solution(a, b, digits))
            for i, (a, b) in enumerate(_pairs(n, seed, split, digits))]


def _question(a: int, b: int) -> str:
    return f"What is {a}+{b}? Reply with the number only."


def _worked_question(a: int, b: int) -> str:
    return f'What is {a}+{b}? Work column by column from the units up, then give the sum as "Answer: N".'


def _columns_question(a: int, b: int, digits: int) -> str:
    pairs = ", ".join(f"{i + 1}: {a // 10**i % 10}+{b // 10**i % 10}" for i in range(digits))
    return f"Add by columns, carrying, from the units up: {pairs}."
