"""rlkit's per-step metrics where users already look: TensorBoard and Weights & Biases (offline).

    rlkit export runs/a --to tensorboard [--out DIR]     # a finished (or running) run, every step
    rlkit export runs/a --to wandb [--out DIR]           # W&B offline run under DIR/wandb/ (`wandb sync` it)
    rlkit run ... --log-to tensorboard|wandb             # live: each step as the run commits it

The metrics of a step (`step_metrics`): rlkit/mismatch_count, compared_tokens, max_abs_diff, mean_abs_diff,
k3_kl, ratio_spread (max - min importance ratio), ratio_min/mean/max, ratio_outside, reward_mean,
reward_std, loss, clip_fraction, weight_version, valid, and rlkit/time/<phase> for each recorded step time;
for an imported run also the framework's own metrics under its own names (e.g. rollout_corr/k3_kl). A
value the run did not record (NaN, e.g. the loss of an imported run) is not logged. The x axis is the step.

Both libraries are optional extras (`pip install 'rlkit[tensorboard]'`, `'rlkit[wandb]'`); W&B always runs
in offline mode here (no network, no account), writing its transaction log (`run-<id>.wandb`) that
`read_wandb_history` reads back. The live logger is a reader of the run store like the dashboard: a
thread follows the store and logs each complete step, so the loop itself knows nothing about it.
"""

from __future__ import annotations

import math
import os
import struct
import threading
from pathlib import Path
from typing import Any

from rlkit.timeline.records import StepSummary
from rlkit.timeline.store import RunStore, StoreFollower

TARGETS = ("tensorboard", "wandb")
_SUMMARY_FIELDS = ("mismatch_count", "compared_tokens", "max_abs_diff", "mean_abs_diff", "k3_kl", "ratio_min",
                   "ratio_mean", "ratio_max", "ratio_outside", "reward_mean", "reward_std", "loss", "clip_fraction",
                   "weight_version")


class MissingExtra(RuntimeError):
    """The optional library a target needs is not installed."""


def step_metrics(summary: StepSummary, extra: dict[str, float] | None = None) -> dict[str, float]:
    """The step's metrics by name, finite values only."""
    out = {f"rlkit/{k}": float(getattr(summary, k)) for k in _SUMMARY_FIELDS}
    out["rlkit/ratio_spread"] = summary.ratio_max - summary.ratio_min
    out["rlkit/valid"] = float(summary.valid)
    out.update({f"rlkit/{k}": float(getattr(summary, k)) for k in StepSummary._OPTIONAL_FLOATS
                if getattr(summary, k) is not None})
    out.update({f"rlkit/time/{k}": float(v) for k, v in summary.timings.items()})
    out.update({k: float(v) for k, v in (extra or {}).items()})
    return {k: v for k, v in out.items() if math.isfinite(v)}


def default_dir(run_dir: str | os.PathLike, target: str) -> Path:
    """Where a run's logs go unless told: RUN_DIR/tensorboard; for W&B the run directory itself, in which
    W&B makes its own `wandb/` folder (RUN_DIR/wandb/offline-run-<time>-<id>)."""
    return Path(run_dir) / "tensorboard" if target == "tensorboard" else Path(run_dir)


class StepWriter:
    """Writes step metrics to one target; `log(step, metrics)` then `close()`."""

    def __init__(self, target: str, out_dir: str | os.PathLike, run_name: str, config: dict | None = None):
        self.check_available(target)
        self.target, self.out_dir = target, Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if target == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.out_dir))
        else:
            import wandb

            # offline: nothing leaves the machine; `wandb sync` uploads later if the user wants
            self._wb = wandb.init(mode="offline", dir=str(self.out_dir), project="rlkit", name=run_name,
                                  config=config or {}, reinit="create_new",
                                  settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
            self.wandb_dir = Path(self._wb.dir).parent  # .../wandb/offline-run-<time>-<id>

    @staticmethod
    def check_available(target: str) -> None:
        """MissingExtra (one line) unless the target's library imports."""
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; targets: {' | '.join(TARGETS)}")
        try:
            if target == "tensorboard":
                import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            else:
                import wandb  # noqa: F401
        except ImportError:
            raise MissingExtra(f"{target} needs the {target} package: pip install 'rlkit[{target}]'") from None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.target == "tensorboard":
            for name, value in metrics.items():
                self._tb.add_scalar(name, value, global_step=step)
            self._tb.flush()
        else:
            self._wb.log(metrics, step=step)

    def close(self) -> None:
        if self.target == "tensorboard":
            self._tb.close()
        else:
            self._wb.finish()


def _imported_metrics(store: RunStore) -> dict[str, dict[str, float]]:
    source = store.info("import") or {}
    return source.get("metrics", {})


def export_run(run_dir: str | os.PathLike, target: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Every step of the run to `target`; returns the folder written (for W&B the offline run folder)."""
    with RunStore.open(run_dir, readonly=True) as store:
        steps, extra, config = store.steps(), _imported_metrics(store), store.config()
    if not steps:
        raise ValueError(f"{run_dir} has no complete step to export")
    writer = StepWriter(target, out_dir or default_dir(run_dir, target), Path(run_dir).name, config)
    try:
        for s in steps:
            writer.log(s.step, step_metrics(s, extra.get(str(s.step))))
    finally:
        writer.close()
    return writer.wandb_dir if target == "wandb" else writer.out_dir


class LiveLogger:
    """Follows a run directory from a thread and logs each new complete step (`rlkit run --log-to`)."""

    def __init__(self, run_dir: str | os.PathLike, target: str, out_dir: str | os.PathLike | None = None,
                 after_step: int | None = None, period_s: float = 0.5):
        self.run_dir, self.target = Path(run_dir), target
        self.out_dir = Path(out_dir) if out_dir else default_dir(run_dir, target)
        self.after_step, self.period_s = after_step, period_s
        self._stop = threading.Event()
        self._writer: StepWriter | None = None
        self.error: BaseException | None = None
        self.logged: list[int] = []
        self._thread = threading.Thread(target=self._follow, name="rlkit-log-to", daemon=True)

    def start(self) -> "LiveLogger":
        if self.target not in TARGETS:
            raise ValueError(f"unknown --log-to target {self.target!r}; targets: {' | '.join(TARGETS)}")
        self._thread.start()
        return self

    def _drain(self, follower: StoreFollower) -> None:
        for s in follower.poll():
            if self.after_step is not None and s.step <= self.after_step:
                continue  # logged by the command that committed it (a resume replays, it does not re-log)
            if self._writer is None:
                self._writer = StepWriter(self.target, self.out_dir, self.run_dir.name, follower.store.config())
            self._writer.log(s.step, step_metrics(s))
            self.logged.append(s.step)

    def _follow(self) -> None:
        follower = StoreFollower(self.run_dir, missing_ok=True)
        try:
            while not self._stop.wait(self.period_s):
                self._drain(follower)
            self._drain(follower)  # the steps committed before the stop
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e
        finally:
            follower.close()
            if self._writer is not None:
                self._writer.close()

    def stop(self) -> None:
        """Log what is left, close the writer; re-raises what went wrong in the thread."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error


# -- reading back -------------------------------------------------------------------------------------
def read_tensorboard(log_dir: str | os.PathLike) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in the event files under `log_dir` (values are fp32 there)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


_BLOCK = 32768
_HEADER = 7  # ":W&B" + magic 0xBEE1 (little-endian) + version byte, then LevelDB-log records


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B transaction log (`run-<id>.wandb`): LevelDB's log format (32 KiB blocks; each
    chunk: crc32c, uint16 length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4), after a 7-byte W&B header."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    out, pending, pos = [], b"", _HEADER
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
            pending = b""
    return out


def read_wandb_history(run_path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """{step: {key: value}} of an offline W&B run (its folder or its .wandb file), from W&B's own protobuf
    records (wandb.proto.wandb_internal_pb2.Record, history items)."""
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(run_path)
    if path.is_dir():
        path = next(path.glob("run-*.wandb"))
    history: dict[int, dict[str, Any]] = {}
    for raw in _wandb_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
        step = int(record.history.step.num) if record.history.HasField("step") else int(items.get("_step", 0))
        history.setdefault(step, {}).update(items)
    return history
