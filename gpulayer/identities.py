"""Each machine its own identity, as the admin makes, lists and revokes them (`gpulayer access add`,
`list`, `revoke`), and Redis kept in step with the installation by every admin command.

An identity is a Redis user of its own (with its role's rules) and a record in the installation's
registry, signed by the admin: for a worker, the public half of its own result key, so a result or
archive is accepted only under the key of the worker that claimed the attempt. Revoking one deletes
its user (Redis cuts its connections), removes its record (every client refuses its signatures from
then on) and takes the jobs it was running off it, back to their queues as a lost worker's are.

Redis users cannot expire: each admin command (:func:`sync`) removes the users and records of the
identities that have expired. Until one runs, an expired identity's user still logs in, but nobody
accepts what it signs, and a worker under it takes no more jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from redis import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError

from . import access as accesses
from . import home as local
from . import installation as installations
from .access import Access
from .errors import ConfigError
from .installation import Installation
from .models import IdentityRole
from .network import redact
from .settings import Settings
from .store import acl
from .store.connection import connect
from .store.keys import Keys
from .store.replicas import replicas
from .store.scripts import load_library
from .store.stores import Stores

#: How an admin command left Redis: its users saved (in its ACL file, else its config file); made,
#: but only until Redis restarts (it has neither, or may not write them: `gpulayer access apply`
#: makes them again); or `up`'s embedded Redis is stopped, and the next `up` makes them.
Applied = Literal["saved", "unsaved", "stopped"]


@dataclasses.dataclass(frozen=True)
class Listed:
    """One identity as `gpulayer access list` shows it."""

    name: str
    role: IdentityRole
    user: str
    created: datetime
    expires: datetime | None
    valid: bool
    #: The last heartbeat of a live worker under it, if any.
    last_seen: datetime | None


def add(
    home: Path, role: IdentityRole, name: str, expires_in: float | None = None, host: str | None = None
) -> tuple[Access, Applied]:
    """Make the identity ``name``: its access (printed once, kept nowhere), and how Redis took it."""
    installation = installations.load_admin(home)
    made, access = installation.enrol(role, name, expires_in, host)
    return access, _commit(home, installation, made)


def local_worker(home: Path, installation: Installation, name: str) -> Installation:
    """``installation`` with an identity for the worker `gpulayer up` runs here, ``name`` (made now,
    its access kept in ``home``, unless this machine holds it already), Redis in step with it."""
    held = accesses.load(home, "worker")
    if held is not None and held.identity == name and name in installation.identities:
        _commit(home, installation, installation)
        return installation
    if name in installation.identities:
        raise ConfigError(
            f"an identity named {name!r} exists and this machine does not hold its token: revoke "
            f"it (`gpulayer access revoke {name}`) or give the local worker another --name"
        )
    made, access = installation.enrol("worker", name)
    _commit(home, installation, made)
    accesses.save(home, access)
    return made


def revoke(home: Path, name: str) -> tuple[Applied, int]:
    """Revoke the identity ``name``: how Redis took it, and how many jobs it was running went back to
    their queues."""
    installation = installations.load_admin(home)
    made = installation.without(name)
    applied = _commit(home, installation, made)
    if applied == "stopped":
        return applied, 0
    with _admin(made) as redis:
        stores = Stores.open(redis, Settings(prefix=made.prefix))
        moved = stores.registry.release(name)
        if moved:  # now, not at some worker's next reap
            stores.execution(name).reap()
    return applied, moved


def apply(home: Path, login_url: str | None = None) -> Applied:
    """(Re)make the installation kept in ``home`` on its Redis (:func:`sync`), changing nothing of it:
    after an upgrade, or a restart of a Redis of the user's own that lost its users. ``login_url``:
    how to log in to that server (a user allowed ACL SETUSER) when the installation's admin user is
    not there to; its database is the installation's."""
    installation = installations.load_admin(home)
    if login_url is None:
        return _commit(home, installation, installation)
    return make_on(_login(installation, login_url), installation)


def _login(installation: Installation, login_url: str) -> str:
    """``login_url`` in the installation's database: the registry is written there (Redis users and
    functions are the server's, in every database alike)."""
    given, ours = urlsplit(login_url), urlsplit(installation.endpoint)
    if given.path.strip("/") in ("", ours.path.strip("/")):
        return urlunsplit(given._replace(path=ours.path))
    raise ConfigError(
        f"{redact(login_url)} names database {given.path.strip('/')!r}; the installation's is "
        f"{ours.path.strip('/') or '0'!r}: leave the database out"
    )


def listing(home: Path) -> list[Listed]:
    """Every identity the installation holds, by name (the expired ones' users removed first)."""
    installation = installations.load_admin(home)
    seen: dict[str, datetime] = {}
    if _commit(home, installation, installation) != "stopped":
        with _admin(installation) as redis:
            for worker in Stores.open(redis, Settings(prefix=installation.prefix)).workers.list():
                if worker.identity and worker.last_heartbeat:
                    latest = seen.get(worker.identity, worker.last_heartbeat)
                    seen[worker.identity] = max(worker.last_heartbeat, latest)
    now = datetime.now(timezone.utc)
    return [
        Listed(
            name,
            kept.identity.role,
            kept.identity.user,
            kept.identity.created,
            kept.identity.expires,
            not kept.identity.expired(now),
            seen.get(name),
        )
        for name, kept in sorted(installation.identities.items())
    ]


def sync(installation: Installation, redis: Redis) -> bool:
    """Make Redis agree with ``installation``, through ``redis`` (its admin's, or any user allowed ACL
    SETUSER and FUNCTION LOAD), idempotently: each shared role's and valid identity's user made (with
    the rules of this version) on the master and every replica (:func:`_users`), this version's
    scripts loaded, and the registry holding exactly the valid identities' records: whether every
    node kept its users across its restarts (see :data:`Applied`)."""
    keys = Keys(installation.prefix)
    saved = _users(installation, redis)
    for replica in replicas(redis):  # users are not replicated: a promoted replica needs its own
        try:
            saved = _users(installation, replica) and saved
        finally:
            replica.close()
    load_library(redis, keys)  # this version's scripts: on Redis 7 only the admin may load them
    registry = Stores.open(redis, Settings(prefix=installation.prefix)).registry
    registry.publish({name: kept.signed for name, kept in installation.valid().items()})
    return saved


def _users(installation: Installation, node: Redis) -> bool:
    """Make one node's users agree with ``installation``: the wanted ones made, every other user of
    its identities gone (revoked, expired, and the worker user all workers shared before they had
    identities); kept across the node's restarts (:func:`gpulayer.store.acl.save`): whether they are."""
    keys = Keys(installation.prefix)
    wanted = installation.users()
    acl.apply(node, keys, wanted, disable_default=False)
    names = {user.name for user in wanted}
    ours = acl.identity_user(keys, "")
    stale = [
        user
        for user in acl.users(node)
        if user not in names and (user.startswith(ours) or user == acl.user_name(keys, "worker"))
    ]
    acl.remove(node, stale)
    return acl.save(node)


def make_on(redis_url: str, installation: Installation) -> Applied:
    """Make ``installation``'s users and publish its identities on a Redis the user runs, through
    ``redis_url`` (a user allowed ACL SETUSER), and keep them across its restarts where it can
    (:func:`gpulayer.store.acl.save`). The default user is left as it is: other programs may use it."""
    redis = connect(redis_url, ca=installation.ca)
    try:
        return "saved" if sync(installation, redis) else "unsaved"
    except NoPermissionError:
        raise ConfigError(
            f"the user in {redact(redis_url)} may not make Redis users (ACL SETUSER): give an admin's URL, "
            "or apply the rules `gpulayer access init --redis-url URL` prints as one"
        ) from None
    except AuthenticationError as exc:
        raise ConfigError(f"Redis at {redact(redis_url)} refused that login: {exc}") from None
    except ResponseError as exc:
        raise ConfigError(f"Redis refused the roles: {exc}") from None
    except RedisError as exc:
        raise ConfigError(f"cannot reach Redis at {redact(redis_url)}: {exc}") from None
    finally:
        redis.close()


def _commit(home: Path, old: Installation, new: Installation) -> Applied:
    """Redis brought in step with ``new``, then ``new`` kept; nothing changed if either fails. With
    `up`'s Redis stopped, ``new`` is kept, and made at the next `gpulayer up`."""
    if _stopped(home):
        installations.save(home, new)
        return "stopped"
    with _admin(new) as redis:
        try:
            saved = sync(new, redis)
            installations.save(home, new)
        except (RedisError, OSError) as exc:
            with contextlib.suppress(RedisError):
                sync(old, redis)
            raise ConfigError(f"nothing was changed: {exc}") from None
    return "saved" if saved else "unsaved"


def _stopped(home: Path) -> bool:
    state = local.load(home)
    return state is not None and state.embedded and not local.alive(state.redis_pid)


@contextlib.contextmanager
def _admin(installation: Installation) -> Iterator[Redis]:
    """The admin's connection, once Redis answers it (:class:`ConfigError` if it does not)."""
    url = installation.url("admin")
    redis = connect(url, ca=installation.ca)
    try:
        try:
            redis.ping()
        except AuthenticationError as exc:
            # Its users gone: a restart of a Redis that kept them nowhere (docs/security.md).
            raise ConfigError(
                f"the installation's Redis at {redact(url)} refused its admin ({exc}): if it lost its "
                "users, `gpulayer access apply --redis-url redis://USER:PASSWORD@HOST:PORT` as a user "
                "of it allowed ACL SETUSER makes them again"
            ) from None
        except RedisError as exc:
            raise ConfigError(f"cannot reach the installation's Redis at {redact(url)}: {exc}") from None
        yield redis
    finally:
        redis.close()
