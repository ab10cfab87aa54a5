"""Browser sessions: ``POST /login`` takes an API token and answers a session cookie (HttpOnly,
SameSite=Strict) that stands for it — revoking the token ends the session too — and a CSRF token
that every change made through the session must carry. Failed logins are limited per address."""

from __future__ import annotations

import secrets

from flask import Blueprint, Response, g, jsonify, request, session

from ..store.tokens import token_hash
from .auth import client, requires
from .errors import ApiError

login = Blueprint("login", __name__)
#: Failed logins one address may make per window before it is refused (429) until the window ends.
MAX_FAILURES = 10
#: The window (s).
FAILURE_WINDOW = 300


@login.post("/login")
def log_in() -> Response:
    """``{"token": "..."}`` (JSON) or a ``token`` form field: a session for that token."""
    address = request.remote_addr or "unknown"
    if client().failed_logins(address) >= MAX_FAILURES:
        raise ApiError(429, f"too many failed logins from {address}; wait a few minutes")
    data = request.get_json(silent=True)
    token = (data.get("token") if isinstance(data, dict) else None) or request.form.get("token") or ""
    info = client().check_token(str(token)) if token else None
    if info is None:
        client().record_failed_login(address, FAILURE_WINDOW)
        raise ApiError(401, "the token is unknown, revoked or expired")
    session.clear()
    session["token"] = token_hash(str(token))
    session["csrf"] = secrets.token_urlsafe(32)
    return jsonify(name=info.name, role=info.role, csrf_token=session["csrf"])


@login.get("/api/v1/session")
@requires("viewer")
def current() -> Response:
    """Who the request is: its token's name and role, and the session's CSRF token (none for a
    request that sent its token itself). The dashboard asks this when it opens."""
    return jsonify(name=g.token.name, role=g.token.role, csrf_token=session.get("csrf"))


@login.post("/logout")
def log_out() -> Response:
    session.clear()
    return jsonify(logged_out=True)
