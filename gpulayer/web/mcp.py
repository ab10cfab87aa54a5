"""``/mcp``: the MCP server of :mod:`gpulayer.agents` over streamable HTTP, for agents on machines
without Redis credentials, authorized by the API's tokens: a viewer's sees the read-only tools,
a submitter's or an admin's all of them.

The SDK serves it as an ASGI app; this Flask app runs under a WSGI server. The bridge runs the
ASGI apps on one event loop of their own (a daemon thread, with their lifespans held open) and
hands each request to them (a2wsgi). Stateless, with JSON answers: each request stands alone, so
any process of the server can answer it (progress notifications are not sent over HTTP).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from flask import Blueprint, current_app, g, request
from werkzeug.wrappers import Response

from ..client import Client
from .auth import allowed, client, requires
from .errors import ApiError

mcp_http = Blueprint("mcp", __name__)
_PATH = "/mcp"


@mcp_http.route(_PATH, methods=["GET", "POST", "DELETE"])
@requires("viewer")
def serve() -> Response:
    """MCP's own messages, reads and changes alike: the role picks the server that answers them (a
    viewer's has no tool that changes anything)."""
    bridge: Bridge = current_app.extensions.setdefault("gpulayer.mcp", Bridge(client()))
    return Response.from_app(bridge.app(read_only=not allowed(g.token, "submitter")), request.environ)


class Bridge:
    """The read-only and the full server's ASGI apps, made on first use, on one event loop."""

    def __init__(self, connected: Client) -> None:
        self._client = connected
        self._lock = threading.Lock()
        self._apps: dict[bool, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def app(self, *, read_only: bool) -> Any:
        with self._lock:
            if read_only not in self._apps:
                self._apps[read_only] = self._make(read_only)
            return self._apps[read_only]

    def _make(self, read_only: bool) -> Any:
        try:
            from a2wsgi import ASGIMiddleware
            from mcp.server.transport_security import TransportSecuritySettings

            from ..agents import build
        except ImportError:
            raise ApiError(501, "this server has no MCP support: pip install 'gpulayer[mcp]'") from None
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="gpulayer-mcp", daemon=True).start()
        server = build(self._client, read_only=read_only, remote=True)
        asgi = server.streamable_http_app(
            streamable_http_path=_PATH,
            stateless_http=True,
            json_response=True,
            # Requests are authorized by API tokens (above), not by where they seem to come from.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        started = threading.Event()

        async def hold() -> None:
            async with asgi.router.lifespan_context(asgi):
                started.set()
                await asyncio.Event().wait()  # for the life of the process

        asyncio.run_coroutine_threadsafe(hold(), self._loop)
        started.wait(30)
        return ASGIMiddleware(asgi, loop=self._loop)  # type: ignore[arg-type]  # Starlette types its scope loosely
