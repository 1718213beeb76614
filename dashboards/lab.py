"""`rlkit lab` (what `make lab` runs): a strict and a native run side by side, and the dashboard on both.

Two `rlkit run` subprocesses of the lab preset write into runs/lab-<timestamp>/strict and .../native (their
output goes to strict.log and native.log beside them); this process serves the dashboard on both and
prints its URL. Nothing opens a browser, so it works headless (open the URL, or tunnel it: ssh -L).

Both runs use fp32 by default. Measured on this CPU (tiny preset, strict path 0 mismatches throughout):
without a warm start (64 responses x 4 tokens per step) the native path mismatched 1-4 of 256 tokens per step
in bf16 and 40-49 in fp32; after the preset's warm start (responses of about 2 tokens, ~128 per step) 0-1 in
bf16 (most steps 0) and 1-2 in fp32 (every step). bf16 rounding hides most of the native kernels' last-bit
differences here. Running *both* runs in fp32 keeps the kernel path the only difference between them.

Stopping: Ctrl-C (or SIGTERM) stops the dashboard and sends SIGTERM to both runs; each finishes the step
it is in and stops, so its store ends at a complete step (`rlkit run --resume DIR` continues it). A second
Ctrl-C kills the runs at once; their stores still hold only complete steps (one transaction per step).
The runs live in their own session, so a terminal's Ctrl-C reaches only this process, which then stops them
in order; on Linux they also get SIGTERM if this process dies.

    rlkit lab                                     # 50 steps each, dashboard on http://localhost:5006/
    rlkit lab --steps 5 --warm-start 0 --exit-when-done
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("strict", "native")
STOP_TIMEOUT_S = 300.0
"""How long Ctrl-C waits for the runs to finish their current step (an RL step, or a step of the warm
start, which stops between its steps too) before killing them."""


@dataclass
class LabRun:
    kind: str
    run_dir: Path
    log: Path
    argv: list[str]
    proc: subprocess.Popen | None = None
    reported: bool = False

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM when the lab process dies (even by SIGKILL), so no orphaned run keeps
    # writing. Runs in the child between fork and exec; the lab has no threads yet at that point.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Lab:
    """The two runs of one lab session; `start()`, `poll()` and `stop()`."""

    root: Path
    run_args: list[str] = field(default_factory=list)
    """Arguments for `rlkit run` shared by both runs (steps, dtype, ...)."""
    runs: list[LabRun] = field(default_factory=list)

    def __post_init__(self):
        self.root = Path(self.root)
        for kind in KINDS:
            run_dir = self.root / kind
            # progress bars go to the log: `tail -f runs/lab-*/strict.log` shows the warm start
            argv = [sys.executable, "-m", "rlkit", "run", "--run-dir", str(run_dir), "--path", kind, *self.run_args]
            self.runs.append(LabRun(kind, run_dir, self.root / f"{kind}.log", argv))

    @property
    def run_dirs(self) -> list[Path]:
        return [r.run_dir for r in self.runs]

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for r in self.runs:
            with open(r.log, "wb") as log:
                r.proc = subprocess.Popen(r.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True,
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        (self.root / "lab.json").write_text(json.dumps({
            "started_at": time.time(), "runs": {r.kind: {"run_dir": str(r.run_dir), "log": str(r.log),
                                                         "pid": r.proc.pid, "argv": r.argv} for r in self.runs}},
            indent=2))

    def poll(self, out=sys.stderr) -> bool:
        """Report runs that ended since the last call; True when every run has ended."""
        for r in self.runs:
            code = r.returncode
            if code is not None and not r.reported:
                r.reported = True
                if code == 0:
                    print(f"rlkit lab: the {r.kind} run finished ({r.run_dir})", file=out, flush=True)
                else:
                    tail = r.log.read_text(errors="replace").strip().splitlines()[-3:]
                    print(f"rlkit lab: the {r.kind} run exited with code {code}; last lines of {r.log}:\n  "
                          + "\n  ".join(tail), file=out, flush=True)
        return all(r.returncode is not None for r in self.runs)

    def stop(self, timeout: float = STOP_TIMEOUT_S, out=sys.stderr) -> dict[str, int]:
        """SIGTERM every live run and wait for each to finish its step (or its warm-start step); a second
        Ctrl-C (SIGINT), or the timeout, kills them. Returns each run's exit code."""
        live = [r for r in self.runs if r.proc is not None and r.returncode is None]
        for r in live:
            r.proc.send_signal(signal.SIGTERM)
        if live:
            print(f"rlkit lab: stopping {', '.join(r.kind for r in live)}: each finishes its current step "
                  f"(Ctrl-C again to kill now; the stores keep every complete step)", file=out, flush=True)
        kill_now = threading.Event()
        on_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, lambda *_: kill_now.set()) if on_main else None
        try:
            deadline = time.monotonic() + timeout
            while (any(r.returncode is None for r in live) and not kill_now.is_set()
                   and time.monotonic() < deadline):
                time.sleep(0.1)
        finally:
            if on_main:
                signal.signal(signal.SIGINT, previous)
        if any(r.returncode is None for r in live):
            for r in live:
                if r.returncode is None:
                    r.proc.kill()
                    r.proc.wait()
            print("rlkit lab: runs killed; their stores end at their last complete step", file=out, flush=True)
        self.poll(out)
        return {r.kind: r.returncode for r in self.runs if r.proc is not None}


def default_root(runs_dir: str | os.PathLike = "runs") -> Path:
    return Path(runs_dir) / time.strftime("lab-%Y%m%d-%H%M%S")


def run_lab(root: Path, run_args: list[str], port: int, address: str, token: str | None,
            exit_when_done: bool = False, period_ms: int = 1000, out=sys.stderr) -> int:
    """Start both runs, serve the dashboard until Ctrl-C (or until both runs end, with exit_when_done),
    then stop the runs cleanly. Returns 0 when every run ended well (finished or stopped by us)."""
    from .access import check_serve_policy
    from .server import serve

    check_serve_policy(address, token)  # before anything starts
    _check_port(address, port)
    lab = Lab(root, run_args)
    lab.start()
    for r in lab.runs:
        print(f"rlkit lab: {r.kind:6} run in {r.run_dir} (log: {r.log})", file=out, flush=True)

    def started(url: str) -> None:
        print(f"rlkit lab: dashboard at {url}", file=out, flush=True)
        print("rlkit lab: Ctrl-C stops the runs (each finishes its current step) and the dashboard",
              file=out, flush=True)

    def tick() -> bool:
        done = lab.poll(out)
        return done and exit_when_done

    try:
        serve(lab.run_dirs, port=port, address=address, token=token, period_ms=period_ms, on_start=started,
              on_tick=tick)
    finally:
        codes = lab.stop(out=out)
    # 0: finished, or stopped on our SIGTERM after a complete step; -SIGTERM: stopped by it before the run
    # had started its loop (it had written no step)
    return 0 if all(c in (0, -signal.SIGTERM) for c in codes.values()) else 1


def _check_port(address: str, port: int) -> None:
    """Fail before starting the runs when the dashboard's port is taken."""
    import socket

    try:
        with socket.create_server((address, port)):
            pass
    except OSError as e:
        raise OSError(f"cannot serve the dashboard on {address}:{port} ({e.strerror}); pick another --port") from None
