"""Who may call what: every route names the least role it needs, and a request proves its role with
``Authorization: Bearer TOKEN`` (an API token, see ``gpulayer token create``), or with the cookie of
a browser session opened at ``/login``."""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from typing import Any, TypeVar

from flask import current_app, g, request

from ..client import Client
from ..models import BrowserSession, Role, TokenInfo
from .errors import ApiError

F = TypeVar("F", bound=Callable[..., Any])
#: Roles that read, submit and administer, in order: each may do what the ones before it may.
_LADDER: tuple[Role, ...] = ("viewer", "submitter", "admin")
#: The attribute a view's least role is kept in (read by the test that checks every route).
ROLE_ATTRIBUTE = "gpulayer_role"
#: The browser session's cookie: a random id; Redis keeps only its hash.
SESSION_COOKIE = "gpulayer_session"
#: Methods that change nothing, so a session's request needs no CSRF token for them.
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def client() -> Client:
    found: Client = current_app.extensions["gpulayer.client"]
    return found


def allowed(token: TokenInfo, needed: Role) -> bool:
    """``metrics`` tokens read /metrics only; admins do everything; the rest go by the ladder."""
    if token.role == "admin":
        return True
    if needed == "metrics" or token.role == "metrics":
        return token.role == needed
    return _LADDER.index(token.role) >= _LADDER.index(needed)


def requires(role: Role) -> Callable[[F], F]:
    """The view needs a working token whose role allows ``role``: 401 without one, 403 if too weak."""

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def checked(*args: Any, **kwargs: Any) -> Any:
            g.token = authenticate()
            if not allowed(g.token, role):
                raise ApiError(
                    403, f"this needs the {role} role; the token {g.token.name!r} is {g.token.role}"
                )
            return view(*args, **kwargs)

        setattr(checked, ROLE_ATTRIBUTE, role)
        return checked  # type: ignore[return-value]

    return decorate


def authenticate() -> TokenInfo:
    """The request's token: ``Authorization: Bearer TOKEN``, or else a browser session's cookie
    (whose changes must also carry the session's CSRF token)."""
    header = request.headers.get("Authorization", "")
    cookie = request.cookies.get(SESSION_COOKIE)
    if not header and cookie:
        return _from_session(cookie)
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "send an API token: Authorization: Bearer TOKEN")
    info = client().check_token(token.strip())
    if info is None:
        raise ApiError(401, "the token is unknown, revoked or expired")
    return info


def _from_session(cookie: str) -> TokenInfo:
    """The token behind a session, checked again now: a session lives no longer than its token."""
    found = client().session(cookie)
    if found is None:
        g.forget_session = True
        raise ApiError(401, "the session has ended (logged out or too old); log in again")
    info = client().check_token_digest(found.token)
    if info is None:
        client().close_session(cookie)
        g.forget_session = True
        raise ApiError(401, "the session's token is revoked or expired; log in again")
    if request.method not in _SAFE_METHODS and not _csrf_ok(found):
        raise ApiError(403, "missing or wrong CSRF token (X-CSRF-Token header or csrf_token field)")
    g.browser_session = found
    g.session_cookie = cookie
    return info


def session() -> BrowserSession | None:
    """The browser session this request came through, once authenticated; None for a bearer token."""
    found: BrowserSession | None = g.get("browser_session")
    return found


def _csrf_ok(found: BrowserSession) -> bool:
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token") or ""
    return bool(sent) and hmac.compare_digest(sent.encode(), found.csrf_token.encode())
