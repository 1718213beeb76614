"""One small real run for the interop tests, made once: `rlkit run` on the native path in fp32 (where this
CPU's native kernels differ, its records carry mismatching tokens), logging every step live to TensorBoard
and to W&B (offline) with `--log-to` both, into its own log folder. The round trip exports its records;
the step-log tests read its logs back."""

from __future__ import annotations

import pytest

from rlkit.cli import main


@pytest.fixture(scope="session")
def wandb_offline(tmp_path_factory):
    """W&B offline, its settings and caches in a temporary folder: nothing leaves the machine."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_DIR", str(home)),
                            ("WANDB_CONFIG_DIR", str(home / "config")), ("WANDB_CACHE_DIR", str(home / "cache"))):
            mp.setenv(name, value)
        yield home


@pytest.fixture(scope="session")
def native_run(tmp_path_factory, wandb_offline):
    """(run directory, log directory) of a 2-step native fp32 run of the lab preset, 2 prompts x 2 samples."""
    root = tmp_path_factory.mktemp("native-run")
    run_dir, log_dir = root / "run", root / "logs"
    assert main(["run", "--run-dir", str(run_dir), "--steps", "2", "--warm-start", "0", "--prompts", "2",
                 "--samples", "2", "--max-tokens", "4", "--path", "native", "--dtype", "fp32", "--no-progress",
                 "--log-to", "tensorboard", "--log-to", "wandb", "--log-dir", str(log_dir)]) == 0
    return run_dir, log_dir
