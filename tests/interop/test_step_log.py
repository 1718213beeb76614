"""Per-step metrics to TensorBoard and W&B (offline), read back with the libraries' own formats and compared
with the run store: `rlkit export RUN --to tensorboard|wandb` on an imported run (rlkit's metrics and the
framework's own), and `rlkit run --log-to tensorboard --log-to wandb` live on a small real run
(tests/interop/conftest.py).

TensorBoard keeps scalars as fp32, so its values are compared with the store's fp64 values rounded to fp32
(exactly); W&B keeps the JSON of the fp64 value, compared exactly. W&B runs offline: no network.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlkit.cli import main
from rlkit.interop.importer import import_run
from rlkit.interop.step_log import read_tensorboard, read_wandb_history, step_metrics
from rlkit.timeline.store import RunStore
from tests.interop.dumps import write_verl

W_AND_B_OWN = {"_runtime", "_timestamp", "_step"}


@pytest.fixture(autouse=True)
def _offline(wandb_offline):
    return wandb_offline


def _expected(run_dir) -> dict[int, dict[str, float]]:
    with RunStore.open(run_dir, readonly=True) as store:
        extra = (store.info("import") or {}).get("metrics", {})
        return {s.step: step_metrics(s, extra.get(str(s.step))) for s in store.steps()}


def _check_tensorboard(log_dir, expected) -> None:
    scalars = read_tensorboard(log_dir)
    assert set(scalars) == {k for m in expected.values() for k in m}
    for step, metrics in expected.items():
        for name, value in metrics.items():
            assert scalars[name][step] == np.float32(value), (step, name, scalars[name][step], value)


def _check_wandb(run_path, expected) -> None:
    history = read_wandb_history(run_path)
    assert sorted(history) == sorted(expected)
    for step, metrics in expected.items():
        assert set(history[step]) - W_AND_B_OWN == set(metrics)
        for name, value in metrics.items():
            assert history[step][name] == value, (step, name, history[step][name], value)


@pytest.fixture
def imported_verl(tmp_path):
    write_verl(tmp_path / "dump")
    import_run("verl", tmp_path / "dump", tmp_path / "run").close()
    return tmp_path / "run"


def test_export_to_tensorboard_reads_back_equal_to_the_store(imported_verl, tmp_path, capsys):
    assert main(["export", str(imported_verl), "--to", "tensorboard", "--out", str(tmp_path / "tb")]) == 0
    assert "wrote the per-step metrics" in capsys.readouterr().err
    expected = _expected(imported_verl)
    assert "rollout_corr/k3_kl" in expected[1] and "rlkit/k3_kl" in expected[1]
    assert "rlkit/loss" not in expected[1]  # not recorded by the dump: not logged
    _check_tensorboard(tmp_path / "tb", expected)


def test_export_to_wandb_offline_reads_back_equal_to_the_store(imported_verl):
    assert main(["export", str(imported_verl), "--to", "wandb"]) == 0
    runs = list((imported_verl / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    _check_wandb(runs[0], _expected(imported_verl))


def test_run_log_to_both_logged_every_step_live(native_run):
    run_dir, log_dir = native_run
    expected = _expected(run_dir)
    assert sorted(expected) == [0, 1] and "rlkit/time/step_s" in expected[0]
    _check_tensorboard(log_dir, expected)
    runs = list((log_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    _check_wandb(runs[0], expected)


def test_log_dir_without_log_to_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["run", "--run-dir", str(tmp_path / "run"), "--steps", "1", "--log-dir", str(tmp_path / "logs")]) == 2
    assert "--log-dir needs --log-to" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "logs").exists()


def test_live_logger_logs_only_steps_committed_after_it_started_from(tmp_path):
    """A resumed run's logger skips the steps committed before the resume (they were logged by the command
    that ran them) and logs each new one as it is committed."""
    from rlkit.interop.step_log import LiveLogger
    from tests.timeline.fakes import initial, make_step

    run_dir = tmp_path / "run"
    store = RunStore.create(run_dir, {"steps": 3})
    store.commit_initial(*initial())
    for step in (0, 1):
        fake = make_step(step)
        store.commit_step(fake.summary, fake.records, fake.recomputes, fake.versions, fake.syncs)
    logger = LiveLogger(run_dir, "tensorboard", after_step=1, period_s=0.05).start()
    fake = make_step(2)
    store.commit_step(fake.summary, fake.records, fake.recomputes, fake.versions, fake.syncs)
    store.close()
    logger.stop()
    assert logger.logged == [2]
    expected = _expected(run_dir)
    _check_tensorboard(run_dir / "tensorboard", {2: expected[2]})


def test_log_to_on_a_used_run_dir_is_refused_and_logs_nothing(tmp_path, capsys):
    from tests.timeline.fakes import initial, make_step

    run_dir = tmp_path / "run"
    with RunStore.create(run_dir, {"steps": 1}) as store:
        store.commit_initial(*initial())
        fake = make_step(0)
        store.commit_step(fake.summary, fake.records, fake.recomputes, fake.versions, fake.syncs)
    assert main(["run", "--run-dir", str(run_dir), "--steps", "1", "--log-to", "tensorboard"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert not (run_dir / "tensorboard").exists()


@pytest.mark.parametrize("target", ["tensorboard", "wandb"])
def test_a_missing_extra_is_one_line(imported_verl, monkeypatch, capsys, target):
    import sys

    monkeypatch.setitem(sys.modules, target, None)  # as if the extra were not installed
    assert main(["export", str(imported_verl), "--to", target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlkit export: error: {target} needs the {target} package: pip install 'rlkit[{target}]'"]
