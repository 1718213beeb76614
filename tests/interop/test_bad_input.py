"""Bad input to `rlkit import`: one clear line naming the record, exit code 2, and no run directory (nor a
hidden temporary one) left behind. Also an import that fails half way through writing leaves nothing."""

from __future__ import annotations

import json
import math

import pytest

from rlkit.cli import main
from rlkit.interop import ExchangeRow, write_rows
from rlkit.interop.importer import import_run
from rlkit.timeline.store import RunStore
from tests.interop.dumps import write_slime, write_verl


def _row(sample_id: str, **kw) -> dict:
    base = dict(step=0, sample_id=sample_id, prompt_id="p0", sample_index=0, prompt_token_ids=[1, 2],
                response_token_ids=[3, 4, 5], rollout_logprobs=[-0.5, -1.0, -0.25],
                trainer_logprobs=[-0.5, -1.0, -0.25], logprob_semantics="raw")
    base.update(kw)
    return base


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    return str(path)


def _refused(tmp_path, capsys, argv, *needles) -> None:
    run_dir = tmp_path / "run"
    assert main(argv + ["--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("rlkit import: error: ") and "Traceback" not in err[0]
    for needle in needles:
        assert needle in err[0], err[0]
    assert not run_dir.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.importing")]


def test_missing_parquet_column(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_row("a"), _row("b")]
    for r in rows:
        del r["rollout_logprobs"]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    _refused(tmp_path, capsys, ["import", "rlkit", str(tmp_path / "x.parquet")], "missing column(s) rollout_logprobs")


def test_missing_jsonl_field_names_the_record(tmp_path, capsys):
    bad = _row("s0/p1/0")
    del bad["trainer_logprobs"]
    _refused(tmp_path, capsys, ["import", "rlkit", _jsonl(tmp_path / "x.jsonl", [_row("ok"), bad])],
             "record 's0/p1/0'", "missing field(s) trainer_logprobs")


def test_ragged_tokens_and_logprobs(tmp_path, capsys):
    bad = _row("s0/p0/3", trainer_logprobs=[-0.5, -1.0])
    _refused(tmp_path, capsys, ["import", "rlkit", _jsonl(tmp_path / "x.jsonl", [_row("ok"), bad])],
             "record 's0/p0/3' (line 2)", "2 trainer_logprobs for 3 response tokens")


def test_a_line_that_is_not_an_object(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(_row("ok")) + "\n\n" + json.dumps([1, 2]) + "\n")
    _refused(tmp_path, capsys, ["import", "rlkit", str(path)], "x.jsonl: line 3: expected an object, got list")


def test_nan_logprob(tmp_path, capsys):
    bad = _row("s2/p0/1", rollout_logprobs=[-0.5, math.nan, -0.25])
    _refused(tmp_path, capsys, ["import", "rlkit", _jsonl(tmp_path / "x.jsonl", [_row("ok"), bad])],
             "record 's2/p0/1'", "rollout_logprobs[1] is nan")


def test_nan_in_parquet_too(tmp_path, capsys):
    rows = [ExchangeRow(**_row("a")), ExchangeRow(**_row("b", trainer_logprobs=[-0.5, -1.0, math.nan]))]
    path = tmp_path / "x.parquet"
    write_rows(rows, path)
    _refused(tmp_path, capsys, ["import", "rlkit", str(path)], "record 'b'", "trainer_logprobs[2] is nan")


def test_mixed_semantics(tmp_path, capsys):
    rows = [_row("a"), _row("b"), _row("c", logprob_semantics="processed")]
    _refused(tmp_path, capsys, ["import", "rlkit", _jsonl(tmp_path / "x.jsonl", rows)],
             "record 'c'", "mixed logprob semantics")


def test_a_value_that_is_not_fp32(tmp_path, capsys):
    bad = _row("d", rollout_logprobs=[-0.1, -1.0, -0.25])  # -0.1 has no exact fp32 value
    _refused(tmp_path, capsys, ["import", "rlkit", _jsonl(tmp_path / "x.jsonl", [bad])],
             "record 'd'", "not fp32 values")


def test_ragged_slime_dump(tmp_path, capsys):
    import torch

    write_slime(tmp_path / "dump")
    path = tmp_path / "dump" / "rollout_data" / "1.pt"
    payload = torch.load(path, weights_only=True)
    payload["samples"][2]["rollout_log_probs"] = payload["samples"][2]["rollout_log_probs"][:-1]
    torch.save(payload, path)
    _refused(tmp_path, capsys, ["import", "slime", str(tmp_path / "dump")],
             "record 'slime/1/6'", "rollout_log_probs for response_length 5 (ragged record)")


def test_verl_line_without_per_token_fields(tmp_path, capsys):
    write_verl(tmp_path / "dump")
    path = tmp_path / "dump" / "2.jsonl"
    lines = path.read_text().splitlines()
    second = json.loads(lines[1])
    del second["rollout_log_probs"]
    lines[1] = json.dumps(second)
    path.write_text("\n".join(lines) + "\n")
    _refused(tmp_path, capsys, ["import", "verl", str(tmp_path / "dump")],
             "record 'req-2-1' (line 2)", "missing field(s) rollout_log_probs")


def test_a_non_empty_run_dir_is_refused_before_reading(tmp_path, capsys):
    write_slime(tmp_path / "dump")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    assert main(["import", "slime", str(tmp_path / "dump"), "--run-dir", str(tmp_path / "run")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["keep.txt"]


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    write_slime(tmp_path / "dump")
    real = RunStore.commit_step
    calls = []

    def second_step_fails(self, summary, *args, **kw):
        calls.append(summary.step)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real(self, summary, *args, **kw)

    monkeypatch.setattr(RunStore, "commit_step", second_step_fails)
    (tmp_path / "run").mkdir()  # an empty run directory given by the user stays as it was
    with pytest.raises(OSError, match="simulated"):
        import_run("slime", tmp_path / "dump", tmp_path / "run")
    assert calls == [0, 1]
    assert list((tmp_path / "run").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump", "run"]


def test_a_nested_token_list(tmp_path, capsys):
    bad = _row("e", response_token_ids=[[3, 4], [5]])
    _refused(tmp_path, capsys, ["import", "rlkit", _jsonl(tmp_path / "x.jsonl", [bad])],
             "record 'e' (line 1)", "response_token_ids must be a flat list of numbers")
