"""Redis's own users, one per role, each with no more than the role needs.

``admin`` may do anything. The others may reach only this installation's keys and channels
(``<prefix>:*``, RQ's included: :mod:`.rq_names`), in the one database their URL names, and none may
run a command that changes the server itself or reads what is not theirs (``@dangerous``: CONFIG,
ACL, DEBUG, MODULE, KEYS, FLUSHALL/FLUSHDB, SHUTDOWN, CLIENT KILL, MONITOR, SAVE/BGSAVE, REPLICAOF,
...), nor reach past their key patterns (see :data:`_NEVER`). On Redis 7 they run no Lua but the
installation's function library, which the admin loads (FCALL; no EVAL, no SCRIPT, no FUNCTION). On
6.2, which has no functions, the writers load and call scripts by SHA (docs/security.md says what
that leaves open). ``viewer`` runs read commands only. Only ``web`` (the HTTP server) and ``admin``
reach the keys of API tokens and browser sessions (:attr:`Keys.auth`), so no job, worker or
submitter can mint a token.

Written for Redis 6.2 and 7 alike: only command categories, allowed subcommands and key and channel
patterns that both read the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from redis import Redis

from ..models import AccessRole
from .keys import Keys

#: Every role, in the order the rules are written.
ROLES: tuple[AccessRole, ...] = ("admin", "web", "submitter", "worker", "viewer")
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


def user_name(keys: Keys, role: AccessRole) -> str:
    return f"{keys.prefix}-{role}"


def password_hash(password: str) -> str:
    """How Redis keeps a password (``#<sha256>``): an ACL file or a printed rule never holds the
    password itself."""
    return hashlib.sha256(password.encode()).hexdigest()


def rules(keys: Keys, role: AccessRole, redis_major: int = 7) -> list[str]:
    """The ACL rules of ``role``'s user, after its password (see :func:`user_rules`)."""
    if role == "admin":
        return ["allkeys", "allchannels", "+@all"]
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


def user_rules(keys: Keys, role: AccessRole, password: str, redis_major: int = 7) -> list[str]:
    """Everything ``ACL SETUSER <user>`` takes for ``role``: on, its password's hash, its rules."""
    return ["reset", "on", f"#{password_hash(password)}", *rules(keys, role, redis_major)]


def acl_file(keys: Keys, passwords: dict[AccessRole, str], redis_major: int = 7) -> str:
    """An ACL file (``aclfile``) with a user per role and the default user turned off."""
    # Off, so nobody logs in as it; but with every right, because Redis before 8 replays the
    # transactions of its append-only file (every script's writes) as the default user, and drops
    # those it may not run (redis/redis#14541): without them, a restart would lose every job.
    lines = ["user default off allkeys allchannels +@all"]
    for role in ROLES:
        rules_of = user_rules(keys, role, passwords[role], redis_major)
        lines.append(" ".join(["user", user_name(keys, role), *rules_of]))
    return "\n".join(lines) + "\n"


def commands(
    keys: Keys, passwords: dict[AccessRole, str], redis_major: int = 7, disable_default: bool = True
) -> list[list[str]]:
    """The ``ACL SETUSER`` commands that make the roles on a running Redis (and turn off the default
    user last, once the admin exists)."""
    made = [
        ["ACL", "SETUSER", user_name(keys, role), *user_rules(keys, role, passwords[role], redis_major)]
        for role in ROLES
    ]
    return [*made, ["ACL", "SETUSER", "default", "off"]] if disable_default else made


def apply(redis: Redis, keys: Keys, passwords: dict[AccessRole, str], disable_default: bool = True) -> None:
    """Make the roles on ``redis`` (whose connection must be allowed ACL SETUSER)."""
    for command in commands(keys, passwords, server_major(redis), disable_default):
        redis.execute_command(*command)  # type: ignore[no-untyped-call]


def server_major(redis: Redis) -> int:
    version = str(redis.info("server")["redis_version"])
    return int(version.split(".", maxsplit=1)[0])


def printable(command: Iterable[str]) -> str:
    """A command as one line for redis-cli."""
    return " ".join(command)
