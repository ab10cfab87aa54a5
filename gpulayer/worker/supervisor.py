"""One thread per worker that follows every job process it runs: their output, their exits and an
executor's reply, all in one selector loop. Each turn's log lines, of all jobs, go to Redis in one
round trip.

A job's runner hands its processes over with :meth:`Supervisor.follow` and waits on the returned
:class:`Watch`; the policy (timeouts, stops, kill graces, checkpoints) stays with the runner. The
thread that started a job follows it itself for its first moments (``first``), the same way: most
short jobs end before that, and are spared the hand-over to the supervisor and back (two thread
wake-ups, a dozen system calls).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..store.execution import Claim
from .output import Line, Tracked
from .process import exit_notifier, exit_status, has_exited, signal_group, signal_tree

log = logging.getLogger("gpulayer.worker")

#: The loop looks at the clock at least this often (s).
TICK = 0.25
#: After a process exits, its output is read for at most this long (s): what something that left its
#: group holds open is not waited for.
DRAIN = 2.0
#: Without a pidfd, exits are polled: every millisecond at first, so short jobs end promptly.
_FIRST_POLL = 0.001

#: Writes each turn's lines: ``[(claim, lines)]`` in, whether each claim is still its attempt's out.
Writer = Callable[[list[tuple[Claim, list[Line]]]], list[bool]]


class Watch:
    """One job's processes as the supervisor follows them, until ``done`` is set: every process
    exited and its output is read (or, for an executor, it replied, with what it printed before)."""

    def __init__(
        self,
        tracked: list[Tracked],
        replies: Connection | None,
        claim: Claim,
        cap: int,
        *,
        stale: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.tracked = tracked
        self.replies = replies
        self.claim = claim
        self.done = threading.Event()
        #: The executor replied (its output up to the reply is read; it is not reaped).
        self.replied = False
        #: The first of several processes that failed, and how (its exit status).
        self.failed: tuple[int | None, int] | None = None
        #: Why the supervisor could not follow the job to its end (Redis gone for a lease, a bug).
        self.error: BaseException | None = None
        self._cap = cap
        self.on_stale = stale
        self._stopping = stopping
        self._poll = _FIRST_POLL
        self._next_poll = time.monotonic() + _FIRST_POLL
        self.lines: list[Line] = []

    @property
    def finished(self) -> bool:
        return self.replied or self.error is not None or all(one.done for one in self.tracked)

    def kill(self) -> None:
        """SIGKILL every process of the job: its runner can no longer see it through."""
        for one in self.tracked:
            signal_tree(one.pid, signal.SIGKILL)

    def register(self, selector: selectors.BaseSelector) -> None:
        for one in self.tracked:
            assert one.process.stdout is not None
            assert one.process.stderr is not None
            selector.register(one.process.stdout, selectors.EVENT_READ, (self, one, "stdout"))
            selector.register(one.process.stderr, selectors.EVENT_READ, (self, one, "stderr"))
            if one.notifier is None and one.exited_at is None:  # else opened by an earlier follower
                one.notifier = exit_notifier(one.pid)
            if one.notifier is not None and one.exited_at is None:
                selector.register(one.notifier, selectors.EVENT_READ, (self, one, "exit"))
        if self.replies is not None:
            selector.register(self.replies.fileno(), selectors.EVENT_READ, (self, None, "reply"))

    def ready(
        self, selector: selectors.BaseSelector, key: selectors.SelectorKey, one: Tracked | None, what: str
    ) -> None:
        if what == "reply":
            self.replied = True
            self._drain(selector)
        elif what == "exit":
            assert one is not None
            selector.unregister(key.fileobj)
            self._exited(one)
        else:
            assert one is not None
            if not one.read(key.fd, what, self.lines, self._cap):
                selector.unregister(key.fileobj)
                one.streams -= 1

    def _drain(self, selector: selectors.BaseSelector) -> None:
        """Read an executor's output up to now: it flushed before it replied, so all of it is there."""
        for key in list(selector.get_map().values()):
            watch, one, what = key.data
            if watch is self and what in ("stdout", "stderr"):
                while one.read(key.fd, what, self.lines, self._cap, drain=True):
                    pass
                one.flush(self.lines, what)

    def look(self, now: float) -> None:
        """Exits no pidfd announced, and output held open past the end by something that left the
        job's group (no longer listened to)."""
        polled = now >= self._next_poll
        if polled:
            self._poll = min(self._poll * 2, TICK)
            self._next_poll = now + self._poll
        for one in self.tracked:
            if polled and one.notifier is None and one.exited_at is None and has_exited(one.pid):
                self._exited(one)
            if one.exited_at is not None and now - one.exited_at > DRAIN:
                one.streams = 0

    def due(self, now: float) -> float:
        """How long the loop may sleep for this job's sake."""
        waits = [TICK]
        polled = any(one.notifier is None and one.exited_at is None for one in self.tracked)
        # With output still open, its end wakes the loop; a fast poll is for a process without.
        if polled and not any(one.streams for one in self.tracked):
            waits.append(self._next_poll - now)
        waits.extend(one.exited_at + DRAIN - now for one in self.tracked if one.exited_at and one.streams)
        return max(0.0, min(waits))

    def _exited(self, one: Tracked) -> None:
        """One process exited: what it left in its group dies with it (the leader is a zombie until
        reaped, so its group id cannot have been reused); if it failed and others run beside it (the
        ranks of a gang job), they are stopped."""
        one.exited_at = time.monotonic()
        signal_group(one.pid, signal.SIGKILL)
        if len(self.tracked) == 1:
            return
        status = exit_status(one.pid)
        if status and self.failed is None and not self._stopping():
            self.failed = (one.rank, status)
            for other in self.tracked:
                if other.exited_at is None:
                    signal_tree(other.pid, signal.SIGTERM)

    def leave(self, selector: selectors.BaseSelector) -> None:
        """Take its files out of the selector (another follower takes it on)."""
        for key in list(selector.get_map().values()):
            if key.data[0] is self:
                selector.unregister(key.fileobj)

    def close_in(self, selector: selectors.BaseSelector) -> None:
        """Stop watching: each of its files in the selector, each pidfd and (not for an executor,
        which serves the next job) each process's output."""
        self.leave(selector)
        for one in self.tracked:
            if one.notifier is not None:
                with contextlib.suppress(OSError):
                    os.close(one.notifier)
                one.notifier = None
            if not self.replied:
                assert one.process.stdout is not None
                assert one.process.stderr is not None
                one.process.stdout.close()
                one.process.stderr.close()


class Follower:
    """Watches in one selector, turned: what is ready is read, exits no pidfd announced are looked
    for, every watch's new lines go to Redis in one round trip, and finished watches are let go of."""

    def __init__(self, write: Writer, selector: selectors.BaseSelector) -> None:
        self._write = write
        self.selector = selector
        self.watches: list[Watch] = []

    def add(self, watch: Watch) -> None:
        self.watches.append(watch)
        watch.register(self.selector)

    def turn(self, longest: float = TICK) -> None:
        """One turn, waiting at most ``longest`` for something to happen."""
        now = time.monotonic()
        timeout = min((watch.due(now) for watch in self.watches), default=longest)
        for key, _ in self.selector.select(min(timeout, longest)):
            watch, one, what = key.data
            if watch is None:  # the supervisor's wake-up
                with contextlib.suppress(BlockingIOError):
                    os.read(key.fd, 4096)
                continue
            watch.ready(self.selector, key, one, what)
        now = time.monotonic()
        for watch in self.watches:
            watch.look(now)
        self._flush()
        self.finish([watch for watch in self.watches if watch.finished])

    def _flush(self) -> None:
        """Every job's new lines in one round trip; a job no longer its attempt's is stopped."""
        batch = [watch for watch in self.watches if watch.lines]
        if not batch:
            return
        try:
            kept = self._write([(watch.claim, watch.lines) for watch in batch])
        except Exception as exc:
            for watch in batch:
                watch.error = exc
                watch.kill()
            return
        for watch, ours in zip(batch, kept, strict=True):
            watch.lines = []
            if not ours:
                watch.on_stale()

    def finish(self, finished: list[Watch]) -> None:
        for watch in finished:
            watch.close_in(self.selector)
            self.watches.remove(watch)
            watch.done.set()


class Supervisor:
    """Follows every job process of one worker in one thread, started with the first job handed to it."""

    def __init__(self, write: Writer) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._arrivals: list[Watch] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        self._follower = Follower(write, selectors.DefaultSelector())
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._follower.selector.register(self._wake_read, selectors.EVENT_READ, (None, None, "wake"))

    def start(self) -> None:
        """Start following (on the first :meth:`follow`, unless called before): the worker calls it
        from its main thread, as a thread is born in the cgroups of the thread that starts it, and a
        slot thread's are its job's (see :mod:`.cgroups`)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gpulayer-supervisor", daemon=True)
                self._thread.start()

    def follow(self, watch: Watch, first: float = 0.0) -> Watch:
        """Follow ``watch``'s processes to their end: for up to ``first`` seconds from the calling
        thread, then, unless they ended, from the supervisor's; ``done`` is set once they are seen
        through."""
        if first > 0 and self._first(watch, first):
            return watch
        with self._lock:
            if self._closing:
                raise RuntimeError("the worker's supervisor has stopped")
            self._arrivals.append(watch)
        self.start()
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b".")
        return watch

    def _first(self, watch: Watch, seconds: float) -> bool:
        """Follow ``watch`` from this thread for up to ``seconds``: whether it was seen through."""
        # poll() takes its files with each call: no system call to add or remove them.
        follower = Follower(self._write, selectors.PollSelector())
        follower.add(watch)
        deadline = time.monotonic() + seconds
        try:
            while not watch.done.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    watch.leave(follower.selector)
                    return False
                follower.turn(left)
        except BaseException:
            follower.finish([watch])  # its files closed: it is not handed over
            raise
        return True

    def close(self) -> None:
        """Stop once the jobs it follows are seen through (the worker's slots are drained first)."""
        with self._lock:
            self._closing = True
            thread = self._thread
        os.write(self._wake_write, b".")
        if thread is not None:
            thread.join()
        self._follower.selector.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _loop(self) -> None:
        follower = self._follower
        while True:
            with self._lock:
                arrived, self._arrivals = self._arrivals, []
                if self._closing and not follower.watches and not arrived:
                    return
            try:
                for watch in arrived:
                    follower.add(watch)
                follower.turn()
            except Exception as exc:  # a bug must not leave jobs running unseen
                log.exception("the worker's supervisor failed; stopping the jobs it followed")
                for watch in follower.watches:
                    watch.error = exc
                    watch.kill()
                follower.finish(list(follower.watches))
