"""The reward functions on answers whose reward is known by hand: the task's own criterion, 1.0 or 0.0."""

import pytest

from rlkit.data.rewards import REWARDS, arith_reward, ascii_share, dapo_reward, final_answer_reward, gsm8k_reward, working_sum_reward


@pytest.mark.parametrize("response, answer, expected", [
    ("Some work.\nAnswer: 34", "34", 1.0),
    ("Answer: 34\n\n  \n", "34", 1.0),                  # trailing blank lines do not count
    ("Answer: $34$", "34", 1.0),                          # dollar-wrapped
    ("Answer: 34.", "34", 1.0),                           # a final period
    ("Answer:34", "34", 1.0),
    ("Answer: 1,234", "1234", 1.0),                       # thousands separators
    ("Answer: 5.00", "5", 1.0),                           # an integer written with zero decimals
    ("Answer: -7", "-7", 1.0),
    ("Answer: 35", "34", 0.0),                            # wrong number
    ("Answer: 34\nbut maybe 35", "34", 0.0),              # not the last line
    ("The answer is 34", "34", 0.0),                      # no "Answer:" line
    ("answer: 34", "34", 0.0),                            # the marker is case-sensitive
    ("Answer: 34 apples", "34", 0.0),                     # nothing may follow the number
    ("Answer: 5.5", "5", 0.0),
    ("", "34", 0.0),
    ("\n \n", "34", 0.0),
])
def test_dapo_reward(response, answer, expected):
    assert dapo_reward(response, answer) == expected


@pytest.mark.parametrize("response, answer, expected", [
    ("16 - 3 - 4 = 9, 9 * 2 = 18\n#### 18", "18", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("#### 3 #### 4", "4", 1.0),                          # the last marker counts
    ("#### 3 #### 4", "3", 0.0),
    ("#### $18 dollars", "18", 1.0),                      # the first number after the marker
    ("the answer is 18", "18", 0.0),                      # no marker
    ("####", "18", 0.0),                                  # a marker without a number
    ("#### 18.0", "18", 1.0),
    ("#### -2", "2", 0.0),
])
def test_gsm8k_reward(response, answer, expected):
    assert gsm8k_reward(response, answer) == expected


@pytest.mark.parametrize("response, answer, expected", [
    ("7", "7", 1.0),
    ("7<|im_end|>", "7", 1.0),
    ("The sum is 7.", "7", 1.0),
    ("3+4=7", "7", 0.0),                                  # the first number is 3
    ("8", "7", 0.0),
    ("seven", "7", 0.0),
    ("", "7", 0.0),
    ("07", "7", 0.0),                                     # not normalized: a different string
])
def test_arith_reward(response, answer, expected):
    assert arith_reward(response, answer) == expected


@pytest.mark.parametrize("response, answer, expected", [
    ("1: 3+4+0=7 write 7 carry 0\nAnswer: 7", "7", 1.0),
    ("Answer: 7", "7", 1.0),                              # the working is never read
    ("1: 3+4+0=8 write 8 carry 0\nAnswer: 7", "7", 1.0),  # ... not even a wrong one
    ("1: 3+4+0=7 write 7 carry 0\nAnswer: 8", "7", 0.0),  # a right working, a wrong answer
    ("1: 3+4+0=7 write 7 carry 0\n7", "7", 0.0),          # no "Answer:"
    ("Answer: 7\nAnswer: 8", "7", 0.0),                   # the last "Answer:" counts
    ("Answer: 8\nAnswer: 7", "7", 1.0),
    ("Answer:7", "7", 1.0),
    ("Answer: 7<|im_end|>", "7", 1.0),
    ("Answer: 7 and more text", "7", 1.0),                # what follows the number is not read
    ("Answer: 70", "7", 0.0),
    ("Answer: 07", "7", 0.0),                             # not normalized: a different string
    ("Answer:\n7", "7", 0.0),                             # the number must follow on the line
    ("Answer: seven", "7", 0.0),
    ("answer: 7", "7", 0.0),                              # the marker is case-sensitive
    ("", "7", 0.0),
])
def test_final_answer_reward(response, answer, expected):
    assert final_answer_reward(response, answer) == expected


def test_ascii_share_counts_characters():
    assert ascii_share("") == 0.0
    assert ascii_share("abc") == 1.0
    assert ascii_share("ab\u00e9\u4e2d") == 0.5  # two of four characters are ASCII
    assert ascii_share("\u4e2d\u6587") == 0.0


def test_reward_table_names_each_task():
    assert REWARDS == {"dapo": dapo_reward, "gsm8k": gsm8k_reward, "arith": arith_reward,
                       "final_answer": final_answer_reward, "working_sum": working_sum_reward}
