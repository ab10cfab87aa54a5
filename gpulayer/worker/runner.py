"""One claimed job on this worker: fetch its files, run its command, stream its logs, upload outputs, end it.

A runner lives in one slot thread. Other threads reach it only through :meth:`JobRunner.stop`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import redis.exceptions

from ..archive import extract, pack_outputs
from ..errors import ArchiveError, ArtifactTooLarge
from ..models import JobSpec, JobState, OutputSummary
from ..settings import Settings
from ..store.artifacts import (
    INPUTS_ARCHIVE,
    OUTPUTS_ARCHIVE,
    SOURCE_ARCHIVE,
    ArtifactStore,
    CorruptArtifact,
    MissingArtifact,
)
from ..store.execution import Claim, ExecutionStore
from .process import JobProcesses, exit_notifier, has_exited, signal_group, signal_tree

log = logging.getLogger("gpulayer.worker")
T = TypeVar("T")

#: Why a job stops before its command ends by itself.
StopReason = Literal["cancel", "timeout", "requeue", "stale"]
#: The runner looks at the clock at least this often (s) while its process runs.
_TICK = 0.25
#: Seconds between tries of a Redis call while Redis cannot be reached.
_REDIS_RETRY = 0.5
#: A cancelled job's processes get this long (s) after SIGTERM before SIGKILL.
CANCEL_GRACE = 0.5
_READ = 65536
#: After the job's command exits, its output is read for at most this long (s).
_DRAIN = 2.0
# Spool archives in memory up to this size, on disk beyond.
_SPOOL = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a job ended, as the worker records it."""

    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    outputs: OutputSummary | None = None


@dataclasses.dataclass(frozen=True)
class Context:
    """What every runner of one worker shares."""

    store: ExecutionStore
    artifacts: ArtifactStore
    settings: Settings
    processes: JobProcesses
    #: Seconds a job's lease holds without renewal: how long a runner keeps retrying Redis.
    lease_ttl: float


class JobRunner:
    def __init__(
        self, claim: Claim, spec: JobSpec, context: Context, workdir: Path, base_env: Mapping[str, str]
    ) -> None:
        self.claim = claim
        self.spec = spec
        self._store = context.store
        self._artifacts = context.artifacts
        self._settings = context.settings
        self._processes = context.processes
        self._lease_ttl = context.lease_ttl
        self._workdir = workdir
        self._base_env = base_env
        self._lock = threading.Lock()
        self._stop: StopReason | None = None
        self._leader: int | None = None
        self._deadline = 0.0

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    def stop(self, reason: StopReason) -> None:
        """Stop the job from another thread: its processes get SIGTERM now, SIGKILL after a grace."""
        with self._lock:
            if self._stop is None:
                self._stop = reason
            leader = self._leader
        if leader is not None:
            signal_tree(leader, signal.SIGTERM)

    def run(self) -> None:
        started = time.monotonic()
        ending: Ending | None
        try:
            self._workdir.mkdir(parents=True)
            self._fetch_inputs()
            ending = self._execute()
        except (ArchiveError, MissingArtifact, CorruptArtifact) as exc:
            ending = Ending(JobState.FAILED, reason=f"cannot unpack the job's files: {exc}")
        finally:
            # Before the job ends: its slot is not free until its folder is gone.
            _remove(self._workdir)
        if ending is not None:
            self._end(ending, time.monotonic() - started)

    def _execute(self) -> Ending | None:
        """Run the command; returns how the job ended, or None if it was given back or is not ours."""
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        status = self._persist(self._store.start, self.claim)
        if status == "stale":
            log.warning(
                "job %s: attempt %d is no longer this worker's; not starting it",
                self.job_id,
                self.claim.attempt,
            )
            return None
        if status == "cancel" or self._stop == "cancel":
            return Ending(JobState.CANCELLED, reason="cancelled")
        env = {
            **self._base_env,
            "PYTHONUNBUFFERED": "1",
            **self.spec.env,
            "GPULAYER_JOB_ID": self.job_id,
            "GPULAYER_ATTEMPT": str(self.claim.attempt),
        }
        try:
            process = self._processes.spawn(self.spec.command, self._workdir, env)
        except OSError as exc:
            code, reason = _spawn_failure(self.spec.command[0], exc)
            self._system(reason)
            return Ending(JobState.FAILED, code, reason)
        with self._lock:
            self._leader = process.pid
            stop = self._stop
        if stop is not None:
            self.stop(stop)
        try:
            returncode = self._pump(process)
        except BaseException:
            # The worker cannot follow the job any more (Redis gone, a bug): it must not run on unseen.
            signal_tree(process.pid, signal.SIGKILL)
            self._processes.reap(process)
            raise
        strays = self._processes.kill_strays(self.job_id)
        if strays:
            self._system(f"stopped {strays} process(es) the job left running")
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        outputs, too_large = self._upload_outputs()
        return self._outcome(returncode, outputs, too_large)

    def _fetch_inputs(self) -> None:
        names = ([SOURCE_ARCHIVE] if self.spec.source else []) + (
            [INPUTS_ARCHIVE] if self.spec.inputs else []
        )
        for name in names:
            with tempfile.SpooledTemporaryFile(_SPOOL) as archive:
                self._persist(self._download, name, archive)
                extract(archive, self._workdir)

    def _download(self, name: str, archive: IO[bytes]) -> None:
        # From the start on every try, so a download cut short by Redis leaves nothing behind.
        archive.seek(0)
        archive.truncate()
        self._artifacts.get_inputs(self.job_id, name, archive)
        archive.seek(0)

    def _pump(self, process: subprocess.Popen[bytes]) -> int:
        """Forward the process's output to the job's log until it and everything it started are gone."""
        assert process.stdout is not None
        assert process.stderr is not None
        pid = process.pid
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ, "stdout")
        selector.register(process.stderr, selectors.EVENT_READ, "stderr")
        notifier = exit_notifier(pid)
        if notifier is not None:
            selector.register(notifier, selectors.EVENT_READ, "exit")
        partial = {"stdout": b"", "stderr": b""}
        self._deadline = time.monotonic() + (self.spec.timeout or 0)
        kill_at: float | None = None
        exited_at: float | None = None
        # Without a pidfd, exit is polled: quickly at first, so short jobs end promptly.
        poll = 0.001
        try:
            while not (exited_at is not None and not selector.get_map()):
                wait = _TICK if notifier is not None or len(selector.get_map()) else poll
                poll = min(poll * 2, _TICK)
                lines: list[tuple[str, str]] = []
                for key, _ in selector.select(wait):
                    if key.data == "exit":
                        exited_at = time.monotonic()
                        selector.unregister(key.fileobj)
                        # What the job left running in its group dies with it. The leader is a zombie
                        # until reaped below, so its group id cannot have been reused.
                        signal_group(pid, signal.SIGKILL)
                        continue
                    chunk = os.read(key.fd, _READ)
                    if chunk:
                        lines.extend(self._split(key.data, partial, chunk))
                    else:
                        selector.unregister(key.fileobj)
                        if partial[key.data]:
                            lines.append((key.data, _text(partial.pop(key.data))))
                if lines and not self._persist(self._store.append_logs, self.claim, lines):
                    self.stop("stale")
                if notifier is None and exited_at is None and has_exited(pid):
                    exited_at = time.monotonic()
                    signal_group(pid, signal.SIGKILL)
                if exited_at is not None and time.monotonic() - exited_at > _DRAIN:
                    # Something that left the job's group still holds its output open; stop listening.
                    for key in list(selector.get_map().values()):
                        selector.unregister(key.fileobj)
                kill_at = self._enforce(pid, kill_at)
        finally:
            selector.close()
            if notifier is not None:
                os.close(notifier)
            process.stdout.close()
            process.stderr.close()
        return self._processes.reap(process)

    def _enforce(self, pid: int, kill_at: float | None) -> float | None:
        """Apply the timeout and any stop: SIGTERM first, SIGKILL once the grace has passed. Returns
        when SIGKILL is due (``inf`` once sent)."""
        now = time.monotonic()
        if self.spec.timeout and self._stop is None and now >= self._deadline:
            self._stop = "timeout"
            self._system(f"timed out after {self.spec.timeout:g} s: stopping the job's processes")
            signal_tree(pid, signal.SIGTERM)
        if self._stop is not None and kill_at is None:
            kill_at = now + (CANCEL_GRACE if self._stop == "cancel" else self._settings.kill_grace_seconds)
        if kill_at is not None and now >= kill_at:
            signal_tree(pid, signal.SIGKILL)
            kill_at = float("inf")
        return kill_at

    def _split(self, stream: str, partial: dict[str, bytes], chunk: bytes) -> list[tuple[str, str]]:
        *complete, rest = (partial[stream] + chunk).split(b"\n")
        cap = self._settings.log_line_max_bytes
        lines: list[tuple[str, str]] = []
        for raw in complete:
            line = raw.removesuffix(b"\r")
            lines.extend((stream, _text(line[i : i + cap])) for i in range(0, max(len(line), 1), cap))
        while len(rest) > cap:
            lines.append((stream, _text(rest[:cap])))
            rest = rest[cap:]
        partial[stream] = rest
        return lines

    def _upload_outputs(self) -> tuple[OutputSummary | None, str | None]:
        if not self.spec.outputs:
            return None, None
        with tempfile.SpooledTemporaryFile(_SPOOL) as archive:
            try:
                summary = pack_outputs(
                    self._workdir, self.spec.outputs, archive, self._settings.max_job_bytes
                )
            except ArtifactTooLarge as exc:
                return None, str(exc)
            self._persist(self._upload, archive)
        return summary, None

    def _upload(self, archive: IO[bytes]) -> None:
        # From the start on every try; the staged key is overwritten chunk by chunk.
        archive.seek(0)
        self._artifacts.put_outputs(self.job_id, self.claim.attempt, OUTPUTS_ARCHIVE, archive)

    def _outcome(self, returncode: int, outputs: OutputSummary | None, too_large: str | None) -> Ending:
        code = _shell_code(returncode)
        if self._stop == "cancel":
            return Ending(JobState.CANCELLED, code, "cancelled", outputs)
        if self._stop == "timeout":
            return Ending(JobState.TIMED_OUT, code, f"timed out after {self.spec.timeout:g} s", outputs)
        if returncode < 0:
            return Ending(
                JobState.FAILED, code, f"killed by signal {signal.Signals(-returncode).name}", outputs
            )
        if returncode != 0:
            return Ending(JobState.FAILED, code, f"exit code {returncode}", outputs)
        if too_large:
            return Ending(JobState.FAILED, code, too_large)
        if outputs and outputs.missing:
            return Ending(
                JobState.FAILED, code, "output not produced: " + ", ".join(outputs.missing), outputs
            )
        return Ending(JobState.SUCCEEDED, code, None, outputs)

    def _end(self, ending: Ending, seconds: float) -> None:
        state, reason = ending.state, ending.reason
        finished = self._persist(
            self._store.finish,
            self.claim,
            state,
            exit_code=ending.exit_code,
            reason=reason,
            outputs=ending.outputs,
            seconds=seconds,
        )
        said = f"{state.value}{f': {reason}' if reason else ''} ({seconds:.3f} s)"
        if finished == "ended":
            log.info("job %s: %s", self.job_id, said)
        elif finished == "retry":
            log.info("job %s: attempt %d %s; it will run again", self.job_id, self.claim.attempt, said)
        else:
            log.warning(
                "job %s: attempt %d lost the job before it ended; its result is dropped",
                self.job_id,
                self.claim.attempt,
            )

    def _give_back(self) -> None:
        if self._stop == "requeue":
            message = f"worker {self._store.worker} stopped; the job goes back to its queue"
            self._persist(self._store.requeue, "returned", message, [self.job_id])
        else:
            log.warning(
                "job %s: attempt %d lost the job; its processes were stopped", self.job_id, self.claim.attempt
            )

    def _system(self, text: str) -> None:
        self._persist(self._store.append_logs, self.claim, [("system", text)])

    def _persist(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A Redis call the job cannot do without, retried through a Redis outage for as long as the
        job's lease could still hold; past that, the job is presumed taken over and the error raised."""
        deadline = None
        while True:
            try:
                return call(*args, **kwargs)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._lease_ttl
                    log.warning("job %s: cannot reach Redis (%s); retrying", self.job_id, exc)
                if now >= deadline:
                    raise
                time.sleep(_REDIS_RETRY)


def _remove(folder: Path) -> None:
    try:
        folder.rmdir()  # the common case of a job that left nothing behind, at a fraction of rmtree's cost
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _shell_code(returncode: int) -> int:
    """Exit codes as a shell reports them: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _spawn_failure(program: str, exc: OSError) -> tuple[int, str]:
    if isinstance(exc, FileNotFoundError):
        return 127, f"command not found: {program}"
    if isinstance(exc, PermissionError):
        return 126, f"permission denied: {program}"
    return 126, f"cannot start {program}: {exc.strerror}"
