"""The dashboard: the static page in the repository's ``web/`` folder (no build step), served as is.
The page holds no data; it reads everything through the API with the browser's session."""

from __future__ import annotations

import os
from pathlib import Path

from flask import Blueprint, Response, send_from_directory

from .errors import ApiError

dashboard = Blueprint("dashboard", __name__)
#: Where the dashboard's files are: ``GPULAYER_WEB_ROOT``, or ``web/`` beside the package in a source
#: checkout (an editable install, as the README's commands make).
WEB_ROOT = Path(os.environ.get("GPULAYER_WEB_ROOT") or Path(__file__).resolve().parents[2] / "web")


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
