"""The Lua scripts, each its own file in ``lua/``, loaded once per client and called by SHA.

Each script runs after a generated prelude (key templates, state names, limits) and ``_lib.lua``.
Scripts go by SHA; those Redis lost (a restart, ``SCRIPT FLUSH``) are loaded again on ``NOSCRIPT``
and only the refused calls sent again (:meth:`Scripts.pipeline`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import Any

import hiredis
from redis import Redis
from redis.client import Pipeline
from redis.connection import Connection, ConnectionPool
from redis.exceptions import NoScriptError, ResponseError

from ..models import WORKER_LOST, JobState
from ..settings import Settings
from .histograms import RUN_BUCKETS, START_BUCKETS, bounds_ms
from .keys import Keys

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
    "reap",
    "gang",
    "keep_checkpoint",
    "spoil",
)


def _lua(value: Any) -> str:
    """A Lua literal for a str, int, tuple of those, or dict of those."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{name} = {_lua(item)}" for name, item in value.items()) + "}"
    if isinstance(value, tuple):
        return "{" + ", ".join(_lua(item) for item in value) + "}"
    return json.dumps(value)


def prelude(keys: Keys, settings: Settings) -> str:
    constants = {
        "K": keys.lua_templates(),
        "JOBS": keys.jobs,
        "QUEUES": keys.queues,
        "LEASES": keys.leases,
        "DELAYED": keys.delayed,
        "GANGS": keys.gangs,
        "GANG_WAKE": keys.gang_wake,
        "GANG_ORIGINS": keys.gang_origins,
        "GANG_START_TRIES": GANG_START_TRIES,
        "NEW_QUEUE": keys.new_queue,
        "PREFIX": keys.queue_name(""),
        "RQ_QUEUES": keys.rq_queues,
        "RQ_STATUS": {state.value: state.rq_status for state in JobState},
        "LOG_MAX_LINES": settings.log_max_lines,
        "RETENTION": settings.retention_seconds,
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


class Scripts:
    """One ``Script`` per file, bound to a connection; ``run("claim", keys, args)`` calls it by SHA."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self._redis = redis
        folder = resources.files("gpulayer.store") / "lua"
        head = prelude(keys, settings) + (folder / "_lib.lua").read_text()
        self._scripts = {
            name: redis.register_script(head + (folder / f"{name}.lua").read_text()) for name in _NAMES
        }
        self._held = HeldConnection(redis.connection_pool)

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Call one script: see :meth:`calls`."""
        [reply] = self.calls([(name, keys, args)])
        return reply

    def calls(self, calls: Iterable[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Call scripts (name, keys, args) in order, in one round trip, and return their replies.
        Those Redis refused for a lost script go again once the scripts are loaded (see
        :meth:`pipeline`); any other error is raised once every reply is in. A connection lost on the
        way is retried as redis-py retries its commands."""
        commands = [self._command(name, keys, args) for name, keys, args in calls]
        return self._settled(commands, self._exchange(commands, [{}] * len(commands)))

    def _exchange(self, commands: list[tuple[Any, ...]], options: list[dict[str, Any]]) -> list[Any]:
        """Send ``commands`` at once on the held connection and read a reply to each, as redis-py
        gives it (the command's callback applied, with its ``options``); an error reply as its
        exception, not raised. A connection lost on the way is retried as redis-py retries its
        commands."""
        read = functools.partial(_reply, self._redis)

        def exchange(connection: Connection) -> list[Any]:
            connection.send_packed_command([_packed(commands)])  # type: ignore[no-untyped-call]
            return [read(connection, command[0], how) for command, how in zip(commands, options, strict=True)]

        with self._held.connection() as connection:
            return connection.retry.call_with_retry(
                lambda: exchange(connection),
                lambda _: connection.disconnect(),  # type: ignore[no-untyped-call]
            )

    def _command(self, name: str, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        return ("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)

    def queue(self, pipe: Pipeline, name: str, keys: list[str], args: list[Any]) -> None:
        """Queue a call of the script on a pipeline run by :meth:`pipeline`."""
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    def pipeline(self, build: Callable[[Pipeline], object]) -> list[Any]:
        """Send what ``build`` queues in one round trip and return the replies. Scripts go by SHA
        alone, without the SCRIPT EXISTS round trip redis-py's pipelines make first. If Redis lost
        some (a restart, SCRIPT FLUSH, a Redis that never ran them), they are loaded and only the
        calls Redis refused are sent again: the others already ran, and running one twice would
        undo what its first run did (a job's end and the next claim in one round trip: the claim's
        job would be taken and then dropped, to wait for its lease)."""
        pipe = self._redis.pipeline(transaction=False)
        build(pipe)
        # Sent on the held connection, not by the pipeline's execute(), which takes a connection
        # from the pool and checks it with a poll first: twice the client's CPU per round trip here.
        commands = [args for args, _options in pipe.command_stack]
        if not commands:
            return []
        return self._settled(commands, self._exchange(commands, [how for _args, how in pipe.command_stack]))

    def stream(self, calls: Iterable[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Run the calls (script name, keys, args) in order on one connection, each sent before the
        reply to the one before it is read: making the next call (``calls`` is read lazily) overlaps
        Redis running the last. Calls Redis refused for a lost script go again once the scripts are
        loaded (see :meth:`pipeline`); any other error is raised once every reply is in."""
        sent: list[tuple[Any, ...]] = []
        replies: list[Any] = []
        with self._held.connection() as connection:
            for name, keys, args in calls:
                sent.append(self._command(name, keys, args))
                connection.send_command(*sent[-1])  # type: ignore[no-untyped-call]
                if len(sent) > 1:
                    replies.append(_reply(self._redis, connection, "EVALSHA", {}))
            if sent:
                replies.append(_reply(self._redis, connection, "EVALSHA", {}))
        return self._settled(sent, replies)

    def _settled(self, commands: list[Any], replies: list[Any]) -> list[Any]:
        """The replies to ``commands``, once those Redis refused for a lost script went again (loaded
        first; the others already ran, so only those, in one round trip); the first error raised."""
        refused = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused:
            self._load()
            again = self._redis.pipeline(transaction=False)
            for index in refused:
                again.execute_command(*commands[index])  # type: ignore[no-untyped-call]
            for index, reply in zip(refused, again.execute(raise_on_error=False), strict=True):
                replies[index] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _load(self) -> None:
        with self._redis.pipeline(transaction=False) as pipe:
            for script in self._scripts.values():
                pipe.script_load(script.script)
            pipe.execute()


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
