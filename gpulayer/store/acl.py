"""Redis's own users, one per shared role and one per machine identity, each with no more than its
role needs.

``admin`` may do anything. The others may reach only this installation's keys and channels
(``<prefix>:*``, RQ's included: :mod:`.rq_names`), in the one database their URL names, and none may
run a command that changes the server itself or reads what is not theirs (``@dangerous``: CONFIG,
ACL, DEBUG, MODULE, KEYS, FLUSHALL/FLUSHDB, SHUTDOWN, CLIENT KILL, MONITOR, SAVE/BGSAVE, REPLICAOF,
...), nor reach past their key patterns (see :data:`_NEVER`). On Redis 7 they run no Lua but the
installation's function library, which the admin loads (FCALL; no EVAL, no SCRIPT, no FUNCTION). On
6.2, which has no functions, the writers load and call scripts by SHA (docs/security.md says what
that leaves open). ``viewer`` runs read commands only. Only ``web`` (the HTTP server) and ``admin``
reach the keys of API tokens and browser sessions (:attr:`Keys.auth`), so no job, worker or
submitter can mint a token. Only the admin writes the identity registry (:attr:`Keys.identities`);
on Redis 7 the others may read it, on 6.2 (which has no read-only key patterns) they reach it whole.

Workers have no shared user: each machine's identity (`gpulayer access add`) is a user of its own,
``<prefix>~<name>``, with its role's rules, so revoking one machine deletes its user alone.

Written for Redis 6.2 and 7 alike: only command categories, allowed subcommands and key and channel
patterns that both read the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence

from redis import Redis
from redis.exceptions import ResponseError

from ..models import AccessRole
from .keys import Keys

#: The roles with a user shared by every machine in them, in the order the rules are written (every
#: worker is an identity of its own).
ROLES: tuple[AccessRole, ...] = ("admin", "web", "submitter", "viewer")
#: What every non-admin role may run besides its categories: INFO (RQ reads the server's version),
#: TIME (the scripts' clock).
_ALWAYS = ("+@connection", "+info", "+time")
#: What no role may run though its categories hold it. Key patterns hold in every database, so
#: another database is another installation's keys of the same names: no SELECT, MOVE, nor COPY
#: (its DB option). SCAN, RANDOMKEY, PUBSUB (CHANNELS) and CLIENT TRACKING (its invalidations)
#: name every installation's keys and channels: of CLIENT, only INFO (the worker's address); SORT's
#: BY and GET read keys no pattern checks on 6.2.
_NEVER = ("-select", "-move", "-copy", "-scan", "-randomkey", "-pubsub", "-sort", "-client", "+client|info")
_WRITER = ("+@read", "+@write", "+@pubsub", "+@transaction", *_ALWAYS, "-@dangerous", "+info", *_NEVER)
_READER = (
    "+@read",
    "+subscribe",
    "+psubscribe",
    "+unsubscribe",
    "+punsubscribe",
    *_ALWAYS,
    "-@dangerous",
    "+info",
    *_NEVER,
)
#: Redis 7: the installation's functions, called; no other Lua (no EVAL, EVALSHA, SCRIPT, and no
#: FUNCTION, whose LOAD, DELETE, FLUSH and RESTORE @write holds). Named apart, as SORT_RO (denied as
#: SORT is): 6.2 lacks these commands, and naming one there is an error.
_FUNCTIONS = ("-function", "+fcall", "+fcall_ro")
#: Redis 6.2: scripts loaded and called by SHA, neither flushed nor killed.
_SCRIPTS = ("+@scripting", "-script", "+script|load", "+script|exists")


#: What ``ACL SAVE`` answers on a server started without an ACL file.
_NO_ACL_FILE = "not configured to use an ACL file"


def user_name(keys: Keys, role: AccessRole) -> str:
    """A shared role's user."""
    return f"{keys.prefix}-{role}"


def identity_user(keys: Keys, name: str) -> str:
    """A machine identity's user: ``~`` is in no prefix and no identity name, so it names no other
    installation's user, nor a shared role's."""
    return f"{keys.prefix}~{name}"


@dataclasses.dataclass(frozen=True)
class User:
    """One Redis user to make: its name, the role whose rules it gets, and its password's hash."""

    name: str
    role: AccessRole
    password_hash: str


def password_hash(password: str) -> str:
    """How Redis keeps a password (``#<sha256>``): an ACL file or a printed rule never holds the
    password itself."""
    return hashlib.sha256(password.encode()).hexdigest()


def rules(keys: Keys, role: AccessRole, redis_major: int = 7) -> list[str]:
    """The ACL rules of ``role``'s user, after its password (see :func:`user_rules`)."""
    if role == "admin":
        return ["allkeys", "allchannels", "+@all"]
    if role == "capacity":
        return _capacity_rules(keys, redis_major)
    patterns = [f"~{keys.prefix}:*"]
    channels = [f"&{keys.prefix}:*"]
    if role == "web":
        patterns.append(f"~{keys.auth}*")
        channels.append(f"&{keys.auth}*")
    commands = list(_READER if role == "viewer" else _WRITER)
    if redis_major >= 7:
        commands.append("-sort_ro")
    if role != "viewer":
        commands.extend(_FUNCTIONS if redis_major >= 7 else _SCRIPTS)
    return ["resetkeys", "resetchannels", *patterns, *channels, "-@all", *commands]


def _capacity_rules(keys: Keys, redis_major: int) -> list[str]:
    """The autoscaler's: it reads what placement needs (queues, gang jobs, workers) and writes its own
    keys only (:attr:`Keys.capacity`), hearing of submits on the installation's channels; it publishes
    nothing and calls no script. Redis 6.2 has no read-only key patterns: there it reaches every key
    of the installation (docs/security.md)."""
    own = [f"%R~{keys.prefix}:*", f"~{keys.capacity}*"]
    patterns = own if redis_major >= 7 else [f"~{keys.prefix}:*"]
    commands = ["+@read", "+@write", "+@transaction", "+subscribe", "+unsubscribe", *_ALWAYS]
    commands += ["-@dangerous", "+info", *_NEVER, "-publish"]
    if redis_major >= 7:
        commands += ["-sort_ro", "-fcall", "-fcall_ro", "-function"]
    return ["resetkeys", "resetchannels", *patterns, f"&{keys.prefix}:*", "-@all", *commands]


def _registry(keys: Keys, role: AccessRole, redis_major: int) -> list[str]:
    """Every role reads the identity registry; only the admin (all keys) writes it."""
    if role == "admin":
        return []
    return [f"%R~{keys.identities}" if redis_major >= 7 else f"~{keys.identities}"]


def user_rules(keys: Keys, user: User, redis_major: int = 7) -> list[str]:
    """Everything ``ACL SETUSER <user>`` takes: on, its password's hash, its role's rules."""
    return [
        "reset",
        "on",
        f"#{user.password_hash}",
        *rules(keys, user.role, redis_major),
        *_registry(keys, user.role, redis_major),
    ]


def acl_file(keys: Keys, users: Sequence[User], redis_major: int = 7) -> str:
    """An ACL file (``aclfile``) with ``users`` and the default user turned off."""
    # Off, so nobody logs in as it; but with every right, because Redis before 8 replays the
    # transactions of its append-only file (every script's writes) as the default user, and drops
    # those it may not run (redis/redis#14541): without them, a restart would lose every job.
    lines = ["user default off allkeys allchannels +@all"]
    lines.extend(" ".join(["user", user.name, *user_rules(keys, user, redis_major)]) for user in users)
    return "\n".join(lines) + "\n"


def commands(
    keys: Keys, users: Sequence[User], redis_major: int = 7, disable_default: bool = True
) -> list[list[str]]:
    """The ``ACL SETUSER`` commands that make ``users`` on a running Redis (and turn off the default
    user last, once the admin exists)."""
    made = [["ACL", "SETUSER", user.name, *user_rules(keys, user, redis_major)] for user in users]
    return [*made, ["ACL", "SETUSER", "default", "off"]] if disable_default else made


def apply(redis: Redis, keys: Keys, users: Sequence[User], disable_default: bool = True) -> None:
    """Make ``users`` on ``redis`` (whose connection must be allowed ACL SETUSER)."""
    for command in commands(keys, users, server_major(redis), disable_default):
        redis.execute_command(*command)  # type: ignore[no-untyped-call]


def remove(redis: Redis, names: Sequence[str]) -> None:
    """Delete these users; Redis cuts their connections with them."""
    if names:
        redis.execute_command("ACL", "DELUSER", *names)  # type: ignore[no-untyped-call]


def users(redis: Redis) -> list[str]:
    """The users ``redis`` has (an admin's connection)."""
    return [name.decode() for name in redis.execute_command("ACL", "USERS")]  # type: ignore[no-untyped-call]


def save(redis: Redis) -> bool:
    """Keep the users across a restart of Redis, as its admin: in its ACL file (``ACL SAVE``) where it
    has one; else in its config file (``CONFIG REWRITE`` writes them there as ``user`` lines, with
    every setting changed since it started). False where neither works: Redis started without either
    file, may not write it, or this user may not run them (docs/security.md says what to do then)."""
    try:
        redis.execute_command("ACL", "SAVE")  # type: ignore[no-untyped-call]
        return True
    except ResponseError as exc:
        # Redis and Valkey say so alike. Any other failure (the file not writable, not allowed): a
        # config rewrite would not hold the users either, as they live in the ACL file.
        if _NO_ACL_FILE not in str(exc):
            return False
    try:
        redis.execute_command("CONFIG", "REWRITE")  # type: ignore[no-untyped-call]
    except ResponseError:  # no config file, not allowed (NoPermissionError), or renamed away (6.2)
        return False
    return True


def server_major(redis: Redis) -> int:
    version = str(redis.info("server")["redis_version"])
    return int(version.split(".", maxsplit=1)[0])


def printable(command: Iterable[str]) -> str:
    """A command as one line for redis-cli."""
    return " ".join(command)
