"""A run-store writer to kill: `python -m tests.timeline.writer RUN_DIR STEPS [--die-at SQL N | --die-after T]
[--sleep S]`.

Creates the run (or opens it and continues after its last complete step), commits make_step(s) for every
step up to STEPS - 1, printing "committed s" after each commit. With `--die-at SQL N` it SIGKILLs itself
when SQLite starts the N-th statement beginning with SQL (e.g. "COMMIT", "INSERT INTO steps") after it
found where to continue (so "COMMIT 2" dies committing the second step of this process): a crash
inside a step's transaction, after part of the step has been written. A small page cache makes SQLite
spill a step's pages into the WAL before COMMIT, so the kill leaves uncommitted frames behind.
With `--die-after T` a timer thread SIGKILLs the process T seconds after its first commit, wherever the
main thread is; the timer lives in the writer so that a loaded machine slows the clock and the writes alike.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from rlkit.timeline import RunStore
from tests.timeline.fakes import initial, make_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("steps", type=int)
    ap.add_argument("--die-at", nargs=2, metavar=("SQL", "N"))
    ap.add_argument("--die-after", type=float)
    ap.add_argument("--sleep", type=float, default=0.0)
    args = ap.parse_args()
    run_dir = Path(args.run_dir)
    if (run_dir / "run.sqlite").exists():
        store = RunStore.open(run_dir)
    else:
        store = RunStore.create(run_dir, {"task": "fake", "steps": args.steps})
        store.commit_initial(*initial())
    last = store.last_step()  # before the trace, so the N-th COMMIT is the N-th step this process commits
    store._conn.execute("PRAGMA cache_size=-32")  # 32 KiB: a step's data spills into the WAL pre-COMMIT
    if args.die_at:
        prefix, count = args.die_at[0], int(args.die_at[1])
        seen = 0

        def trace(sql: str) -> None:
            nonlocal seen
            if sql.lstrip().upper().startswith(prefix.upper()):
                seen += 1
                if seen == count:
                    os.kill(os.getpid(), signal.SIGKILL)

        store._conn.set_trace_callback(trace)
    for step in range(0 if last is None else last + 1, args.steps):
        s = make_step(step)
        store.commit_step(s.summary, s.records, s.recomputes, s.versions, s.syncs, [])
        print(f"committed {step}", flush=True)
        if args.die_after is not None:
            threading.Timer(args.die_after, os.kill, (os.getpid(), signal.SIGKILL)).start()
            args.die_after = None
        if args.sleep:
            time.sleep(args.sleep)
    store.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
