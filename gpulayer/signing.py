"""Signed payloads: every pickle a worker or a client unpickles carries an HMAC of the installation's
secret, checked before a single byte is unpickled.

Anyone who can write to Redis can write a job; only someone who holds the secret can write one a
worker will unpickle. The secret is never stored in Redis: it comes from ``GPULAYER_SECRET`` or the
file ``$GPULAYER_HOME/secret`` (written, readable by its owner only, by `gpulayer up`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from .errors import ConfigError, UntrustedPayload

SECRET_FILE = "secret"
_DIGEST = hashlib.sha256
_SIZE = _DIGEST().digest_size
#: Signed payloads start with this, so a payload of another kind is told apart from a forged one.
_MAGIC = b"GL1"


class Signer:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ConfigError("the installation's secret must be at least 16 bytes long")
        self._secret = secret

    def sign(self, data: bytes) -> bytes:
        return _MAGIC + hmac.new(self._secret, data, _DIGEST).digest() + data

    def verify(self, blob: bytes) -> bytes:
        """The signed data, or :class:`UntrustedPayload` if it was not signed with this secret."""
        mac, data = blob[len(_MAGIC) : len(_MAGIC) + _SIZE], blob[len(_MAGIC) + _SIZE :]
        expected = hmac.new(self._secret, data, _DIGEST).digest()
        if not blob.startswith(_MAGIC) or not hmac.compare_digest(mac, expected):
            raise UntrustedPayload("the payload is not signed with this installation's secret; not unpickled")
        return data


def load_secret(home: Path, environ: dict[str, str] | None = None) -> bytes | None:
    """``GPULAYER_SECRET``, else the secret file in ``home``, else None."""
    env = os.environ if environ is None else environ
    if env.get("GPULAYER_SECRET"):
        return env["GPULAYER_SECRET"].encode()
    try:
        return (home / SECRET_FILE).read_bytes().strip()
    except FileNotFoundError:
        return None


def store_secret(home: Path, secret: bytes) -> None:
    """Keep ``secret`` as this machine's (replacing any other), readable by its owner only."""
    Signer(secret)
    home.mkdir(parents=True, exist_ok=True)
    path = home / SECRET_FILE
    aside = path.with_name(SECRET_FILE + ".new")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(secret)
    os.replace(aside, path)


def ensure_secret(home: Path) -> bytes:
    """The secret this machine uses, made and kept in ``home`` if there is none yet."""
    existing = load_secret(home)
    if existing:
        return existing
    secret = secrets.token_urlsafe(32).encode()
    store_secret(home, secret)
    return secret


def signer(home: Path) -> Signer:
    """The installation's signer; :class:`ConfigError` saying how to set a secret when there is none."""
    secret = load_secret(home)
    if secret is None:
        raise ConfigError(
            "no secret for signing function payloads: run `gpulayer up`, or set GPULAYER_SECRET "
            "to the same value on every client and worker"
        )
    return Signer(secret)
