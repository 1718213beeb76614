"""The dashboard's HTTP surface: Host validation (DNS rebinding), websocket origins, typed and bounded toggle
requests, and 409 for runs no toggle can reach.

One `rlkit dashboard` subprocess on loopback (no token: the case DNS rebinding targets) serves two fake
runs: `live` (2 of 6 steps) and `done` (every planned step). Requests go through http.client so the test
sets the Host header itself, as a rebinding page's browser would.
"""

from __future__ import annotations

import http.client as httpclient
import json

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from rlkit.dashboards.access import host_allowed, served_hosts
from rlkit.dashboards.server import SOURCE_MAX
from rlkit.timeline import RunStore
from tests.dashboards.conftest import FakeRun, free_port, http, rlkit, stop, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    live, done = FakeRun(root / "live", steps=6), FakeRun(root / "done", steps=2)
    live.commit(2)
    done.commit(2)
    live.close()
    done.close()
    port = free_port()
    log = root / "dashboard.log"
    proc = rlkit("dashboard", str(root / "live"), str(root / "done"), "--port", str(port), log=log)
    try:
        wait_for("the dashboard", lambda: http("GET", f"http://127.0.0.1:{port}/api/status")[0] == 200,
                 proc=proc, log=log)
        yield port, root
    finally:
        assert stop(proc) == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def request(port: int, method: str, path: str, body=None, host: str | None = None,
            headers: dict | None = None) -> tuple[int, dict | str]:
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    hdrs = {"Host": host or f"127.0.0.1:{port}", "Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=hdrs)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def pending(root, run: str) -> list:
    with RunStore.open(root / run, readonly=True) as s:
        return s.pending_toggles()


def test_served_hosts_are_the_loopback_names_or_the_configured_address():
    loop_hosts = served_hosts("127.0.0.1", 5077)
    assert host_allowed("localhost:5077", loop_hosts) and host_allowed("127.0.0.1:5077", loop_hosts)
    assert host_allowed("[::1]:5077", loop_hosts)
    for foreign in ("evil.example:5077", "127.0.0.1:5078", "localhost.evil.example:5077", "", None):
        assert not host_allowed(foreign, loop_hosts), foreign
    assert served_hosts("10.1.2.3", 80) == ["10.1.2.3:80"]
    assert host_allowed("10.1.2.3", served_hosts("10.1.2.3", 80))


def test_the_dns_rebinding_request_is_refused(server):
    """Issue 21 case 5: this exact request (curl's) got 200 and a stored toggle."""
    port, root = server
    evil = f"evil.example:{port}"
    code, body = request(port, "POST", "/api/toggle", {"run": "live", "op": "linear", "path": "native"},
                         host=evil, headers={"Origin": f"http://{evil}"})
    assert code == 403 and "not an address this dashboard serves" in body, (code, body)
    for path in ("/", "/api/status"):  # nor is the page or the status readable under a foreign name
        code, body = request(port, "GET", path, host=evil)
        assert code == 403, (path, code)
    assert pending(root, "live") == []


def test_the_websocket_accepts_only_served_origins(server):
    port, _ = server

    async def connect(origin: str):
        req = HTTPRequest(f"ws://127.0.0.1:{port}/ws", headers={"Origin": origin})
        return await websocket_connect(req)

    with pytest.raises(HTTPClientError) as e:
        IOLoop.current().run_sync(lambda: connect(f"http://evil.example:{port}"))
    assert e.value.code == 403


@pytest.mark.parametrize("body, code, needle", [
    ({"run": ["x"], "op": "linear", "path": "native"}, 400, "field 'run' must be a string"),
    ({"run": "live", "op": 3, "path": "native"}, 400, "field 'op' must be a string"),
    ({"run": "live", "op": "linear", "path": "native", "source": 5}, 400, "field 'source' must be a string"),
    ({"run": "live", "op": "linear", "path": "native", "source": "x" * (SOURCE_MAX + 1)}, 400, "source must be"),
    ({"run": "live", "op": "linear", "path": "native", "token": "t"}, 400, "unknown field 'token'"),
    (["live", "linear", "native"], 400, "expected a JSON object"),
    (b"{not json", 400, "not JSON"),
    ({"run": "live", "op": "softmax", "path": "native"}, 400, "unknown op"),
    ({"run": "nope", "op": "linear", "path": "native"}, 404, "no run"),
    ({"run": "live", "op": "linear", "path": "native", "source": "s" * 5_000_000}, 413, "over"),
    ({"run": "done", "op": "linear", "path": "native"}, 409, "the run is finished"),
])
def test_bad_toggle_requests_are_4xx_and_store_nothing(server, body, code, needle):
    port, root = server
    got, reply = request(port, "POST", "/api/toggle", body)
    assert got == code and needle in (reply["error"] if isinstance(reply, dict) else reply), (got, reply)
    assert pending(root, "live") == [] and pending(root, "done") == []


def test_a_good_toggle_request_is_stored_once(server):
    port, root = server
    code, reply = request(port, "POST", "/api/toggle", {"run": "live", "op": "rope", "path": "native",
                                                        "source": "a script"})
    assert code == 200 and reply["op"] == "rope", reply
    [req] = pending(root, "live")
    assert (req.op, req.path, req.source) == ("rope", "native", "a script")
    code, status = request(port, "GET", "/api/status", host=f"localhost:{port}")
    assert code == 200 and [p["source"] for p in status["runs"][0]["pending"]] == ["a script"]
