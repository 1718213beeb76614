"""The run store: one directory per run, one SQLite database (`run.sqlite`, WAL mode) holding the timeline.

What it keeps: the run's config, every weight version and sync, every rollout record with its tokens and
rollout logprobs, every trainer recompute, one summary per step, toggle requests and the toggles applied,
and checkpoint references. Per-token arrays are little-endian int32 / float32 bytes in BLOBs, so fp32
logprobs come back bit for bit (-0.0, +-inf and NaN included).

Why SQLite in WAL mode: a reader (the dashboard, a notebook, `rlkit report`) follows the run from another
process while the writer appends, without blocking it; and a transaction is all or nothing, so each step
(`commit_step`: summary, records, recomputes, versions, syncs, toggles, checkpoint ref) is committed in one
transaction. A reader never sees part of a step, and a SIGKILL at any point leaves the store at the last
complete step.

    store = RunStore.create("runs/a", config)                 # refuses a non-empty directory
    store.commit_initial([WeightVersion(0, -1, ...)], syncs)  # version 0 before step 0
    store.commit_step(summary, records, recomputes, versions, syncs, toggles, checkpoint="ckpt/step3")
    ...
    store = RunStore.open("runs/a")                           # resume: last_step(), last_checkpoint()
    follower = StoreFollower("runs/a"); follower.poll()       # new complete steps since the last poll

Every failure is a `StoreError` with a one-line message (never a raw sqlite traceback for a missing,
foreign or corrupt run directory).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from rlkit.timeline.records import (CheckpointRef, Recompute, RecordError, RolloutRecord, StepSummary,
                                    SyncEvent, ToggleEvent, ToggleRequest, WeightVersion, check_op_path)

SCHEMA_VERSION = 1
DB_NAME = "run.sqlite"
LOCK_NAME = "run.lock"
"""The run writer's lock file (rlkit/timeline/lock.py): part of a run directory, not of the store."""
BUSY_TIMEOUT_S = 30.0
"""How long a connection waits for another process's write lock (the run's commit, a dashboard's toggle
request) before giving up; a commit takes milliseconds, so hitting this means a process hangs holding it."""

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE versions (
  version INTEGER PRIMARY KEY, step INTEGER NOT NULL, checksum TEXT NOT NULL,
  contract_fingerprint TEXT NOT NULL, created_at REAL NOT NULL, after_step INTEGER NOT NULL);
CREATE TABLE syncs (
  seq INTEGER PRIMARY KEY, engine_id TEXT NOT NULL, version INTEGER NOT NULL, checksum_sent TEXT NOT NULL,
  checksum_acknowledged TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL NOT NULL,
  after_step INTEGER NOT NULL);
CREATE TABLE steps (
  step INTEGER PRIMARY KEY, commit_seq INTEGER NOT NULL UNIQUE, weight_version INTEGER NOT NULL,
  valid INTEGER NOT NULL, mismatch_count INTEGER NOT NULL, n_records INTEGER NOT NULL,
  n_recomputes INTEGER NOT NULL, committed_at REAL NOT NULL, summary TEXT NOT NULL);
CREATE TABLE records (
  record_id TEXT PRIMARY KEY, step INTEGER NOT NULL, prompt_id TEXT NOT NULL, sample_index INTEGER NOT NULL,
  engine_id TEXT NOT NULL, weight_version INTEGER NOT NULL, contract_fingerprint TEXT NOT NULL, reward REAL,
  finish_reason TEXT NOT NULL, sampling TEXT NOT NULL, n_tokens INTEGER NOT NULL, prompt_ids BLOB NOT NULL,
  token_ids BLOB NOT NULL, rollout_logprobs BLOB NOT NULL);
CREATE INDEX records_by_step ON records(step);
CREATE TABLE recomputes (
  seq INTEGER PRIMARY KEY, record_id TEXT NOT NULL, step INTEGER NOT NULL, weight_version INTEGER NOT NULL,
  contract_fingerprint TEXT NOT NULL, trainer_logprobs BLOB NOT NULL, UNIQUE (record_id, step));
CREATE INDEX recomputes_by_step ON recomputes(step);
CREATE TABLE toggle_requests (
  request_id INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL, path TEXT NOT NULL,
  requested_at REAL NOT NULL, source TEXT NOT NULL, applied_step INTEGER);
CREATE TABLE toggles (
  seq INTEGER PRIMARY KEY, step INTEGER NOT NULL, op TEXT NOT NULL, path TEXT NOT NULL,
  requested_at REAL NOT NULL, applied_at REAL NOT NULL, source TEXT NOT NULL, new_fingerprint TEXT NOT NULL,
  request_id INTEGER);
CREATE TABLE checkpoints (step INTEGER PRIMARY KEY, path TEXT NOT NULL, saved_at REAL NOT NULL);
"""


class StoreError(RuntimeError):
    """Anything the run store refuses or cannot do; the message is always one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


# -- per-token arrays: fixed little-endian dtypes, so a store written on one machine reads on any --------
def _i32(values: Sequence[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _f32(values: Sequence[float]) -> bytes:
    # Exact: records only hold fp32 values (RolloutRecord / Recompute refuse others).
    return np.asarray(values, dtype="<f4").tobytes()


def _ints(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").tolist()


def _floats(blob: bytes) -> list[float]:
    return np.frombuffer(blob, dtype="<f4").tolist()


def _nan_if_null(x: float | None) -> float:
    # SQLite stores a NaN REAL as NULL; the only REAL that may be NaN is a record's reward.
    return float("nan") if x is None else x


def _json(obj: Any) -> str:
    # allow_nan: step metrics can be NaN/inf (a diverged loss); Python's json reads its own NaN back, and
    # repr-based float text round-trips fp64 exactly.
    return json.dumps(obj, sort_keys=True, allow_nan=True)


class RunStore:
    """A run's timeline on disk. Build with `create` or `open`; one writer process, any number of readers."""

    def __init__(self, run_dir: Path, conn: sqlite3.Connection, readonly: bool):
        self.run_dir = run_dir
        self.readonly = readonly
        self._conn = conn
        self._lock = threading.Lock()  # one connection shared by a Panel server's threads

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: str | os.PathLike, config: dict[str, Any]) -> "RunStore":
        """A new run in `run_dir` (created if missing; refused if it exists and is not empty)."""
        run_dir = Path(run_dir)
        cls.check_new(run_dir)
        try:
            config_text = json.dumps(config, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise StoreError(f"the run config is not JSON-serializable: {e}") from None
        run_dir.mkdir(parents=True, exist_ok=True)
        # Build the database under a temporary name and rename it: a run directory either has a complete
        # run.sqlite (schema and meta) or none, even if creation is killed half way.
        tmp = run_dir / (DB_NAME + ".creating")
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            # WAL is a property of the file: set before the rename, so no reader ever sees the store in
            # rollback-journal mode (switching later would need an exclusive lock with readers around).
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript("BEGIN;" + _SCHEMA)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("schema_version", str(SCHEMA_VERSION)), ("config", config_text),
                ("created_at", repr(time.time())), ("commit_seq", "0")])
            conn.execute("COMMIT")
        finally:
            conn.close()
        os.replace(tmp, run_dir / DB_NAME)
        _fsync_dir(run_dir)
        return cls.open(run_dir)

    @staticmethod
    def check_new(run_dir: str | os.PathLike) -> None:
        """StoreError unless `run_dir` can hold a new run: missing, or an empty directory (its writer's lock
        file aside). Creates nothing."""
        run_dir = Path(run_dir)
        if run_dir.exists():
            if not run_dir.is_dir():
                raise StoreError(f"cannot create a run at {run_dir}: it exists and is not a directory")
            entries = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)
            if entries:
                raise StoreError(f"refusing to create a run in {run_dir}: the directory is not empty "
                                 f"({len(entries)} entries, e.g. {entries[0]}); pick a new run directory "
                                 f"or resume this one")

    @classmethod
    def open(cls, run_dir: str | os.PathLike, readonly: bool = False, untouched: bool = False) -> "RunStore":
        """An existing run. `readonly=True` opens with SQLite's mode=ro: safe beside the running writer.
        `untouched=True` (read-only) also creates no file: a reader in WAL mode makes run.sqlite-wal and -shm
        beside the database; when there is no WAL file (no writer connected, nothing uncommitted), the
        database is opened as immutable instead, which reads the file alone. For checks that must leave a
        run directory exactly as they found it (a refused resume)."""
        run_dir = Path(run_dir)
        db = run_dir / DB_NAME
        if not run_dir.exists():
            raise StoreError(f"no run directory at {run_dir}")
        if not run_dir.is_dir():
            raise StoreError(f"{run_dir} is not a directory, so not a run directory")
        if not db.is_file():
            raise StoreError(f"{run_dir} is not an rlkit run directory (no {DB_NAME})")
        conn = None
        try:
            if readonly:
                immutable = untouched and not (run_dir / (DB_NAME + "-wal")).exists()
                conn = sqlite3.connect(db.resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else ""),
                                       uri=True, isolation_level=None,
                                       timeout=BUSY_TIMEOUT_S, check_same_thread=False)
                conn.execute("PRAGMA query_only=ON")
            else:
                conn = sqlite3.connect(db, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                                       check_same_thread=False)
            found = _schema_version(conn, db)
            if found != SCHEMA_VERSION:
                raise StoreError(f"{db} has schema version {found}; this rlkit reads schema version "
                                 f"{SCHEMA_VERSION} (open it with a matching rlkit, or start a new run)")
            if not readonly:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise StoreError(f"{db}: could not switch to WAL mode (got {mode})")
                # FULL, not NORMAL: in WAL mode NORMAL already survives a SIGKILL (the WAL is in the OS
                # cache), but a power loss may drop the last commits. FULL fsyncs the WAL per commit, so a
                # step the progress bar reported stays in the store. Measured on the CPU dev machine for a
                # step of 64 records x 512 tokens: commit 18 ms (FULL) vs 9 ms (NORMAL), against RL steps
                # of seconds.
                conn.execute("PRAGMA synchronous=FULL")
            return cls(run_dir, conn, readonly)
        except StoreError:
            if conn is not None:
                conn.close()
            raise
        except sqlite3.Error as e:
            if conn is not None:
                conn.close()
            raise StoreError(f"{db} is not a readable rlkit run store ({e})") from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r}{', readonly' if self.readonly else ''})"

    # -- transactions ---------------------------------------------------------------------------
    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StoreError(f"cannot {what}: {self.run_dir} was opened read-only")
        with self._lock:
            try:
                # IMMEDIATE takes the write lock now, so two writers queue on busy_timeout instead of one
                # failing when it upgrades a read transaction.
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise StoreError(f"cannot {what} in {self.run_dir}: {e}") from None
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as e:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"cannot {what} in {self.run_dir}: {e}") from None
                if isinstance(e, RecordError):
                    raise StoreError(f"cannot {what}: {e}") from None
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # One short read transaction per call: every query of the call sees one snapshot, and the WAL is
        # not pinned between calls (a long-lived reader would stop the writer's checkpoints).
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                try:
                    yield self._conn
                finally:
                    self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise StoreError(f"cannot read {self.run_dir / DB_NAME}: {e}") from None

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._read() as c:
            return c.execute(sql, params).fetchall()

    # -- meta -----------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        rows = self._rows("SELECT value FROM meta WHERE key = 'config'")
        try:
            config = json.loads(rows[0][0])
            if not isinstance(config, dict):
                raise ValueError(f"a {type(config).__name__}, not an object")
        except (IndexError, TypeError, ValueError) as e:
            raise StoreError(f"{self.run_dir / DB_NAME}: the stored run config is missing or garbled ({e})") from None
        return config

    @property
    def schema_version(self) -> int:
        return int(self._rows("SELECT value FROM meta WHERE key = 'schema_version'")[0][0])

    INFO_KEYS = ("platform", "progress", "import", "run_state", "init_checkpoint", "placement")
    """Run information that is not part of the timeline: where the run computes and why in that dtype
    ("platform"), what it is doing before its first step ("progress": the warm start's step, loss
    and time left), for a run imported from another framework's dump where it came from and what
    the dump did not record ("import", rlkit/interop/importer.py), and whether the writer is running,
    finished, stopped or failed, and why ("run_state", rlkit/loop.py; a writer killed outright leaves
    "running" behind, which readers check against the writer lock), and the init checkpoint a run started
    from instead of its seeded init ("init_checkpoint": path, weights checksum, SHA-256, what made it;
    rlkit/loop.py), and where the runner put the trainer's and the engines' ranks ("placement": the
    runner's `placement()`, e.g. each Ray actor's GPU). Overwritten in place; readers take the latest."""

    def set_info(self, key: str, value: dict[str, Any]) -> None:
        if key not in self.INFO_KEYS:
            raise StoreError(f"unknown run info {key!r}; expected one of {', '.join(self.INFO_KEYS)}")
        with self._write(f"record the run's {key}") as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"info.{key}", _json(value)))

    def info(self, key: str) -> dict[str, Any] | None:
        """The latest value written by `set_info` (None when the run never wrote one)."""
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (f"info.{key}",))
        if not rows:
            return None
        try:
            return json.loads(rows[0][0])
        except ValueError:
            return None

    # -- writing --------------------------------------------------------------------------------
    def commit_initial(self, versions: Iterable[WeightVersion] = (), syncs: Iterable[SyncEvent] = ()) -> None:
        """Versions and syncs outside a step (version 0 before step 0; re-syncs after a resume), in one
        transaction."""
        with self._write("record versions and syncs") as c:
            after = _last_step(c)
            known = self._insert_versions(c, list(versions), after)
            self._insert_syncs(c, list(syncs), after, known)

    def commit_step(self, summary: StepSummary, records: Iterable[RolloutRecord] = (),
                    recomputes: Iterable[Recompute] = (), versions: Iterable[WeightVersion] = (),
                    syncs: Iterable[SyncEvent] = (), toggles: Iterable[ToggleEvent] = (), *,
                    checkpoint: str | os.PathLike | None = None) -> None:
        """Everything of one step in one transaction: all of it is visible to readers, or none of it.

        Checked before anything is written (a failed check raises StoreError and writes nothing): the step
        is newer than the last one; records, recomputes and toggles belong to this step; record ids are
        new; every weight version named is stored or committed here; every recompute names a record and
        has one logprob per token; every toggle's request is pending (it is marked applied here).
        `checkpoint`: the path of the weights saved after this step, stored with it (see last_checkpoint)."""
        records, recomputes = list(records), list(recomputes)
        versions, syncs, toggles = list(versions), list(syncs), list(toggles)
        step = summary.step
        with self._write(f"commit step {step}") as c:
            last = _last_step(c)
            if last is not None and step <= last:
                raise StoreError(f"step {step} cannot follow step {last}: steps are committed in increasing "
                                 f"order (truncate_after({step - 1}) first to redo it)")
            for kind, items in (("record", records), ("recompute", recomputes), ("toggle", toggles)):
                wrong = [x for x in items if x.step != step]
                if wrong:
                    raise StoreError(f"commit of step {step} holds a {kind} of step {wrong[0].step}")
            known = self._insert_versions(c, versions, step)
            for what, v in [(f"step {step}", summary.weight_version)] + [
                    (f"record {r.record_id}", r.weight_version) for r in records] + [
                    (f"recompute of {r.record_id}", r.weight_version) for r in recomputes]:
                if v not in known:
                    raise StoreError(f"{what} names weight version {v}, which is not in the store")
            self._insert_records(c, records)
            self._insert_recomputes(c, recomputes)
            self._insert_syncs(c, syncs, step, known)
            self._insert_toggles(c, toggles)
            seq = int(c.execute("SELECT value FROM meta WHERE key = 'commit_seq'").fetchone()[0]) + 1
            c.execute("UPDATE meta SET value = ? WHERE key = 'commit_seq'", (str(seq),))
            c.execute("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (
                step, seq, summary.weight_version, int(summary.valid), summary.mismatch_count, len(records),
                len(recomputes), time.time(), _json(summary.to_dict())))
            if checkpoint is not None:
                c.execute("INSERT INTO checkpoints VALUES (?, ?, ?)", (step, str(checkpoint), time.time()))

    def _insert_versions(self, c: sqlite3.Connection, versions: list[WeightVersion],
                         after: int | None) -> set[int]:
        known = {v for (v,) in c.execute("SELECT version FROM versions")}
        for v in versions:
            if v.version in known:
                raise StoreError(f"weight version {v.version} is already in the store")
            known.add(v.version)
        c.executemany("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?)", [
            (v.version, v.step, v.checksum, v.contract_fingerprint, v.created_at, -1 if after is None else after)
            for v in versions])
        return known

    def _insert_syncs(self, c: sqlite3.Connection, syncs: list[SyncEvent], after: int | None,
                      known: set[int]) -> None:
        for s in syncs:
            if s.version not in known:
                raise StoreError(f"sync to {s.engine_id} names weight version {s.version}, which is not "
                                 f"in the store")
        c.executemany("INSERT INTO syncs (engine_id, version, checksum_sent, checksum_acknowledged, started_at,"
                      " finished_at, after_step) VALUES (?, ?, ?, ?, ?, ?, ?)", [
                          (s.engine_id, s.version, s.checksum_sent, s.checksum_acknowledged, s.started_at,
                           s.finished_at, -1 if after is None else after) for s in syncs])

    def _insert_records(self, c: sqlite3.Connection, records: list[RolloutRecord]) -> None:
        ids = [r.record_id for r in records]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise StoreError(f"record {dup} appears twice in one step")
        for i in range(0, len(ids), 500):  # SQLite caps the number of bound parameters per statement
            chunk = ids[i:i + 500]
            hit = c.execute(f"SELECT record_id, step FROM records WHERE record_id IN "
                            f"({','.join('?' * len(chunk))})", chunk).fetchone()
            if hit:
                raise StoreError(f"record {hit[0]} is already in the store (step {hit[1]})")
        c.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            (r.record_id, r.step, r.prompt_id, r.sample_index, r.engine_id, r.weight_version,
             r.contract_fingerprint, r.reward, r.finish_reason, _json(r.sampling), r.n_tokens,
             _i32(r.prompt_ids), _i32(r.token_ids), _f32(r.rollout_logprobs)) for r in records])

    def _insert_recomputes(self, c: sqlite3.Connection, recomputes: list[Recompute]) -> None:
        for r in recomputes:
            row = c.execute("SELECT n_tokens FROM records WHERE record_id = ?", (r.record_id,)).fetchone()
            if row is None:
                raise StoreError(f"recompute of step {r.step} names record {r.record_id}, which is not in "
                                 f"the store or this step")
            if row[0] != len(r.trainer_logprobs):
                raise StoreError(f"recompute of record {r.record_id} has {len(r.trainer_logprobs)} logprobs "
                                 f"for {row[0]} tokens")
        c.executemany("INSERT INTO recomputes (record_id, step, weight_version, contract_fingerprint, "
                      "trainer_logprobs) VALUES (?, ?, ?, ?, ?)", [
                          (r.record_id, r.step, r.weight_version, r.contract_fingerprint,
                           _f32(r.trainer_logprobs)) for r in recomputes])

    def _insert_toggles(self, c: sqlite3.Connection, toggles: list[ToggleEvent]) -> None:
        for t in toggles:
            if t.request_id is not None:
                row = c.execute("SELECT applied_step FROM toggle_requests WHERE request_id = ?",
                                (t.request_id,)).fetchone()
                if row is None or row[0] is not None:
                    state = "unknown" if row is None else f"already applied at step {row[0]}"
                    raise StoreError(f"toggle {t.op}={t.path} answers request {t.request_id}, which is {state}")
                c.execute("UPDATE toggle_requests SET applied_step = ? WHERE request_id = ?",
                          (t.step, t.request_id))
        c.executemany("INSERT INTO toggles (step, op, path, requested_at, applied_at, source, new_fingerprint,"
                      " request_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
                          (t.step, t.op, t.path, t.requested_at, t.applied_at, t.source, t.new_fingerprint,
                           t.request_id) for t in toggles])

    def save_checkpoint_ref(self, step: int, path: str | os.PathLike) -> None:
        """Record that the weights after complete step `step` are saved at `path`."""
        with self._write(f"save the checkpoint of step {step}") as c:
            if c.execute("SELECT 1 FROM steps WHERE step = ?", (step,)).fetchone() is None:
                raise StoreError(f"cannot reference a checkpoint of step {step}: the step is not in the store")
            c.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?)", (step, str(path), time.time()))

    def truncate_after(self, step: int) -> None:
        """Forget every step after `step` (and its records, recomputes, versions, syncs, toggles and
        checkpoints; toggle requests applied there become pending again). For resuming from a checkpoint
        older than the last complete step: the redone steps are committed again under the same numbers."""
        with self._write(f"truncate after step {step}") as c:
            for table, column in (("steps", "step"), ("records", "step"), ("recomputes", "step"),
                                  ("versions", "after_step"), ("syncs", "after_step"), ("toggles", "step"),
                                  ("checkpoints", "step")):
                c.execute(f"DELETE FROM {table} WHERE {column} > ?", (step,))
            c.execute("UPDATE toggle_requests SET applied_step = NULL WHERE applied_step > ?", (step,))

    def token_steps_every(self) -> int:
        """1, or k where this store is an `export` that kept per-token data of every k-th step only."""
        rows = self._rows("SELECT value FROM meta WHERE key = 'token_steps_every'")
        return int(rows[0][0]) if rows else 1

    def export(self, dst_dir: str | os.PathLike, token_steps_every: int = 1) -> Path:
        """Copy the run to `dst_dir` (a new run folder the dashboard opens), keeping every step summary,
        version, sync and toggle, and the per-token records and recomputes of every
        `token_steps_every`-th step only (1: all of them). For bringing a long run back through a
        size-limited channel; the copy's meta says what was kept. Returns the copy's run.sqlite."""
        if token_steps_every < 1:
            raise ValueError("token_steps_every must be >= 1")
        dst = Path(dst_dir)
        dst.mkdir(parents=True, exist_ok=True)
        path = dst / DB_NAME
        if path.exists():
            raise StoreError(f"{path} exists; export into a new folder")
        copy = sqlite3.connect(path)
        try:
            with self._lock:
                self._conn.backup(copy)
            if token_steps_every > 1:
                for table in ("records", "recomputes"):
                    copy.execute(f"DELETE FROM {table} WHERE step % ? != 0", (token_steps_every,))
                copy.execute("INSERT OR REPLACE INTO meta VALUES ('token_steps_every', ?)", (str(token_steps_every),))
            copy.execute("DELETE FROM checkpoints")  # the checkpoint files do not travel with the copy
            copy.commit()
            copy.execute("VACUUM")
        finally:
            copy.close()
        return path

    # -- toggle requests ------------------------------------------------------------------------
    def request_toggle(self, op: str, path: str, source: str) -> int:
        """Ask the run to switch `op` to `path` at its next step boundary; returns the request id."""
        return self.request_toggles({op: path}, source)[0]

    def request_toggles(self, paths: dict[str, str], source: str) -> list[int]:
        """Ask for several ops' switches in one transaction (the run's next boundary applies all of them or,
        if it read the requests first, none); returns the request ids in `paths`' order."""
        try:
            for op, path in paths.items():
                check_op_path(op, path)
        except RecordError as e:
            raise StoreError(f"toggle request refused: {e}") from None
        what = ", ".join(f"{op}={path}" for op, path in paths.items())
        with self._write(f"request toggle {what}") as c:
            now = time.time()
            return [int(c.execute("INSERT INTO toggle_requests (op, path, requested_at, source) VALUES (?, ?, ?, ?)",
                                  (op, path, now, str(source))).lastrowid) for op, path in paths.items()]

    def pending_toggles(self) -> list[ToggleRequest]:
        return [ToggleRequest(*row) for row in self._rows(
            "SELECT request_id, op, path, requested_at, source FROM toggle_requests "
            "WHERE applied_step IS NULL ORDER BY request_id")]

    # -- reading --------------------------------------------------------------------------------
    def steps(self) -> list[StepSummary]:
        return [self._summary(n, s) for n, s in self._rows("SELECT step, summary FROM steps ORDER BY step")]

    def _summary(self, step: Any, text: Any) -> StepSummary:
        """A step row's summary, or one StoreError line for a garbled row (a damaged store)."""
        try:
            return StepSummary.from_dict(json.loads(text))
        except (TypeError, ValueError, RecordError) as e:
            raise StoreError(f"{self.run_dir / DB_NAME}: the row of step {step} is garbled ({e}); the store is "
                             f"damaged (rlkit report --check lists what is wrong)") from None

    def integrity_problems(self, limit: int = 10) -> list[str]:
        """What is wrong with the store: SQLite's `PRAGMA integrity_check` (pages, indexes, constraints) and
        every step row read back as a StepSummary. [] for a sound store; at most `limit` lines."""
        try:
            with self._read() as c:
                found = [row[0] for row in c.execute(f"PRAGMA integrity_check({int(limit)})")]
                rows = c.execute("SELECT step, summary FROM steps ORDER BY step").fetchall()
        except StoreError as e:
            return [str(e)]
        problems = [] if found == ["ok"] else [" ".join(str(f).split()) for f in found]
        for step, text in rows:
            try:
                self._summary(step, text)
            except StoreError as e:
                problems.append(str(e))
        return problems[:limit]

    def last_step(self) -> int | None:
        with self._read() as c:
            return _last_step(c)

    def versions(self) -> list[WeightVersion]:
        return [WeightVersion(*row) for row in self._rows(
            "SELECT version, step, checksum, contract_fingerprint, created_at FROM versions ORDER BY version")]

    def syncs(self) -> list[SyncEvent]:
        return [SyncEvent(*row) for row in self._rows(
            "SELECT engine_id, version, checksum_sent, checksum_acknowledged, started_at, finished_at "
            "FROM syncs ORDER BY seq")]

    _RECORD_COLUMNS = ("record_id, step, prompt_id, sample_index, engine_id, weight_version, contract_fingerprint,"
                       " prompt_ids, token_ids, rollout_logprobs, reward, finish_reason, sampling")

    @staticmethod
    def _record(row: tuple) -> RolloutRecord:
        (rid, step, pid, idx, eng, ver, fp, prompt, tokens, lps, reward, finish, sampling) = row
        return RolloutRecord(rid, step, pid, idx, eng, ver, fp, _ints(prompt), _ints(tokens), _floats(lps),
                             _nan_if_null(reward), finish, json.loads(sampling))

    def records(self, step: int) -> list[RolloutRecord]:
        """The records generated at `step`, in the order they were committed ([] for an unknown step)."""
        return [self._record(row) for row in self._rows(
            f"SELECT {self._RECORD_COLUMNS} FROM records WHERE step = ? ORDER BY rowid", (step,))]

    def record(self, record_id: str) -> RolloutRecord:
        rows = self._rows(f"SELECT {self._RECORD_COLUMNS} FROM records WHERE record_id = ?", (record_id,))
        if not rows:
            raise StoreError(f"no record {record_id!r} in {self.run_dir}")
        return self._record(rows[0])

    _RECOMPUTE_COLUMNS = "record_id, step, weight_version, contract_fingerprint, trainer_logprobs"

    def recomputes(self, step: int) -> list[Recompute]:
        """The trainer recomputes used by the update of `step`, in commit order."""
        return [Recompute(rid, s, v, fp, _floats(lps)) for rid, s, v, fp, lps in self._rows(
            f"SELECT {self._RECOMPUTE_COLUMNS} FROM recomputes WHERE step = ? ORDER BY seq", (step,))]

    def recomputes_of(self, record_id: str) -> list[Recompute]:
        return [Recompute(rid, s, v, fp, _floats(lps)) for rid, s, v, fp, lps in self._rows(
            f"SELECT {self._RECOMPUTE_COLUMNS} FROM recomputes WHERE record_id = ? ORDER BY seq", (record_id,))]

    def toggles(self) -> list[ToggleEvent]:
        return [ToggleEvent(*row) for row in self._rows(
            "SELECT step, op, path, requested_at, applied_at, source, new_fingerprint, request_id "
            "FROM toggles ORDER BY seq")]

    def checkpoints(self) -> list[CheckpointRef]:
        return [CheckpointRef(*row) for row in self._rows("SELECT step, path, saved_at FROM checkpoints "
                                                          "ORDER BY step")]

    def last_checkpoint(self) -> CheckpointRef | None:
        """The newest checkpoint reference; resume loads it, truncate_after(ref.step) and continues."""
        rows = self._rows("SELECT step, path, saved_at FROM checkpoints ORDER BY step DESC LIMIT 1")
        return CheckpointRef(*rows[0]) if rows else None

    def _steps_since(self, commit_seq: int) -> list[tuple[int, StepSummary]]:
        return [(seq, self._summary(n, s)) for seq, n, s in self._rows(
            "SELECT commit_seq, step, summary FROM steps WHERE commit_seq > ? ORDER BY commit_seq", (commit_seq,))]


def _last_step(c: sqlite3.Connection) -> int | None:
    return c.execute("SELECT MAX(step) FROM steps").fetchone()[0]


def _schema_version(conn: sqlite3.Connection, db: Path) -> int:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            raise StoreError(f"{db} is an SQLite file but not an rlkit run store (no meta table)") from None
        raise
    if row is None or not str(row[0]).isdigit():
        raise StoreError(f"{db} is not an rlkit run store (its meta table has no valid schema_version)")
    return int(row[0])


def _fsync_dir(path: Path) -> None:
    # The rename that publishes run.sqlite is durable only once its directory entry is.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StoreFollower:
    """Follow a run from another process: `poll()` returns the steps committed since the last poll.

    Steps are returned in commit order and only ever complete (a step and its records are one transaction).
    A step redone after `truncate_after` is returned again, with its new content. With `missing_ok`, polling
    a run that has not been created yet returns [] until it appears."""

    def __init__(self, run_dir: str | os.PathLike, *, missing_ok: bool = False):
        self.run_dir = Path(run_dir)
        self._seq = 0
        self._store: RunStore | None = None
        if not missing_ok:
            self._store = RunStore.open(self.run_dir, readonly=True)

    @property
    def store(self) -> RunStore | None:
        """The read-only store, for records(step) of a polled step (None until the run exists)."""
        return self._store

    def poll(self) -> list[StepSummary]:
        if self._store is None:
            if not (self.run_dir / DB_NAME).is_file():  # create() renames it into place complete
                return []
            self._store = RunStore.open(self.run_dir, readonly=True)
        new = self._store._steps_since(self._seq)
        if new:
            self._seq = new[-1][0]
        return [summary for _, summary in new]

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> "StoreFollower":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
