"""A native peer: a second process that times native calls when asked, so one benchmark can time strict
and native in turn although the two need different cuBLAS settings.

Why a second process: the strict cuBLAS route needs cuBLAS without a workspace for the whole process
(kernels/gemm_cublas.py), while the native control a user runs keeps torch's defaults (split-K where
cuBLAS likes it). torch reads that setting once, when it first sizes a workspace, so one process cannot
hold both. Why in turn: on the lent GPUs one compute-bound cuBLAS kernel, timed twice in one process
seconds apart, read 0.558 and 0.681 ms (the H100, qwen3-8b down at M = 4096, lab/LOG.md 2026-12-06), so a
native time taken in another process minutes earlier moves a ratio by as much as the gaps it should show. The peer answers
one request at a time while this process waits: each round times strict here and native there, seconds
apart, and the ratio is taken round by round.

The protocol is one JSON object a line: the peer writes {"ready": ...} once, then answers each request
line with {"ok": ...} or {"error": ...}. Anything else the peer prints goes to its log, never into the
replies.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


class PeerError(RuntimeError):
    """The peer could not answer: it failed to start, died, timed out or refused the request."""


class NativePeer:
    """A started peer process. `ask(request)` returns its answer (a dict) or raises PeerError, naming the
    tail of the peer's log. Use as a context manager, or call close()."""

    def __init__(self, argv: list[str], env: dict[str, str], log: str | Path, start_timeout: float = 300.0,
                 answer_timeout: float = 300.0):
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.answer_timeout = answer_timeout
        self._log_file = open(self.log, "w")  # noqa: SIM115 - kept open for the peer's life
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log_file, text=True, bufsize=1)
        self.ready = self._read(start_timeout, "start").get("ready", {})

    def ask(self, request: dict) -> dict:
        if self._proc.poll() is not None:
            raise PeerError(f"the native peer has exited (status {self._proc.returncode}){self._tail()}")
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise PeerError(f"the native peer stopped reading ({e}){self._tail()}") from None
        reply = self._read(self.answer_timeout, f"request {request}")
        if "error" in reply:
            raise PeerError(f"the native peer refused {request}: {reply['error']}")
        return reply["ok"]

    def _read(self, timeout: float, what: str) -> dict:
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            self._proc.kill()  # a peer stuck on one request would answer the next one with its reply
            self._proc.wait()
            raise PeerError(f"the native peer did not answer {what} within {timeout:.0f} s (stopped){self._tail()}")
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=30)
            raise PeerError(f"the native peer exited (status {self._proc.returncode}) before answering "
                            f"{what}{self._tail()}")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise PeerError(f"the native peer answered {what} with {line[:200]!r}, not JSON") from None

    def _tail(self, lines: int = 8) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        text = self.log.read_text(errors="replace").strip().splitlines()[-lines:] if self.log.exists() else []
        return (f"; its log ({self.log}) ends:\n  " + "\n  ".join(text)) if text else f"; its log {self.log} is empty"

    def close(self) -> None:
        """Ends the peer: its requests end, it exits (killed if it has not within 30 s)."""
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log_file.close()

    def __enter__(self) -> NativePeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(handle: Callable[[dict], dict], ready: dict | None = None, requests=None, replies=None) -> int:
    """The peer's side: announce `ready`, then answer each request line with handle(request). A request
    the handler raises on is answered with the error and the peer goes on. Everything else printed goes to
    stderr (the replies own stdout). Returns 0 when the requests end."""
    requests = requests or sys.stdin
    replies = replies or sys.stdout
    sys.stdout = sys.stderr  # prints from here on (libraries' included) go to the log

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    reply({"ready": ready or {}})
    for line in requests:
        if not line.strip():
            continue
        try:
            reply({"ok": handle(json.loads(line))})
        except Exception as e:  # noqa: BLE001 - a bad request is answered, not fatal
            reply({"error": f"{type(e).__name__}: {str(e)[:300]}"})
    return 0


def environment_at_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with rlkit's cuBLAS settings taken back out: torch's defaults (its
    workspace, split-K allowed) and the strict cuBLAS route off, as a native user's process runs."""
    from rlkit.kernels import gemm_cublas

    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k not in gemm_cublas.NO_WORKSPACE}
    env[gemm_cublas.SWITCH] = "0"
    return env
