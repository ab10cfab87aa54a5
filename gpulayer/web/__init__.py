"""The HTTP API (and, later, the dashboard): a Flask app over :class:`gpulayer.Client`."""

from .app import create_app

__all__ = ["create_app"]
