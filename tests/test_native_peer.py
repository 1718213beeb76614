"""rlkit.bench.native_peer: a second process answering timing requests in lockstep, so strict (here) and
native (there, at torch's cuBLAS defaults) are timed in turn. The protocol runs on the CPU with a stand-in
handler; the GPU handler (rlkit.bench.kernels._peer_request) runs in the benchmark on the lent GPU."""

import os
import sys

import pytest

from rlkit.bench.native_peer import NativePeer, PeerError, environment_at_defaults

HANDLER = """
import os, sys, time
from rlkit.bench.native_peer import serve
def handle(req):
    print("noise on stdout must not reach the replies")
    if req["op"] == "die":
        sys.stderr.write("dying as asked\\n"); sys.stderr.flush(); os._exit(3)
    if req["op"] == "sleep":
        time.sleep(req["s"])
    if req["op"] != "square" and req["op"] != "sleep":
        raise ValueError(f"unknown op {req['op']!r}")
    return {"ms": req.get("x", 0) ** 2, "switch": os.environ.get("RLKIT_GEMM_CUBLAS"),
            "workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
sys.exit(serve(handle, ready={"pid": os.getpid()}))
"""


def _peer(tmp_path, **kw) -> NativePeer:
    env = environment_at_defaults({**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"})
    return NativePeer([sys.executable, "-c", HANDLER], env, tmp_path / "peer.log", **kw)


def test_the_peer_answers_in_turn_at_torchs_defaults(tmp_path):
    """Requests are answered one by one in order; the peer's environment has rlkit's no-workspace settings
    taken out and the strict route off; what it prints goes to its log, not into the replies."""
    with _peer(tmp_path) as peer:
        assert isinstance(peer.ready["pid"], int) and peer.ready["pid"] != os.getpid()
        answers = [peer.ask({"op": "square", "x": x}) for x in (1, 2, 3)]
    assert [a["ms"] for a in answers] == [1, 4, 9]
    assert answers[0]["switch"] == "0" and answers[0]["workspace"] is None
    assert "noise on stdout" in (tmp_path / "peer.log").read_text()


def test_a_refused_request_is_an_error_and_the_peer_goes_on(tmp_path):
    with _peer(tmp_path) as peer:
        with pytest.raises(PeerError, match="unknown op 'cube'"):
            peer.ask({"op": "cube", "x": 2})
        assert peer.ask({"op": "square", "x": 5})["ms"] == 25


def test_a_peer_that_dies_is_reported_with_its_log(tmp_path):
    with _peer(tmp_path) as peer:
        with pytest.raises(PeerError, match=r"exited \(status 3\)[\s\S]*dying as asked"):
            peer.ask({"op": "die"})
        with pytest.raises(PeerError, match="has exited"):
            peer.ask({"op": "square", "x": 1})


def test_a_peer_that_does_not_answer_in_time_is_stopped(tmp_path):
    with _peer(tmp_path, answer_timeout=1.0) as peer:
        with pytest.raises(PeerError, match=r"did not answer .* within 1 s \(stopped\)"):
            peer.ask({"op": "sleep", "s": 30})
        assert peer._proc.poll() is not None


def test_a_peer_that_fails_to_start_says_why(tmp_path):
    with pytest.raises(PeerError, match=r"before answering start[\s\S]*ZeroDivisionError"):
        NativePeer([sys.executable, "-c", "1/0"], dict(os.environ), tmp_path / "peer.log")


def test_the_defaults_environment_drops_only_rlkits_cublas_settings():
    env = environment_at_defaults({"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0",
                                   "RLKIT_GEMM_CUBLAS": "1", "PATH": "/bin"})
    assert env == {"RLKIT_GEMM_CUBLAS": "0", "PATH": "/bin"}
