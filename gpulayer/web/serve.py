"""Serving the app in production: gunicorn, one process with threads (flask-sock's websockets need
a thread each), not Flask's development server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

#: Requests (and open websockets) served at once.
THREADS = 32


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, app: Flask, options: dict[str, Any]) -> None:
        self._app = app
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return self._app


def serve(
    app: Flask, host: str, port: int, threads: int = THREADS, *, tls: tuple[Path, Path] | None = None
) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM or Ctrl+C; over HTTPS with ``tls``, a
    certificate (PEM, with its chain) and its key."""
    options: dict[str, Any] = {
        "bind": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        "workers": 1,
        "worker_class": "gthread",
        "threads": threads,
        # Websockets stay open for as long as a browser tab does.
        "timeout": 0,
        "graceful_timeout": 5,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
    }
    if tls is not None:
        options["certfile"], options["keyfile"] = (str(path) for path in tls)
    _Gunicorn(app, options).run()
