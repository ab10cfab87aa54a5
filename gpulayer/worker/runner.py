"""One claimed job on this worker: fetch its files, run its command, stream its logs, upload outputs, end it.

A runner lives in one slot thread. Other threads reach it only through :meth:`JobRunner.stop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import selectors
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, TypeVar

import redis.exceptions
from redis.client import Pipeline

from ..archive import pack_outputs
from ..errors import ArchiveError, ArtifactTooLarge, UntrustedPayload
from ..models import CHECKPOINT_VARIABLE, JobSpec, JobState, OutputSummary
from ..payloads import CALL, ERROR, RESULT
from ..settings import Settings
from ..signing import check_file, sign_result
from ..store.artifacts import (
    INPUTS_ARCHIVE,
    OUTPUTS_ARCHIVE,
    SOURCE_ARCHIVE,
    ArtifactStore,
    CorruptArtifact,
    MissingArtifact,
    small_files,
)
from ..store.execution import Claim, Claimed, ClaimRequest, ExecutionStore
from ..units import format_size
from ..unpacking import extract
from .checkpoints import PREFIX as CHECKPOINT_PREFIX
from .checkpoints import CheckpointKeeper
from .endings import Ending, StopReason
from .executors import Executor, Key
from .functions import FunctionRuntime
from .output import Line, Tracked
from .process import (
    JOB_ID_VARIABLE,
    JobProcesses,
    exit_notifier,
    exit_status,
    has_exited,
    signal_group,
    signal_tree,
)

log = logging.getLogger("gpulayer.worker")
T = TypeVar("T")

#: The runner looks at the clock at least this often (s) while its process runs.
_TICK = 0.25
#: Seconds between tries of a Redis call while Redis cannot be reached.
_REDIS_RETRY = 0.5
#: A cancelled job's processes (and the other ranks of a node where one failed) get this long (s)
#: after SIGTERM before SIGKILL.
CANCEL_GRACE = 0.5
#: After the job's command exits, its output is read for at most this long (s).
_DRAIN = 2.0
# Spool archives in memory up to this size, on disk beyond.
_SPOOL = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Context:
    """What every runner of one worker shares."""

    store: ExecutionStore
    artifacts: ArtifactStore
    settings: Settings
    processes: JobProcesses
    #: Seconds a job's lease holds without renewal: how long a runner keeps retrying Redis.
    lease_ttl: float
    #: None on a worker without the key to sign results: it cannot run function jobs.
    functions: FunctionRuntime | None = None
    #: Where other machines reach this one: rank 0 of a gang job listens there.
    address: str = "127.0.0.1"
    #: What to claim as a job ends, in the same round trip as its end (None: claim nothing).
    next_claim: Callable[[], ClaimRequest | None] = lambda: None
    #: Where what that claim took goes (the worker starts it in turn).
    took: Callable[[Claimed], None] = lambda claimed: None


class JobRunner:
    def __init__(
        self,
        claim: Claim,
        spec: JobSpec,
        files: Mapping[str, str],
        context: Context,
        workdir: Path,
        base_env: Mapping[str, str],
    ) -> None:
        self.claim = claim
        self.spec = spec
        #: The SHA-256 of each file the job's signature covers, by name: what its files must be.
        self._files = files
        self._store = context.store
        self._artifacts = context.artifacts
        self._settings = context.settings
        self._processes = context.processes
        self._lease_ttl = context.lease_ttl
        self._functions = context.functions
        self._address = context.address
        self._next_claim = context.next_claim
        self._took = context.took
        self._workdir = workdir
        self._base_env = base_env
        self._lock = threading.Lock()
        self._stop: StopReason | None = None
        self._leaders: list[int] = []
        #: The first of several ranks that failed, and how (its exit status).
        self._failed: tuple[int | None, int] | None = None
        self._deadline = 0.0
        self._checkpoints: CheckpointKeeper | None = None
        #: Set once the job's work is done and only its end is being recorded: the worker's spread
        #: delay does not count it as busy (its caller may already be submitting the next job).
        self.ending = False

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    def stop(self, reason: StopReason) -> None:
        """Stop the job from another thread: its processes get SIGTERM now, SIGKILL after a grace."""
        with self._lock:
            if self._stop is None:
                self._stop = reason
            leaders = list(self._leaders)
        for leader in leaders:
            signal_tree(leader, signal.SIGTERM)

    def run(self) -> None:
        started = time.monotonic()
        ending: Ending | None
        folder = self._needs_folder
        try:
            if folder:
                self._workdir.mkdir(parents=True, mode=0o700)
            if self.spec.function is None:
                self._fetch_inputs()
            if folder:
                # Unpacked while only the worker could write there; the job's user's from now on.
                self._processes.hand_over(self._workdir)
            ending = self._execute()
        except (ArchiveError, MissingArtifact, CorruptArtifact) as exc:
            ending = Ending(JobState.FAILED, reason=f"cannot unpack the job's files: {exc}")
        except UntrustedPayload as exc:
            ending = Ending(JobState.FAILED, reason=f"refused: {exc}; it was not run")
            self._system(ending.reason or "")
        finally:
            # Before the job ends: its slot is not free until its folders are gone.
            if folder:
                _remove(self._workdir)
                _remove(self._checkpoint_dir)
        if ending is not None:
            self.ending = True
            self._end(ending, time.monotonic() - started)

    def _execute(self) -> Ending | None:
        """Run the job; returns how it ended, or None if it was given back or is not ours."""
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        # A function's call is read in the same round trip.
        read_call = (
            (lambda pipe: self._artifacts.queue_inputs(pipe, self.claim.target))
            if self.spec.function
            else None
        )
        announced = self._announce()
        status, replies = (
            ("ok", [])
            if self.claim.started
            else self._persist(self._store.start, self.claim, read_call, announced)
        )
        if status == "stale":
            log.warning(
                "job %s: attempt %d is no longer this worker's; not starting it",
                self.job_id,
                self.claim.attempt,
            )
            return None
        if status == "cancel" or self._stop == "cancel":
            return Ending(JobState.CANCELLED, reason="cancelled")
        attempt = str(self.claim.attempt)
        env = {**self.spec.env, JOB_ID_VARIABLE: self.claim.target, "GPULAYER_ATTEMPT": attempt}
        if self._functions is not None:
            # An idle executor may hold GPU memory this job is about to need.
            devices = set(filter(None, self._base_env.get("CUDA_VISIBLE_DEVICES", "").split(",")))
            self._functions.executors.evict(devices, self._executor_key())
        call = None
        if self.spec.function is not None:
            call = small_files(replies[0], [CALL]).get(CALL)
            if call is None:
                raise MissingArtifact(CALL)
            check_file(self._files, CALL, hashlib.sha256(call).hexdigest())
        if self._has_checkpoint_folder:
            env[CHECKPOINT_VARIABLE] = str(self._checkpoint_folder())
        return self._launch(env, call, announced)

    @property
    def _has_checkpoint_folder(self) -> bool:
        """Commands have one; a function's call runs in an executor, which outlives the job."""
        return self.spec.function is None

    def _checkpoint_folder(self) -> Path:
        """The job's checkpoint folder: filled with what an earlier attempt kept, and kept while the
        job runs (node 0's, for a gang job)."""
        folder = self._checkpoint_dir
        folder.mkdir(mode=0o700)
        if self.claim.part is None or self.claim.part.node == 0:
            self._checkpoints = CheckpointKeeper(
                folder,
                self.claim,
                self._store,
                self._artifacts,
                interval=self._settings.checkpoint_interval,
                max_bytes=self._settings.max_job_bytes,
                say=self._system,
                reading=self._processes.reading,
            )
            if self.claim.attempt > 1:  # a first attempt has nothing kept: no round trip
                self._persist(self._checkpoints.restore)
        self._processes.hand_over(folder)
        return folder

    @property
    def _checkpoint_dir(self) -> Path:
        """Beside the job's folder, not in it: a listing or an output pattern of the job's own files
        does not meet it (the worker's leftovers sweep does: same suffix)."""
        return self._workdir.with_name(CHECKPOINT_PREFIX + self._workdir.name)

    @property
    def _needs_folder(self) -> bool:
        """A command runs in a folder of its own; a function's call in its code bundle's."""
        return self.spec.function is None

    def _announce(self) -> str:
        """What ``start.lua`` is told of where rank 0 listens: nothing, but for node 0 of a gang job."""
        return ""

    def _launch(self, env: dict[str, str], call: bytes | None, announced: str) -> Ending | None:
        """Start the job's process (its command, or its call in an executor) and follow it to its end."""
        if call is not None:
            return self._call(env, call)
        try:
            process = self._processes.spawn(
                self.spec.command, self._workdir, {**self._base_env, "PYTHONUNBUFFERED": "1", **env}
            )
        except OSError as exc:
            code, reason = spawn_failure(self.spec.command[0], exc)
            self._system(reason)
            return Ending(JobState.FAILED, code, reason)
        return self._command([Tracked(process)])

    def _command(self, tracked: list[Tracked]) -> Ending | None:
        """Follow the job's processes to their end, then upload its outputs: how the job ended."""
        self._follow(tracked)
        self._clean_up()
        if self._checkpoints is not None and self._stop != "stale":
            self._checkpoints.tick(now=True)  # what it saved last; a cold shutdown's retry needs it too
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        outputs, too_large = self._upload_outputs()
        return self._outcome(tracked[0].returncode or 0, outputs, too_large)

    def _call(self, env: dict[str, str], call: bytes) -> Ending | None:
        """Run a function's call in an executor: a warm one for this code and these GPUs, or a new one."""
        function = self.spec.function
        assert function is not None
        functions = self._runtime()
        if isinstance(functions, Ending):
            return functions
        folder = self._persist(functions.bundles.folder, function.bundle)
        key = self._executor_key()
        try:
            if function.fresh_process:
                executor = functions.executors.start(key, self._base_env, folder)
            else:
                executor = functions.executors.acquire(key, self._base_env, folder)
        except OSError as exc:
            reason = f"cannot start a Python process for the call: {exc.strerror}"
            self._system(reason)
            return Ending(JobState.FAILED, reason=reason)
        with contextlib.suppress(BrokenPipeError):  # a dead executor shows as its exit, below
            executor.send({"env": env}, call)
        tracked = Tracked(executor.process)
        returncode = tracked.returncode if self._follow([tracked], executor.replies) else None
        reply = None
        if returncode is None:
            try:
                reply = executor.receive()
            except (EOFError, OSError):
                returncode = self._processes.reap(executor.process)
        self._clean_up(executor if reply is not None and reply[0].get("children") else None)
        keep = reply is not None and self._stop is None and not function.fresh_process
        functions.executors.release(executor, keep=keep)
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        if reply is None or self._stop is not None:
            ending = self._outcome(returncode if returncode is not None else 1, None, None)
            if ending.state is JobState.FAILED:
                return dataclasses.replace(ending, reason=f"the call's Python process died ({ending.reason})")
            return ending
        return self._reply_ending(*reply)

    def _runtime(self) -> FunctionRuntime | Ending:
        """What runs function calls here; or how the job ends, on a worker without the key that signs
        their results."""
        if self._functions is None:
            reason = (
                "this worker holds no key to sign results with (its access is not a worker's), "
                "so it cannot run function calls"
            )
            self._system(reason)
            return Ending(JobState.FAILED, reason=reason)
        return self._functions

    def _executor_key(self) -> Key:
        function = self.spec.function
        devices = self._base_env.get("CUDA_VISIBLE_DEVICES", "")
        return Key(function.bundle if function else "", self.spec.requirements.capability, devices)

    def _reply_ending(self, header: dict[str, Any], payload: bytes) -> Ending:
        """How the call ended, with what it returned (or raised) to store as its result."""
        if len(payload) > self._settings.max_job_bytes:
            reason = (
                f"its result pickles to {format_size(len(payload))}, above the "
                f"{format_size(self._settings.max_job_bytes)} cap (GPULAYER_MAX_JOB_BYTES on the worker)"
            )
            self._system(reason)
            return Ending(JobState.FAILED, 1, reason)
        if header["ok"]:
            return Ending(JobState.SUCCEEDED, 0, result=(RESULT, payload))
        return Ending(JobState.FAILED, 1, _one_line(header["error"]), result=(ERROR, payload))

    def _follow(self, tracked: list[Tracked], replies: Connection | None = None) -> bool:
        """Pump the processes' output until they exit (True; each has its return code) or, for an
        executor, until it replies (False)."""
        with self._lock:
            self._leaders = [one.pid for one in tracked]
            stop = self._stop
        if stop is not None:
            self.stop(stop)
        try:
            return self._pump(tracked, replies)
        except BaseException:
            # The worker cannot follow the job any more (Redis gone, a bug): it must not run on unseen.
            for one in tracked:
                signal_tree(one.pid, signal.SIGKILL)
                self._processes.reap(one.process)
            raise
        finally:
            # Their pids may be reused, or an executor serves the next job: a late stop must not reach them.
            with self._lock:
                self._leaders = []

    def _clean_up(self, executor: Executor | None = None) -> None:
        """Kill what the job left running: under the executor that says it has children, and
        anywhere else it went."""
        strays = executor.kill_children() if executor is not None and executor.alive else 0
        strays += self._processes.kill_strays(self.claim.target)
        if strays:
            self._system(f"stopped {strays} process(es) the job left running")

    def _fetch_inputs(self) -> None:
        names = ([SOURCE_ARCHIVE] if self.spec.source else []) + (
            [INPUTS_ARCHIVE] if self.spec.inputs else []
        )
        for name in names:
            with tempfile.SpooledTemporaryFile(_SPOOL) as archive:
                check_file(self._files, name, self._persist(self._download, name, archive))
                # Inputs after the source, never over it: an input may not replace a source file.
                extract(archive, self._workdir, max_bytes=self._settings.max_job_bytes)

    def _download(self, name: str, archive: IO[bytes]) -> str:
        # From the start on every try, so a download cut short by Redis leaves nothing behind.
        archive.seek(0)
        archive.truncate()
        digest = self._artifacts.get_inputs(self.claim.target, name, archive)
        archive.seek(0)
        return digest

    def _pump(self, tracked: list[Tracked], replies: Connection | None) -> bool:
        """Forward the processes' output to the job's log until they and everything they started are
        gone (True), or, for an executor, until it replies (False; what it printed before replying is
        read first). When one of several processes fails, the others are stopped."""
        selector = _watch(tracked, replies)
        cap = self._settings.log_line_max_bytes
        self._deadline = time.monotonic() + (self.spec.timeout or 0)
        kill_at: float | None = None
        replied = False
        # Without a pidfd, exit is polled: quickly at first, so short jobs end promptly.
        poll = 0.001
        try:
            while not replied and not all(one.done for one in tracked):
                polled = any(one.notifier is None and one.exited_at is None for one in tracked)
                wait = poll if polled and not any(one.streams for one in tracked) else _TICK
                poll = min(poll * 2, _TICK)
                lines: list[Line] = []
                replied = self._select(selector, tracked, wait, lines, cap)
                if replied:
                    self._drain(selector, lines, cap)
                if lines and not self._persist(self._store.append_logs, self.claim, lines):
                    self.stop("stale")
                self._look_for_exits(tracked)
                kill_at = self._enforce(kill_at)
                if self._checkpoints is not None:
                    self._checkpoints.tick()
        finally:
            _close(selector, tracked, streams=not replied)
        if replied:
            return False
        for one in tracked:
            one.returncode = self._processes.reap(one.process)
        return True

    def _select(
        self,
        selector: selectors.BaseSelector,
        tracked: list[Tracked],
        wait: float,
        lines: list[Line],
        cap: int,
    ) -> bool:
        """Handle what is ready within ``wait`` seconds: output read into ``lines``, exits; whether
        the executor replied."""
        replied = False
        for key, _ in selector.select(wait):
            one, what = key.data
            if what == "reply":
                replied = True
            elif what == "exit":
                selector.unregister(key.fileobj)
                self._exited(one, tracked)
            elif not one.read(key.fd, what, lines, cap):
                selector.unregister(key.fileobj)
                one.streams -= 1
        return replied

    def _look_for_exits(self, tracked: list[Tracked]) -> None:
        """Exits no pidfd announced, and output held open past the end by something that left the
        job's group (no longer listened to)."""
        for one in tracked:
            if one.notifier is None and one.exited_at is None and has_exited(one.pid):
                self._exited(one, tracked)
            if one.exited_at is not None and time.monotonic() - one.exited_at > _DRAIN:
                one.streams = 0

    def _exited(self, one: Tracked, tracked: list[Tracked]) -> None:
        """One process exited: what it left in its group dies with it (the leader is a zombie until
        reaped, so its group id cannot have been reused); if it failed and others run beside it (the
        ranks of a gang job), they are stopped."""
        one.exited_at = time.monotonic()
        signal_group(one.pid, signal.SIGKILL)
        if len(tracked) == 1:
            return
        status = exit_status(one.pid)
        if status and self._failed is None and self._stop is None:
            self._failed = (one.rank, status)
            for other in tracked:
                if other.exited_at is None:
                    signal_tree(other.pid, signal.SIGTERM)

    def _drain(self, selector: selectors.BaseSelector, lines: list[Line], cap: int) -> None:
        """Read an executor's output up to now: it flushed before it replied, so all of it is there."""
        for key in list(selector.get_map().values()):
            one, what = key.data
            if what in ("stdout", "stderr"):
                while one.read(key.fd, what, lines, cap, drain=True):
                    pass
                one.flush(lines, what)

    def _enforce(self, kill_at: float | None) -> float | None:
        """Apply the timeout and any stop: SIGTERM first, SIGKILL once the grace has passed. Returns
        when SIGKILL is due (``inf`` once sent)."""
        now = time.monotonic()
        if self.spec.timeout and self._stop is None and now >= self._deadline:
            self._stop = "timeout"
            self._system(f"timed out after {self.spec.timeout:g} s: stopping the job's processes")
            self._signal_all(signal.SIGTERM)
        if (self._stop is not None or self._failed is not None) and kill_at is None:
            quick = self._stop in ("cancel", None)
            kill_at = now + (CANCEL_GRACE if quick else self._settings.kill_grace_seconds)
        if kill_at is not None and now >= kill_at:
            self._signal_all(signal.SIGKILL)
            kill_at = float("inf")
        return kill_at

    def _signal_all(self, sig: signal.Signals) -> None:
        with self._lock:
            leaders = list(self._leaders)
        for leader in leaders:
            signal_tree(leader, sig)

    def _upload_outputs(self) -> tuple[OutputSummary | None, str | None]:
        if not self.spec.outputs:
            return None, None
        with tempfile.SpooledTemporaryFile(_SPOOL) as archive:
            try:
                # As the job's user: a link it left towards the worker's files reads as nothing.
                with self._processes.reading():
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
        finished, claimed = self._persist(
            self._store.finish,
            self.claim,
            "unstarted" if ending.unstarted else state,
            exit_code=ending.exit_code,
            reason=reason,
            outputs=ending.outputs,
            seconds=seconds,
            before=self._stage(ending.result) if ending.result else None,
            then=self._next_claim(),
        )
        if claimed is not None:
            self._took(claimed)
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

    def _stage(self, result: tuple[str, bytes]) -> Callable[[Pipeline], object]:
        """Queue a function's result, signed for the job users know and this attempt only."""
        name, payload = result
        assert self._functions is not None, "only a worker that can sign results runs calls"
        signed = sign_result(self._functions.result_key, self.claim.target, self.claim.attempt, name, payload)
        return lambda pipe: self._artifacts.put_outputs(
            self.job_id, self.claim.attempt, name, io.BytesIO(signed), pipe
        )

    def _give_back(self) -> None:
        if self._stop == "requeue":
            message = f"worker {self._store.worker} stopped; the job goes back to its queue"
            self._persist(self._store.requeue, "returned", message, [self.job_id])
        else:
            log.warning(
                "job %s: attempt %d lost the job; its processes were stopped", self.job_id, self.claim.attempt
            )

    def _system(self, line: str) -> None:
        self._persist(self._store.append_logs, self.claim, [("system", line, None)])

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


def _watch(tracked: list[Tracked], replies: Connection | None) -> selectors.BaseSelector:
    """A selector on the processes' output, their exits (where there are pidfds) and the replies."""
    selector = selectors.DefaultSelector()
    for one in tracked:
        assert one.process.stdout is not None
        assert one.process.stderr is not None
        selector.register(one.process.stdout, selectors.EVENT_READ, (one, "stdout"))
        selector.register(one.process.stderr, selectors.EVENT_READ, (one, "stderr"))
        one.notifier = exit_notifier(one.pid)
        if one.notifier is not None:
            selector.register(one.notifier, selectors.EVENT_READ, (one, "exit"))
    if replies is not None:
        selector.register(replies.fileno(), selectors.EVENT_READ, (None, "reply"))
    return selector


def _close(selector: selectors.BaseSelector, tracked: list[Tracked], *, streams: bool) -> None:
    """Stop watching: the selector, each pidfd and (``streams``: not for an executor, which serves
    the next job) each process's output."""
    selector.close()
    for one in tracked:
        if one.notifier is not None:
            os.close(one.notifier)
        if streams:
            assert one.process.stdout is not None
            assert one.process.stderr is not None
            one.process.stdout.close()
            one.process.stderr.close()


def _remove(folder: Path) -> None:
    try:
        folder.rmdir()  # the common case of a job that left nothing behind, at a fraction of rmtree's cost
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


def _one_line(text: str, limit: int = 500) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _shell_code(returncode: int) -> int:
    """Exit codes as a shell reports them: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def spawn_failure(program: str, exc: OSError) -> tuple[int, str]:
    if isinstance(exc, FileNotFoundError):
        return 127, f"command not found: {program}"
    if isinstance(exc, PermissionError):
        return 126, f"permission denied: {program}"
    return 126, f"cannot start {program}: {exc.strerror}"
