"""Reward functions: DAPO's "Answer: N" last line, GSM8K's "#### N", the arithmetic task's answer, and
the worked arithmetic tasks' number after the last "Answer:", and the column tasks' sum as the working
writes it.

Each returns 1.0 for a correct final answer and 0.0 otherwise (no partial credit: the reward is the
task's own criterion, so reward curves compare across runs).
"""

from __future__ import annotations

import re

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"


def _normalize(num: str) -> str:
    num = num.replace(",", "").strip()
    if re.fullmatch(r"-?\d+\.0+", num):
        num = num.split(".")[0]
    return num.lstrip("+")


def dapo_reward(response: str, answer: str) -> float:
    """DAPO: the last non-empty line must be `Answer: N` with N equal to the ground truth."""
    lines = [ln.strip() for ln in response.strip().splitlines() if ln.strip()]
    if not lines:
        return 0.0
    m = re.fullmatch(rf"Answer:\s*\$?({_NUMBER})\$?\.?", lines[-1])
    return float(bool(m) and _normalize(m.group(1)) == _normalize(answer))


def gsm8k_reward(response: str, answer: str) -> float:
    """GSM8K: the number after the last `####`."""
    parts = response.split("####")
    if len(parts) < 2:
        return 0.0
    m = re.search(_NUMBER, parts[-1])
    return float(bool(m) and _normalize(m.group(0)) == _normalize(answer))


def arith_reward(response: str, answer: str) -> float:
    """Arithmetic task: the response's first number equals the answer."""
    m = re.search(_NUMBER, response)
    return float(bool(m) and _normalize(m.group(0)) == _normalize(answer))


def final_answer_reward(response: str, answer: str) -> float:
    """Worked tasks (add8w): the number right after the last `Answer:` (spaces between allowed) equals
    the answer. Nothing else is read: the working above it may be anything, and text after the number
    does not count."""
    _, marker, tail = response.rpartition("Answer:")
    if not marker:
        return 0.0
    m = re.match(rf"[ \t]*({_NUMBER})", tail)
    return float(bool(m) and _normalize(m.group(1)) == _normalize(answer))


_COLUMN_LINE = re.compile(r"(\d+): \d\+\d\+\d=\d+ write (\d) carry (\d)")


def working_sum_reward(response: str, answer: str) -> float:
    """Column tasks (add9c): the sum the working writes equals the answer. The working is the response's
    lines of the form "i: x+y+c=s write w carry k" (other lines are not read); they must be labelled 1, 2,
    ... in order, and the sum they write is the last line's carry followed by their written digits from
    the last line up. Only w and k are read, so a wrong "x+y+c=s" under the right digits still scores."""
    lines = [m for m in map(_COLUMN_LINE.fullmatch, response.strip().splitlines()) if m]
    if not lines or [int(m.group(1)) for m in lines] != list(range(1, len(lines) + 1)):
        return 0.0
    written = lines[-1].group(3) + "".join(m.group(2) for m in reversed(lines))
    return float(_normalize(answer).lstrip("-").isdigit() and int(written) == int(_normalize(answer)))


def ascii_share(response: str) -> float:
    """A shaping term, not a task reward: the share of the response's characters that are ASCII, a
    language-consistency reward for English prompts (in the spirit of DeepSeek-R1's: the share of the
    chain of thought in the prompt's language). 0.0 for an empty response. RunConfig.shaping weighs it."""
    return sum(c < "\x80" for c in response) / len(response) if response else 0.0


REWARDS = {"dapo": dapo_reward, "gsm8k": gsm8k_reward, "arith": arith_reward, "final_answer": final_answer_reward,
           "working_sum": working_sum_reward}
