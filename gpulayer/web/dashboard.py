"""The dashboard: the static page in the repository's ``web/`` folder (no build step), served as is.
The page holds no data; it reads everything through the API with the browser's session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flask import Blueprint, Response, send_from_directory

from .errors import ApiError

dashboard = Blueprint("dashboard", __name__)


def _web_root() -> Path:
    """Where the dashboard's files are: ``GPULAYER_WEB_ROOT``; else ``web/`` beside the package in a
    source checkout (an editable install, as the README's commands make); else where a wheel put
    them, ``<prefix>/share/gpulayer/web``."""
    if os.environ.get("GPULAYER_WEB_ROOT"):
        return Path(os.environ["GPULAYER_WEB_ROOT"])
    checkout = Path(__file__).resolve().parents[2] / "web"
    return (
        checkout if (checkout / "index.html").is_file() else Path(sys.prefix) / "share" / "gpulayer" / "web"
    )


WEB_ROOT = _web_root()


def _send(name: str) -> Response:
    if not (WEB_ROOT / "index.html").is_file():
        raise ApiError(404, f"the dashboard's files are not here ({WEB_ROOT}); set GPULAYER_WEB_ROOT")
    answer = send_from_directory(WEB_ROOT, name, max_age=0)
    # The page runs only its own scripts, and nothing may frame it.
    answer.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'"
    )
    answer.headers["X-Content-Type-Options"] = "nosniff"
    return answer


@dashboard.get("/")
def page() -> Response:
    return _send("index.html")


@dashboard.get("/static/<path:name>")
def static(name: str) -> Response:
    return _send(name)
