"""Fixtures of the dashboard tests: fake run stores built step by step (no model, milliseconds), a small
live `rlkit run` subprocess, a dashboard server subprocess, and Debian Chromium through Playwright.

Screenshots of the browser tests go to artifacts/dashboards/ at the repository root (git-ignored), or to
$RLKIT_ARTIFACTS/dashboards/ when that is set (CI keeps the folder as a build artifact).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlkit.contract import OPS
from rlkit.distributed import free_port  # noqa: F401  (the dashboard tests import it from here)
from rlkit.timeline import RunStore, StepSummary, ToggleEvent
from rlkit.timeline.lock import RunLock
from tests.conftest import REPO
from tests.timeline.fakes import FP, initial, make_step

ARTIFACTS = Path(os.environ.get("RLKIT_ARTIFACTS", REPO / "artifacts")) / "dashboards"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "lab-token-for-tests"
WAIT_S = 240.0
"""Upper bound of every wait for a live run or a page (a loaded 2-core machine is slow; nothing is timed)."""


class FakeRun:
    """A run store the test writes step by step, as the loop would (make_step content, all ops strict
    unless a toggle was applied), holding the run's writer lock and saying it is running until closed."""

    def __init__(self, run_dir: Path, steps: int = 6):
        self.run_dir = run_dir
        self.store = RunStore.create(run_dir, {"steps": steps, "path": "strict", "ops": {}, "task": "fake"})
        self.lock = RunLock.acquire(run_dir)
        self.store.set_info("run_state", {"state": "running", "pid": os.getpid(), "since": time.time()})
        self.store.commit_initial(*initial())
        self.paths = {op: "strict" for op in OPS}
        self.next = 0

    def commit(self, n: int = 1) -> None:
        for _ in range(n):
            fake = make_step(self.next)
            toggles = []
            for req in self.store.pending_toggles():  # applied at the step boundary, as rlkit.loop does
                self.paths[req.op] = req.path
                toggles.append(ToggleEvent(self.next, req.op, req.path, req.requested_at, time.time(), req.source,
                                           FP, req.request_id))
            summary = StepSummary.from_dict(dict(fake.summary.to_dict(), ops_paths=dict(self.paths)))
            self.store.commit_step(summary, fake.records, fake.recomputes, fake.versions, fake.syncs, toggles)
            self.next += 1

    def end(self, state: str, reason: str) -> None:
        """Say how the run ended, as rlkit.loop.record_end does."""
        self.store.set_info("run_state", {"state": state, "reason": reason, "ended_at": time.time()})

    def close(self) -> None:
        self.store.close()
        self.lock.release()


@pytest.fixture
def fake_run(tmp_path):
    run = FakeRun(tmp_path / "fake")
    yield run
    run.close()


def labelled_text(i: int) -> str:
    return f"tok{i}"


# -- live processes ----------------------------------------------------------------------------------
def rlkit(*args: str, log: Path) -> subprocess.Popen:
    """`python -m rlkit ARGS` in its own session (so a signal reaches only it), output to `log`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "rlkit", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=REPO, env=env, start_new_session=True)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = WAIT_S) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_for(what: str, check, timeout: float = WAIT_S, every: float = 0.25, proc=None, log=None):
    """Call `check()` until it returns something truthy; fail with `what` (and the log's tail) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log else ""
            pytest.fail(f"{what}: the process exited with {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log else ""
            pytest.fail(f"gave up waiting for {what}\n{tail}")
        time.sleep(every)


def http(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["X-Rlkit-Token"] = token
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (urllib.error.URLError, ConnectionError):
        return 0, {}


@contextlib.contextmanager
def serve_finished_runs(run_dirs, log: Path):
    """`rlkit dashboard RUN_DIRS` on a free port, yielding its base URL once the API answers; on leaving,
    stopped, and its exit status (0) and log (no traceback) checked. Enter it in a fixture requested before
    `page`, so the page is closed before its server goes away."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    dash = rlkit("dashboard", *map(str, run_dirs), "--port", str(port), "--token", TOKEN, "--period-ms", "500",
                 log=log)
    try:
        wait_for("the dashboard server", lambda: http("GET", f"{base}/api/status", token=TOKEN)[0] == 200,
                 proc=dash, log=log)
        yield base
    finally:
        code = stop(dash)
    assert code == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def steps_in(run_dir: Path) -> int:
    if not (run_dir / "run.sqlite").is_file():
        return 0
    with RunStore.open(run_dir, readonly=True) as s:
        return len(s.steps())


def small_run_args(run_dir: Path, steps: int, *extra: str) -> list[str]:
    """The smallest live run of the lab preset: no warm start, 2 prompts x 2 samples."""
    return ["run", "--run-dir", str(run_dir), "--steps", str(steps), "--warm-start", "0", "--prompts", "2",
            "--samples", "2", "--no-progress", *extra]


# -- the browser -------------------------------------------------------------------------------------
@pytest.fixture(scope="package")
def browser():
    """One Chromium for the dashboard tests. Package scope, not session: Playwright's sync API keeps its
    event loop marked running on the main thread while it is open, which would break any later test
    that starts an event loop of its own (the notebooks' runner)."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).is_file(), f"Debian chromium is missing at {CHROMIUM} (make setup-test installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    """A fresh page; afterwards: a full-page screenshot under ARTIFACTS, and no traceback and no JS error."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_S * 1000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    yield pg
    try:
        pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        assert pg.get_by_text("Traceback (most recent call last)").count() == 0, "a traceback is on the page"
        assert not errors, "JS errors on the page:\n" + "\n".join(errors)
    finally:
        context.close()
