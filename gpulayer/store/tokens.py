"""API tokens: named, with a role, optionally expiring, stored only as their SHA-256.

A token's record lives under the hash of the token, with a TTL when it expires, so checking one is
one read and an expired or revoked token is simply not found. A name index lets people list and
revoke them by name; revoking publishes the name, so open websockets of that token close at once.

A browser session is a random cookie whose record Redis keeps under the cookie's SHA-256: the
token's SHA-256 and the session's CSRF token. Redis holds neither the cookie nor anything a cookie
could be made from, so a copy of Redis (its append-only file, a backup) opens no session.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from datetime import datetime, timedelta, timezone
from typing import cast

from redis import Redis
from redis.client import Pipeline

from ..errors import InvalidJobSpec, TokenError
from ..models import BrowserSession, OpenedSession, Role, TokenInfo, validated
from .keys import Keys

#: Every token starts so, for secret scanners and people reading logs.
TOKEN_PREFIX = "glt_"
#: The longest a token may be made to last (s): ten years; or it may never expire.
MAX_LIFETIME = 10 * 365 * 86400
#: The longest a browser session lasts (s): a working day, so a cookie left in a browser goes stale
#: even while its token lives on; never past the token's own expiry.
SESSION_LIFETIME = 12 * 3600


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def create(self, name: str, role: Role, expires_in: float | None = None) -> tuple[str, TokenInfo]:
        """A new token (returned once, never stored) and its record. :class:`TokenError` if the name
        is taken or the name, role or lifetime is not valid."""
        now = datetime.now(timezone.utc)
        if expires_in is not None and not 0 < expires_in <= MAX_LIFETIME:
            raise TokenError("a token's lifetime must be positive and at most 10 years")
        expires = now + timedelta(seconds=expires_in) if expires_in is not None else None
        try:
            info = validated(
                TokenInfo, {"name": name, "role": role, "created_at": now, "expires_at": expires}
            )
        except InvalidJobSpec as exc:
            raise TokenError(str(exc).replace("invalid job", "invalid token", 1)) from None
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        digest = token_hash(token)
        ttl = math.ceil(expires_in * 1000) if expires_in is not None else None  # never 0: Redis refuses it

        def write(pipe: Pipeline) -> None:
            # Both keys or neither; a name whose token expired may be used again.
            old = pipe.hget(self._keys.tokens, name)
            if old is not None and pipe.exists(self._keys.token(cast(bytes, old).decode())):
                raise TokenError(f"a token named {name!r} exists; revoke it first")
            pipe.multi()
            pipe.hset(self._keys.tokens, name, digest)
            pipe.set(self._keys.token(digest), info.model_dump_json(), px=ttl)

        self._redis.transaction(write, self._keys.tokens)
        return token, info

    def check(self, token: str) -> TokenInfo | None:
        """The token's record, if it exists, is not revoked and has not expired."""
        return self.check_digest(token_hash(token))

    def check_digest(self, digest: str) -> TokenInfo | None:
        """:meth:`check` by the token's SHA-256 (what a browser session keeps instead of the token)."""
        raw = self._redis.get(self._keys.token(digest))
        if raw is None:
            return None
        info = TokenInfo.model_validate_json(cast(bytes, raw))
        if info.expires_at is not None and info.expires_at <= datetime.now(timezone.utc):
            return None
        return info

    def list(self) -> list[TokenInfo]:
        """Every token that still works, by name."""
        names = cast(dict[bytes, bytes], self._redis.hgetall(self._keys.tokens))
        ordered = sorted(names.items())
        records = (
            self._redis.mget([self._keys.token(digest.decode()) for _, digest in ordered]) if ordered else []
        )
        found = [TokenInfo.model_validate_json(raw) for raw in records if raw is not None]
        expired = [name for (name, _), raw in zip(ordered, records, strict=True) if raw is None]
        if expired:
            self._redis.hdel(self._keys.tokens, *expired)
        return found

    def revoke(self, name: str) -> bool:
        """Stop the token named ``name`` from working, at once; False if there is none."""
        digest = self._redis.hget(self._keys.tokens, name)
        if digest is None:
            return False
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self._keys.token(cast(bytes, digest).decode()))
        pipe.hdel(self._keys.tokens, name)
        pipe.publish(self._keys.tokens_revoked, name)
        pipe.execute()
        return True

    def failed_login(self, client: str, window: int) -> int:
        """Count a failed login from ``client`` (an address); how many in the last ``window`` seconds."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.incr(self._keys.login_failures(client))
        pipe.expire(self._keys.login_failures(client), window, nx=True)
        count, _ = pipe.execute()
        return int(count)

    def login_failures(self, client: str) -> int:
        return int(cast(bytes | None, self._redis.get(self._keys.login_failures(client))) or 0)

    def open_session(self, token: str, lifetime: float = SESSION_LIFETIME) -> OpenedSession | None:
        """A session for ``token``, for ``lifetime`` seconds or until the token expires, whichever
        comes first; None if the token does not work."""
        info = self.check(token)
        if info is None:
            return None
        if info.expires_at is not None:
            lifetime = min(lifetime, (info.expires_at - datetime.now(timezone.utc)).total_seconds())
        if lifetime <= 0:
            return None
        cookie = secrets.token_urlsafe(32)
        record = BrowserSession(token=token_hash(token), csrf_token=secrets.token_urlsafe(32))
        ttl = math.ceil(lifetime * 1000)
        self._redis.set(self._keys.session(token_hash(cookie)), record.model_dump_json(), px=ttl)
        return OpenedSession(cookie=cookie, record=record, token=info, lifetime=max(1, math.ceil(ttl / 1000)))

    def session(self, cookie: str) -> BrowserSession | None:
        """The record of the session ``cookie`` stands for, until it is closed or its lifetime ends
        (whether its token still works is the caller's to check: :meth:`check_digest`)."""
        raw = self._redis.get(self._keys.session(token_hash(cookie)))
        return BrowserSession.model_validate_json(cast(bytes, raw)) if raw is not None else None

    def close_session(self, cookie: str) -> bool:
        """End the session at once, whoever holds a copy of its cookie; False if it had ended."""
        return bool(self._redis.delete(self._keys.session(token_hash(cookie))))
