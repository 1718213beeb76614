"""One writer per run directory: an OS lock (`flock`) on `RUN_DIR/run.lock`, held for the life of the run.

`rlkit run` (a new run or `--resume`) takes the lock before it writes anything and keeps it until the
process ends; the kernel releases it when the process dies, however it dies (a `kill -9` leaves no stale
lock to clean up). A second writer finds it taken and stops with one line naming the holder's pid,
having written nothing. Readers (`rlkit report`, the dashboard, a notebook) never take it: SQLite's WAL
lets them read beside the writer. A toggle request from the dashboard is not a run writer either: it adds
one row that the run applies at its next step boundary, and SQLite queues it with the run's commits.

    lock = RunLock.acquire("runs/a")     # RunLocked if another process holds it
    ...                                  # write the run
    lock.release()                       # or let the process end

The lock file holds the holder's pid (for the message only; the lock itself is the kernel's flock).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rlkit.timeline.store import StoreError

LOCK_NAME = "run.lock"


class RunLocked(StoreError):
    """Another process is writing this run directory."""


def holder(run_dir: str | os.PathLike) -> int | None:
    """The pid of the process holding `run_dir`'s lock, or None when nobody holds it. Creates nothing."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid(fd) or -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def check_free(run_dir: str | os.PathLike) -> None:
    """RunLocked when another process holds `run_dir`'s lock (a quick check that creates nothing)."""
    pid = holder(run_dir)
    if pid is not None:
        raise RunLocked(_held_message(Path(run_dir), pid if pid > 0 else None))


def _held_message(run_dir: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    return (f"{run_dir} is being written by {who} (it holds {run_dir / LOCK_NAME}); one writer per run: wait for "
            f"it to end, or stop it (Ctrl-C / SIGTERM ends it at a complete step)")


def _pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


class RunLock:
    """The writer's lock on one run directory (see the module docstring)."""

    def __init__(self, run_dir: Path, fd: int, created: bool):
        self.run_dir, self._fd, self.created = run_dir, fd, created

    @classmethod
    def acquire(cls, run_dir: str | os.PathLike) -> "RunLock":
        """Take the lock of an existing directory without waiting; RunLocked if another process holds it.
        `created` says whether this call made the lock file (a refused writer leaves no file behind)."""
        run_dir = Path(run_dir)
        path = run_dir / LOCK_NAME
        created = False
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                created = True
            except FileExistsError:  # another writer made it just now
                fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid(fd)
            os.close(fd)
            raise RunLocked(_held_message(run_dir, pid)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(run_dir, fd, created)

    def release(self, remove: bool = False) -> None:
        """Let go of the lock; `remove` also deletes the lock file (for a directory this writer made and is
        removing again)."""
        if self._fd is None:
            return
        if remove:
            (self.run_dir / LOCK_NAME).unlink(missing_ok=True)
        else:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
