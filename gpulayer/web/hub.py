"""Live log lines and events for every websocket of one server process, from two Redis connections.

One thread reads the log streams of all the jobs being watched in a single blocking ``XREAD`` and
hands each line to every socket watching that job; a socket that joins late first gets the lines
the hub had already passed. Another listens on pub/sub: the events channel (job states, workers,
telemetry) while any socket follows it, and revoked tokens, whose sockets it closes. Each blocks on
its own connection, so neither waits on the other.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from typing import Any, cast

from ..service import Service

log = logging.getLogger("gpulayer.web")
#: How long one read blocks (ms): how soon a newly watched job is read from.
_BLOCK_MS = 100
#: Lines read per stream per round.
_COUNT = 500

#: What a watcher receives: a line with its id, the job's end (its final state), an event (JSON text),
#: or its token's revocation.
Event = tuple[str, Any]


@dataclasses.dataclass(eq=False)
class Watcher:
    """One websocket following one job's log (``job_id``), or the events channel (``job_id`` None)."""

    job_id: str | None
    token: str
    inbox: queue.Queue[Event] = dataclasses.field(default_factory=queue.Queue)


class LogHub(threading.Thread):
    def __init__(self, service: Service) -> None:
        super().__init__(name="gpulayer-log-hub", daemon=True)
        self._service = service
        self._lock = threading.Lock()
        self._joining: list[tuple[Watcher, str]] = []
        self._leaving: list[Watcher] = []
        self._revoked: list[str] = []
        #: Per watched job: the id of the last line handed out, and who watches it.
        self._cursors: dict[str, str] = {}
        self._watchers: dict[str, list[Watcher]] = {}
        self._stopping = threading.Event()

    def watch(self, job_id: str, token: str, after: str = "0-0") -> Watcher:
        """Follow a job's log from the line after ``after``; read the watcher's inbox."""
        watcher = Watcher(job_id, token)
        with self._lock:
            self._joining.append((watcher, after))
        return watcher

    def leave(self, watcher: Watcher) -> None:
        with self._lock:
            self._leaving.append(watcher)

    def revoke(self, token: str) -> None:
        """Close the sockets of a revoked token (at the next round)."""
        with self._lock:
            self._revoked.append(token)

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._admit()
                self._read()
            except Exception:  # the hub must outlive any one bad read; sockets retry through it
                log.exception("the log hub failed a round; going on")
                self._stopping.wait(1.0)

    def _admit(self) -> None:
        with self._lock:
            joining, self._joining = self._joining, []
            leaving, self._leaving = self._leaving, []
            revoked, self._revoked = self._revoked, []
        for watcher in leaving:
            job = cast(str, watcher.job_id)
            remaining = [w for w in self._watchers.get(job, []) if w is not watcher]
            if remaining:
                self._watchers[job] = remaining
            else:
                self._watchers.pop(job, None)
                self._cursors.pop(job, None)
        for watcher, after in joining:
            job = cast(str, watcher.job_id)
            if job in self._cursors:
                # Late: it first gets what the hub already handed out after its own cursor.
                for line in self._service.log_range(job, after, self._cursors[job]):
                    watcher.inbox.put(("line", line))
            else:
                self._cursors[job] = after
            self._watchers.setdefault(job, []).append(watcher)
        for token in revoked:
            for watchers in self._watchers.values():
                for watcher in watchers:
                    if watcher.token == token:
                        watcher.inbox.put(("revoked", token))

    def _read(self) -> None:
        if not self._cursors:
            self._stopping.wait(_BLOCK_MS / 1000)
            return
        updates = self._service.read_logs(self._cursors, count=_COUNT, block_ms=_BLOCK_MS)
        for job, lines in updates.lines.items():
            for line in lines:
                for watcher in self._watchers.get(job, []):
                    watcher.inbox.put(("line", line))
                self._cursors[job] = line[0]
        # A job's last lines may still be unread this round: only once a read finds none is it over.
        for job in updates.ended.keys() - updates.lines.keys():
            for watcher in self._watchers.pop(job, []):
                watcher.inbox.put(("end", updates.ended[job].value))
            self._cursors.pop(job, None)


class Channels(threading.Thread):
    """The pub/sub side: events for ``/ws/events`` sockets (subscribed only while one is open, since
    every job's every state change crosses that channel) and revoked tokens for every socket."""

    def __init__(self, service: Service, logs: LogHub) -> None:
        super().__init__(name="gpulayer-channels", daemon=True)
        self._service = service
        self._logs = logs
        self._lock = threading.Lock()
        self._listeners: list[Watcher] = []
        self._stopping = threading.Event()

    def listen(self, token: str) -> Watcher:
        """Follow the events channel from now on (from the next round: up to ``_BLOCK_MS``)."""
        watcher = Watcher(None, token)
        with self._lock:
            self._listeners.append(watcher)
        return watcher

    def leave(self, watcher: Watcher) -> None:
        with self._lock:
            self._listeners = [w for w in self._listeners if w is not watcher]

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        subscription = None
        while not self._stopping.is_set():
            try:
                subscription = subscription or self._service.subscribe()
                with self._lock:
                    wanted = bool(self._listeners)
                subscription.follow_events(wanted)
                message = subscription.next(timeout=_BLOCK_MS / 1000)
                if message is not None:
                    self._hand_out(*message)
            except Exception:  # as the log hub: outlive any one bad round
                log.exception("the channel listener failed a round; going on")
                self._stopping.wait(1.0)
        if subscription is not None:
            subscription.close()

    def _hand_out(self, kind: str, data: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        if kind == "event":
            for watcher in listeners:
                watcher.inbox.put(("event", data))
            return
        for watcher in listeners:
            if watcher.token == data:
                watcher.inbox.put(("revoked", data))
        self._logs.revoke(data)


class Hub:
    """The app's two threads, started by the first socket that needs them: in the process that
    serves it, not in one that forks servers later (threads do not survive a fork)."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._threads: tuple[LogHub, Channels] | None = None
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Stop the threads, if they run (they start again when needed)."""
        with self._lock:
            for thread in self._threads or ():
                thread.stop()
                thread.join(5)
            self._threads = None

    def _started(self) -> tuple[LogHub, Channels]:
        with self._lock:
            if self._threads is None or not all(thread.is_alive() for thread in self._threads):
                for thread in self._threads or ():
                    thread.stop()
                logs = LogHub(self._service)
                self._threads = (logs, Channels(self._service, logs))
                for thread in self._threads:
                    thread.start()
            return self._threads

    def watch(self, job_id: str, token: str, after: str = "0-0") -> Watcher:
        return self._started()[0].watch(job_id, token, after)

    def listen(self, token: str) -> Watcher:
        return self._started()[1].listen(token)

    def leave(self, watcher: Watcher) -> None:
        logs, channels = self._started()
        (channels if watcher.job_id is None else logs).leave(watcher)
