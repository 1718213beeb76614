"""Bad values, bad data and damaged stores are refused first, in one line, leaving nothing behind.

`rlkit run` checks every value (max-tokens within the model's length, a finite temperature > 0, a device
that exists) and loads the task's data before it creates the run directory; `rlkit report` checks the
store's integrity and refuses a damaged one. The commands run in this process (`rlkit.cli.main`), so no
model is built for a refusal and the tests take seconds.
"""

from __future__ import annotations

import json
import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.cli import main
from rlkit.data import tasks
from rlkit.timeline import RunStore
from tests.timeline.fakes import initial, make_step

SMALL = ["--steps", "2", "--prompts", "2", "--samples", "2", "--warm-start", "0", "--no-progress"]


def refused(capsys, argv: list[str], needle: str, code: int = 2) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == code, (rc, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    return err


def refused_by_parser(capsys, argv: list[str], needle: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


# -- 6. values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, needle", [
    (["--max-tokens", "99999999999999999999"], "expected an integer <= 2147483647"),
    (["--temperature", "inf"], "expected a finite number"),
    (["--temperature", "nan"], "expected a finite number"),
    (["--temperature", "0"], "expected a number > 0"),
    (["--steps", "-1"], "expected an integer >= 1"),
    (["--trainer-cp", "0"], "expected an integer >= 1"),
])
def test_the_parser_refuses_unbounded_values(tmp_path, capsys, flags, needle):
    refused_by_parser(capsys, ["run", "--run-dir", str(tmp_path / "r"), *SMALL, *flags], needle)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, needle", [
    (["--max-tokens", "5000"], "max_tokens 5000: a sequence holds at most"),
    (["--device", "bogus"], "device 'bogus' is not a device name"),
    (["--device", "cuda:99"], "device 'cuda:99'"),
    (["--device", "meta"], "rlkit runs on cpu or cuda"),
    (["--trainer", "megatron", "--runner", "ray", "--trainer-tp", "3", "--trainer-cp", "2"],
     "trainer layout TP 3 x CP 2 x PP 1 for tiny: TP 3 does not divide num_key_value_heads=2"),
    (["--trainer", "megatron", "--runner", "ray", "--trainer-pp", "4"],
     "trainer layout TP 1 x CP 1 x PP 4 for tiny: PP 4 does not divide num_hidden_layers=2"),
])
def test_values_the_run_cannot_use_are_refused_before_anything_is_created(tmp_path, capsys, flags, needle):
    """Issue 21 case 6: --device bogus left a run.sqlite behind (the same --run-dir was then 'not empty'),
    and --max-tokens was capped silently."""
    refused(capsys, ["run", "--run-dir", str(tmp_path / "r"), *SMALL, *flags], needle)
    assert not (tmp_path / "r").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(capsys, ["run", "--run-dir", str(empty), *SMALL, *flags], needle)
    assert list(empty.iterdir()) == [], "a refused command left something in the run directory"


# -- 7. data -----------------------------------------------------------------------------------------
@pytest.fixture
def data(tmp_path, monkeypatch):
    """An RLKIT_DATA folder the test fills; the task pools are reloaded from it."""
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "dapo-math-17k").mkdir()
    monkeypatch.setenv("RLKIT_DATA", str(root))
    tasks._shuffled.cache_clear()
    yield root
    tasks._shuffled.cache_clear()


GSM8K = "gsm8k/train.jsonl"


@pytest.mark.parametrize("content, needle", [
    ("", "no problems in the file (it is empty)"),
    ('{"q": "1+1?", "answer": "#### 2"}\n', "line 1 has no 'question' text field"),
    ('{"question": "1+1?", "answer": "#### 2"}\n{not json\n', "line 2 is not JSON"),
    ('["question"]\n', "line 1 is not a JSON object"),
])
def test_bad_gsm8k_data_fails_first_naming_the_file(tmp_path, capsys, data, content, needle):
    """Issue 21 case 7: an empty file gave ZeroDivisionError at step 0, a missing column KeyError, each
    after the store was created, the model built and the warm start run."""
    (data / GSM8K).write_text(content)
    err = refused(capsys, ["run", "--run-dir", str(tmp_path / "r"), "--task", "gsm8k", *SMALL], needle)
    assert str(data / GSM8K) in err
    assert not (tmp_path / "r").exists()


def _dapo_table(**columns) -> pa.Table:
    return pa.table(columns)


def test_corrupt_or_malformed_parquet_fails_first_naming_the_file(tmp_path, capsys, data):
    path = data / "dapo-math-17k" / "dapo_math_17k.parquet"
    good = _dapo_table(prompt=[[{"content": "What is 1+1?", "role": "user"}]] * 64,
                       reward_model=[{"ground_truth": "2"}] * 64, extra_info=[{"index": 1}] * 64)
    pq.write_table(good, path, compression="snappy")
    raw = bytearray(path.read_bytes())
    raw[8:len(raw) // 2] = bytes(len(raw) // 2 - 8)  # zero the pages, keep the footer: a damaged file
    path.write_bytes(bytes(raw))
    run = ["run", "--run-dir", str(tmp_path / "r"), "--task", "dapo", *SMALL]
    err = refused(capsys, run, "not a readable parquet file")
    assert str(path) in err and not (tmp_path / "r").exists()
    pq.write_table(_dapo_table(prompt=good.column("prompt"), extra_info=good.column("extra_info")), path)
    refused(capsys, run, "no column 'reward_model'")
    path.write_bytes(b"")
    refused(capsys, run, "not a readable parquet file")
    assert not (tmp_path / "r").exists()


# -- report: integrity -------------------------------------------------------------------------------
@pytest.fixture
def store_dir(tmp_path):
    store = RunStore.create(tmp_path / "run", {"steps": 4, "task": "fake"})
    store.commit_initial(*initial())
    for step in range(3):
        s = make_step(step)
        store.commit_step(s.summary, s.records, s.recomputes, s.versions, s.syncs, [])
    store.close()
    return tmp_path / "run"


def test_report_checks_a_sound_store(store_dir, capsys):
    assert main(["report", str(store_dir), "--check"]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    assert main(["report", str(store_dir), "--json"]) == 0
    assert [r["step"] for r in json.loads(capsys.readouterr().out)] == [0, 1, 2]


def test_a_garbled_step_row_is_one_clear_line(store_dir, capsys):
    db = sqlite3.connect(store_dir / "run.sqlite")
    db.execute("UPDATE steps SET summary = '{\"step\": 1, \"trunc' WHERE step = 1")
    db.commit()
    db.close()
    refused(capsys, ["report", str(store_dir)], "the row of step 1 is garbled")
    refused(capsys, ["report", str(store_dir), "--json"], "the row of step 1 is garbled")
    assert main(["report", str(store_dir), "--check"]) == 1
    assert "step 1 is garbled" in capsys.readouterr().out


def test_report_refuses_a_store_that_fails_the_integrity_check(store_dir, capsys):
    """Issue 21 case 6: `rlkit report` exited 0 on a store failing PRAGMA integrity_check. Here the index
    of records by step loses its entries (its root page zeroed): every table row still reads."""
    db = sqlite3.connect(store_dir / "run.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records_by_step'").fetchone()[0]
    db.close()
    with open(store_dir / "run.sqlite", "r+b") as f:  # a leaf page header with no cells: an empty index
        f.seek((root - 1) * page_size)
        f.write(bytes([10, 0, 0, 0, 0, 0, 0, 0]) + bytes(page_size - 8))
    err = refused(capsys, ["report", str(store_dir)], "is damaged")
    assert "report --check" in err
    assert main(["report", str(store_dir), "--check"]) == 1
    assert "records_by_step" in capsys.readouterr().out
