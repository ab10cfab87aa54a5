"""What a machine holds to take part in an installation: its Redis user (in the URL), the CA that
Redis's certificate must be signed by, the keys of its role (:mod:`gpulayer.signing`), and, for a
machine with an identity of its own (every worker), that identity's name.

Kept in ``$GPULAYER_HOME/access/<role>.json`` (the folder 700, each file 600), and handed from one
machine to another as an *access token*: the same thing on one line (``gla1_...``), which `gpulayer
join` and `gpulayer connect` read from a file, stdin or an environment variable, never from the
command line, where any user of the machine could see it.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from . import home as local
from . import sentinel
from .errors import ConfigError, NoInstallation
from .models import AccessRole, validation_message
from .signing import Keyring

TOKEN_PREFIX = "gla1_"
#: An access token in the environment: what `join`, `connect`, containers and CI use instead of a file.
TOKEN_VARIABLE = "GPULAYER_ACCESS_TOKEN"
#: The roles a client (the CLI, the SDK) acts as, the strongest it holds first.
CLIENT_ROLES: tuple[AccessRole, ...] = ("admin", "submitter", "viewer")
#: The installation's keys each role holds (a worker also holds its own result key): every role
#: checks identity records, since every one may read what workers signed.
KEYS_OF: dict[AccessRole, tuple[str, ...]] = {
    "admin": ("job_key", "job_verify", "identity_key", "identity_verify"),
    "web": ("job_key", "job_verify", "identity_verify"),
    "submitter": ("job_key", "job_verify", "identity_verify"),
    "worker": ("job_verify", "identity_verify"),
    "viewer": ("identity_verify",),
    "capacity": (),
}


class Access(BaseModel):
    """One role's way into one installation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: None for a bare Redis URL given by hand: then it holds no keys.
    role: AccessRole | None = None
    #: With the role's user and password; ``rediss://`` when Redis speaks TLS.
    redis_url: str
    #: The PEM of the installation's own CA: the only one a TLS connection to its Redis trusts.
    ca: str | None = None
    #: The role's keys, as :meth:`Keyring.as_texts` writes them.
    keys: dict[str, str] = {}
    #: The machine's identity (`gpulayer access add`), for one made for it; None for a shared role's.
    identity: str | None = None

    @property
    def keyring(self) -> Keyring:
        return Keyring.from_texts(self.keys)

    def token(self) -> str:
        """This access on one line, for another machine."""
        data = self.model_dump_json(exclude_none=True).encode()
        return TOKEN_PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    @classmethod
    def from_token(cls, text: str) -> Access:
        """:class:`ConfigError` with one line if ``text`` is not an access token."""
        text = text.strip()
        if not text.startswith(TOKEN_PREFIX):
            raise ConfigError(f"not a GPUlayer access token (they start with {TOKEN_PREFIX})")
        body = text[len(TOKEN_PREFIX) :]
        try:
            data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except ValueError:
            raise ConfigError("the access token is damaged (cut short when copied?)") from None
        try:
            access = cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"the access token is damaged: {validation_message(exc)}") from None
        access.keyring  # noqa: B018  # a damaged key is found now, not at the first signature
        return access

    def with_url(self, redis_url: str) -> Access:
        return self.model_copy(update={"redis_url": redis_url})


def folder(home: Path) -> Path:
    return home / "access"


def save(home: Path, access: Access) -> Path:
    """Keep ``access`` as this machine's for its role, readable by its owner only."""
    assert access.role is not None, "a bare URL is not kept"
    target = folder(home)
    local.private_folder(target)
    path = target / f"{access.role}.json"
    local.write_private(path, access.model_dump_json(indent=2, exclude_none=True))
    return path


def load(home: Path, role: AccessRole) -> Access | None:
    path = folder(home) / f"{role}.json"
    try:
        return Access.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError:
        raise ConfigError(f"{path} is damaged; remove it, then join or connect again") from None


def resolve(
    explicit_url: str | None,
    home: Path,
    roles: Sequence[AccessRole] = CLIENT_ROLES,
    environ: Mapping[str, str] | None = None,
) -> Access:
    """How to reach the installation: an access token in :data:`TOKEN_VARIABLE`, else the first of
    ``roles`` kept in ``home``. ``explicit_url`` (``--redis-url``, ``GPULAYER_REDIS_URL``) replaces its
    URL, keeping its keys; with nothing kept, it is a bare URL with no keys. With none of these,
    :class:`NoInstallation`."""
    env = os.environ if environ is None else environ
    found: Access | None = None
    if env.get(TOKEN_VARIABLE):
        found = Access.from_token(env[TOKEN_VARIABLE])
    else:
        found = next((access for access in (load(home, role) for role in roles) if access), None)
        if found is not None and not explicit_url:
            _check_running(home, found.redis_url)
    if explicit_url:
        return found.with_url(explicit_url) if found else Access(redis_url=explicit_url)
    if found is None:
        held = [path.stem for path in sorted(folder(home).glob("*.json"))]
        if held:
            raise ConfigError(
                f"this needs the {' or '.join(roles)} role's access; this machine holds only the "
                f"{', '.join(held)} role's (`gpulayer access export ROLE` on the admin's machine makes one)"
            )
        raise NoInstallation(
            "no installation to talk to: run `gpulayer up`, join or connect with an access token, "
            "or pass --redis-url / set GPULAYER_REDIS_URL"
        )
    return found


def _check_running(home: Path, url: str) -> None:
    """A clear error when the kept URL is the Redis `gpulayer up` started here, and it is down."""
    state = local.load(home)
    if state is None or not state.embedded or state.port is None or sentinel.is_sentinel(url):
        return
    if urlsplit(url).port == state.port and not local.alive(state.redis_pid):
        raise ConfigError("the Redis that `gpulayer up` started is not running: run `gpulayer up` again")


def read_token(source: str | None, environ: Mapping[str, str] | None = None) -> Access:
    """An access token from ``source`` (a file, or ``-`` for stdin), else :data:`TOKEN_VARIABLE`."""
    env = os.environ if environ is None else environ
    if source == "-":
        text = sys.stdin.readline()
    elif source:
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the access token from {source}: {exc.strerror}") from None
    elif env.get(TOKEN_VARIABLE):
        text = env[TOKEN_VARIABLE]
    else:
        raise ConfigError(
            f"give the access token: --token-file FILE, --token-file - (stdin), or {TOKEN_VARIABLE}"
        )
    return Access.from_token(text)


def describe(access: Access) -> str:
    """Which role, user and Redis, without the password."""
    parts = urlsplit(access.redis_url)
    user = unquote(parts.username or "") or "default"
    if sentinel.is_sentinel(access.redis_url):
        where = sentinel.parse(access.redis_url).describe()
    elif parts.scheme == "unix":
        where = f"unix://{parts.path}"
    else:
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or "localhost"
        where = f"{parts.scheme}://{host}:{parts.port or 6379}"
    secure = ", TLS" if parts.scheme.startswith("rediss") else ""
    return f"{access.role or 'a bare URL'} (Redis user {user} at {where}{secure})"
