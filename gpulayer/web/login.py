"""Browser sessions: ``POST /login`` takes an API token and answers a session cookie (HttpOnly,
SameSite=Strict) and a CSRF token that every change made through the session must carry.

The cookie is a random id. Redis keeps only its SHA-256, naming the session's record (the token's
SHA-256, the CSRF token) with a TTL, so nothing in Redis, nor any key kept there, makes a cookie.
A session ends at ``/logout``, when its token is revoked or expires, or after
:data:`~gpulayer.store.tokens.SESSION_LIFETIME`, whichever comes first; it ends on the server, so
a copy of the cookie stops working too. Failed logins (and failed bearer tokens) are limited per
client address, and a login a page of another site posts is refused (login CSRF: it would log the
browser into the attacker's session).
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, jsonify, request

from .auth import SESSION_COOKIE, guessed, refuse_other_sites, requires, service, session

login = Blueprint("login", __name__)
#: The app's setting that makes the cookie Secure (served over TLS, or behind a proxy that is).
SECURE_COOKIES = "GPULAYER_SECURE_COOKIES"


@login.post("/login")
def log_in() -> Response:
    """``{"token": "..."}`` (JSON) or a ``token`` form field: a session for that token."""
    refuse_other_sites("logins")
    opened = guessed(service().open_session, _sent_token())
    _close_sent_session()  # a browser holds one session: the one it had ends now, not in 12 h
    answer = jsonify(name=opened.token.name, role=opened.token.role, csrf_token=opened.record.csrf_token)
    answer.set_cookie(
        SESSION_COOKIE,
        opened.cookie,
        max_age=opened.lifetime,
        path="/",
        secure=_secure(),
        httponly=True,
        samesite="Strict",
    )
    return answer


def _sent_token() -> str:
    data = request.get_json(silent=True)
    token = (data.get("token") if isinstance(data, dict) else None) or request.form.get("token") or ""
    return str(token)


@login.get("/api/v1/session")
@requires("viewer")
def current() -> Response:
    """Who the request is: its token's name and role, and the session's CSRF token (none for a
    request that sent its token itself). The dashboard asks this when it opens."""
    found = session()
    return jsonify(
        name=g.token.name, role=g.token.role, csrf_token=found.csrf_token if found is not None else None
    )


@login.post("/logout")
def log_out() -> Response:
    """End the request's session on the server (a saved copy of its cookie is refused from now on)
    and clear the cookie."""
    _close_sent_session()
    answer = jsonify(logged_out=True)
    _forget(answer)
    return answer


def _close_sent_session() -> None:
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        service().close_session(cookie)


@login.after_app_request
def _forget_ended(answer: Response) -> Response:
    """A request whose session had ended (found so by :func:`.auth.authenticate`) also clears the
    browser's stale cookie."""
    if g.get("forget_session"):
        _forget(answer)
    return answer


def _forget(answer: Response) -> None:
    answer.delete_cookie(SESSION_COOKIE, path="/", secure=_secure(), httponly=True, samesite="Strict")


def _secure() -> bool:
    """Secure when the app is told so, or when this request came over HTTPS anyway."""
    return bool(current_app.config.get(SECURE_COOKIES)) or request.is_secure
