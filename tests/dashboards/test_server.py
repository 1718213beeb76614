"""The server's asyncio exception handler: a closed browser socket is not printed as a traceback;
anything else still reaches asyncio's default handler."""

from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from rlkit.dashboards.server import _quiet_closed_sockets


class FakeLoop:
    def __init__(self):
        self.reported = []

    def default_exception_handler(self, context):
        self.reported.append(context)


def test_closed_sockets_are_quiet_and_other_errors_are_reported():
    loop = FakeLoop()
    _quiet_closed_sockets(loop, {"message": "Task exception was never retrieved", "exception": WebSocketClosedError()})
    _quiet_closed_sockets(loop, {"message": "Task exception was never retrieved", "exception": StreamClosedError()})
    assert loop.reported == []
    boom = {"message": "Task exception was never retrieved", "exception": RuntimeError("boom")}
    _quiet_closed_sockets(loop, boom)
    _quiet_closed_sockets(loop, {"message": "no exception at all"})
    assert loop.reported == [boom, {"message": "no exception at all"}]
