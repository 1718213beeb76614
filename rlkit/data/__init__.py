"""Data for the lab: real datasets from the data folder, prompt templates, rewards, the arithmetic task."""

from rlkit.data.arith import arith_problems, column_addition_problems, worked_addition_problems
from rlkit.data.datasets import DataError, Problem, load_dapo, load_gsm8k, load_math500
from rlkit.data.rewards import (REWARDS, arith_reward, dapo_reward, final_answer_reward, gsm8k_reward,
                                working_sum_reward)

__all__ = ["Problem", "DataError", "load_dapo", "load_gsm8k", "load_math500", "arith_problems",
           "worked_addition_problems", "column_addition_problems", "REWARDS", "dapo_reward", "gsm8k_reward",
           "arith_reward", "final_answer_reward", "working_sum_reward"]
