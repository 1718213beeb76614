"""An `rlkit run` to kill: `python -m tests.runners.victim KILL_POINT N -- RLKIT_ARGS...`, or
`... -- new RUN_DIR CONFIG_JSON` for a new run of a RunConfig saved as JSON (`rlkit.loop.run`).

Runs `rlkit ...` in this process and SIGKILLs itself at the N-th occurrence of KILL_POINT:
- `sql:PREFIX`       SQLite starts a statement beginning with PREFIX on the run's writer connection
                     ("INSERT INTO syncs" is the resume's re-sync, "INSERT INTO records" / "INSERT INTO steps"
                     / "COMMIT" are inside a step's transaction);
- `ckpt-partial`     half of a checkpoint's bytes are on disk (the temporary file) when the process dies;
- `ckpt-written`     the checkpoint is in place under its final name, the step is not committed yet;
- `committed`        the step and its checkpoint reference are committed, old checkpoints not pruned yet;
- `train`            a step's update begins (its rollout is done, nothing of it is committed);
- `timer:SECONDS`    a timer thread, started at the first commit, fires wherever the main thread is
                     (in the middle of a rollout, a train step or a sync); N is unused.
The hooks wrap rlkit functions in this process only; nothing of the library changes.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, nth: int) -> None:
    import torch

    from rlkit import rundir
    from rlkit.timeline.store import RunStore

    seen = {"n": 0}

    def hit() -> None:
        seen["n"] += 1
        if seen["n"] == nth:
            _die()

    if point.startswith("sql:"):
        prefix = point[4:].upper()
        real_init = RunStore.__init__

        def init(self, run_dir, conn, readonly):
            real_init(self, run_dir, conn, readonly)
            if not readonly:
                conn.set_trace_callback(lambda sql: hit() if sql.lstrip().upper().startswith(prefix) else None)

        RunStore.__init__ = init
    elif point == "ckpt-partial":
        real_save = torch.save

        def save(obj, path, *a, **kw):
            if str(path).endswith(".tmp"):
                seen["n"] += 1
                if seen["n"] == nth:
                    buf = io.BytesIO()
                    real_save(obj, buf, *a, **kw)
                    data = buf.getvalue()
                    with open(path, "wb") as f:
                        f.write(data[: len(data) // 2])
                        f.flush()
                        os.fsync(f.fileno())
                    _die()
            return real_save(obj, path, *a, **kw)

        torch.save = save
    elif point == "ckpt-written":
        real_commit = RunStore.commit_step

        def commit_step(self, *a, **kw):
            if kw.get("checkpoint") is not None:
                hit()
            return real_commit(self, *a, **kw)

        RunStore.commit_step = commit_step
    elif point == "committed":
        real_prune = rundir.prune_checkpoints

        def prune(*a, **kw):
            hit()
            return real_prune(*a, **kw)

        rundir.prune_checkpoints = prune
    elif point == "train":
        from rlkit.runners.local import LocalRunner

        real_train = LocalRunner.train_step

        def train_step(self, batch):
            hit()
            return real_train(self, batch)

        LocalRunner.train_step = train_step
    elif point.startswith("timer:"):
        delay = float(point[6:])
        real_commit = RunStore.commit_step

        def commit_step(self, *a, **kw):
            out = real_commit(self, *a, **kw)
            if not seen["n"]:
                seen["n"] = 1
                threading.Timer(delay, _die).start()
            return out

        RunStore.commit_step = commit_step
    else:
        raise SystemExit(f"unknown kill point {point!r}")


def main() -> None:
    point, nth, sep, *run_args = sys.argv[1:]
    assert sep == "--", "usage: victim KILL_POINT N -- (RLKIT_RUN_ARGS... | new RUN_DIR CONFIG_JSON)"
    install(point, int(nth))
    if run_args[0] == "new":  # a new run of a RunConfig written as JSON (fields the CLI has no flag for)
        import json

        from rlkit.config import RunConfig
        from rlkit.loop import run

        run(run_args[1], RunConfig.from_dict(json.loads(open(run_args[2]).read())), progress=False).close()
        sys.exit(0)
    from rlkit.cli import main as cli_main

    sys.exit(cli_main(run_args))


if __name__ == "__main__":
    main()
