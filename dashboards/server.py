"""Serving the dashboard: `rlkit dashboard RUN_DIR [RUN_DIR ...]` and `rlkit lab` call `serve()`.

Each browser session gets its own `DashboardState` (its own read-only store connections) and a periodic
callback that polls the runs. Loopback by default; another address needs a token (dashboards/access.py):
a session opened without `?token=` shows only a refusal, and its toggle requests are refused too.

Every request must name a served address in its Host header (dashboards/access.py: a DNS-rebinding page
is refused with 403 before any handler runs), and the page's websocket must come from one of them.

Two small JSON endpoints beside the page, for scripts and tests (token in the `X-Rlkit-Token` header when
one is set; a toggle must be POSTed as application/json from a served origin or from no browser):

    GET  /api/status                          -> {"runs": [{"label", "steps", "paths", "pending", "platform",
                                                  "progress" (the warm start's, before step 0), ...}]}
    POST /api/toggle {"run", "op", "path"[, "source"]}  -> {"request_id": 3}

A toggle answers 400 for a malformed body (fields must be strings; `source` at most SOURCE_MAX characters),
403 without the token or from another origin, 404 for an unknown run, 409 for a run that has not started or
has finished (nothing would apply the toggle), 413 for a body over BODY_MAX bytes, 415 for a non-JSON body.

Started by `rlkit dashboard runs/a runs/b --port 5006` (dashboards/commands.py) or `serve()` from Python.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from urllib.parse import urlsplit

import panel as pn
from tornado.ioloop import PeriodicCallback
from tornado.routing import Matcher, Rule
from tornado.web import RequestHandler

from rlkit.timeline.store import RunStore, StoreError

from .access import (DEFAULT_PORT, TOKEN_HEADER, TOKEN_PARAM, AccessError, check_serve_policy, host_allowed,
                     served_hosts, session_token, token_matches)
from .state import DashboardState, RunNotToggleable, initial_paths, request_toggle_in, run_labels
from .views import EXTENSIONS, Dashboard

REFUSED_TITLE = "Refused: this rlkit dashboard needs its token"
SOURCE_MAX = 200
"""Characters of a toggle request's `source` (who asked: "dashboard", "api", a script's name)."""
BODY_MAX = 4096
"""Bytes of a toggle request's JSON body."""


def url(address: str, port: int, token: str | None) -> str:
    host = "localhost" if address in ("127.0.0.1", "localhost") else address
    if host in ("0.0.0.0", "::"):
        import socket

        host = socket.gethostname()
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/" + (f"?{TOKEN_PARAM}={token}" if token else "")


def make_app(run_dirs, token: str | None = None, period_ms: int = 1000):
    """The function Panel calls for each new session: the dashboard, or a refusal without the token."""
    run_dirs = [str(d) for d in run_dirs]

    def app():
        pn.extension(*EXTENSIONS)
        presented = session_token(pn.state.session_args) if pn.state.curdoc else None
        if not token_matches(token, presented):
            how = "without a token" if not presented else "with a wrong token"
            return pn.pane.Markdown(
                f"# {REFUSED_TITLE}\nThe page was opened {how}. The dashboard was started with `--token`: open "
                f"it as `/?{TOKEN_PARAM}=<token>`. Nothing of the runs is shown and no toggle is accepted.")
        state = DashboardState.from_run_dirs(run_dirs, required_token=token, session_token=presented)
        dash = Dashboard(state)
        dash.follow(period_ms)
        pn.state.on_session_destroyed(lambda _ctx: (dash.stop(), state.close()))
        return dash

    return app


class _ForeignHost(Matcher):
    """Matches a request whose Host header names no address this dashboard serves."""

    def __init__(self, allowed: list[str]):
        self.allowed = allowed

    def match(self, request):
        return None if host_allowed(request.host, self.allowed) else {}


class _HostRefused(RequestHandler):
    def prepare(self):
        self.set_status(403)
        self.set_header("Content-Type", "text/plain")
        self.finish(f"refused: Host {self.request.host!r} is not an address this dashboard serves\n")


def refuse_foreign_hosts(app, allowed: list[str]) -> None:
    """Put a first rule into a tornado Application's router: any request with a foreign Host gets 403
    before the page or an endpoint sees it."""
    rule = app.default_router.process_rule(Rule(_ForeignHost(allowed), _HostRefused))
    app.default_router.rules.insert(0, rule)


class _ApiHandler(RequestHandler):
    def initialize(self, runs: dict[str, Path], token: str | None, hosts: list[str]):
        self.runs, self.token, self.hosts = runs, token, hosts

    def _reply(self, status: int, body: dict) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def _allowed(self) -> bool:
        if not host_allowed(self.request.host, self.hosts):  # also refused by the router's first rule
            self._reply(403, {"error": f"refused: Host {self.request.host!r} is not served here"})
            return False
        presented = self.request.headers.get(TOKEN_HEADER)
        if not token_matches(self.token, presented):
            how = "without a token" if not presented else "with a wrong token"
            self._reply(403, {"error": f"refused: this dashboard was started with --token and the request came "
                                       f"{how}; send it in the {TOKEN_HEADER} header"})
            return False
        return True


class StatusHandler(_ApiHandler):
    def get(self):
        if not self._allowed():
            return
        out = []
        for label, path in self.runs.items():
            entry = {"label": label, "run_dir": str(path), "exists": (path / "run.sqlite").is_file()}
            if entry["exists"]:
                try:
                    store = RunStore.open(path, readonly=True)
                except StoreError as e:
                    entry["error"] = str(e)
                    out.append(entry)
                    continue
                try:
                    steps = store.steps()
                    cfg = store.config()
                    entry.update(steps=len(steps), planned_steps=cfg.get("steps"),
                                 paths=steps[-1].ops_paths if steps else initial_paths(cfg),
                                 pending=[r.to_dict() for r in store.pending_toggles()],
                                 toggles=[t.to_dict() for t in store.toggles()],
                                 platform=store.info("platform"),
                                 progress=None if steps else store.info("progress"))
                except StoreError as e:
                    entry["error"] = str(e)
                finally:
                    store.close()
            out.append(entry)
        self._reply(200, {"runs": out})


TOGGLE_SHAPE = 'expected a JSON object {"run": LABEL, "op": OP, "path": "strict"|"native"[, "source": TEXT]}'


class ToggleHandler(_ApiHandler):
    def post(self):
        if not self._allowed():
            return
        # A form or text/plain POST from another site needs no CORS preflight; JSON does, and a page of
        # another origin is refused outright.
        if not self.request.headers.get("Content-Type", "").startswith("application/json"):
            return self._reply(415, {"error": "send the toggle as application/json: {\"run\", \"op\", \"path\"}"})
        origin = self.request.headers.get("Origin")
        if origin and not host_allowed(urlsplit(origin).netloc, self.hosts):
            return self._reply(403, {"error": f"refused: cross-origin request from {origin[:100]}"})
        if len(self.request.body or b"") > BODY_MAX:
            return self._reply(413, {"error": f"the body is over {BODY_MAX} bytes"})
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            return self._reply(400, {"error": f"not JSON; {TOGGLE_SHAPE}"})
        if not isinstance(body, dict):
            return self._reply(400, {"error": TOGGLE_SHAPE})
        unknown = sorted(set(body) - {"run", "op", "path", "source"})
        wrong = [k for k in ("run", "op", "path") if not isinstance(body.get(k), str)]
        source = body.get("source", "api")
        if unknown or wrong or not isinstance(source, str):
            what = f"unknown field {unknown[0]!r}" if unknown else f"field {(wrong or ['source'])[0]!r} must be a string"
            return self._reply(400, {"error": f"{what}; {TOGGLE_SHAPE}"})
        if not 0 < len(source) <= SOURCE_MAX:
            return self._reply(400, {"error": f"source must be 1 to {SOURCE_MAX} characters"})
        label, op, path = body["run"], body["op"], body["path"]
        if label not in self.runs:
            return self._reply(404, {"error": f"no run {label[:100]!r}; runs: {', '.join(self.runs)}"})
        try:
            request_id = request_toggle_in(self.runs[label], op, path, source)
        except RunNotToggleable as e:
            return self._reply(409, {"error": str(e)})
        except StoreError as e:
            return self._reply(400, {"error": str(e)})
        self._reply(200, {"request_id": request_id, "run": label, "op": op, "path": path})


def _quiet_closed_sockets(asyncio_loop, context: dict) -> None:
    """A browser tab that closes while the server is still sending to it ends a pending write with
    WebSocketClosedError/StreamClosedError: the normal end of a session, not an error to print a
    traceback for. Everything else goes to asyncio's default handler."""
    from tornado.iostream import StreamClosedError
    from tornado.websocket import WebSocketClosedError

    if isinstance(context.get("exception"), (WebSocketClosedError, StreamClosedError)):
        return
    asyncio_loop.default_exception_handler(context)


def serve(run_dirs, port: int = DEFAULT_PORT, address: str = "127.0.0.1", token: str | None = None,
          period_ms: int = 1000, on_start=None, on_tick=None) -> None:
    """Serve the dashboard of `run_dirs` until Ctrl-C or SIGTERM (or until `on_tick()`, called every second,
    returns True). `on_start(url)` runs once the port is bound. Raises AccessError for a non-loopback
    address without a token, OSError when the port is taken."""
    check_serve_policy(address, token)
    runs = run_labels(run_dirs)
    hosts = served_hosts(address, port)
    api = dict(runs=runs, token=token, hosts=hosts)
    # The page's websocket: only from the served names (Bokeh's list takes no bracketed IPv6 names)
    origins = [h for h in hosts if not h.startswith("[")]
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # before Panel's
    server = pn.serve({"/": make_app(list(runs.values()), token, period_ms)}, port=port, address=address,
                      websocket_origin=origins, show=False, start=False, title="rlkit dashboard",
                      extra_patterns=[(r"/api/status", StatusHandler, api), (r"/api/toggle", ToggleHandler, api)],
                      verbose=False, location=False)
    refuse_foreign_hosts(server._tornado, hosts)  # Bokeh's tornado Application (no public accessor)
    loop = server.io_loop
    loop.asyncio_loop.set_exception_handler(_quiet_closed_sockets)

    def stop(*_args) -> None:
        loop.asyncio_loop.call_soon_threadsafe(loop.stop)

    for sig in previous:
        signal.signal(sig, stop)
    ticker = None
    if on_tick is not None:
        ticker = PeriodicCallback(lambda: on_tick() and stop(), 1000)
        ticker.start()
    server.start()
    try:
        if on_start is not None:
            on_start(url(address, port, token))
        loop.start()
    finally:
        if ticker is not None:
            ticker.stop()
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["serve", "make_app", "url", "AccessError", "DEFAULT_PORT"]
