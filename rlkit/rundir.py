"""A run directory as the RL loop writes it: checks before anything is created, the writer's lock,
checkpoint files, and what a resume must verify before it continues a stored run.

Nothing here changes a store it refuses: every check that can fail runs before the first write, and each
refusal is one line (ValueError for bad values, DataError for bad data, ResumeError, RunLocked).
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import torch

from rlkit.config import RunConfig
from rlkit.data.tasks import task as get_task
from rlkit.model.config import preset
from rlkit.timeline.lock import RunLock
from rlkit.timeline.records import CheckpointRef, ToggleEvent, WeightVersion, bitwise_differences
from rlkit.timeline.store import RunStore

KEEP_CHECKPOINTS = 2
CHECKPOINT_DIR = "checkpoints"


class ResumeError(RuntimeError):
    """A run that cannot be continued as it is stored; raised before the store is changed at all."""


def _checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINT_DIR / f"step-{step:06d}.pt"


def checkpoint_file(run_dir, ref: CheckpointRef) -> Path:
    """Where the checkpoint `ref` lives: always inside `run_dir`, so a copied or moved run directory
    resumes from its own files. References are stored relative to the run directory
    (`checkpoints/step-000003.pt`); older stores recorded the path as it was typed (absolute, or relative
    to the shell's directory), and those are looked up by file name in the run's own checkpoints/."""
    path = Path(ref.path)
    if not path.is_absolute() and path.parts[:1] == (CHECKPOINT_DIR,):
        return Path(run_dir) / path
    return Path(run_dir) / CHECKPOINT_DIR / path.name


def save_checkpoint(runner, run_dir: Path, step: int) -> str:
    """Save the trainer's state after `step`; returns the reference to store (relative to the run dir)."""
    path = _checkpoint(run_dir, step)
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    _remove(tmp)  # left by a crash
    runner.save(tmp)  # a file, or a folder of per-rank files for a multi-rank trainer
    _remove(path)  # a crash after saving but before the commit: this step is being redone
    os.replace(tmp, path)  # a reader of the store never finds a half-written checkpoint
    return path.relative_to(run_dir).as_posix()


def prune_checkpoints(run_dir: Path, step: int) -> None:
    """After the commit that references step `step`'s checkpoint: keep it and the newest older ones up to
    KEEP_CHECKPOINTS. Pruning only after the commit means the store's newest reference always has its file."""
    older = [p for p in (run_dir / CHECKPOINT_DIR).glob("step-*.pt") if p.name <= _checkpoint(run_dir, step).name]
    for old in sorted(older)[:-KEEP_CHECKPOINTS]:
        _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def preflight(cfg: RunConfig) -> None:
    """Refuse, in one line (ValueError) and before anything is created, values the run cannot use: a device
    this machine does not have, a non-finite temperature, more new tokens than a sequence may hold, a
    Megatron trainer layout the model's shape does not split into."""
    check_device(cfg.device)
    if not math.isfinite(cfg.temperature) or cfg.temperature <= 0:
        raise ValueError(f"temperature {cfg.temperature!r}: expected a finite number > 0 (top_k=1 for greedy)")
    if cfg.trainer == "megatron" and cfg.trainer_ranks > 1:
        from rlkit.train.megatron.convert import check_layout

        try:
            check_layout(preset(cfg.model), cfg.trainer_tp, cfg.trainer_pp)
        except ValueError as e:
            raise ValueError(f"trainer layout TP {cfg.trainer_tp} x CP {cfg.trainer_cp} x PP {cfg.trainer_pp} "
                             f"for {cfg.model}: {e}") from None
    room = min(cfg.engine.max_model_len, preset(cfg.model).max_position_embeddings) - 1
    if cfg.max_tokens > room:
        raise ValueError(f"max_tokens {cfg.max_tokens}: a sequence holds at most {room + 1} tokens here "
                         f"(engine max_model_len {cfg.engine.max_model_len}), the prompt included")


def check_device(name: str) -> None:
    """Refuse (ValueError, one line) a device name this machine does not have."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"device {name!r} is not a device name ({' '.join(str(e).split())}); "
                         f"use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this torch has no usable CUDA device here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: there are {torch.cuda.device_count()} CUDA devices here")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r}: rlkit runs on cpu or cuda[:N]")


def prepare_task(cfg: RunConfig):
    """The run's task with its data loaded and checked (DataError names the file and what is wrong)."""
    t = get_task(cfg.task)
    t.prepare(cfg.seed)
    return t


def resume_point(store: RunStore) -> tuple[int | None, CheckpointRef | None]:
    """(last complete step, checkpoint to resume from); ResumeError when steps exist without a checkpoint."""
    last, ckpt = store.last_step(), store.last_checkpoint()
    if last is not None and ckpt is None:
        raise ResumeError(f"{store.run_dir} has {last + 1} complete steps but no checkpoint reference to resume "
                          f"from (checkpoint_every=0, or a copy made by export, which keeps none); nothing was "
                          f"changed")
    if ckpt is not None and not checkpoint_file(store.run_dir, ckpt).exists():
        raise ResumeError(f"{store.run_dir}: the checkpoint of step {ckpt.step} is missing "
                          f"({checkpoint_file(store.run_dir, ckpt)}); nothing was changed")
    return last, ckpt


def contract_at(cfg: RunConfig, toggles: list[ToggleEvent], before_step: int):
    """The contract the run had when step `before_step` began (its config, then the toggles applied before)."""
    contract = cfg.contract()
    for t in toggles:
        if t.step < before_step:
            contract = contract.with_ops(**{t.op: t.path})
    return contract


def _check_resume_state(store: RunStore) -> RunConfig:
    """Everything a resume can check without building the model; raises before the store is touched."""
    resume_point(store)
    cfg = RunConfig.from_dict(store.config())
    last, ckpt = store.last_step(), store.last_checkpoint()
    start = 0 if ckpt is None else ckpt.step + 1
    versions = {v.version: v for v in store.versions()}
    here = contract_at(cfg, store.toggles(), start).fingerprint()
    if start in versions and versions[start].contract_fingerprint != here:
        raise ResumeError(f"{store.run_dir}: weight version {start} was made under contract "
                          f"{versions[start].contract_fingerprint}; this rlkit's contract for the stored settings is "
                          f"{here} (another contract version): a run is never continued under another contract; "
                          f"start a new run")
    return cfg


def open_for_resume(run_dir: Path):
    """Check the stored run read-only (lock-free), then take the writer's lock and check again."""
    with RunStore.open(run_dir, readonly=True, untouched=True) as peek:
        cfg = _check_resume_state(peek)
    preflight(cfg)
    task = prepare_task(cfg)
    lock = RunLock.acquire(run_dir)
    store = None
    try:
        store = RunStore.open(run_dir)
        cfg = _check_resume_state(store)  # under the lock: what another writer may have added meanwhile
    except BaseException:
        if store is not None:
            store.close()
        lock.release()
        raise
    return store, cfg, task, lock


def create(run_dir: Path, cfg: RunConfig):
    """Validate a new run and take its directory's lock; nothing is created when a check fails. A new
    run's init checkpoint must hold its model shape in its (resolved) dtype; a resume reloads it only when
    no step checkpoint exists yet, and checks it then (rlkit/loop.py)."""
    preflight(cfg)
    if cfg.init_checkpoint:
        from rlkit.model.init_checkpoint import check_init_checkpoint

        check_init_checkpoint(cfg.init_checkpoint, model_name=cfg.model, dtype=cfg.dtype)
    task = prepare_task(cfg)
    RunStore.check_new(run_dir)
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = RunLock.acquire(run_dir)
    except BaseException:
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return task, lock, made


def check_weights(store: RunStore, version: WeightVersion | None, syncs, what: str) -> None:
    """The weights a (re)start loaded must be the ones the store recorded for that version."""
    if version is None:
        return
    got = {s.checksum_sent for s in syncs}
    if got != {version.checksum}:
        raise ResumeError(f"{store.run_dir}: {what} has weight checksum {', '.join(sorted(got))}, the store "
                          f"recorded {version.checksum} for version {version.version}: not this run's weights; "
                          f"nothing was changed")


def replay_check(store: RunStore, step: int, records, recomputes, checksum: str) -> None:
    """A step recomputed after a resume must equal the committed one, bit for bit."""
    stored = store.records(step) + store.recomputes(step)
    got = list(records) + list(recomputes)
    problems = [] if len(stored) == len(got) else [f"{len(got)} records and recomputes vs {len(stored)} stored"]
    for a, b in zip(got, stored):
        problems += [f"{getattr(a, 'record_id', '?')}: {d}" for d in bitwise_differences(a, b)[:1]]
    version = {v.version: v for v in store.versions()}.get(step + 1)
    if version is not None and version.checksum != checksum:
        problems.append(f"weight checksum {checksum} vs stored {version.checksum}")
    if problems:
        raise ResumeError(f"{store.run_dir}: step {step} recomputed from the checkpoint differs from the committed "
                          f"step ({problems[0]}); the committed steps are kept as they are")
