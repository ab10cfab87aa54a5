"""The HTTP API and the dashboard: a Flask app over :class:`gpulayer.Client` and, for tokens, sessions
and monitoring, :class:`gpulayer.service.Service`."""

from .app import create_app

__all__ = ["create_app"]
