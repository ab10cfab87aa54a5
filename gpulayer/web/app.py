"""The Flask app factory: ``create_app(client)`` serves the HTTP API over one :class:`Client` (and the
:class:`Service` over it)."""

from __future__ import annotations

from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from ..client import Client
from ..service import Service
from . import errors, sockets
from .api import api
from .dashboard import dashboard
from .hub import Hub
from .login import SECURE_COOKIES, login
from .mcp import mcp_http
from .metrics import metrics
from .openapi import openapi


def create_app(
    client: Client | None = None, *, behind_proxy: bool = False, secure_cookies: bool = False
) -> Flask:
    """The app, over ``client`` (default: a :class:`Client` with the default connection). Its hub's
    threads start with the first websocket.

    ``behind_proxy``: every request comes through one trusted proxy (which terminates TLS), so the
    client's address, scheme and host are the ones that proxy's ``X-Forwarded-*`` headers name, and
    cookies are Secure. Without it those headers are ignored: a client could send any address in
    them and so dodge the limit on failed logins. ``secure_cookies``: served over TLS."""
    app = Flask("gpulayer.web", static_folder=None)  # the dashboard serves /static itself
    app.json.sort_keys = False  # type: ignore[attr-defined]  # fields in the models' order
    connected = client or Client()
    service = Service(connected)
    app.extensions["gpulayer.client"] = connected
    app.extensions["gpulayer.service"] = service
    app.extensions["gpulayer.hub"] = Hub(service)
    app.config.update(
        {SECURE_COOKIES: secure_cookies or behind_proxy},
        # Uploads (a job's source and inputs) past the job's own limit are refused before they are read.
        MAX_CONTENT_LENGTH=connected.settings.max_job_bytes + 1024 * 1024,
    )
    if behind_proxy:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1, x_host=1)  # type: ignore[method-assign]
    app.register_blueprint(dashboard)
    app.register_blueprint(login)
    app.register_blueprint(api)
    app.register_blueprint(metrics)
    app.register_blueprint(openapi)
    app.register_blueprint(mcp_http)
    sockets.install(app)
    errors.install(app)
    return app
