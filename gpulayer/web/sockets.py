"""Websockets: ``/ws/jobs/<id>/logs`` sends a job's log lines, those stored first, then each new one
as it is printed, until the job ends; ``/ws/events`` sends every job's state changes, workers joining
and leaving, and each worker's telemetry samples. The token and the request's Origin are checked
before a connection is upgraded. A socket closes (1008) when its token is revoked, when its token
expires, and when the browser session it was opened through ends: it was let in once, and must not
outlive what let it in."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from flask import Blueprint, Flask, current_app, g, request
from flask_sock import Sock

from ..models import TokenInfo
from .auth import ROLE_ATTRIBUTE, allowed, authenticate, client, refuse_other_sites, service
from .errors import ApiError
from .hub import Hub, Watcher

sockets = Blueprint("sockets", __name__, url_prefix="/ws")
sock = Sock()
#: How often (s) a socket with nothing to send checks that its client is still there.
_IDLE = 1.0


@sockets.before_request
def _check() -> None:
    """Before the upgrade: a same-origin page (or a client that sends no Origin), and a token that
    may read."""
    refuse_other_sites("websockets")
    g.token = authenticate()
    if not allowed(g.token, "viewer"):
        raise ApiError(403, f"this needs the viewer role; the token {g.token.name!r} is {g.token.role}")


def hub() -> Hub:
    found: Hub = current_app.extensions["gpulayer.hub"]
    return found


@sock.route("/jobs/<job_id>/logs", bp=sockets)  # type: ignore[untyped-decorator]
def job_logs(ws: Any, job_id: str) -> None:
    """``?rank=R`` keeps one rank of a gang job; ``?after=ID`` starts after that line."""
    client().get(job_id)  # 404 (as a close) for a job that does not exist
    rank = request.args.get("rank")

    def send(kind: str, value: Any) -> bool:
        if kind == "end":
            ws.send(json.dumps({"end": value}))
            return False
        line_id, line = value
        if rank is None or str(line.rank) == rank:
            ws.send(json.dumps({"id": line_id, **line.model_dump(mode="json")}))
        return True

    _pump(ws, hub().watch(job_id, g.token.name, request.args.get("after", "0-0")), send, _still_let_in())


@sock.route("/events", bp=sockets)  # type: ignore[untyped-decorator]
def events(ws: Any) -> None:
    """Each event as its JSON text: ``{"type": "job", "id", "state"}``, ``{"type": "worker", "name",
    "event": "joined"|"left"}``, ``{"type": "telemetry", "worker", "sample"}``."""

    def send(kind: str, value: Any) -> bool:
        ws.send(value)
        return True

    _pump(ws, hub().listen(g.token.name), send, _still_let_in())


def _pump(
    ws: Any, watcher: Watcher, send: Callable[[str, Any], bool], ended: Callable[[], str | None]
) -> None:
    """Hand what the hub gives ``watcher`` to ``send`` until it says stop, the client goes, the
    token is revoked, or ``ended`` (asked about once per ``_IDLE``, however busy the socket) gives a
    reason to close."""
    next_check = 0.0
    try:
        while True:
            try:
                kind, value = watcher.inbox.get(timeout=_IDLE)
            except queue.Empty:
                ws.receive(timeout=0)  # raises once the client has gone
                kind, value = "idle", None
            if kind == "revoked":
                ws.close(reason=1008, message="token revoked")
                return
            if time.monotonic() >= next_check:
                reason = ended()
                if reason is not None:
                    ws.close(reason=1008, message=reason)
                    return
                next_check = time.monotonic() + _IDLE
            if kind != "idle" and not send(kind, value):
                return
    finally:
        hub().leave(watcher)


def _still_let_in() -> Callable[[], str | None]:
    """For :func:`_pump`: why this request's socket must close now (its token expired, or the
    session it came through ended), or None while it may stay open."""
    token: TokenInfo = g.token
    cookie: str | None = g.get("session_cookie")

    def ended() -> str | None:
        if token.expires_at is not None and token.expires_at <= datetime.now(timezone.utc):
            return "token expired"
        if cookie is not None and service().session(cookie) is None:
            return "session ended"
        return None

    return ended


def install(app: Flask) -> None:
    """Serve the websockets; each needs the viewer role (checked before the upgrade, above)."""
    sock.init_app(app)
    app.register_blueprint(sockets)
    for endpoint, view in app.view_functions.items():
        if endpoint.startswith(f"{sockets.name}."):
            setattr(view, ROLE_ATTRIBUTE, "viewer")
