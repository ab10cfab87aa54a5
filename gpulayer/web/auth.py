"""Who may call what: every route names the least role it needs, and a request proves its role with
``Authorization: Bearer TOKEN`` (an API token, see ``gpulayer token create``)."""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from typing import Any, TypeVar

from flask import current_app, g, request, session

from ..client import Client
from ..models import Role, TokenInfo
from .errors import ApiError

F = TypeVar("F", bound=Callable[..., Any])
#: Roles that read, submit and administer, in order: each may do what the ones before it may.
_LADDER: tuple[Role, ...] = ("viewer", "submitter", "admin")
#: The attribute a view's least role is kept in (read by the test that checks every route).
ROLE_ATTRIBUTE = "gpulayer_role"


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
    """The request's token: ``Authorization: Bearer TOKEN``, or a browser session from ``/login``
    (whose changes must also carry the session's CSRF token)."""
    header = request.headers.get("Authorization", "")
    if not header and "token" in session:
        info = client().check_token_digest(session["token"])
        if info is None:
            session.clear()
            raise ApiError(401, "the session's token is revoked or expired; log in again")
        if request.method not in ("GET", "HEAD", "OPTIONS") and not _csrf_ok():
            raise ApiError(403, "missing or wrong CSRF token (X-CSRF-Token header or csrf_token field)")
        return info
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "send an API token: Authorization: Bearer TOKEN")
    info = client().check_token(token.strip())
    if info is None:
        raise ApiError(401, "the token is unknown, revoked or expired")
    return info


def _csrf_ok() -> bool:
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token") or ""
    return bool(sent) and hmac.compare_digest(sent, session.get("csrf", ""))
