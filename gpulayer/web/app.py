"""The Flask app factory: ``create_app(client)`` serves the HTTP API over one :class:`Client`."""

from __future__ import annotations

from flask import Flask

from ..client import Client
from . import errors
from .api import api


def create_app(client: Client | None = None) -> Flask:
    """The app, over ``client`` (default: a :class:`Client` with the default connection)."""
    app = Flask("gpulayer.web")
    app.json.sort_keys = False  # type: ignore[attr-defined]  # fields in the models' order
    app.extensions["gpulayer.client"] = client or Client()
    app.register_blueprint(api)
    errors.install(app)
    return app
