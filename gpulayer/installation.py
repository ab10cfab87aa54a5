"""What the machine that set an installation up keeps: each role's Redis password, both key pairs,
and where its Redis listens. From it come the access of every role (:mod:`gpulayer.access`) and the
Redis users that match them (:mod:`gpulayer.store.acl`).

Kept in ``$GPULAYER_HOME/installation.json`` (600) by `gpulayer up`, or by `gpulayer access init`
for a Redis run by the user. It is the installation's master key: it never leaves this machine; other
machines get one role's access each.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import redis.exceptions
from pydantic import BaseModel, ConfigDict, ValidationError
from redis import Redis
from redis.connection import parse_url

from . import access as accesses
from . import home as local
from .access import KEYS_OF, Access
from .errors import ConfigError
from .models import AccessRole
from .network import redact
from .signing import Keyring
from .store import acl
from .store.acl import ROLES, user_name
from .store.connection import connect
from .store.keys import Keys
from .store.scripts import load_library

FILE = "installation.json"


class Installation(BaseModel):
    """One installation's secrets and its Redis's address."""

    model_config = ConfigDict(extra="forbid")

    prefix: str
    #: ``redis://host:port/db`` (``rediss://`` with TLS) as this machine reaches Redis; no user.
    endpoint: str
    passwords: dict[AccessRole, str]
    #: Both halves of both key pairs (:meth:`Keyring.as_texts`).
    keys: dict[str, str]
    #: The PEM of the CA that signs Redis's certificate, when Redis speaks TLS.
    ca: str | None = None

    @classmethod
    def generate(cls, prefix: str, endpoint: str, ca: str | None = None) -> Installation:
        return cls(
            prefix=prefix,
            endpoint=endpoint,
            passwords={role: secrets.token_urlsafe(24) for role in ROLES},
            keys=Keyring.generate().as_texts(),
            ca=ca,
        )

    def url(self, role: AccessRole, host: str | None = None) -> str:
        """The Redis URL of ``role``'s user; ``host`` in place of the endpoint's (another machine's view)."""
        parts = urlsplit(self.endpoint)
        netloc = f"{quote(user_name(Keys(self.prefix), role))}:{quote(self.passwords[role], safe='')}@"
        where = host or parts.hostname or "127.0.0.1"
        netloc += (f"[{where}]" if ":" in where else where) + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    def access(self, role: AccessRole, host: str | None = None) -> Access:
        """What a machine needs to act as ``role``: its URL, the CA, and its keys only."""
        keys = {name: text for name, text in self.keys.items() if name in KEYS_OF[role]}
        return Access(role=role, redis_url=self.url(role, host), ca=self.ca, keys=keys)

    def save_accesses(self, home: Path) -> None:
        """Every role's access, kept in ``home`` (this machine acts in each)."""
        for role in ROLES:
            accesses.save(home, self.access(role))

    def acl_file(self, redis_major: int = 7) -> str:
        """Its roles' Redis users as an ACL file for a Redis that starts with it (password hashes
        only; the default user off)."""
        return acl.acl_file(Keys(self.prefix), self.passwords, redis_major)

    def acl_commands(self, redis_major: int = 7) -> list[str]:
        """The redis-cli lines that make its roles' users on a running Redis (password hashes only;
        the default user left as it is: other programs may use it)."""
        made = acl.commands(Keys(self.prefix), self.passwords, redis_major, disable_default=False)
        return [acl.printable(command) for command in made]


def endpoint_of(redis_url: str) -> str:
    """The URL without its user and password; :class:`ConfigError` for one naming a database other
    than 0, which the roles could not reach: they may not SELECT (key patterns hold in every
    database, so another database is another installation's keys of the same names)."""
    database = int(parse_url(redis_url).get("db") or 0)  # type: ignore[no-untyped-call]
    if database:
        raise ConfigError(
            f"{redact(redis_url)} names database {database}: an installation's roles may not SELECT, so "
            "it lives in database 0; installations on one Redis are told apart by GPULAYER_PREFIX"
        )
    parts = urlsplit(redis_url)
    host = parts.hostname or "127.0.0.1"
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def create_on(redis_url: str, prefix: str, ca: str | None = None) -> Installation:
    """A new installation for a Redis the user runs, its roles and scripts made there through
    ``redis_url`` (a user allowed ACL SETUSER and FUNCTION LOAD). The default user is left as it is:
    other programs may use it."""
    installation = Installation.generate(prefix, endpoint_of(redis_url), ca)
    client = connect(redis_url, ca=ca)
    try:
        _make(client, installation)
    except redis.exceptions.NoPermissionError:
        raise ConfigError(
            f"the user in {redact(redis_url)} may not make Redis users (ACL SETUSER): give an admin's URL, "
            "or apply the rules `gpulayer access init --redis-url URL` prints as one"
        ) from None
    except redis.exceptions.ResponseError as exc:
        raise ConfigError(f"Redis refused the roles: {exc}") from None
    finally:
        client.close()
    return installation


def sync(installation: Installation) -> None:
    """Bring the installation's Redis up to this version, as its admin: the roles' users with this
    version's rules (their passwords kept; the default user left as it is), and its scripts loaded,
    which on Redis 7 only a user allowed FUNCTION LOAD can (the roles call them, never load them)."""
    client = connect(installation.url("admin"), ca=installation.ca)
    try:
        _make(client, installation)
    finally:
        client.close()


def _make(admin: Redis, installation: Installation) -> None:
    keys = Keys(installation.prefix)
    acl.apply(admin, keys, installation.passwords, disable_default=False)
    load_library(admin, keys)


def load(home: Path) -> Installation | None:
    path = home / FILE
    try:
        return Installation.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError:
        raise ConfigError(
            f"{path} is damaged: the installation's keys and passwords cannot be read"
        ) from None


def save(home: Path, installation: Installation) -> None:
    local.private_folder(home)
    local.write_private(home / FILE, installation.model_dump_json(indent=2, exclude_none=True))
