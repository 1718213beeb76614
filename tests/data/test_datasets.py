"""rlkit.data's loaders on the real files of the data folder (tests/conftest.py's `data_dir`: $RLKIT_DATA or
the checkout's neighbouring shared/data), the prompt templates, and the arithmetic task's problems.

The counts and first rows are the files' own (their README lists sizes and hashes), so a loader that
drops, reorders or mis-parses rows fails here."""

import pytest

from rlkit.data import DataError, Problem, arith_problems, load_dapo, load_gsm8k, load_math500
from rlkit.data.datasets import DAPO_TEMPLATE, GSM8K_TEMPLATE
from rlkit.data.tasks import TASKS, task


@pytest.fixture(autouse=True)
def _data_folder(data_dir, monkeypatch):
    monkeypatch.setenv("RLKIT_DATA", str(data_dir))  # the loaders read the folder the tests check


def test_dapo_loads_every_unique_prompt_with_an_integer_answer():
    rows = load_dapo()
    assert len(rows) == 17_917 == len({p.prompt_id for p in rows})
    first = rows[0]
    assert (first.prompt_id, first.answer, first.source) == ("dapo-0", "34", "dapo")
    assert first.question.startswith("In triangle $ABC$, $\\sin \\angle A = \\frac{4}{5}$")
    assert all(int(p.answer) == int(p.answer.strip()) for p in rows[:500])
    assert [p.prompt_id for p in load_dapo(limit=3)] == ["dapo-0", "dapo-1", "dapo-2"]


def test_gsm8k_answers_are_the_number_after_the_marks():
    test = load_gsm8k("test")
    assert len(test) == 1_319 and len(load_gsm8k("train", limit=5)) == 5
    assert (test[0].prompt_id, test[0].answer, test[0].source) == ("gsm8k-test-0", "18", "gsm8k")
    assert test[0].question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert all("####" not in p.answer and "," not in p.answer for p in test)


def test_math500_keeps_latex_answers():
    rows = load_math500()
    assert len(rows) == 500
    assert (rows[0].prompt_id, rows[0].answer) == ("math500-0", "\\left( 3, \\frac{\\pi}{2} \\right)")


def test_bad_split_and_missing_folder_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="gsm8k split 'dev'; expected train or test"):
        load_gsm8k("dev")
    monkeypatch.setenv("RLKIT_DATA", str(tmp_path))
    with pytest.raises(DataError, match="data file not found: .*gsm8k/test.jsonl .*set RLKIT_DATA"):
        load_gsm8k("test")


def test_templates_wrap_the_question_by_source():
    dapo = Problem("d", "What is 1+1?", "2", "dapo")
    assert dapo.user_message() == DAPO_TEMPLATE.format(problem="What is 1+1?")
    assert dapo.user_message().startswith("Solve the following math problem step by step.")
    assert dapo.user_message().endswith("What is 1+1?\n\nRemember to put your answer on its own line after \"Answer:\".")
    gsm = Problem("g", "How many?", "3", "gsm8k")
    assert gsm.user_message() == GSM8K_TEMPLATE.format(problem="How many?") == (
        "How many?\nLet's think step by step and output the final answer after \"####\".")
    for source in ("math500", "arith"):  # no wrapper: the question is the message
        assert Problem("x", "Q?", "1", source).user_message() == "Q?"


def test_arith_problems_are_seeded_sums_of_small_operands():
    a, b = arith_problems(64, seed=5), arith_problems(64, seed=5)
    assert a == b and a != arith_problems(64, seed=6)
    for p in a:
        x, y = p.question.removeprefix("What is ").split("?")[0].split("+")
        assert 0 <= int(x) <= 4 and 0 <= int(y) <= 4 and p.answer == str(int(x) + int(y))
        assert p.question.endswith("? Reply with the number only.") and p.source == "arith"
    assert max(int(p.answer) for p in arith_problems(200, seed=1, max_operand=9)) > 8


def test_task_problems_depend_on_seed_and_step_only():
    arith = task("arith")
    assert arith.problems(3, 4, seed=1) == arith.problems(3, 4, seed=1) != arith.problems(4, 4, seed=1)
    dapo = task("dapo")
    step0, step1 = dapo.problems(0, 3, seed=0), dapo.problems(1, 3, seed=0)
    assert len({p.prompt_id for p in step0 + step1}) == 6  # consecutive steps take consecutive slices
    assert step0 == dapo.problems(0, 3, seed=0) != dapo.problems(0, 3, seed=1)
    assert {t: TASKS[t].default_max_tokens for t in TASKS} == {"arith": 6, "add2": 6, "add3": 8, "add8w": 192,
                                                               "add9c": 192, "gsm8k": 256, "dapo": 512}
    with pytest.raises(ValueError, match="unknown task 'mmlu'; choose one of arith, add2, add3, add8w, add9c, gsm8k, dapo"):
        task("mmlu")
