"""One claimed job on this worker, from claim to end: its folders, its files, its start, following
its processes (through the worker's supervisor) under its timeout and stops, and its end.

How the job's processes start is its launch's (:mod:`.launches`): a command, a function's call, or
one node's part of a gang job. A runner lives in one slot thread; other threads reach it only
through :meth:`JobRunner.stop`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from redis.client import Pipeline

from ..errors import ArchiveError, OutputsUnavailable, UntrustedPayload
from ..models import (
    ATTEMPT_VARIABLE,
    CHECKPOINT_VARIABLE,
    JOB_ID_VARIABLE,
    JobSpec,
    JobState,
    JobUsage,
    OutputSummary,
)
from ..payloads import CALL
from ..settings import Settings
from ..signing import ResultSigner, check_file, sign_result
from ..store.artifacts import ArtifactStore, CorruptArtifact, MissingArtifact, small_files
from ..store.execution import Claim, Claimed, ClaimRequest, ExecutionStore
from ..units import format_size
from . import files, outages
from .boxes import NO_BOX, Box, Containment, Limits, Usage
from .checkpoints import PREFIX as CHECKPOINT_PREFIX
from .checkpoints import CheckpointKeeper
from .devices import devices_shown
from .endings import Ending, StopReason, shell_code
from .env_builds import EnvironmentCache, Failed
from .executor_pool import Executor, Key
from .folders import Folders
from .functions import FunctionRuntime
from .launches import Followed, Launch, LaunchContext, Started
from .output import Tracked
from .process import JobProcesses, descendants, signal_tree
from .supervisor import DRAIN, TICK, Supervisor, Watch
from .threads import thread_variables
from .usage import GpuMemory, Meter

log = logging.getLogger("gpulayer.worker")
T = TypeVar("T")

#: A runner follows its job's processes itself for this long (s) before the supervisor takes them on.
FIRST_LOOK = 0.05
#: Seconds between samples of a job's GPU memory (an NVML call per GPU, and a look at its processes).
GPU_SAMPLE = 1.0
#: A cancelled job's processes (and the other ranks of a node where one failed) get this long (s)
#: after SIGTERM before SIGKILL.
CANCEL_GRACE = 0.5
#: How a job's HOME (and TMPDIR) is named, before its folder's name (whose suffix the worker's
#: leftovers sweep looks for).
HOME_PREFIX = "home-"


@dataclasses.dataclass(frozen=True)
class Context:
    """What every runner of one worker shares."""

    store: ExecutionStore
    artifacts: ArtifactStore
    settings: Settings
    processes: JobProcesses
    supervisor: Supervisor
    folders: Folders
    #: Seconds a job's lease holds without renewal: how long a runner keeps retrying Redis.
    lease_ttl: float
    functions: FunctionRuntime
    #: The worker's identity and its own result key: what its results, outputs and checkpoints are
    #: signed with.
    signer: ResultSigner
    #: Checks an archive an earlier attempt of a job stored (job id, archive name, SHA-256, seal):
    #: :class:`UntrustedPayload` unless the worker that ran that attempt signed it.
    check_archive: Callable[[str, str, str, str | None], None]
    #: How the worker contains its jobs, and what each job may use (from what it asked for).
    containment: Containment
    limits: Callable[[JobSpec, Claim], Limits]
    #: The Python environments jobs bring, built and kept on this machine.
    environments: EnvironmentCache
    #: Where outputs too large for Redis are kept, and from what size.
    held: files.Held
    #: How inputs too large for Redis are pulled from their submitter.
    pulls: files.InputPulls
    #: What to claim as a job ends, in the same round trip as its end (None: claim nothing).
    next_claim: Callable[[], ClaimRequest | None] = lambda: None
    #: Where what that claim took goes (the worker starts it in turn).
    took: Callable[[Claimed], None] = lambda claimed: None
    #: Reads the GPU memory of a job's processes (None: no GPU of this worker can be read).
    gpu_memory: GpuMemory | None = None


class JobRunner:
    def __init__(
        self,
        claim: Claim,
        spec: JobSpec,
        digests: Mapping[str, str],
        launch: Launch,
        context: Context,
        workdir: Path,
        base_env: Mapping[str, str],
    ) -> None:
        self.claim = claim
        self.spec = spec
        #: The SHA-256 of each file the job's signature covers, by name: what its files must be.
        self.digests = digests
        self.context = context
        self.workdir = workdir
        self.base_env = base_env
        self._launch = launch
        self._lock = threading.Lock()
        self._stop: StopReason | None = None
        self._leaders: list[int] = []
        self._checkpoints: CheckpointKeeper | None = None
        #: Set once the job's work is done and only its end is being recorded: the worker's spread
        #: delay does not count it as busy (its caller may already be submitting the next job).
        self.ending = False
        #: Where the job's processes run (see :meth:`contain`), held to ``limits``; what they used.
        self.box: Box = NO_BOX
        self._own_box = False
        self.limits = Limits()
        self.used: Usage | None = None
        #: What measures the job's processes where they have no cgroup (see :meth:`contain`).
        self.meter: Meter | None = None
        #: The most GPU memory its processes were seen to hold (sampled while it runs).
        self._gpu_peak: int | None = None

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def stopped(self) -> StopReason | None:
        """Why the job is being stopped early, if it is."""
        return self._stop

    @property
    def processes(self) -> JobProcesses:
        return self.context.processes

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
        folder = self._launch.folder
        try:
            if folder:
                self.context.folders.make(self.workdir)
            self.context.folders.make(self._home)
            self.processes.hand_over(self._home)
            if self.spec.function is None:
                files.fetch_inputs(
                    self.context.artifacts,
                    self.claim.target,
                    self.spec,
                    self.digests,
                    self.workdir,
                    max_bytes=self.context.settings.max_job_bytes,
                    retry=self.through_outage,
                    pulls=self.context.pulls,
                )
            if folder:
                # Unpacked while only the worker could write there; the job's user's from now on.
                self.processes.hand_over(self.workdir)
            ending = self._execute()
        except (ArchiveError, MissingArtifact, CorruptArtifact) as exc:
            ending = Ending(JobState.FAILED, reason=f"cannot unpack the job's files: {exc}")
        except OutputsUnavailable as exc:
            ending = Ending(JobState.FAILED, reason=f"cannot fetch the job's inputs: {exc}")
        except UntrustedPayload as exc:
            ending = Ending(JobState.FAILED, reason=f"refused: {exc}; it was not run")
            self.system(ending.reason or "")
        finally:
            if self._own_box:
                # Its processes end here even if following them failed (Redis gone for a lease):
                # the slot's next job must not start beside them.
                self.box.sweep()
                self.box.release()
            # Before the job ends: its slot is not free until its folders are gone.
            if folder:
                self.context.folders.remove(self.workdir)
                self.context.folders.remove(self._checkpoint_dir)
            self.context.folders.remove(self._home)
        if ending is not None:
            self.ending = True
            self._end(self._measured(ending), time.monotonic() - started)

    def _measured(self, ending: Ending) -> Ending:
        """``ending`` with what the job used, if it ran anything to measure: as its cgroup counted
        it, else as its meter did."""
        if self.used is not None:
            usage = JobUsage(cpu_seconds=round(self.used.cpu_seconds, 6), peak_memory=self.used.peak_memory)
        elif self.meter is not None:
            usage = self.meter.end()
        else:
            return ending
        if self._gpu_peak is not None:
            usage = usage.model_copy(update={"peak_gpu_memory": self._gpu_peak})
        return dataclasses.replace(ending, usage=usage)

    def _execute(self) -> Ending | None:
        """Run the job; returns how it ended, or None if it was given back or is not ours."""
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        artifacts = self.context.artifacts
        # A function's call is read in the same round trip.
        read_call = (
            (lambda pipe: artifacts.queue_inputs(pipe, self.claim.target)) if self.spec.function else None
        )
        announced = self._launch.announce()
        status, replies = (
            ("ok", [self.claim.inputs])
            if self.claim.started
            else self.through_outage(self.context.store.start, self.claim, read_call, announced)
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
        home = str(self._home)
        # TMP and TEMP too where the worker's environment sets them, so no job gets the worker's;
        # not otherwise: Linux programs read TMPDIR, and each variable costs a warm executor's calls.
        temporary = {name: home for name in ("TMP", "TEMP") if name in self.base_env}
        env = {
            "HOME": home,
            "TMPDIR": home,
            **temporary,
            **self.spec.env,
            **thread_variables(self.spec),
            # Python adds no user site folder, nor runs the .pth files there, whatever HOME says.
            "PYTHONNOUSERSITE": "1",
            JOB_ID_VARIABLE: self.claim.target,
            ATTEMPT_VARIABLE: attempt,
        }
        # An idle executor may hold GPU memory this job is about to need (a job with no GPU needs none).
        devices = set(devices_shown(self.base_env))
        if devices:
            self.context.functions.executors.evict(devices, Key.of(self.spec, self.base_env))
        call = None
        if self.spec.function is not None:
            call = small_files(replies[0], [CALL]).get(CALL)
            if call is None:
                raise MissingArtifact(CALL)
            check_file(self.digests, CALL, hashlib.sha256(call).hexdigest())
        if self._launch.folder:
            env[CHECKPOINT_VARIABLE] = str(self._checkpoint_folder())
        if self.spec.environment is None:
            return self._start(self._view, env, call, announced)
        with self.context.environments.held(self.spec.environment, self.system) as ready:
            if isinstance(ready, Failed):
                return Ending(JobState.FAILED, reason=f"cannot build its Python environment: {ready.reason}")
            env.update(ready.variables(env.get("PATH", self.base_env.get("PATH", ""))))
            return self._start(dataclasses.replace(self._view, python=ready.python), env, call, announced)

    def _start(
        self, view: LaunchContext, env: dict[str, str], call: bytes | None, announced: str
    ) -> Ending | None:
        started = self._launch.start(view, env, call, announced)
        return started if isinstance(started, Ending) else self._follow_through(started)

    @functools.cached_property
    def _view(self) -> LaunchContext:
        """What the job's launch may use of it."""
        return LaunchContext(
            spec=self.spec,
            claim=self.claim,
            folder=self.workdir,
            base_env=self.base_env,
            processes=self.processes,
            functions=self.context.functions,
            max_result_bytes=self.context.settings.max_job_bytes,
            say=self.system,
            retry=self.through_outage,
            contain=self.contain,
            stopped=lambda: self._stop,
            outcome=self.outcome,
            master=lambda: self.through_outage(self.context.store.master, self.claim),
        )

    def _checkpoint_folder(self) -> Path:
        """The job's checkpoint folder: filled with what an earlier attempt kept, and kept while the
        job runs (node 0's, for a gang job)."""
        folder = self._checkpoint_dir
        self.context.folders.make(folder)
        if self.claim.part is None or self.claim.part.node == 0:
            self._checkpoints = CheckpointKeeper(
                folder,
                self.claim,
                self.context.store,
                self.context.artifacts,
                self.context.signer,
                self.context.check_archive,
                interval=self.context.settings.checkpoint_interval,
                max_bytes=self.context.settings.max_job_bytes,
                say=self.system,
                reading=self.processes.reading,
            )
            if self.claim.attempt > 1:  # a first attempt has nothing kept: no round trip
                self.through_outage(self._checkpoints.restore)
        self.processes.hand_over(folder)
        return folder

    @functools.cached_property
    def _home(self) -> Path:
        """The job's HOME, also its TMPDIR: fresh for each job (each call, each node's part) and gone
        with it, so nothing one job leaves there (a ``.pth`` file, a poisoned cache) reaches a later
        one. Beside the job's folder, as its checkpoint folder is, and for the same reasons. One
        folder for both: each folder a job gets costs the worker about 30 µs of CPU."""
        return self.workdir.with_name(HOME_PREFIX + self.workdir.name)

    @functools.cached_property
    def _checkpoint_dir(self) -> Path:
        """Beside the job's folder, not in it: a listing or an output pattern of the job's own files
        does not meet it (the worker's leftovers sweep does: same suffix)."""
        return self.workdir.with_name(CHECKPOINT_PREFIX + self.workdir.name)

    def contain(self, meter: Meter, box: Box | None = None) -> Box:
        """Put the job's processes from now on in ``box`` (default: a cgroup of the job's own), held to
        what the job asked for, and measure them: by their cgroup, or where there is none with
        ``meter``. Before they start. :class:`OSError` (EBUSY) if what already runs in ``box`` uses
        more memory than the job may."""
        if box is None:
            box, self._own_box = self.context.containment.box(), True
        if box is NO_BOX:  # nothing to hold it to: no limits worked out
            self.meter = meter
            meter.begin()
        else:
            self.limits = self.context.limits(self.spec, self.claim)
            box.limit(self.limits)
        self.box = box
        return box

    def _follow_through(self, started: Started) -> Ending | None:
        """Follow what the launch started to its end (for an executor, its reply), clear up after it,
        keep its last checkpoint and upload its outputs (where this runner holds them); then its
        launch says how the job ended. None: the job was given back, or is not ours any more."""
        executor = started.executor
        watch = self._follow(started.tracked, started.replies)
        returncode = None if watch.replied else started.tracked[0].returncode
        reply = None
        if executor is not None and returncode is None:
            try:
                reply = executor.receive()
            except (EOFError, OSError):
                returncode = self.processes.reap(executor.process, self.meter)
        self._clean_up(executor, children=reply is not None and bool(reply[0].get("children")))
        if executor is not None:
            fresh = self.spec.function is not None and self.spec.function.fresh_process
            self.context.functions.executors.release(
                executor, keep=reply is not None and not fresh and not self._stop
            )
        if self._checkpoints is not None and self._stop != "stale":
            self._checkpoints.tick(now=True)  # what it saved last; a cold shutdown's retry needs it too
        if self._stop in ("requeue", "stale"):
            self._give_back()
            return None
        outputs, unkept = self._upload_outputs() if started.outputs else (None, None)
        return self._launch.finish(
            self._view, started, Followed(returncode, outputs, unkept, reply, watch.failed)
        )

    def _upload_outputs(self) -> tuple[OutputSummary | None, str | None]:
        return files.upload_outputs(
            self.context.artifacts,
            self.claim,
            self.spec.outputs,
            self.workdir,
            signer=self.context.signer,
            held=self.context.held,
            reading=self.processes.reading,
            retry=self.through_outage,
        )

    def _follow(self, tracked: list[Tracked], replies: Connection | None = None) -> Watch:
        """Hand the processes to the supervisor and see them through: their exits (each then has its
        return code) or, for an executor, its reply (``replied``). Applies the timeout and stops
        meanwhile, and keeps the checkpoints."""
        with self._lock:
            self._leaders = [one.pid for one in tracked]
            stop = self._stop
        if stop is not None:
            self.stop(stop)
        watch = Watch(
            tracked,
            replies,
            self.claim,
            self.context.settings.log_line_max_bytes,
            stale=lambda: self.stop("stale"),
            stopping=lambda: self._stop is not None,
        )
        try:
            timeout = self.spec.timeout or FIRST_LOOK
            self.context.supervisor.follow(watch, first=min(FIRST_LOOK, timeout))
            self._oversee(watch)
        except BaseException:
            # The worker cannot follow the job any more (Redis gone, a bug): it must not run on unseen.
            watch.kill()
            watch.done.wait(DRAIN + TICK)  # the supervisor lets go of their files (if it had them)
            self._reap(tracked)
            raise
        finally:
            # Their pids may be reused, or an executor serves the next job: a late stop must not reach them.
            with self._lock:
                self._leaders = []
        if watch.error is not None:
            watch.kill()
            self._reap(tracked)
            raise watch.error
        if not watch.replied:
            self._reap(tracked)
        return watch

    def _reap(self, tracked: list[Tracked]) -> None:
        for one in tracked:
            one.returncode = self.processes.reap(one.process, self.meter)

    def _oversee(self, watch: Watch) -> None:
        """Until the supervisor has seen the processes through: the timeout, stops and their kill
        grace (SIGTERM first, SIGKILL once it passed), and the checkpoint keeper's turns."""
        timeout = self.spec.timeout or 0.0
        deadline = time.monotonic() + timeout
        kill_at: float | None = None
        sample_at = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= sample_at:
                self._sample_gpu_memory()
                sample_at = now + GPU_SAMPLE
            if timeout and self._stop is None and now >= deadline:
                self._stop = "timeout"
                self.system(f"timed out after {timeout:g} s: stopping the job's processes")
                self._signal_all(signal.SIGTERM)
            if (self._stop is not None or watch.failed is not None) and kill_at is None:
                quick = self._stop in ("cancel", None)
                grace = self.spec.kill_grace or self.context.settings.kill_grace_seconds
                kill_at = now + (CANCEL_GRACE if quick else grace)
            if kill_at is not None and now >= kill_at:
                self._signal_all(signal.SIGKILL)
                kill_at = float("inf")
            waits = [TICK, kill_at - now if kill_at is not None else TICK]
            if timeout and self._stop is None:
                waits.append(deadline - now)
            if watch.done.wait(max(min(waits), 0.0)):
                return
            if self._checkpoints is not None:
                self._checkpoints.tick()

    def _sample_gpu_memory(self) -> None:
        """Note the GPU memory the job's processes hold on its GPUs (a job holding GPUs, on a worker
        that can read them)."""
        gauge = self.context.gpu_memory
        if gauge is None or not self.claim.gpus:
            return
        with self._lock:
            leaders = list(self._leaders)
        pids = {pid for leader in leaders for pid in (leader, *descendants(leader))}
        used = gauge.used(self.claim.gpus, pids)
        if used is not None:
            self._gpu_peak = max(self._gpu_peak or 0, used)

    def _signal_all(self, sig: signal.Signals) -> None:
        with self._lock:
            leaders = list(self._leaders)
        for leader in leaders:
            signal_tree(leader, sig)

    def _clean_up(self, executor: Executor | None = None, children: bool = False) -> None:
        """Kill what the job left running: everything in its cgroup (but the ``executor`` it ran in),
        under the executor that says it has ``children``, and anywhere else it went; then read what
        it used."""
        live = executor if executor is not None and executor.alive else None
        strays = self.box.sweep((live.process.pid,) if live is not None else ())
        if live is not None and children:
            strays += live.kill_children()
        strays += self.processes.kill_strays(self.claim.target)
        if strays:
            self.system(f"stopped {strays} process(es) the job left running")
        self.used = self.box.usage()

    def outcome(self, returncode: int, outputs: OutputSummary | None, unkept: str | None) -> Ending:
        code = shell_code(returncode)
        if self._stop == "cancel":
            return Ending(JobState.CANCELLED, code, "cancelled", outputs)
        if self._stop == "timeout":
            return Ending(JobState.TIMED_OUT, code, f"timed out after {self.spec.timeout:g} s", outputs)
        if returncode != 0 and self.box.out_of_memory():
            return Ending(JobState.FAILED, code, self._over_memory(), outputs)
        if returncode < 0:
            return Ending(
                JobState.FAILED, code, f"killed by signal {signal.Signals(-returncode).name}", outputs
            )
        if returncode != 0:
            return Ending(JobState.FAILED, code, f"exit code {returncode}", outputs)
        if unkept:
            return Ending(JobState.FAILED, code, unkept)
        if outputs and outputs.missing:
            return Ending(
                JobState.FAILED, code, "output not produced: " + ", ".join(outputs.missing), outputs
            )
        return Ending(JobState.SUCCEEDED, code, None, outputs)

    def _over_memory(self) -> str:
        size = format_size(self.limits.memory or 0)
        if self.spec.requirements.memory:
            return f"used more than its {size} of memory"
        return f"used more than the {size} of memory free on its worker (ask for more with --memory)"

    def _end(self, ending: Ending, seconds: float) -> None:
        state, reason = ending.state, ending.reason
        finished, claimed = self.through_outage(
            self.context.store.finish,
            self.claim,
            "unstarted" if ending.unstarted else state,
            exit_code=ending.exit_code,
            reason=reason,
            outputs=ending.outputs,
            seconds=seconds,
            usage=ending.usage,
            before=self._stage(ending.result) if ending.result else None,
            then=self.context.next_claim(),
        )
        if claimed is not None:
            self.context.took(claimed)
        if finished == "lost":
            self._lost("its result is dropped")
        elif log.isEnabledFor(logging.INFO):  # a busy worker logs at WARNING: spare the formatting
            said = f"{state.value}{f': {reason}' if reason else ''} ({seconds:.3f} s)"
            if finished == "ended":
                log.info("job %s: %s", self.job_id, said)
            else:
                log.info("job %s: attempt %d %s; it will run again", self.job_id, self.claim.attempt, said)

    def _stage(self, result: tuple[str, bytes]) -> Callable[[Pipeline], object]:
        """Queue a function's result, signed for the job users know and this attempt only."""
        name, payload = result
        signed = sign_result(self.context.signer, self.claim.target, self.claim.attempt, name, payload)
        return lambda pipe: self.context.artifacts.put_outputs(
            self.job_id, self.claim.attempt, name, io.BytesIO(signed), pipe
        )

    def _give_back(self) -> None:
        if self._stop == "requeue":
            message = f"worker {self.context.store.worker} stopped; the job goes back to its queue"
            self.through_outage(self.context.store.requeue, "returned", message, [self.job_id])
        else:
            self._lost("its processes were stopped")

    def _lost(self, then: str) -> None:
        """This attempt no longer owns the job: taken over, or deleted through RQ (then what it held
        here is freed: nothing else would)."""
        if self.through_outage(self.context.store.forget, self.claim):
            log.warning("job %s: deleted through RQ while it ran; %s", self.job_id, then)
        else:
            log.warning("job %s: attempt %d lost the job; %s", self.job_id, self.claim.attempt, then)

    def system(self, line: str) -> None:
        """A line of the worker's own in the job's log (saying which node, for a gang job's part)."""
        self.through_outage(
            self.context.store.append_logs, self.claim, [("system", self._launch.label(line), None)]
        )

    def through_outage(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A Redis call the job cannot do without, retried through a Redis outage for as long as the
        job's lease could still hold; past that, the job is presumed taken over and the error raised."""
        return outages.through_outage(
            call, *args, lease_ttl=self.context.lease_ttl, what=f"job {self.job_id}", **kwargs
        )
