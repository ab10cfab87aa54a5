"""The GPUlayer worker: an RQ worker that runs several jobs at once (commands, and calls of remote
functions in warm executors), each with the GPUs, CPU slots and memory it asked for.

RQ's ``work()`` loop, signal handling and command channel are used as they are; its registration,
suspension and maintenance as they are too, but on this installation's keys (RQ's own functions
name RQ's global ones: see :mod:`gpulayer.store.rq_names`). What changes:

* the queues: the worker serves exactly the queues whose requirements it could ever meet, and picks
  up a new requirement set as soon as its first job is submitted;
* ``dequeue_job_and_maintain_ttl`` claims with one Lua script that reserves each job's GPUs and slots
  as it pops it (atomic across queues; never more than fits), and sleeps until a submit or a freed
  slot wakes it, not on BLPOP;
* ``execute_job`` hands the job to a slot thread and returns, so several jobs run at once;
* ``register_birth`` takes over a name whose previous process died, giving its jobs back at once;
* a warm shutdown waits for running jobs; a cold one stops them and puts them back in their queues.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any, Literal, cast

import psutil
import redis.exceptions
from pydantic import ValidationError
from redis import Redis
from redis.client import Pipeline
from redis.sentinel import SentinelConnectionPool
from rq.command import parse_payload
from rq.exceptions import StopRequested
from rq.queue import Queue
from rq.utils import now, utcformat
from rq.worker import BaseWorker, WorkerStatus

from ..errors import ConfigError, UntrustedPayload
from ..home import private_folder
from ..inventory import SILENT_BEATS, Offer, WorkerInfo
from ..models import MAX_SPEC_BYTES, ActivitySample, JobSpec, JobState, validation_message
from ..network import address_towards
from ..settings import Settings
from ..signing import Keyring, ResultSigner, Verified, check_job
from ..store.connection import RECONNECT_AFTER
from ..store.execution import Claim, Claimed, ClaimRequest
from ..store.gangs import Hold
from ..store.jobs import parse_spec
from ..store.stores import Stores
from ..store.workers import Holder
from .calling import CallLaunch
from .cgroups import Containment, Limits, Mode, open_containment
from .endings import StopReason
from .executors import ExecutorPool
from .folders import Folders, remove_folder
from .functions import CodeBundles, FunctionRuntime
from .gangs import GangPlacer
from .identity import RunAs, job_area
from .launches import CommandLaunch, Launch
from .leases import LeaseKeeper
from .listener import Listener
from .output import Line
from .parts import PartLaunch
from .process import JobProcesses, become_subreaper, job_environment
from .queues import ServedQueues
from .runner import Context, JobRunner, persist
from .supervisor import Supervisor
from .telemetry import TelemetryReporter
from .usage import GpuMemory

log = logging.getLogger("gpulayer.worker")

#: The worker's RQ hash lives this long (+60 s, RQ's margin) without a heartbeat.
WORKER_TTL = 60
#: Seconds between runs of RQ's registry cleaning and our index pruning.
MAINTENANCE_INTERVAL = 60
#: Set to ``exit-after-claim`` (tests only), a worker dies right after claiming: the dequeue window.
FAULT_VARIABLE = "GPULAYER_TEST_FAULT"
#: Ends the name of each job folder, so a restart removes those and nothing else in --workdir.
JOB_FOLDER_SUFFIX = ".gljob"
#: Longest sleep (s) without looking at the queues, should a wake-up message be lost.
POLL_INTERVAL = 1.0
#: Seconds between full reads of the queue registry (new queues are also announced at once).
REFRESH_INTERVAL = 5.0
#: Woken by a submit while busy, a worker waits this long times how busy it is (0 to 1) before it
#: claims, so a less busy worker that fits takes the job first (spread).
SPREAD_DELAY = 0.05
#: While gang jobs wait for workers, a worker tries to place them at most this often (s), besides
#: when one is submitted and when one of its own jobs ends.
PLACE_INTERVAL = 0.5
#: A worker held for a gang job stays held this long (ms) unless the hold is renewed.
HOLD_TTL_MS = 10_000


class Worker(BaseWorker):
    """Offers ``offer`` (CPU slots, memory, GPUs, labels, frameworks) to this installation's jobs, and
    runs only those a submitter signed (checked with ``keyring``'s public job key), as the worker
    ``identity``, whose result key (``keyring``'s) signs what its jobs leave."""

    #: When its identity stops being valid (from its record: :meth:`check_identity`).
    _expires: datetime | None = None
    _submitted = False
    #: The last claim took fewer jobs than it asked for: see :meth:`_try_claim`.
    _drained = False

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
        self._verifier, self._verified = keyring.checker(), Verified()
        self._signer = _signer(identity, keyring)
        self.lease_ttl, self.heartbeat_interval = _timing(settings.lease_ttl, settings.heartbeat)
        self.settings, self.display_name = settings, name
        self._containment, self.offer = _contain(settings, name, offer)
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
        self.store = stores.execution(name, identity)
        self._placer = GangPlacer(
            stores.gangs, stores.workers, name=name, hold=_hold(settings), lease_ms=int(self.lease_ttl * 1000)
        )
        #: Gang jobs waiting for workers, as last seen; set to place them at the next turn of the loop.
        self._gangs = 0
        self._place_now = False
        self._next_placement = 0.0
        #: Set when a part of a gang job was placed on this worker: claim it even if full.
        self._parts = False
        self.address = advertise_addr or _address_towards(connection)
        self._base_env = job_environment(os.environ)
        self._runners: dict[str, JobRunner] = {}
        self._claimed: deque[Claim] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: At most one job per CPU slot plus one per GPU runs at once (GPU jobs hold no CPU slot by default).
        self.capacity = self.offer.slots + len(self.offer.gpus)
        self._context = self._make_context(workdir, run_as)
        self._pool = ThreadPoolExecutor(max_workers=self.capacity, thread_name_prefix="gpulayer-slot")
        self._next_suspension_check = 0.0
        become_subreaper()

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
        folders = Folders(self.workdir, JOB_FOLDER_SUFFIX, reuse=run_as is None, keep=3 * self.capacity)
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
            self._next_claim,
            self._took_for_slot,
            GpuMemory.open(self.offer.gpus),
        )

    def _functions(self, settings: Settings, processes: JobProcesses) -> FunctionRuntime:
        bundles = CodeBundles(self._bundles, self._stores.artifacts, settings.max_source_bytes)
        bundles.prune()
        return FunctionRuntime(bundles, ExecutorPool(processes, self.capacity, self._containment))

    def _limits(self, spec: JobSpec, claim: Claim) -> Limits:
        """What a job may use: the memory it asked for (else what no other running job holds), its CPU
        slots as a CPU quota, the pids limit, and none of this machine's GPUs but its own."""
        memory = spec.requirements.memory
        if not memory:
            with self._lock:
                held = sum(
                    runner.spec.requirements.memory
                    for runner in self._runners.values()
                    if runner.claim is not claim
                )
            memory = max(self.offer.memory - held, 0) or self.offer.memory
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

    def _set_ip_address(self, connection: Redis) -> None:
        """The address Redis sees this worker at, from CLIENT INFO: RQ's own way lists every client
        (CLIENT LIST), which a worker's Redis user may not."""
        try:
            self.ip_address = str(connection.client_info()["addr"])
        except (redis.exceptions.ResponseError, KeyError):
            self.ip_address = "unknown"

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
        if holder is None or replace or not _alive(holder, self.hostname or ""):
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
        self._listener = Listener(self.connection, self._channels(), on_change=self._on_change)
        self._listener.start()
        self._keeper = LeaseKeeper(
            self.store,
            self.incarnation,
            interval=self.heartbeat_interval,
            lease_ttl=self.lease_ttl,
            registration_ttl=self.worker_ttl + 60,
            running=self._running_attempts,
            stop_job=self._stop_job,
            stop_all=self._stop_all,
        )
        self._keeper.start()
        self._telemetry = TelemetryReporter(
            self._stores.telemetry, self.display_name, self.offer.gpus, self._busy_gpus, self._activity
        )
        self._telemetry.start()
        self._context.supervisor.start()
        self._refresh_queues()

    def unsubscribe(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        if self._telemetry is not None:
            self._telemetry.stop()
        if self._listener is not None:
            self._listener.stop()

    def _claims(self) -> list[Claim]:
        """Every job this worker holds: running, or claimed and about to run."""
        with self._lock:
            return [runner.claim for runner in self._runners.values()] + list(self._claimed)

    def _running_attempts(self) -> list[tuple[str, int]]:
        """Every job this worker holds a lease on."""
        return [(claim.job_id, claim.attempt) for claim in self._claims()]

    def _busy_gpus(self) -> set[int]:
        return {index for claim in self._claims() for index in claim.gpus}

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
            self.keys.new_queue: self._on_new_queue,
            self.keys.gang_wake: self._on_gang,
            self.keys.worker_wake(self.display_name): self._on_part,
        }
        channels.update({self.keys.wake(name): self._on_wake for name in self._served.names})
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
            self.queues = [self.queue_class(name, connection=self.connection) for name in self._served.names]
            self._ordered_queues = self.queues[:]
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
        while not self._stop_requested and self.connection.exists(self.keys.rq_suspended):
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
                if (claim := self._next_claimed()) is not None:
                    return claim, self.queue_class(claim.queue, connection=self.connection)
                self._refresh_queues()
                if self._place_now or (self._gangs and time.monotonic() >= self._next_placement):
                    self._place_gangs()
                outcome = self._try_claim()
                backoff = RECONNECT_AFTER
                if outcome in ("took", "again"):
                    continue
                if outcome == "nothing" and timeout is None and not self._claims():
                    # Burst mode: the queues are empty and none of its jobs is left to run. (While
                    # one runs, its end may still claim the queue's last job, as RQ's burst worker
                    # looks again after each job; ended now, that job went back with no worker left.)
                    return None
                if self._runners:
                    idle_since = time.monotonic()
                elif max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                    return None
                self._idle()
            except redis.exceptions.AuthenticationError:
                log.error(
                    "worker %s: Redis refused its user: identity %s was revoked; stopping",
                    self.display_name,
                    self._signer.identity,
                )
                self._stop_all("stale")  # its jobs went back to their queues: they run elsewhere now
                return None
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                log.error(
                    "worker %s: cannot reach Redis (%s); retrying in %.2g s", self.display_name, exc, backoff
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, self.heartbeat_interval)
        return None

    def _try_claim(self) -> Literal["took", "nothing", "full", "again"]:
        """Claim for the free slots (and any gang part placed here): it took jobs; it found nothing
        to take; the slots are full; or a slot freed meanwhile (look again)."""
        # Cleared before anything it decides on is read: what sets a flag and then wakes this loop
        # after the read still wakes the wait that follows. (Cleared after, a submit that came
        # between the two slept a poll's interval.)
        self._wake.clear()
        with self._lock:
            # A job a runner claimed as it ended (see _next_claim) holds a slot already.
            running = len(self._runners) + len(self._claimed)
        busy = self._busy()
        free = self.capacity - running
        if free <= 0 and not self._parts:
            # Full: nothing to claim until a runner ends, which wakes this loop again.
            with self._lock:
                return "again" if len(self._runners) < self.capacity else "full"
        if self._drained and not (self._submitted or self._parts):
            # The last claim came back short: nothing more until a submit, a placed part or a quiet
            # poll says so. A freed slot's resources were offered to that slot's own claim already.
            return "nothing"
        if self._submitted and busy and free > 0:
            self._spread(busy)
        self._submitted = self._parts = False
        wanted = max(free, 0)
        self._took(self.store.claim(self._claim_request(wanted)), wanted)
        if self._claimed:
            return "took"
        return "nothing" if free > 0 else "full"

    def _busy(self) -> int:
        """How many of its jobs are still at work (not only recording their end)."""
        with self._lock:
            return sum(not runner.ending for runner in self._runners.values())

    def _spread(self, busy: int) -> None:
        """Let a less busy worker take a job submitted while this one is busy: wait SPREAD_DELAY
        times how busy it is, but no longer than its jobs are at work. (A wake-up that crossed this
        worker's own claim of its job would otherwise hold back the next submit for the whole
        delay: one idle dispatch in ten took 22 ms.)"""
        deadline = time.monotonic() + SPREAD_DELAY * busy / self.capacity
        while (left := deadline - time.monotonic()) > 0 and self._busy():
            self._wake.clear()
            self._wake.wait(left)

    def _idle(self) -> None:
        """Sleep until woken (a submit, a freed slot, a placed part) or a poll's interval passes."""
        if self._served.due:
            return  # a new queue was announced since this turn of the loop looked
        woken = self._wake.wait(POLL_INTERVAL)
        if not woken:
            self._drained = False  # a wake-up may have been lost: look again
        if not woken and not self._runners and self.get_state() != WorkerStatus.IDLE:
            # Said after a quiet poll, not between two jobs, where it would cost a write each.
            self.set_state(WorkerStatus.IDLE)

    def _claim_request(self, limit: int) -> ClaimRequest:
        offer = self.offer
        return ClaimRequest(
            self._served.claim_order(), limit, offer.slots, offer.memory, int(self.lease_ttl * 1000)
        )

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
        self._stop_requested = True
        return True

    @property
    def _stopping(self) -> bool:
        """Asked to stop, or found that another process took over this worker's name."""
        return self._stop_requested or bool(self._keeper and self._keeper.taken_over.is_set())

    def _next_claim(self) -> ClaimRequest | None:
        """What a runner claims as its job ends, in the same round trip: one job for its slot; none
        once the worker is stopping."""
        if self._stopping:
            return None
        try:
            self._refresh_queues()
        except redis.exceptions.RedisError as exc:  # the job's end must still be recorded
            log.error("worker %s: could not look for new queues: %s", self.display_name, exc)
        return self._claim_request(1)

    def _took(self, claimed: Claimed, wanted: int, *, wake: bool = True) -> None:
        """Jobs a claim for ``wanted`` took, to be started in turn: by the main loop, which ``wake``
        wakes; a runner's claim for its own slot is started by that slot's thread once its job is over."""
        claims, self._gangs = claimed
        self._drained = len(claims) < wanted
        if claims and os.environ.get(FAULT_VARIABLE) == "exit-after-claim":
            os._exit(9)
        if claims:
            with self._lock:
                self._claimed.extend(claims)
            if wake:
                self._wake.set()

    def _took_for_slot(self, claimed: Claimed) -> None:
        self._took(claimed, 1, wake=False)

    def execute_job(self, job: Claim, queue: Queue) -> None:  # type: ignore[override]
        """Start the job in a free slot and return at once."""
        runner = self._runner(job)
        if runner is not None:
            self._pool.submit(self._run_in_slot, runner)

    def _runner(self, job: Claim) -> JobRunner | None:
        """The job's runner, counted among the running; None for a job that is not exactly what a
        submitter signed, or not claimed as what it signed asks, which fails, unrun."""
        try:
            spec = _read_spec(job.spec_json)
            files = check_job(self._verifier, job.target, job.spec_json or b"", job.seal, self._verified)
            if misplaced := job.misplaced(spec, self.keys.queue_for(spec.queue)):
                raise UntrustedPayload(misplaced)
        except (ValueError, UntrustedPayload) as exc:
            refused = isinstance(exc, UntrustedPayload)
            reason = f"refused: {exc}; it was not run" if refused else f"invalid job record: {exc}"
            if refused:
                self.store.append_logs(job, [("system", reason, None)])
            self.store.finish(job, JobState.FAILED, exit_code=None, reason=reason, outputs=None, seconds=0.0)
            log.error("job %s: %s", job.job_id, reason)
            return None
        folder = self.workdir / f"{job.job_id}-{job.attempt}{JOB_FOLDER_SUFFIX}"
        env = {**self._base_env, **self._gpu_env(job)}
        runner = JobRunner(job, spec, files, self._launch(job, spec), self._context, folder, env)
        with self._lock:
            self._runners[job.job_id] = runner
        if self.get_state() != WorkerStatus.BUSY:
            self.set_state(WorkerStatus.BUSY)
        if log.isEnabledFor(logging.INFO):  # a busy worker logs at WARNING: spare the join
            log.info("job %s: attempt %d started: %s", job.job_id, job.attempt, " ".join(spec.command))
        return runner

    def _launch(self, job: Claim, spec: JobSpec) -> Launch:
        if job.part is not None:
            assert spec.distributed is not None, "only a gang job has parts"
            return PartLaunch(job.part, spec.distributed, self.display_name, self.address)
        return CallLaunch() if spec.function is not None else CommandLaunch()

    def _write_logs(self, batches: list[tuple[Claim, list[Line]]]) -> list[bool]:
        """The supervisor's log lines of all running jobs, in one round trip."""
        return persist(
            self.store.append_logs_of, batches, lease_ttl=self.lease_ttl, what=f"worker {self.display_name}"
        )

    def _gpu_env(self, job: Claim) -> dict[str, str]:
        """The job sees exactly its reserved GPUs, numbered as nvidia-smi does; no GPU, no CUDA device."""
        kinds = {gpu.index: gpu.kind for gpu in self.offer.gpus}
        cuda = [str(index) for index in job.gpus if kinds.get(index) == "cuda"]
        return {"CUDA_VISIBLE_DEVICES": ",".join(cuda), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def _run_in_slot(self, runner: JobRunner) -> None:
        """Run the job, then the next one its end claimed, if any: a busy slot hands nothing to
        another thread between two jobs."""
        following: JobRunner | None = runner
        try:
            while following is not None:
                self._run_one(following)
                # What it held is free: a waiting gang job may fit now.
                if self._gangs:
                    self._place_now = True
                    self._wake.set()
                following = None
                while following is None and (claim := self._next_claimed()) is not None:
                    following = self._runner(claim)
        except Exception:  # a job it could not refuse (Redis gone) is left to its lease
            log.exception("worker %s: a slot failed between two jobs", self.display_name)
        finally:
            self._wake.set()  # the slot is free

    def _next_claimed(self) -> Claim | None:
        """A claimed job, not yet started, for the main loop or a slot that just freed (both take
        from the same queue: checked and taken under one lock); none once the worker stops (the
        claimed jobs then go back to their queues)."""
        with self._lock:
            if self._claimed and not self._stopping:
                return self._claimed.popleft()
        return None

    def _run_one(self, runner: JobRunner) -> None:
        try:
            runner.run()
        except redis.exceptions.AuthenticationError:
            log.error("job %s: left to its lease: Redis refused this worker's user", runner.job_id)
        except Exception as exc:
            log.exception("job %s: the worker failed running it", runner.job_id)
            try:
                self.store.finish(
                    runner.claim,
                    JobState.FAILED,
                    exit_code=None,
                    reason=f"worker error: {exc}",
                    outputs=None,
                    seconds=0.0,
                )
            except redis.exceptions.RedisError:
                log.error("job %s: could not record the failure", runner.job_id)
        finally:
            with self._lock:
                del self._runners[runner.job_id]

    # --- commands and shutdown ---------------------------------------------------------------------
    def handle_payload(self, message: dict[Any, Any]) -> None:
        payload = parse_payload(message)
        if payload.get("command") == "stop-job":
            self._stop_job(str(payload.get("job_id")), "cancel")
        elif payload.get("command") == "shutdown" and payload.get("requeue"):
            # `gpulayer worker stop --requeue`: a cold shutdown, as a second signal would be.
            self.request_force_stop(0, None)
        else:
            super().handle_payload(message)  # type: ignore[no-untyped-call]

    def _on_wake(self, message: dict[Any, Any]) -> None:
        job_id = message.get("data")
        with self._lock:
            # Published after this worker already took the job: nothing new is waiting.
            held = job_id is not None and job_id.decode() in (
                {claim.job_id for claim in self._claimed} | set(self._runners)
            )
        if not held:
            self._submitted = True
            self._wake.set()

    def _on_gang(self, message: dict[Any, Any]) -> None:
        self._place_now = True
        self._wake.set()

    def _on_part(self, message: dict[Any, Any]) -> None:
        self._parts = True
        self._wake.set()

    def _on_change(self) -> None:
        # Messages may have been missed while (re)subscribing: act as if each kind had come.
        self._parts = self._place_now = True
        self._on_wake({})

    def _place_gangs(self) -> None:
        """Try to place the waiting gang jobs (on any workers, this one or not)."""
        self._place_now = False
        self._next_placement = time.monotonic() + PLACE_INTERVAL
        try:
            waiting = self._placer.place()
            # Not this worker's turn: another just tried; try again at the next interval regardless.
            self._gangs = max(self._gangs, 1) if waiting is None else waiting
        except redis.exceptions.ResponseError as exc:
            # A record the script cannot read must not stop the worker; the next try may do better.
            log.error("worker %s: placing gang jobs failed: %s", self.display_name, exc)

    def _on_new_queue(self, message: dict[Any, Any]) -> None:
        self._served.look_soon()
        self._submitted = True
        self._wake.set()

    def _stop_job(self, job_id: str, reason: StopReason) -> None:
        with self._lock:
            runner = self._runners.get(job_id)
        if runner is not None:
            log.info("job %s: stopping its processes (%s)", job_id, reason)
            runner.stop(reason)

    def _stop_all(self, reason: StopReason) -> None:
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.stop(reason)

    def _shutdown(self) -> None:
        """Warm shutdown (first SIGTERM/SIGINT): take no new jobs; running ones finish."""
        self._stop_requested = True
        _aside(self._warm_shutdown)

    def _warm_shutdown(self) -> None:
        log.info(
            "worker %s: finishing %d running job(s), then stopping; signal again to stop them now",
            self.display_name,
            len(self._runners),
        )
        self._wake.set()

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """Cold shutdown (second signal): stop running jobs and give them back to their queues."""
        self._stop_requested = True
        _aside(self._cold_shutdown)

    def _cold_shutdown(self) -> None:
        log.warning("worker %s: stopping now; running jobs go back to their queues", self.display_name)
        self._stop_all("requeue")
        self._wake.set()

    def _give_back_claimed(self) -> None:
        """Jobs claimed and not started go back to their queues."""
        with self._lock:
            unstarted = [claim.job_id for claim in self._claimed]
            self._claimed.clear()
        if unstarted:
            self.store.requeue(
                "returned",
                f"worker {self.display_name} stopped before starting the job; it goes back to its queue",
                unstarted,
            )

    def teardown(self) -> None:
        # Also the end of a burst: a job ending from now on claims no next one.
        self._stop_requested = True
        self._give_back_claimed()
        self._pool.shutdown(wait=True)
        self._give_back_claimed()  # what a job's end claimed before it saw the stop
        self._context.supervisor.close()
        self._context.folders.close()
        if self._context.functions is not None:
            self._context.functions.executors.close()
        self._containment.close()
        if self._context.gpu_memory is not None:
            self._context.gpu_memory.close()
        super().teardown()  # type: ignore[no-untyped-call]


def _contain(settings: Settings, name: str, offer: Offer) -> tuple[Containment, Offer]:
    """How this worker contains its jobs (``settings.containment``), and its offer saying so:
    :class:`ConfigError` if a mode asked for by name cannot be had here."""
    try:
        containment = open_containment(cast(Mode, settings.containment), name, offer.memory)
        return containment, offer.model_copy(update={"containment": containment.describe()})
    except OSError as exc:
        raise ConfigError(
            f"GPULAYER_CONTAINMENT={settings.containment}: not available here: {exc.strerror}"
        ) from None


def _alive(holder: Holder, host: str) -> bool:
    """Whether the process registered under a name still runs: by its pid on this machine (a
    process started after the registration is another one), else by its heartbeats."""
    if holder.host == host:
        try:
            process = psutil.Process(holder.pid)
            started = process.create_time()
            if process.status() == psutil.STATUS_ZOMBIE:
                return False  # it ended; its parent (init, for a worker `up` started) has not reaped it yet
        except (psutil.Error, ValueError):
            return False
        return holder.pid != os.getpid() and (holder.birth is None or started <= holder.birth.timestamp() + 1)
    if holder.last_heartbeat is None:
        return False
    silent = (datetime.now(timezone.utc) - holder.last_heartbeat).total_seconds()
    return silent <= holder.heartbeat * SILENT_BEATS


def _signer(identity: str, keyring: Keyring) -> ResultSigner:
    if keyring.result_key is None or not identity:
        raise ConfigError(
            "this worker's access is no identity's (a token made before each machine had its own): "
            "get one with `gpulayer access add worker NAME` on the admin's machine"
        )
    return ResultSigner(identity, keyring.result_key)


def _timing(lease_ttl: float, heartbeat: float) -> tuple[float, float]:
    """The lease and the heartbeat that renews it, checked."""
    if not 0 < heartbeat < lease_ttl:
        raise ConfigError(f"the heartbeat ({heartbeat:g} s) must be shorter than the lease ({lease_ttl:g} s)")
    return lease_ttl, heartbeat


def _hold(settings: Settings) -> Hold:
    """How long a worker held for a gang job waits for the rest before it is let go (ms)."""
    return Hold(int(settings.gang_hold_after * 1000), HOLD_TTL_MS)


def _aside(work: Callable[[], None]) -> None:
    """Run ``work`` in a thread of its own: a signal handler runs between two steps of the main
    thread, which may be holding a lock ``work`` needs (the wake-up event's, the runners'), and would
    wait on itself for ever."""
    threading.Thread(target=work, name="gpulayer-shutdown", daemon=True).start()


def _address_towards(connection: Redis) -> str:
    """This machine's address on the route to Redis: what other workers, which reach the same Redis,
    most likely reach it at."""
    pool = connection.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
        return address_towards(host, int(port))
    kwargs = pool.connection_kwargs
    host = kwargs.get("host")
    if not host:  # a Unix socket: Redis, and so every worker, is on this machine
        return "127.0.0.1"
    return address_towards(host, int(kwargs.get("port", 6379)))


def _read_spec(raw: bytes | None) -> JobSpec:
    """The stored spec, or ValueError with a one-line reason: a job written to Redis by anything
    other than a client can be missing, garbled or huge, and must fail, not crash the worker."""
    if raw is None:
        raise ValueError("it has no spec")
    if len(raw) > MAX_SPEC_BYTES:
        raise ValueError(f"its spec is {len(raw)} bytes, over the {MAX_SPEC_BYTES} allowed")
    try:
        return parse_spec(raw)  # parsed once for the many jobs of a loop or a map that share it
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None
