"""Submits sent by a thread of their own, many per round trip and under one signature.

What ``Client(background_submits=True)`` uses: a loop of submits then costs the caller no round trip
and no signature per job. The price is what Ray's ``.remote()`` pays too: a submit has returned before
its job is in Redis. :meth:`Sender.flush` waits until it is (every call of the client that reads or
changes jobs does), and a failure is raised there, or by the next submit, as :class:`SubmitFailed`.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable

from ..errors import SubmitFailed
from ..models import JobSpec
from .jobs import JobStore

Submit = tuple[str, JobSpec]


class Sender:
    """Sends the submits :meth:`put` is given, in order, up to ``batch`` per round trip: those the
    thread finds waiting when it is free, so a lone submit goes at once and a loop's gather. A
    submit waits while ``most_waiting`` are still to send: a loop faster than Redis holds a bounded
    number of jobs in memory, and loses no more than that if its process is killed."""

    def __init__(self, jobs: JobStore, batch: int, most_waiting: int) -> None:
        self._jobs = jobs
        self._batch = batch
        self._most_waiting = most_waiting
        self._waiting: list[Submit] = []
        self._sending = False
        self._closed = False
        self._failure: SubmitFailed | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        # A script that ends without closing its client still has its last submits sent.
        self._at_exit = _flusher(weakref.ref(self))
        atexit.register(self._at_exit)

    def put(self, job_id: str, spec: JobSpec) -> None:
        """Send this job's submit soon; :class:`SubmitFailed` now if an earlier one failed."""
        with self._changed:
            while len(self._waiting) >= self._most_waiting and self._failure is None:
                self._changed.wait()
            self._raise_failure()
            if self._closed:
                raise RuntimeError("this client is closed")
            self._waiting.append((job_id, spec))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpulayer-sender", daemon=True)
                self._thread.start()
            self._changed.notify()

    def flush(self) -> None:
        """Wait until every submit put so far is in Redis; :class:`SubmitFailed` for those that are not."""
        with self._changed:
            while self._waiting or self._sending:
                self._changed.wait()
            self._raise_failure()

    def close(self) -> None:
        """Flush, then end the thread."""
        atexit.unregister(self._at_exit)
        try:
            self.flush()
        finally:
            with self._changed:
                self._closed = True
                self._changed.notify_all()
            if self._thread is not None:
                self._thread.join()

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._closed:
                    self._changed.wait()
                if not self._waiting:
                    return
                batch, self._waiting = self._waiting[: self._batch], self._waiting[self._batch :]
                self._sending = True
                self._changed.notify_all()  # room for a submit that waits (see most_waiting)
            failure = self._send(batch)
            with self._changed:
                self._sending = False
                if failure is not None:
                    # Those after the failed ones are not sent either: submits keep their order.
                    lost = failure.job_ids + [job_id for job_id, _ in self._waiting]
                    self._waiting = []
                    previous = self._failure.job_ids if self._failure else []
                    self._failure = _failed(previous + lost, failure.__cause__)
                self._changed.notify_all()

    def _send(self, batch: list[Submit]) -> SubmitFailed | None:
        """Submit the batch, one script call per run of jobs that differ only in their command."""
        runs: list[list[Submit]] = []
        for submit in batch:
            if runs and runs[-1][0][1].same_but_command(submit[1]):
                runs[-1].append(submit)
            else:
                runs.append([submit])
        for index, run in enumerate(runs):
            try:
                created = self._jobs.submit_many(run)
            except BaseException as exc:  # whatever it is, this thread is the one to report it
                return _failed([job_id for later in runs[index:] for job_id, _ in later], exc)
            taken = [job_id for (job_id, _), made in zip(run, created, strict=True) if made is None]
            if taken:  # a random id another job has; its handle cannot be given another
                rest = [job_id for later in runs[index + 1 :] for job_id, _ in later]
                return _failed(taken + rest, None)
        return None


def _failed(job_ids: list[str], cause: BaseException | None) -> SubmitFailed:
    why = f": {cause}" if cause is not None else ": an id was taken by another job"
    shown = ", ".join(job_ids[:3]) + (", ..." if len(job_ids) > 3 else "")
    message = f"{len(job_ids)} job(s) submitted in the background were not made ({shown}){why}"
    failure = SubmitFailed(message, job_ids)
    failure.__cause__ = cause
    return failure


def _flusher(sender: weakref.ref[Sender]) -> Callable[[], None]:
    def flush() -> None:
        alive = sender()
        if alive is not None:
            alive.flush()

    return flush
