"""The GPUlayer worker: an RQ worker that runs several jobs at once (commands, and calls of remote
functions in warm executors), each with the GPUs, CPU slots and memory it asked for.

RQ's ``work()`` loop, signal handling and command channel are used as they are; its registration,
suspension and maintenance as they are too, but on this installation's keys (RQ's own functions
name RQ's global ones: see :mod:`gpulayer.store.rq_names`); RQ's private members are reached in
:mod:`.rq_shim` alone. What changes:

* the queues: the worker serves exactly the queues whose requirements it could ever meet, and picks
  up a new requirement set as soon as its first job is submitted;
* ``dequeue_job_and_maintain_ttl`` turns the claiming loop (:mod:`.claiming`): one Lua script
  reserves each job's GPUs and slots as it pops it, and the loop sleeps until a submit or a freed
  slot wakes it, not on BLPOP;
* ``execute_job`` hands the job to a slot (:mod:`.slots`) and returns, so several jobs run at once;
* ``register_birth`` takes over a name whose previous process died, giving its jobs back at once;
* a warm shutdown waits for running jobs; a cold one stops them and puts them back in their queues.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import redis.exceptions
from redis import Redis
from redis.client import Pipeline
from rq.command import parse_payload
from rq.exceptions import StopRequested
from rq.queue import Queue
from rq.utils import now, utcformat
from rq.worker import WorkerStatus

from ..errors import ConfigError, UntrustedPayload
from ..home import private_folder
from ..inventory import Offer, WorkerInfo
from ..models import ActivitySample, JobSpec
from ..settings import Settings
from ..signing import Keyring
from ..store.connection import RECONNECT_AFTER
from ..store.execution import Claim
from ..store.stores import Stores
from .boxes import Limits
from .cgroups import contain
from .claiming import POLL_INTERVAL, ClaimLoop
from .env_builds import EnvironmentCache
from .executor_pool import ExecutorPool
from .files import Held, InputPulls
from .folders import Folders, remove_folder
from .functions import CodeBundles, FunctionRuntime
from .gangs import GangPlacer, gang_hold
from .identity import RunAs, job_area
from .intake import JOB_FOLDER_SUFFIX, JobIntake
from .leases import LeaseKeeper, holder_alive, lease_timing
from .listener import Listener
from .outages import through_outage
from .output import Line
from .parts import redis_route_address
from .process import JobProcesses, become_subreaper, job_environment
from .queues import ServedQueues
from .rq_shim import RQWorkerShim
from .runner import Context, JobRunner
from .serving import OutputServer
from .slots import Slots
from .supervisor import Supervisor
from .telemetry import TelemetryReporter
from .usage import GpuMemory

log = logging.getLogger("gpulayer.worker")

#: The worker's RQ hash lives this long (+60 s, RQ's margin) without a heartbeat.
WORKER_TTL = 60
#: Seconds between runs of RQ's registry cleaning and our index pruning.
MAINTENANCE_INTERVAL = 60
#: Seconds between full reads of the queue registry (new queues are also announced at once).
REFRESH_INTERVAL = 5.0


class Worker(RQWorkerShim):
    """Offers ``offer`` (CPU slots, memory, GPUs, labels, frameworks) to this installation's jobs, and
    runs only those a submitter signed (checked with ``keyring``'s public job key), as the worker
    ``identity``, whose result key (``keyring``'s) signs what its jobs leave."""

    #: When its identity stops being valid (from its record: :meth:`check_identity`).
    _expires: datetime | None = None

    def __init__(
        self,
        connection: Redis,
        settings: Settings,
        *,
        keyring: Keyring,
        identity: str,
        name: str,
        offer: Offer,
        workdir: Path | None = None,
        run_as: RunAs | None = None,
        advertise_addr: str | None = None,
    ) -> None:
        self._stores = stores = Stores.open(connection, settings, keyring)
        self.keys = stores.keys
        self._signer, self._checker = keyring.result_signer(identity), keyring.checker()
        self.lease_ttl, self.heartbeat_interval = lease_timing(settings.lease_ttl, settings.heartbeat)
        self.settings, self.display_name = settings, name
        self._containment, self.offer = contain(settings, name, offer)
        self.incarnation = uuid.uuid4().hex
        super().__init__(
            queues=[],
            name=self.keys.rq_worker_name(name),
            connection=connection,
            worker_ttl=WORKER_TTL,
            maintenance_interval=MAINTENANCE_INTERVAL,
        )
        self._served = ServedQueues(
            WorkerInfo(
                **self.offer.model_dump(), name=name, host=self.hostname or "", pid=os.getpid(), state=""
            ),
            REFRESH_INTERVAL,
        )
        self._refreshing = threading.Lock()
        self._listener: Listener | None = None
        self._keeper: LeaseKeeper | None = None
        self._telemetry: TelemetryReporter | None = None
        self._outputs: OutputServer | None = None
        self.store = stores.execution(name, identity)
        self.address = advertise_addr or redis_route_address(connection)
        self._wake = threading.Event()
        self._slots, self._claiming = self._make_loop(settings, name)
        self._context = self._make_context(workdir, run_as)
        self._intake = JobIntake(
            self.store,
            self.keys,
            self._checker,
            self._context,
            self.offer,
            name=self.display_name,
            address=self.address,
            workdir=self.workdir,
            base_env=job_environment(os.environ),
        )
        self._next_suspension_check = 0.0
        become_subreaper()

    def _make_loop(self, settings: Settings, name: str) -> tuple[Slots, ClaimLoop]:
        """The slots jobs run in, and the loop that claims for them."""
        #: At most one job per CPU slot plus one per GPU runs at once (GPU jobs hold no CPU slot by default).
        capacity = self.offer.slots + len(self.offer.gpus)
        slots = Slots(
            capacity,
            self.store,
            prepare=self._runner,
            ended=lambda: self._claiming.job_ended(),  # noqa: PLW0108  # the loop is made next, from these slots
            wake=self._wake,
            stopping=lambda: self._stopping,
        )
        stores, lease_ms = self._stores, int(self.lease_ttl * 1000)
        placer = GangPlacer(
            stores.gangs, stores.workers, name=name, hold=gang_hold(settings), lease_ms=lease_ms
        )
        claiming = ClaimLoop(
            self.store,
            slots,
            self._served,
            placer,
            self.offer,
            lease_ttl=self.lease_ttl,
            wake=self._wake,
            refresh=self._refresh_queues,
            stopping=lambda: self._stopping,
        )
        return slots, claiming

    def _make_context(self, workdir: Path | None, run_as: RunAs | None) -> Context:
        """What the runners share, with the folders jobs run in: with ``run_as``, job folders
        and bundles are outside the worker's home, which the job user must not enter."""
        settings, name = self.settings, self.display_name
        area = job_area(workdir, f"{settings.prefix}-{name}") if run_as else None
        self.workdir = area or private_folder(workdir or settings.home / "work" / name)
        self._bundles = area / "bundles" if area else private_folder(settings.home / "bundles")
        if area:
            self._bundles.mkdir(mode=0o755, exist_ok=True)  # the job user imports from it
        processes = JobProcesses(run_as)
        # Three folders per job (its own, its checkpoints', its HOME); a job run as another user owns
        # its own.
        folders = Folders(
            self.workdir, JOB_FOLDER_SUFFIX, reuse=run_as is None, keep=3 * self._slots.capacity
        )
        return Context(
            self.store,
            self._stores.artifacts,
            settings,
            processes,
            Supervisor(self._write_logs),
            folders,
            self.lease_ttl,
            self._functions(settings, processes),
            self._signer,
            self._check_archive,
            self._containment,
            self._limits,
            self._environments(area),
            Held.of(settings, name),
            InputPulls(self._stores.transfers, self._checker, settings.home / "pulled" / name),
            self._claiming.next_claim,
            self._claiming.took_for_slot,
            GpuMemory.open(self.offer.gpus),
        )

    def _environments(self, area: Path | None) -> EnvironmentCache:
        """The cache of the Python environments jobs bring: the setting's folder, else in the home;
        with ``--run-as``, beside the job folders, where the job user may enter."""
        settings = self.settings
        root = settings.env_cache or (area / "envs" if area else settings.home / "envs")
        environ = job_environment(os.environ)
        return EnvironmentCache(root, settings.env_cache_max_bytes, settings.env_build_timeout, environ)

    def _functions(self, settings: Settings, processes: JobProcesses) -> FunctionRuntime:
        bundles = CodeBundles(self._bundles, self._stores.artifacts, settings.max_source_bytes)
        bundles.prune()
        return FunctionRuntime(bundles, ExecutorPool(processes, self._slots.capacity, self._containment))

    def _limits(self, spec: JobSpec, claim: Claim) -> Limits:
        """What a job may use: the memory it asked for (else what no other running job holds), its CPU
        slots as a CPU quota, the pids limit, and none of this machine's GPUs but its own."""
        memory = spec.requirements.memory
        if not memory:
            memory = max(self.offer.memory - self._slots.memory_held(claim), 0) or self.offer.memory
        minors = {
            gpu.index: gpu.minor for gpu in self.offer.gpus if gpu.kind == "cuda" and gpu.minor is not None
        }
        denied = frozenset(minor for index, minor in minors.items() if index not in claim.gpus)
        return Limits(memory, spec.requirements.cpus, self.settings.job_pids, denied)

    def _check_archive(self, job_id: str, name: str, sha256: str, seal: str | None) -> None:
        """:class:`UntrustedPayload` unless the worker that ran the attempt ``seal`` names signed it."""
        record = self._stores.jobs.get(job_id)
        if record is None:
            raise UntrustedPayload(f"no job {job_id} to check its {name} against")
        self._stores.registry.check_archive(record, name, sha256, seal)

    def check_identity(self) -> None:
        """Refuse to run (:class:`ConfigError`) under an identity whose record the registry does not
        hold, whose key is not this worker's, or that expired: no client would accept what it signs."""
        name = self._signer.identity
        found = self._stores.registry.identity(name)
        if found is None:
            raise ConfigError(
                f"worker identity {name!r} is not in the installation's registry: it was revoked, or "
                "the admin has not published it yet (any `gpulayer access` command there does)"
            )
        if found.result_key != self._signer.key.public.text:
            raise ConfigError(
                f"this worker's key is not the one identity {name!r} has now: ask for a new token"
            )
        if found.expired(datetime.now(timezone.utc)):
            raise ConfigError(f"worker identity {name!r} expired at {found.expires:%Y-%m-%d %H:%M} UTC")
        self._expires = found.expires

    @property
    def connection_timeout(self) -> int:
        """Redis commands give up after this long, so a silent network shows within a lease; RQ
        would otherwise raise the socket timeout to its own blocking dequeue's (over 400 s)."""
        return max(1, int(self.lease_ttl / 2))

    # --- registration --------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """RQ's hash of this worker, in this installation's namespace."""
        return self.keys.rq_worker(self.display_name)

    @property
    def pubsub_channel_name(self) -> str:
        return self.keys.pubsub(self.display_name)

    def serialize(self) -> dict[str, Any]:
        fields: dict[str, Any] = super().serialize()
        fields.update(
            gl_incarnation=self.incarnation,
            gl_name=self.display_name,
            gl_identity=self._signer.identity,
            gl_offer=self.offer.model_dump_json(),
            gl_heartbeat=self.heartbeat_interval,
            gl_address=self.address,
        )
        return fields

    def check_name(self, *, replace: bool = False) -> None:
        """Refuse (:class:`ConfigError`) a name a live worker holds: on this machine, one whose
        process still runs; elsewhere, one heard from within three heartbeats. ``replace``: take it
        over anyway (the other process then stops). A dead holder's name is taken over at once."""
        holder = self._stores.workers.holder(self.display_name)
        if holder is None or replace or not holder_alive(holder, self.hostname or ""):
            return
        raise ConfigError(
            f"a worker named {self.display_name!r} is running (pid {holder.pid} on {holder.host}): "
            "give this one another --name, or pass --replace to take the name over"
        )

    def register_birth(self) -> None:
        """Take over this name at once: a previous process under it (a machine that rebooted) gives
        its jobs back to their queues, and its registration is replaced."""
        moved = self.store.requeue("lost", f"worker {self.display_name} restarted; its previous run is gone")
        # Job folders a previous process under this name left behind belong to jobs it no longer holds;
        # so do the processes in its cgroups.
        for folder in self.workdir.glob(f"*{JOB_FOLDER_SUFFIX}"):
            remove_folder(folder)
        self._containment.clear_leftovers()
        if moved:
            log.warning(
                "worker %s: a previous run held %d job(s); they are back in their queues",
                self.display_name,
                moved,
            )
        self.birth_date = self.last_heartbeat = now()
        with self.connection.pipeline() as pipe:
            pipe.delete(self.key)
            pipe.hset(self.key, mapping=self.serialize())  # type: ignore[arg-type]
            self._registration(pipe, live=True)
            pipe.expire(self.key, self.worker_ttl + 60)
            pipe.execute()
        self._stores.telemetry.announce(self.display_name, "joined")

    def register_death(self) -> None:
        if self._keeper is not None and self._keeper.taken_over.is_set():
            return  # the registration under this name is the new holder's now: it stays
        with self.connection.pipeline() as pipe:
            self._registration(pipe, live=False)
            pipe.hset(self.key, "death", utcformat(now()))
            pipe.expire(self.key, 60)
            pipe.execute()
        self._stores.telemetry.announce(self.display_name, "left")

    def _registration(self, pipe: Pipeline, *, live: bool) -> None:
        """RQ's view of the worker, as RQ's registration writes it: among the live workers, and under
        each queue it serves (what ``rq info`` lists)."""
        change = pipe.sadd if live else pipe.srem
        change(self.keys.rq_workers, self.key)
        for name in self.queue_names():
            change(self.keys.rq_workers_of(name), self.key)

    def subscribe(self) -> None:
        """RQ's command channel (stop-job, shutdown), the channel new queues are announced on, and
        the wake-up channel of each served queue (kept current by :meth:`_refresh_queues`)."""
        # A wake-up missed while subscribing counts as one: the spread delay applies to it too.
        self._listener = Listener(self.connection, self._channels(), on_change=self._claiming.on_change)
        self._listener.start()
        self._keeper = LeaseKeeper(
            self.store,
            self.incarnation,
            interval=self.heartbeat_interval,
            lease_ttl=self.lease_ttl,
            registration_ttl=self.worker_ttl + 60,
            running=self._running_attempts,
            stop_job=self._slots.stop_job,
            stop_all=self._slots.stop_all,
        )
        self._keeper.start()
        self._telemetry = TelemetryReporter(
            self._stores.telemetry, self.display_name, self.offer.gpus, self._busy_gpus, self._activity
        )
        self._telemetry.start()
        self._outputs = OutputServer(self._stores, self._context.held, self._signer, self.settings)
        self._outputs.start()
        self._context.supervisor.start()
        self._refresh_queues()

    def unsubscribe(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        for thread in (self._telemetry, self._outputs):
            if thread is not None:
                thread.stop()
        if self._listener is not None:
            self._listener.stop()

    def _running_attempts(self) -> list[tuple[str, int]]:
        """Every job this worker holds a lease on."""
        return [(claim.job_id, claim.attempt) for claim in self._slots.claims()]

    def _busy_gpus(self) -> set[int]:
        return {index for claim in self._slots.claims() for index in claim.gpus}

    def _activity(self) -> ActivitySample:
        queues, gangs = self._stores.queues.list()
        return ActivitySample(
            time=int(time.time() * 1000),
            jobs=self._stores.jobs.counts(),
            queues={queue.name: queue.depth for queue in queues},
            gangs_waiting=gangs,
        )

    def _channels(self) -> dict[str, Any]:
        channels: dict[str, Any] = {
            self.pubsub_channel_name: self.handle_payload,
            self.keys.new_queue: self._claiming.on_new_queue,
            self.keys.gang_wake: self._claiming.on_gang,
            self.keys.worker_wake(self.display_name): self._claiming.on_part,
        }
        channels.update({self.keys.wake(name): self._claiming.on_wake for name in self._served.names})
        return channels

    def _refresh_queues(self) -> None:
        """Serve each new queue whose requirements this worker could ever meet, if a look is due.
        Whichever claims next looks first: the main loop, or a slot claiming as its job ends (a full
        worker's main loop may not wake before the slot's next claim)."""
        if not self._served.due:
            return  # checked again under the lock: two threads may both find it due
        with self._refreshing:
            if not self._served.due or not self._served.update(self.store.queue_registry):
                return
            self.serve([self.queue_class(name, connection=self.connection) for name in self._served.names])
            # RQ's own view: `rq info` lists the worker under each queue it serves.
            with self.connection.pipeline() as pipe:
                self._registration(pipe, live=True)
                pipe.hset(self.key, "queues", ",".join(self._served.names))
                pipe.execute()
            if self._listener is not None:
                self._listener.set_channels(self._channels())
        log.info("worker %s: serving %s", self.display_name, ", ".join(self._served.names))

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's loop calls this after every job; heartbeats come from the LeaseKeeper thread instead."""

    def run_maintenance_tasks(self) -> None:
        """RQ's maintenance, on this installation's keys: prune.lua drops what expired from the job
        indexes and RQ's registries of ended jobs, and workers that died unannounced from RQ's sets.
        (RQ's started registry never expires a job of ours: their scores are +inf.)"""
        self.store.prune(self.queue_names())
        self.last_cleaned_at = now()  # type: ignore[assignment]  # RQ's type: None, before a first clean
        if self._context.functions is not None:
            self._context.functions.executors.close_stale()

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's suspension (``rq suspend``): while it lasts the worker waits, shown as suspended, and
        a burst worker stops. The claim script refuses work while suspended too, so this looks once
        per poll interval, not at every turn of the loop."""
        moment = time.monotonic()
        if moment < self._next_suspension_check:
            return
        self._next_suspension_check = moment + POLL_INTERVAL
        before: str | None = None
        while not self.stop_requested and self.connection.exists(self.keys.rq_suspended):
            if burst:
                raise StopRequested
            if before is None:
                log.info("worker %s: suspended; `rq resume` resumes it", self.display_name)
                before = self.get_state()
                self.set_state(WorkerStatus.SUSPENDED)
            time.sleep(POLL_INTERVAL)
        if before is not None:
            self.set_state(before)

    # --- the loop ---------------------------------------------------------------------------------
    def dequeue_job_and_maintain_ttl(  # type: ignore[override]
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Claim, Queue] | None:
        """Wait for a free slot and a queued job; claim as many jobs as there are free slots.
        Returns None to end the loop: a stop, an empty queue in burst mode (``timeout`` None), or idleness."""
        idle_since = time.monotonic()
        backoff = RECONNECT_AFTER
        while not self._stopping:
            if self._expired():
                return None
            try:
                # RQ's own loop does this between jobs; an idle worker does it here.
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                if (claim := self._slots.next_claimed()) is not None:
                    return claim, self.queue_class(claim.queue, connection=self.connection)
                outcome = self._claiming.turn()
                backoff = RECONNECT_AFTER
                if outcome in ("took", "again"):
                    continue
                if outcome == "nothing" and timeout is None and not self._slots.claims():
                    # Burst mode: the queues are empty and none of its jobs is left to run. (While
                    # one runs, its end may still claim the queue's last job, as RQ's burst worker
                    # looks again after each job; ended now, that job went back with no worker left.)
                    return None
                if self._slots.running:
                    idle_since = time.monotonic()
                elif max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                    return None
                if (
                    self._claiming.idle()
                    and not self._slots.running
                    and self.get_state() != WorkerStatus.IDLE
                ):
                    # Said after a quiet poll, not between two jobs, where it would cost a write each.
                    self.set_state(WorkerStatus.IDLE)
            except redis.exceptions.AuthenticationError:
                log.error(
                    "worker %s: Redis refused its user: identity %s was revoked; stopping",
                    self.display_name,
                    self._signer.identity,
                )
                self._slots.stop_all("stale")  # its jobs went back to their queues: they run elsewhere now
                return None
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                log.error(
                    "worker %s: cannot reach Redis (%s); retrying in %.2g s", self.display_name, exc, backoff
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, self.heartbeat_interval)
        return None

    def _expired(self) -> bool:
        """Whether its identity has expired: it then takes no more jobs (what it signs from now on
        nobody accepts), saying so once."""
        if self._expires is None or datetime.now(timezone.utc) < self._expires:
            return False
        log.error(
            "worker %s: identity %s expired at %s UTC; it takes no more jobs",
            self.display_name,
            self._signer.identity,
            f"{self._expires:%Y-%m-%d %H:%M}",
        )
        self.stop_requested = True
        return True

    @property
    def _stopping(self) -> bool:
        """Asked to stop, or found that another process took over this worker's name."""
        return self.stop_requested or bool(self._keeper and self._keeper.taken_over.is_set())

    def execute_job(self, job: Claim, queue: Queue) -> None:  # type: ignore[override]
        """Start the job in a free slot and return at once."""
        self._slots.start(job)

    def _runner(self, job: Claim) -> JobRunner | None:
        runner = self._intake.runner(job)
        if runner is not None and self.get_state() != WorkerStatus.BUSY:
            self.set_state(WorkerStatus.BUSY)
        return runner

    def _write_logs(self, batches: list[tuple[Claim, list[Line]]]) -> list[bool]:
        """The supervisor's log lines of all running jobs, in one round trip."""
        return through_outage(
            self.store.append_logs_of, batches, lease_ttl=self.lease_ttl, what=f"worker {self.display_name}"
        )

    # --- commands and shutdown ---------------------------------------------------------------------
    def handle_payload(self, message: dict[Any, Any]) -> None:
        payload = parse_payload(message)
        if payload.get("command") == "stop-job":
            self._slots.stop_job(str(payload.get("job_id")), "cancel")
        elif payload.get("command") == "shutdown" and payload.get("requeue"):
            # `gpulayer worker stop --requeue`: a cold shutdown, as a second signal would be.
            self.request_force_stop(0, None)
        else:
            super().handle_payload(message)  # type: ignore[no-untyped-call]

    def warm_shutdown(self) -> None:
        """Warm shutdown (first SIGTERM/SIGINT): take no new jobs; running ones finish."""
        self.stop_requested = True
        _aside(self._say_warm_shutdown)

    def _say_warm_shutdown(self) -> None:
        log.info(
            "worker %s: finishing %d running job(s), then stopping; signal again to stop them now",
            self.display_name,
            self._slots.running,
        )
        self._wake.set()

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """Cold shutdown (second signal): stop running jobs and give them back to their queues."""
        self.stop_requested = True
        _aside(self._cold_shutdown)

    def _cold_shutdown(self) -> None:
        log.warning("worker %s: stopping now; running jobs go back to their queues", self.display_name)
        self._slots.stop_all("requeue")
        self._wake.set()

    def teardown(self) -> None:
        # Also the end of a burst: a job ending from now on claims no next one.
        self.stop_requested = True
        self._slots.close()
        self._context.supervisor.close()
        self._context.folders.close()
        if self._context.functions is not None:
            self._context.functions.executors.close()
        self._containment.close()
        if self._context.gpu_memory is not None:
            self._context.gpu_memory.close()
        super().teardown()  # type: ignore[no-untyped-call]


def _aside(work: Callable[[], None]) -> None:
    """Run ``work`` in a thread of its own: a signal handler runs between two steps of the main
    thread, which may be holding a lock ``work`` needs (the wake-up event's, the runners'), and would
    wait on itself for ever."""
    threading.Thread(target=work, name="gpulayer-shutdown", daemon=True).start()
