"""The Flask app factory: ``create_app(client)`` serves the HTTP API over one :class:`Client`."""

from __future__ import annotations

from flask import Flask

from ..client import Client
from . import errors, sockets
from .api import api
from .dashboard import dashboard
from .hub import Hub
from .login import login
from .metrics import metrics
from .openapi import openapi


def create_app(client: Client | None = None) -> Flask:
    """The app, over ``client`` (default: a :class:`Client` with the default connection). Its hub's
    threads start with the first websocket."""
    app = Flask("gpulayer.web", static_folder=None)  # the dashboard serves /static itself
    app.json.sort_keys = False  # type: ignore[attr-defined]  # fields in the models' order
    connected = client or Client()
    app.extensions["gpulayer.client"] = connected
    app.extensions["gpulayer.hub"] = Hub(connected)
    app.config.update(
        SECRET_KEY=connected.session_key(),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_NAME="gpulayer_session",
        # Uploads (a job's source and inputs) past the job's own limit are refused before they are read.
        MAX_CONTENT_LENGTH=connected.settings.max_job_bytes + 1024 * 1024,
    )
    app.register_blueprint(dashboard)
    app.register_blueprint(login)
    app.register_blueprint(api)
    app.register_blueprint(metrics)
    app.register_blueprint(openapi)
    sockets.install(app)
    errors.install(app)
    return app
