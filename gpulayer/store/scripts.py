"""The Lua scripts, each its own file in ``lua/``: on Redis 7, one function library called by FCALL;
on Redis 6.2, which has no functions, each script called by SHA.

Each script runs after a generated prelude (key templates, state names, limits) and ``_lib.lua``.
On Redis 7 they are the library's functions, named for the installation and for what they hold
(:class:`Library`), so two installations on one Redis, or two versions during an upgrade, never
meet; the roles may call them and run no other Lua (:mod:`.acl`), so only a user allowed FUNCTION
LOAD (the admin, at ``gpulayer up``) loads the library. A caller's settings the scripts read go
with each call, after its arguments: the library is the same for every caller of one installation.

Calls Redis refused for a lost library or script (a restart without persistence, a flush, a Redis
that never had them) go again, alone, once it is loaded (:meth:`Scripts.pipeline`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import Any

import hiredis
from redis import Redis
from redis.client import Pipeline
from redis.connection import Connection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from ..errors import ConfigError, NotReplicated
from ..models import WORKER_LOST, JobState
from ..settings import Settings
from .histograms import RUN_BUCKETS, START_BUCKETS, bounds_ms
from .keys import Keys
from .rq_jobs import UNSIGNED

#: A gang job that fails to start this many times (a rank cannot be spawned, a worker vanishes before
#: its part starts) fails; before that, it goes back to wait for workers.
GANG_START_TRIES = 3

_NAMES = (
    "submit",
    "submit_many",
    "claim",
    "start",
    "append_logs",
    "finish",
    "cancel",
    "heartbeat",
    "requeue",
    "prune",
    "gc",
    "reap",
    "gang",
    "keep_checkpoint",
    "spoil",
    "forget",
)
#: The scripts whose writes a submit acknowledges: with ``submit_replicas``, replicas have them first.
_SUBMITS = frozenset({"submit", "submit_many"})
#: What Redis 7 answers a call of a function it does not have.
_NO_FUNCTION = "Function not found"


class ScriptsMissing(ConfigError, RedisConnectionError):
    """Redis lacks this version's scripts and this user may not load them. A :class:`ConfigError`,
    for one line from the CLI; a ``ConnectionError`` too, so a worker waits as for a Redis out of
    reach (its admin's `gpulayer up` may load them at any moment) instead of stopping."""


def _lua(value: Any) -> str:
    """A Lua literal for a str, int, tuple of those, or dict of those."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{name} = {_lua(item)}" for name, item in value.items()) + "}"
    if isinstance(value, tuple):
        return "{" + ", ".join(_lua(item) for item in value) + "}"
    return json.dumps(value)


def prelude(keys: Keys) -> str:
    constants = {
        "K": keys.lua_templates(),
        "JOBS": keys.jobs,
        "QUEUES": keys.queues,
        "LEASES": keys.leases,
        "DELAYED": keys.delayed,
        "GANGS": keys.gangs,
        "GANG_WAKE": keys.gang_wake,
        "GANG_ORIGINS": keys.gang_origins,
        "TAKEN_BY_RQ": keys.taken_by_rq,
        "UNSIGNED": UNSIGNED,
        "GANG_START_TRIES": GANG_START_TRIES,
        "NEW_QUEUE": keys.new_queue,
        "PREFIX": keys.queue_name(""),
        "RQ_QUEUES": keys.rq_queues,
        "RQ_WORKERS": keys.rq_workers,
        "RQ_STATUS": {state.value: state.rq_status for state in JobState},
        "EVENTS": keys.events,
        "START_LATENCY": keys.start_latency,
        "START_BUCKETS": bounds_ms(START_BUCKETS),
        "RUN_TIME": keys.run_time,
        "RUN_BUCKETS": bounds_ms(RUN_BUCKETS),
        "ENDED_COUNTS": keys.ended_counts,
        "FINAL": {state.value: 1 for state in JobState if state.is_terminal},
        "WORKER_LOST": WORKER_LOST,
    }
    return "".join(f"local {name} = {_lua(value)}\n" for name, value in constants.items())


@dataclasses.dataclass(frozen=True)
class Library:
    """The scripts of one installation and version: a Redis 7 function library (``code``, a function
    per script), and each script whole, for Redis 6.2's EVALSHA (``scripts``)."""

    #: ``gl_<prefix>_<digest of what it holds>``: another installation's or version's has another.
    name: str
    code: str
    #: Each script whole (the prelude, ``_lib.lua`` and its own file), by name.
    scripts: dict[str, str]
    #: Each script's SHA-1, by name: what EVALSHA calls it by.
    shas: dict[str, str]
    #: Each script's name, by what a call sends (its function's name, its SHA-1).
    names: dict[str, str]

    def head(self, name: str, functions: bool) -> tuple[str, str]:
        """The command and first argument that call script ``name``: FCALL of its function, or (on a
        Redis without functions) EVALSHA of it whole."""
        return ("FCALL", f"{self.name}_{name}") if functions else ("EVALSHA", self.shas[name])


@functools.lru_cache(maxsize=8)
def library(prefix: str) -> Library:
    """The scripts of installation ``prefix``, as this version has them."""
    folder = resources.files("gpulayer.store") / "lua"
    head = prelude(Keys(prefix)) + (folder / "_lib.lua").read_text()
    bodies = {name: "begin(ARGV)\n" + (folder / f"{name}.lua").read_text() for name in _NAMES}
    digest = hashlib.sha256("".join([head, *bodies.values()]).encode()).hexdigest()[:16]
    name = f"gl_{re.sub('[^A-Za-z0-9_]', '_', prefix)}_{digest}"
    # Each script's body, a function's now: Redis calls it with KEYS and ARGV, as EVAL sets them.
    functions = "".join(
        f"redis.register_function('{name}_{script}', function(KEYS, ARGV)\n{body}\nend)\n"
        for script, body in bodies.items()
    )
    shas = {script: hashlib.sha1((head + body).encode()).hexdigest() for script, body in bodies.items()}
    called = {f"{name}_{script}": script for script in _NAMES} | {sha: script for script, sha in shas.items()}
    return Library(
        name=name,
        code=f"#!lua name={name}\n{head}{functions}",
        scripts={script: head + body for script, body in bodies.items()},
        shas=shas,
        names=called,
    )


def load_library(redis: Redis, keys: Keys) -> bool:
    """Load the installation's function library through ``redis`` (a user allowed FUNCTION LOAD: the
    admin). False on a Redis without functions (6.2), where each client loads the scripts it calls."""
    try:
        _load(redis, library(keys.prefix))
    except ResponseError as exc:
        if _unknown_command(exc):
            return False
        raise
    return True


def _load(redis: Redis, scripts: Library) -> None:
    try:
        redis.function_load(scripts.code)
    except ResponseError as exc:
        if "already exists" not in str(exc):  # a caller of the same version loaded it meanwhile
            raise


def _unknown_command(reply: Any) -> bool:
    return isinstance(reply, ResponseError) and str(reply).lower().startswith("unknown command")


def _lost(command: tuple[Any, ...], reply: Any) -> bool:
    """Whether Redis refused a script's call for want of the script (so it never ran)."""
    if command[0] not in ("FCALL", "EVALSHA"):
        return False
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and (str(reply).startswith(_NO_FUNCTION) or _unknown_command(reply))
    )


class Scripts:
    """The scripts of one installation, bound to a connection: ``run("claim", keys, args)`` calls one."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self._redis = redis
        self._library = library(keys.prefix)
        # What every call carries after its arguments (begin() in _lib.lua takes them off).
        self._settings = (settings.log_max_lines, settings.retention_seconds)
        #: Whether Redis has functions (7 and later), until a reply says it has not (6.2).
        self._functions = True
        self._held = HeldConnection(redis.connection_pool)
        #: WAIT's arguments after a submit (replicas, milliseconds), or None.
        self._wait = (
            (settings.submit_replicas, round(settings.submit_replicas_timeout * 1000))
            if settings.submit_replicas
            else None
        )

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Call one script: see :meth:`calls`."""
        [reply] = self.calls([(name, keys, args)])
        return reply

    def calls(self, calls: Iterable[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Call scripts (name, keys, args) in order, in one round trip, and return their replies.
        Those Redis refused for a lost library go again once it is loaded (see :meth:`pipeline`);
        any other error is raised once every reply is in. A connection lost on the way is retried
        as redis-py retries its commands."""
        commands = [self._command(name, keys, args) for name, keys, args in calls]
        commands += (wait := self._waits(commands))
        replies = self._exchange(commands, [{}] * len(commands))
        return self._acknowledged(wait, self._settled(commands, replies))

    def _exchange(self, commands: list[tuple[Any, ...]], options: list[dict[str, Any]]) -> list[Any]:
        """Send ``commands`` at once on the held connection and read a reply to each, as redis-py
        gives it (the command's callback applied, with its ``options``); an error reply as its
        exception, not raised. A connection lost on the way is retried as redis-py retries its
        commands."""
        read = functools.partial(_reply, self._redis)

        def exchange(connection: Connection) -> list[Any]:
            _connected(connection)
            connection.send_packed_command([_packed(commands)])  # type: ignore[no-untyped-call]
            return [read(connection, command[0], how) for command, how in zip(commands, options, strict=True)]

        with self._held.connection() as connection:
            return connection.retry.call_with_retry(
                lambda: exchange(connection),
                lambda _: connection.disconnect(),  # type: ignore[no-untyped-call]
            )

    def _waits(self, commands: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """What to send after ``commands`` on their connection: a WAIT (which counts the replicas
        that have every write of its connection so far) if they hold a submit and replicas are asked
        for (``submit_replicas``); else nothing."""
        if self._wait is None or not any(self._submits(command) for command in commands):
            return []
        return [("WAIT", *self._wait)]

    def _submits(self, command: tuple[Any, ...]) -> bool:
        return command[0] in ("FCALL", "EVALSHA") and self._library.names.get(command[1]) in _SUBMITS

    def _acknowledged(self, wait: list[tuple[Any, ...]], replies: list[Any]) -> list[Any]:
        """``replies`` without the WAIT's last one (see :meth:`_waits`); :class:`NotReplicated` if it
        counted too few replicas."""
        if not wait:
            return replies
        *replies, acknowledged = replies
        wanted, milliseconds = wait[0][1:]
        if acknowledged < wanted:
            raise NotReplicated(
                f"Redis's master has the job, but {acknowledged} of the {wanted} replicas asked for "
                f"(GPULAYER_SUBMIT_REPLICAS) had it within {milliseconds / 1000:g} s: it is lost if the "
                "master fails before they do"
            )
        return replies

    def _command(self, name: str, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        return (*self._library.head(name, self._functions), len(keys), *keys, *args, *self._settings)

    def queue(self, pipe: Pipeline, name: str, keys: list[str], args: list[Any]) -> None:
        """Queue a call of the script on a pipeline run by :meth:`pipeline`."""
        pipe.execute_command(*self._command(name, keys, args))  # type: ignore[no-untyped-call]

    def pipeline(self, build: Callable[[Pipeline], object]) -> list[Any]:
        """Send what ``build`` queues in one round trip and return the replies, without the
        SCRIPT EXISTS round trip redis-py's pipelines make first. If Redis lost the library (a
        restart, a flush, a Redis that never had it), it is loaded and only the calls Redis refused
        are sent again: the others already ran, and running one twice would undo what its first
        run did (a job's end and the next claim in one round trip: the claim's job would be taken
        and then dropped, to wait for its lease)."""
        pipe = self._redis.pipeline(transaction=False)
        build(pipe)
        # Sent on the held connection, not by the pipeline's execute(), which takes a connection
        # from the pool and checks it with a poll first: twice the client's CPU per round trip here.
        commands = [args for args, _options in pipe.command_stack]
        if not commands:
            return []
        options = [how for _args, how in pipe.command_stack]
        commands += (wait := self._waits(commands))
        replies = self._exchange(commands, options + [{}] * len(wait))
        return self._acknowledged(wait, self._settled(commands, replies))

    def stream(self, calls: Iterable[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Run the calls (script name, keys, args) in order on one connection, each sent before the
        reply to the one before it is read: making the next call (``calls`` is read lazily) overlaps
        Redis running the last. Calls Redis refused for a lost library go again once it is loaded
        (see :meth:`pipeline`); any other error is raised once every reply is in."""
        sent: list[tuple[Any, ...]] = []
        replies: list[Any] = []
        with self._held.connection() as connection:
            _connected(connection)
            for name, keys, args in calls:
                sent.append(self._command(name, keys, args))
                connection.send_command(*sent[-1])  # type: ignore[no-untyped-call]
                if len(sent) > 1:
                    replies.append(_reply(self._redis, connection, sent[-2][0], {}))
            if sent:
                replies.append(_reply(self._redis, connection, sent[-1][0], {}))
            for command in (wait := self._waits(sent)):
                sent.append(command)
                connection.send_command(*command)  # type: ignore[no-untyped-call]
                replies.append(_reply(self._redis, connection, command[0], {}))
        return self._acknowledged(wait, self._settled(sent, replies))

    def _settled(self, commands: list[Any], replies: list[Any]) -> list[Any]:
        """The replies to ``commands``, once those Redis refused for want of a script went again
        (loaded first; the others already ran, so only those, in one round trip); the first error
        raised."""
        refused = [index for index, reply in enumerate(replies) if _lost(commands[index], reply)]
        if refused:
            self._provide(replies[refused[0]])
            again = self._redis.pipeline(transaction=False)
            for index in refused:
                again.execute_command(*self._recalled(commands[index]))  # type: ignore[no-untyped-call]
            # Sent again on another connection, which the first WAIT does not count for.
            wait = self._waits(commands[index] for index in refused)
            for command in wait:
                again.execute_command(*command)  # type: ignore[no-untyped-call]
            results = again.execute(raise_on_error=False)
            for index, reply in zip(refused, results[: len(refused)], strict=True):
                replies[index] = reply
            if wait:
                replies[-1] = min(replies[-1], results[-1])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _recalled(self, command: tuple[Any, ...]) -> tuple[Any, ...]:
        """A refused call, as it goes again: FCALL turns into EVALSHA on a Redis without functions."""
        return (*self._library.head(self._library.names[command[1]], self._functions), *command[2:])

    def _provide(self, refusal: ResponseError) -> None:
        """Load what Redis lacked: on Redis 6.2 (it knows no FCALL), every script; else the library,
        which only a user allowed FUNCTION LOAD may (the admin; the roles call, never load)."""
        if _unknown_command(refusal):
            self._functions = False
        if not self._functions:
            with self._redis.pipeline(transaction=False) as pipe:
                for script in self._library.scripts.values():
                    pipe.script_load(script)
                pipe.execute()
            return
        try:
            _load(self._redis, self._library)
        except NoPermissionError:
            raise ScriptsMissing(
                f"this installation's Redis lacks the scripts of this GPUlayer version "
                f"({self._library.name}) and this Redis user may not load them: the installation's "
                "admin loads them with `gpulayer up`, or `gpulayer access apply` for a Redis of their own"
            ) from None


class HeldConnection:
    """A connection of redis-py's pool that one client keeps for its script calls: taking one from
    the pool and giving it back costs more of the client's CPU than sending a call and reading its
    reply (redis-py 8: about 10 µs of 45 here). A thread that finds it in use takes one from the pool
    as before; after a fork, the child takes one of its own (the pool starts afresh in a child). A
    connection whose user raised is disconnected: replies left unread would answer its next user."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._held: Connection | None = None
        self._pid = os.getpid()

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        if not self._lock.acquire(blocking=False):
            connection = self._pool.get_connection()
            try:
                yield from _disconnected_on_error(connection)
            finally:
                self._pool.release(connection)
            return
        try:
            if self._held is None or self._pid != os.getpid():
                self._held, self._pid = self._pool.get_connection(), os.getpid()
            yield from _disconnected_on_error(self._held)
        finally:
            self._lock.release()


def _connected(connection: Connection) -> None:
    """Connect ``connection`` if it is not: through its own ``connect``, which for a connection to a
    master behind Sentinel asks the sentinels where the master is now. A command sent on a connection
    that lost its socket would connect again by itself, but to the address it had: after a failover,
    the dead master's."""
    connection.connect()  # type: ignore[no-untyped-call]  # at once if connected


def _disconnected_on_error(connection: Connection) -> Iterator[Connection]:
    try:
        yield connection
    except BaseException:
        connection.disconnect()  # type: ignore[no-untyped-call]
        raise


def _packed(commands: list[tuple[Any, ...]]) -> bytes:
    """The commands in Redis's protocol, by hiredis's packer, as redis-py packs them (with hiredis,
    which GPUlayer requires) less its look at each argument in Python first, for kinds we never send
    (bytearray, memoryview): a third of the cost, for a submit's fifty arguments. A command named in
    two words ("SCRIPT LOAD") is two arguments, as redis-py sends it."""
    return b"".join(
        hiredis.pack_command((*command[0].split(), *command[1:]) if " " in command[0] else command)
        for command in commands
    )


def _reply(redis: Redis, connection: Connection, command: str, options: dict[str, Any]) -> Any:
    """The next reply on the connection, as redis-py gives it to ``command`` with its ``options``;
    an error reply as its exception, not raised."""
    try:
        return redis.parse_response(connection, command, **options)  # type: ignore[no-untyped-call]
    except ResponseError as exc:
        return exc
