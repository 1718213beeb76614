"""The worked addition task (add8w): the working is right column by column, the reward reads only the final
answer, the held-out split is disjoint from training, and the responses are as long as designed (the
real Qwen3 tokenizer: 141-157 tokens with <|im_end|>). (The learning preset's task is add9c now,
tests/data/test_column_addition.py; add8w stays selectable.)"""

import random
import re

import pytest

from rlkit.config import learning_0_6b
from rlkit.data.arith import addition_problems, is_heldout, worked_addition_problems, worked_solution
from rlkit.data.rewards import final_answer_reward
from rlkit.data.tasks import task
from rlkit.model.tokenizer import chat_prompt_ids, load_tokenizer
from rlkit.warmstart import warmstart_0_6b

LINE = re.compile(r"(\d): (\d)\+(\d)\+(\d)=(\d+) write (\d) carry (\d)")
SHORTEST, LONGEST = 141, 157
"""The designed range of a response in tokens, <|im_end|> included: 8 column lines of 16 tokens + the
1-2 digits of the column sum, then "Answer:", a space and the 1-9 digits of the sum."""


def _check_working(a: int, b: int, text: str, digits: int = 8) -> None:
    """Every column line re-derived from a and b alone; the answer line is the sum."""
    *columns, last = text.split("\n")
    assert len(columns) == digits and last == f"Answer: {a + b}", text
    carry, written = 0, []
    for i, line in enumerate(columns, 1):
        m = LINE.fullmatch(line)
        assert m, f"column {i} is not of the form 'i: x+y+c=s write w carry k': {line!r}"
        col, x, y, c, s, w, k = map(int, m.groups())
        assert (col, x, y, c) == (i, a // 10 ** (i - 1) % 10, b // 10 ** (i - 1) % 10, carry), (line, a, b)
        assert (s, w, k) == (x + y + c, (x + y + c) % 10, (x + y + c) // 10), line
        carry = k
        written.append(str(w))
    assert int(str(carry) + "".join(reversed(written))) == a + b  # the answer is the working read back


@pytest.mark.parametrize("a, b", [(0, 0), (99_999_999, 1), (1, 99_999_999), (99_999_999, 99_999_999),
                                  (12_345_678, 87_654_321), (50_000_000, 50_000_000), (7, 5)])
def test_the_working_is_right_at_the_edges(a, b):
    _check_working(a, b, worked_solution(a, b, 8))


def test_the_working_is_right_for_random_pairs_and_reads_as_designed():
    rng = random.Random(17)
    for _ in range(2000):
        a, b = rng.randint(0, 10**8 - 1), rng.randint(0, 10**8 - 1)
        _check_working(a, b, worked_solution(a, b, 8))
    for digits in (1, 3, 9):
        _check_working(10**digits - 1, 1, worked_solution(10**digits - 1, 1, digits), digits)
    assert worked_solution(99_999_999, 1, 8) == "\n".join(
        ["1: 9+1+0=10 write 0 carry 1"] + [f"{i}: 9+0+1=10 write 0 carry 1" for i in range(2, 9)]
        + ["Answer: 100000000"])  # every column carries
    assert worked_solution(0, 0, 8) == "\n".join([f"{i}: 0+0+0=0 write 0 carry 0" for i in range(1, 9)]
                                                + ["Answer: 0"])  # none does
    for wrong in ("3: 9+0+1=10 write 0 carry 0", "3: 9+0+0=9 write 9 carry 0"):  # a carry dropped
        with pytest.raises(AssertionError):
            _check_working(99_999_999, 1, worked_solution(99_999_999, 1, 8).replace("3: 9+0+1=10 write 0 carry 1",
                                                                                    wrong))
    with pytest.raises(ValueError, match="operands must lie in 0..99999999"):
        worked_solution(10**8, 0, 8)


def test_the_problems_are_the_addition_draws_with_their_working_and_split_like_them():
    train = worked_addition_problems(300, seed=3, digits=8)
    plain = addition_problems(300, seed=3, digits=8)
    held = task("add8w").heldout(200)
    assert train == worked_addition_problems(300, seed=3, digits=8) and held == task("add8w").heldout(200)
    for w, p in zip(train, plain):  # the same operand pairs as the bare-sum task, in the same order
        a, b = map(int, p.question.removeprefix("What is ").split("?")[0].split("+"))
        assert w.question == (f'What is {a}+{b}? Work column by column from the units up, then give the sum '
                              f'as "Answer: N".')
        assert (w.answer, w.source, w.demonstration) == (str(a + b), "add8w", worked_solution(a, b, 8))
        assert not is_heldout(a, b)
    for p in held:
        a, b = map(int, p.question.removeprefix("What is ").split("?")[0].split("+"))
        assert is_heldout(a, b) and p.demonstration == worked_solution(a, b, 8)
    train_pairs = {p.question for p in train} | {p.question for p in worked_addition_problems(2000, seed=4, digits=8)}
    assert not train_pairs & {p.question for p in held}
    assert len({p.prompt_id for p in train + held}) == 500
    assert task("add8w").problems(5, 8, seed=1) == worked_addition_problems(8, seed=1 * 1_000_003 + 5, digits=8)
    assert task("add8w").reward is final_answer_reward
    # a bare-answer problem's demonstration is its answer (what the warm start trained on before)
    assert [p.demonstration for p in plain[:20]] == [p.answer for p in plain[:20]]


def test_the_reward_reads_the_final_answer_and_never_the_working():
    a, b = 48_213_957, 99_004_316
    good = worked_solution(a, b, 8)
    assert final_answer_reward(good, str(a + b)) == 1.0
    wrong_answer = good.replace(f"Answer: {a + b}", f"Answer: {a + b + 10}")
    assert wrong_answer != good and final_answer_reward(wrong_answer, str(a + b)) == 0.0  # neat working, wrong sum
    no_answer = good.rsplit("\n", 1)[0]
    assert "Answer" not in no_answer and final_answer_reward(no_answer, str(a + b)) == 0.0
    assert final_answer_reward(f"Answer: {a + b}", str(a + b)) == 1.0             # no working at all
    assert final_answer_reward(f"1: 0+0+0=7 junk\nAnswer: {a + b}", str(a + b)) == 1.0  # a wrong working
    assert final_answer_reward(good + "\nAnswer: 5", str(a + b)) == 0.0             # the last Answer: counts


def test_a_response_is_as_long_as_designed_in_qwen3_tokens():
    tok = load_tokenizer()

    def tokens(a, b):
        return len(tok(worked_solution(a, b, 8), add_special_tokens=False)["input_ids"]) + 1  # + <|im_end|>

    assert tokens(0, 0) == SHORTEST and tokens(99_999_999, 99_999_999) == LONGEST
    rng = random.Random(5)
    pairs = [(rng.randint(0, 10**8 - 1), rng.randint(0, 10**8 - 1)) for _ in range(400)]
    pairs += [(rng.randint(0, 10**rng.randint(0, 8) - 1), rng.randint(0, 10**rng.randint(0, 8) - 1))
              for _ in range(200)]  # short operands too
    lengths = []
    for a, b in pairs:
        n = tokens(a, b)
        sums = worked_solution(a, b, 8).split("\n")
        designed = sum(16 + len(line.split("=")[1].split()[0]) for line in sums[:-1]) + 3 + len(str(a + b)) + 1
        assert n == designed and SHORTEST <= n <= LONGEST, (a, b, n, designed)
        lengths.append(n)
    mean = sum(lengths[:400]) / 400
    assert 150 < mean < 154, mean  # uniform 8-digit pairs: 152 on average
    # the budget: the longest response with margin, under the engines' max_model_len with the longest prompt
    budget = task("add8w").default_max_tokens
    longest_prompt = len(chat_prompt_ids('What is 99999999+99999999? Work column by column from the units up, '
                                         'then give the sum as "Answer: N".', tok))
    assert longest_prompt == 52 and budget >= LONGEST + 32
    for engine in (learning_0_6b().engine, warmstart_0_6b().engine):  # the learning presets still fit add8w
        assert longest_prompt + budget <= engine.max_model_len
        assert engine.num_pages >= engine.max_num_seqs * -(-engine.max_model_len // engine.page_size)
