"""What the machine that set an installation up keeps: each shared role's Redis password, the job and
identity key pairs, every machine identity it made, and where its Redis listens. From it come the
access of every role and identity (:mod:`gpulayer.access`) and the Redis users that match them
(:mod:`gpulayer.store.acl`).

Kept in ``$GPULAYER_HOME/installation.json`` (600) by `gpulayer up`, or by `gpulayer access init`
for a Redis run by the user. It is the installation's master key: it never leaves this machine; other
machines get one role's access each, or an identity of their own. Of an identity it keeps the record
the registry publishes and its password's hash, never the password nor a worker's private result key:
those are only in the token printed once.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, ValidationError
from redis.connection import parse_url

from . import access as accesses
from . import home as local
from . import sentinel
from .access import KEYS_OF, Access
from .errors import ConfigError
from .models import AccessRole, Identity, IdentityRole, validation_message
from .network import address_text, parse_address, redact
from .signing import Keyring, SigningKey, sign_identity
from .store import acl
from .store.acl import ROLES, User, identity_user, password_hash, user_name
from .store.keys import Keys

FILE = "installation.json"
#: The longest an identity may be made to last (s): ten years, as an API token; or it never expires.
MAX_LIFETIME = 10 * 365 * 86400


class Enrolled(BaseModel):
    """A machine identity as the admin keeps it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    identity: Identity
    #: Its record as the registry holds it, signed (:func:`gpulayer.signing.sign_identity`).
    signed: str
    #: How Redis keeps its password: the ACL file and the rules hold this, never the password.
    password_hash: str


class Installation(BaseModel):
    """One installation's secrets and its Redis's address."""

    model_config = ConfigDict(extra="forbid")

    prefix: str
    #: ``redis://host:port/db`` (``rediss://`` with TLS) as this machine reaches Redis; no user.
    endpoint: str
    #: Of each shared role's user (:data:`gpulayer.store.acl.ROLES`).
    passwords: dict[AccessRole, str]
    #: Both halves of the job and identity key pairs (:meth:`Keyring.as_texts`).
    keys: dict[str, str]
    #: The PEM of the CA that signs Redis's certificate, when Redis speaks TLS.
    ca: str | None = None
    #: Every machine identity made and not revoked (expired ones too), by name.
    identities: dict[str, Enrolled] = {}

    @classmethod
    def generate(cls, prefix: str, endpoint: str, ca: str | None = None) -> Installation:
        return cls(
            prefix=prefix,
            endpoint=endpoint,
            passwords={role: secrets.token_urlsafe(24) for role in ROLES},
            keys=Keyring.generate().as_texts(),
            ca=ca,
        )

    def upgraded(self) -> Installation | None:
        """This installation with what machine identities need, if it was made before them (an
        identity key pair; no worker user shared by every worker, nor its result key); else None."""
        if "identity_key" in self.keys:
            return None
        identity = SigningKey.generate()
        keys = {name: text for name, text in self.keys.items() if not name.startswith("result_")}
        keys.update(identity_key=identity.text, identity_verify=identity.public.text)
        passwords = {role: password for role, password in self.passwords.items() if role in ROLES}
        return self.model_copy(update={"keys": keys, "passwords": passwords})

    def url(self, role: AccessRole, host: str | None = None) -> str:
        """The Redis URL of a shared role's user; ``host`` in place of the endpoint's (another
        machine's view)."""
        return self._url(user_name(Keys(self.prefix), role), self.passwords[role], host)

    def _url(self, user: str, password: str, host: str | None) -> str:
        parts = urlsplit(self.endpoint)
        netloc = f"{quote(user)}:{quote(password, safe='')}@"
        if sentinel.is_sentinel(self.endpoint):
            if host is not None:
                raise ConfigError("--host does not apply to a Sentinel URL: every machine asks its sentinels")
            return urlunsplit(parts._replace(netloc=netloc + parts.netloc))
        where, port = parts.hostname or "127.0.0.1", parts.port
        if host is not None:  # HOST keeps the endpoint's port; HOST:PORT and [v6]:PORT give their own
            where, given = _host_option(host)
            port = given or port
        return urlunsplit(parts._replace(netloc=netloc + address_text(where, port)))

    def access(self, role: AccessRole, host: str | None = None) -> Access:
        """What a machine needs to act as a shared ``role``: its URL, the CA, and its keys only."""
        if role not in self.passwords:
            raise ConfigError(
                f"the {role} role has no shared access: each machine gets its own identity "
                f"(`gpulayer access add {role} NAME`)"
            )
        return Access(role=role, redis_url=self.url(role, host), ca=self.ca, keys=self._keys_of(role))

    def _keys_of(self, role: AccessRole) -> dict[str, str]:
        return {name: text for name, text in self.keys.items() if name in KEYS_OF[role]}

    def save_accesses(self, home: Path) -> None:
        """Every shared role's access, kept in ``home`` (this machine acts in each)."""
        for role in ROLES:
            accesses.save(home, self.access(role))

    def enrol(
        self, role: IdentityRole, name: str, expires_in: float | None = None, host: str | None = None
    ) -> tuple[Installation, Access]:
        """A new identity ``name`` for one machine in ``role``, valid for ``expires_in`` seconds (or
        for ever): this installation with it, and the machine's access (for a worker, with its own
        result key, which nothing else keeps). :class:`ConfigError` if the name is taken or not valid."""
        if name in self.identities:
            raise ConfigError(f"an identity named {name!r} exists: revoke it first, or pick another name")
        if expires_in is not None and not 0 < expires_in <= MAX_LIFETIME:
            raise ConfigError("an identity's lifetime must be positive and at most 10 years")
        signer = Keyring.from_texts(self.keys).identity_key
        assert signer is not None, "an upgraded installation holds its identity key"
        now = datetime.now(timezone.utc)
        result = SigningKey.generate() if role == "worker" else None
        try:
            identity = Identity(
                name=name,
                role=role,
                user=identity_user(Keys(self.prefix), name),
                result_key=result.public.text if result else None,
                created=now,
                expires=now + timedelta(seconds=expires_in) if expires_in is not None else None,
            )
        except ValidationError as exc:
            raise ConfigError(f"not a valid identity: {validation_message(exc)}") from None
        password = secrets.token_urlsafe(24)
        enrolled = Enrolled(
            identity=identity, signed=sign_identity(signer, identity), password_hash=password_hash(password)
        )
        keys = self._keys_of(role) | ({"result_key": result.text} if result else {})
        access = Access(
            role=role,
            redis_url=self._url(identity.user, password, host),
            ca=self.ca,
            keys=keys,
            identity=name,
        )
        return self.model_copy(update={"identities": {**self.identities, name: enrolled}}), access

    def without(self, name: str) -> Installation:
        """This installation with the identity ``name`` gone (:class:`ConfigError` if there is none)."""
        if name not in self.identities:
            raise ConfigError(f"no identity named {name!r} (`gpulayer access list` shows them)")
        return self.model_copy(update={"identities": {k: v for k, v in self.identities.items() if k != name}})

    def valid(self, now: datetime | None = None) -> dict[str, Enrolled]:
        """The identities that have not expired, by name."""
        at = now or datetime.now(timezone.utc)
        return {name: kept for name, kept in self.identities.items() if not kept.identity.expired(at)}

    def users(self, now: datetime | None = None) -> list[User]:
        """The Redis users it has: each shared role's, and each valid identity's."""
        keys = Keys(self.prefix)
        shared = [User(user_name(keys, role), role, password_hash(self.passwords[role])) for role in ROLES]
        return shared + [
            User(kept.identity.user, kept.identity.role, kept.password_hash)
            for kept in self.valid(now).values()
        ]

    def acl_file(self, redis_major: int = 7) -> str:
        """Its users as an ACL file for a Redis that starts with it (password hashes only; the
        default user off)."""
        return acl.acl_file(Keys(self.prefix), self.users(), redis_major)

    def acl_commands(self, redis_major: int = 7) -> list[str]:
        """The redis-cli lines that make its users on a running Redis (password hashes only; the
        default user left as it is: other programs may use it)."""
        made = acl.commands(Keys(self.prefix), self.users(), redis_major, disable_default=False)
        return [acl.printable(command) for command in made]


def endpoint_of(redis_url: str) -> str:
    """The URL without its user and password; :class:`ConfigError` for one naming a database other
    than 0, which the roles could not reach: they may not SELECT (key patterns hold in every
    database, so another database is another installation's keys of the same names)."""
    found = sentinel.parse(redis_url) if sentinel.is_sentinel(redis_url) else None
    database = found.db if found else int(parse_url(redis_url).get("db") or 0)  # type: ignore[no-untyped-call]
    if database:
        raise ConfigError(
            f"{redact(redis_url)} names database {database}: an installation's roles may not SELECT, so "
            "it lives in database 0; installations on one Redis are told apart by GPULAYER_PREFIX"
        )
    if found:
        hosts = sentinel.hosts_text(found.sentinels)
        return f"{found.scheme}+sentinel://{hosts}/{quote(found.master, safe='')}"
    parts = urlsplit(redis_url)
    return urlunsplit(parts._replace(netloc=address_text(parts.hostname or "127.0.0.1", parts.port)))


def _host_option(text: str) -> tuple[str, int | None]:
    """``--host``'s HOST, HOST:PORT or [v6]:PORT, read; :class:`ConfigError` in one line if not one."""
    try:
        return parse_address(text)
    except ValueError as exc:
        raise ConfigError(f"--host: {exc}") from None


def load(home: Path) -> Installation | None:
    return local.read_record(
        home / FILE, Installation, "the installation's keys and passwords cannot be read"
    )


def load_admin(home: Path) -> Installation:
    """The installation this machine is the admin of (:func:`load_current`); :class:`ConfigError` on a
    machine that is none's admin."""
    found = load_current(home)
    if found is None:
        raise ConfigError(
            "this machine holds no installation: run this where `gpulayer up` (or `access init`) ran"
        )
    return found


def load_current(home: Path) -> Installation | None:
    """The installation kept in ``home``, brought up to date (:meth:`Installation.upgraded`, and the
    accesses it keeps written again), if there is one."""
    kept = load(home)
    upgraded = kept.upgraded() if kept is not None else None
    if upgraded is None:
        return kept
    save(home, upgraded)
    upgraded.save_accesses(home)
    legacy = accesses.folder(home) / "worker.json"
    legacy.unlink(missing_ok=True)  # the shared worker's: its user is gone
    return upgraded


def save(home: Path, installation: Installation) -> None:
    local.private_folder(home)
    local.write_private(home / FILE, installation.model_dump_json(indent=2, exclude_none=True))
