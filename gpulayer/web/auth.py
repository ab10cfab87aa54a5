"""Who may call what: every route names the least role it needs, and a request proves its role with
``Authorization: Bearer TOKEN`` (an API token, see ``gpulayer token create``), or with the cookie of
a browser session opened at ``/login``. Failed guesses at a token, sent to ``/login`` or as a bearer
token, count toward one limit per client address."""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import current_app, g, request

from ..client import Client
from ..models import BrowserSession, Role, TokenInfo
from ..service import Service
from .errors import ApiError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
#: Roles that read, submit and administer, in order: each may do what the ones before it may.
_LADDER: tuple[Role, ...] = ("viewer", "submitter", "admin")
#: The attribute a view's least role is kept in (read by the test that checks every route).
ROLE_ATTRIBUTE = "gpulayer_role"
#: The browser session's cookie: a random id; Redis keeps only its hash.
SESSION_COOKIE = "gpulayer_session"
#: Methods that change nothing, so a session's request needs no CSRF token for them.
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
#: Failed guesses at a token (logins, bearer tokens) one address may make per window before its
#: logins and bearer requests are refused (429) until the window ends.
MAX_FAILURES = 10
#: The window (s).
FAILURE_WINDOW = 300


def client() -> Client:
    found: Client = current_app.extensions["gpulayer.client"]
    return found


def service() -> Service:
    found: Service = current_app.extensions["gpulayer.service"]
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
    return guessed(service().check_token, token.strip())


def guessed(check: Callable[[str], T | None], token: str) -> T:
    """What ``check`` finds for a token the request sent (as a bearer token, or to log in): 401 if
    nothing, and the guess counts toward its address's limit; 429 while the address is over it, even
    for a right guess, so guessing on past the limit learns nothing."""
    address = request.remote_addr or "unknown"
    if service().failed_logins(address) >= MAX_FAILURES:
        raise ApiError(429, f"too many failed logins from {address}; wait a few minutes")
    found = check(token) if token else None
    if found is None:
        service().record_failed_login(address, FAILURE_WINDOW)
        raise ApiError(401, "the token is unknown, revoked or expired")
    return found


def refuse_other_sites(what: str) -> None:
    """Refuse (403) a request a page of another site made a browser send: its ``Origin``, else its
    ``Referer``, names another host than this server's. A request naming neither (a program's, not a
    page's) passes: it is what its token, or the token it logs in with, lets it be."""
    sent = request.headers.get("Origin") or request.headers.get("Referer")
    if sent is not None and not _same_origin(sent, request.host):
        raise ApiError(403, f"{what} from {urlsplit(sent).netloc or sent} are not accepted here")


def _same_origin(origin: str, host: str) -> bool:
    """Whether a page from ``origin`` is this server's (``host``: the Host header, a port or not)."""
    page = urlsplit(origin)
    return page.netloc == host if ":" in host else page.hostname == host


def _from_session(cookie: str) -> TokenInfo:
    """The token behind a session, checked again now: a session lives no longer than its token."""
    found = service().session(cookie)
    if found is None:
        g.forget_session = True
        raise ApiError(401, "the session has ended (logged out or too old); log in again")
    info = service().check_token_digest(found.token)
    if info is None:
        service().close_session(cookie)
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
