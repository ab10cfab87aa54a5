"""The one way in: the CLI, the SDK and the web API all go through :class:`Client` (a server's tokens,
sessions and monitoring through :class:`gpulayer.service.Service`, over the same stores)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from . import archive, placement, private, submits
from .access import Access
from .archive_server import ArchiveServer
from .calls import Call, Calls
from .errors import (
    ArtifactTooLarge,
    InvalidJobSpec,
    JobNotFound,
    Unschedulable,
    WaitTimeout,
    WorkerNotFound,
)
from .inventory import WorkerInfo
from .job import Job
from .models import (
    JobRecord,
    JobSpec,
    JobState,
    validated,
)
from .network import redact
from .object_store import ObjectStore
from .options import CallOptions, SubmitKeywords, SubmitOptions
from .placement import Plan
from .provisioned import Machine
from .requirements import Requirements
from .served_inputs import ServedInputs, packed
from .settings import Settings
from .store.artifacts import INPUTS_ARCHIVE, OUTPUTS_ARCHIVE, SOURCE_ARCHIVE, HeldArchive
from .store.connection import BLOCK_MS, connect
from .store.jobs import Collected, new_job_id, under_new_ids
from .store.readahead import ReadAhead
from .store.sender import Sender
from .store.stores import Stores
from .units import format_size

PathLike = str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class Away:
    """Where a submit's files over what Redis holds go: its inputs served by this client or put in
    the object store (None: into Redis); its outputs' URLs made by the object store ``outputs``."""

    inputs: ServedInputs | ObjectStore | None = None
    outputs: ObjectStore | None = None


#: The longest (ms) a wait on many jobs blocks on the first :data:`_FIRST` of them at a time.
_TURN = 50
_FIRST = 64
#: How often (s) a wait on many jobs reads every one's done stream, to catch those that ended out of order.
_SWEEP_EVERY = 0.1
#: :meth:`Client.submit_many` sends this many jobs per round trip, under one signature.
SUBMIT_BATCH = 1000


class Client:
    """A connection to one GPUlayer installation.

    ``access`` says how to reach it (its Redis user, CA and keys: see :mod:`gpulayer.access`); by
    default an access token in ``GPULAYER_ACCESS_TOKEN``, else the strongest role this machine holds
    (what `gpulayer up`, `join` or `connect` kept). ``redis_url`` (default ``GPULAYER_REDIS_URL``)
    replaces its Redis URL. Nothing is sent to Redis until the first call. Where none of these is
    configured, the first client of a process starts a private installation for it, stopped when it
    exits (:mod:`gpulayer.private`; ``GPULAYER_AUTOSTART=0`` turns that off).

    With ``background_submits``, :meth:`submit` of a job without files or an idempotency key returns
    before the job is in Redis: a thread sends the submits, many per round trip and under one
    signature. Every call that reads or changes jobs waits for them first (:meth:`flush`), and
    raises :class:`SubmitFailed` for those that did not get there; so does the next submit.

    A function's result is unpickled as data only (see :mod:`gpulayer.unpickling`): a global that is
    not data raises :class:`UnsafePickle`, uncalled. ``allow_pickle`` unpickles results whole, for
    workers trusted with code (a remote function's own ``allow_pickle`` overrides it).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        access: Access | None = None,
        background_submits: bool = False,
        allow_pickle: bool = False,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.access = access or private.resolve(redis_url or self.settings.redis_url, self.settings)
        self.redis_url = self.access.redis_url
        self.redis = connect(self.redis_url, ca=self.access.ca)
        self.stores = Stores.open(self.redis, self.settings, self.access.keyring)
        self.keys = self.stores.keys
        self._calls = Calls(
            self.settings,
            self.stores.jobs,
            self.stores.artifacts,
            self.stores.registry,
            self.access.keyring,
            allow_pickle,
        )
        self._sender = (
            Sender(self.stores.jobs, SUBMIT_BATCH, 10 * SUBMIT_BATCH) if background_submits else None
        )
        self._ends = ReadAhead(self.stores.jobs)
        #: What serves the inputs too large for Redis of the jobs this client submitted, by job id.
        self._serving: dict[str, ArchiveServer] = {}

    def __repr__(self) -> str:
        return f"Client({redact(self.redis_url)!r})"

    def close(self) -> None:
        """Stops what this client does in the background (submits, serving inputs: a job whose worker
        has not pulled them yet fails) and closes its connection."""
        for server in self._serving.values():
            server.stop()
        for server in self._serving.values():
            # Ended before the connection closes: no word of serving after this, none on a closed socket.
            server.join(timeout=5)
        try:
            if self._sender is not None:
                self._sender.close()
        finally:
            self.redis.close()

    def flush(self) -> None:
        """Wait until every job submitted in the background is in Redis (see :class:`Client`);
        :class:`SubmitFailed` for those that are not. Without ``background_submits``, nothing to do."""
        if self._sender is not None:
            self._sender.flush()

    def submit(
        self,
        command: str | Sequence[str],
        *,
        source: PathLike | None = None,
        inputs: Iterable[PathLike] = (),
        requirements: Requirements | None = None,
        options: SubmitOptions | None = None,
        **keywords: Unpack[SubmitKeywords],
    ) -> Job:
        """Queue ``command`` (a list of arguments, or a string split like a shell would; it runs without
        a shell). ``source`` is a folder shipped and unpacked as the job's working folder; each input
        lands there under its base name.

        How it runs is a :class:`SubmitOptions` (``options``), or its fields as keywords: ``env``,
        ``timeout``, ``name``, ``outputs`` (paths or globs uploaded when the job ends), ``priority``,
        ``retries`` of the failures ``retry_on`` names after ``retry_delay`` seconds (doubling each
        time), ``idempotency_key`` (a second submit with the same key returns the first job),
        ``fail_if_unschedulable`` (refuse, :class:`Unschedulable`, a job no connected worker could
        ever run), and ``nodes``, ``procs_per_node``, ``launcher``, which make it a gang job
        (docs/distributed.md). What it needs is a :class:`Requirements` (``requirements``), or its
        fields as keywords (``accelerator``, ``gpus``, ``gpu_memory``, ``gpu_name``, ``frameworks``,
        ``cpus``, ``memory``, ``labels``, ``target``: a worker on this machine, another, or any; sizes
        may be strings like ``"24GB"``). Either, not both.

        Everything is checked before anything is written; a submit that fails leaves nothing in Redis.
        """
        options, needs = submits.options_and_needs(options, requirements, keywords, self.settings.profiles)
        argv = submits.argv(command)
        source_files = (
            archive.source_manifest(Path(source), self.settings.max_source_bytes, self.settings.home)
            if source
            else None
        )
        input_files = archive.inputs_manifest(Path(path) for path in inputs)
        if source_files is not None:
            submits.no_input_over_the_source(source_files, input_files)
        spec = submits.command_spec(
            argv,
            options,
            needs,
            source=source_files is not None,
            inputs=[arcname for arcname in input_files.members if "/" not in arcname],
            environment=submits.environment(
                options, Path(source) if source else None, self.settings.profiles
            ),
        )
        if options.fail_if_unschedulable:
            self._check_schedulable(spec)
        # Inputs over what Redis holds go to the object store, else are served by this client until a
        # worker pulled them.
        big = bool(spec.inputs) and input_files.size > self.settings.redis_outputs_max_bytes
        store = ObjectStore.configured(self.settings) if big or spec.outputs else None
        serve = big and store is None
        total = (0 if big else input_files.size) + (source_files.size if source_files else 0)
        if total > self.settings.max_job_bytes:
            raise ArtifactTooLarge(
                f"the job's source and inputs hold {format_size(total)}, above the "
                f"{format_size(self.settings.max_job_bytes)} per-job cap (GPULAYER_MAX_JOB_BYTES)"
            )
        uploads = {SOURCE_ARCHIVE: source_files, INPUTS_ARCHIVE: input_files if spec.inputs else None}
        idempotency_key = options.idempotency_key
        if (
            self._sender is not None
            and not idempotency_key
            and store is None
            and all(m is None for m in uploads.values())
        ):
            self.stores.jobs.dump(spec)  # its size checked now, not in the background
            job_id = new_job_id()
            self._sender.put(job_id, spec)
        else:
            self.flush()  # after the jobs submitted before it
            retention = self.settings.retention_seconds
            served = (
                ServedInputs.pack(input_files, self.settings.home, self.stores.transfers, retention)
                if serve
                else None
            )
            try:
                away = Away(served or (store if big else None), store if spec.outputs else None)
                [job_id] = under_new_ids(
                    1, lambda ids: {0: self._submit_as(ids[0], spec, uploads, idempotency_key, away)}
                )
            except BaseException:
                if served is not None:
                    served.remove()
                raise
            if served is not None:
                key = self.access.keyring.signer()
                self._serving[job_id] = served.serve(self.stores, job_id, key, retention)
        self._ends.submitted((job_id,))
        return Job(self, job_id)

    def _submit_as(
        self,
        job_id: str,
        spec: JobSpec,
        uploads: dict[str, archive.Manifest | None],
        idempotency_key: str | None,
        away: Away | None = None,
    ) -> str | None:
        """Upload the archives (the inputs out of Redis where ``away`` says so: only their record)
        and submit the job under ``job_id``: that id, an existing job's (the idempotency key's), or
        None if the id was taken."""
        away = away or Away()
        staged = any(manifest is not None for manifest in uploads.values()) or away.outputs is not None
        upload = secrets.token_hex(4) if staged else ""
        try:
            files = {
                name: self._upload(job_id, upload, name, manifest)
                for name, manifest in uploads.items()
                if manifest is not None and not (away.inputs is not None and name == INPUTS_ARCHIVE)
            }
            if away.inputs is not None and (manifest := uploads[INPUTS_ARCHIVE]) is not None:
                held = _put_away(job_id, manifest, away.inputs)
                self.stores.artifacts.hold_inputs(job_id, upload, INPUTS_ARCHIVE, held)
                files[INPUTS_ARCHIVE] = held.sha256
            if away.outputs is not None:
                urls = away.outputs.presign(job_id, OUTPUTS_ARCHIVE)
                self.stores.artifacts.plan_outputs(job_id, upload, urls.put or "", urls.get)
            submitted = self.stores.jobs.submit(job_id, spec, upload, files, idempotency_key)
        except BaseException:
            if staged:
                self.stores.artifacts.discard_inputs(job_id, upload)
            raise
        if submitted != job_id and staged:  # nothing of this try is the job's
            self.stores.artifacts.discard_inputs(job_id, upload)
        return submitted

    def _upload(self, job_id: str, upload: str, name: str, manifest: archive.Manifest) -> str:
        """Stage one archive of the job's; its SHA-256, which the job's signature names."""
        with tempfile.SpooledTemporaryFile(archive.SPOOL_BYTES) as file:
            manifest.write(file)
            file.seek(0)
            return self.stores.artifacts.put_inputs(job_id, upload, name, file)

    def submit_many(
        self,
        commands: Iterable[str | Sequence[str]],
        *,
        requirements: Requirements | None = None,
        options: SubmitOptions | None = None,
        **keywords: Unpack[SubmitKeywords],
    ) -> list[Job]:
        """Queue one job per command, all with the same options (those of :meth:`submit`, without
        files or an idempotency key), :data:`SUBMIT_BATCH` per round trip and under one signature:
        many times faster than a loop of submits. Every command is checked before anything is
        written."""
        options, needs = submits.options_and_needs(options, requirements, keywords, self.settings.profiles)
        if options.idempotency_key is not None:
            raise InvalidJobSpec("invalid job: a list of jobs takes no idempotency_key: it names one job")
        argvs = [submits.argv(command) for command in commands]
        if not argvs:
            return []
        environment = submits.environment(options, None, self.settings.profiles)
        first = submits.command_spec(argvs[0], options, needs, environment=environment)
        # One spec checked whole; the others differ from it only in their command.
        specs = [first, *(first.with_command(argv) for argv in argvs[1:])]
        if options.fail_if_unschedulable:
            self._check_schedulable(first)
        self.flush()
        ids = under_new_ids(len(specs), functools.partial(self._submit_batches, specs))
        self._ends.submitted(ids)
        return [Job(self, job_id) for job_id in ids]

    def _submit_batches(self, specs: list[JobSpec], ids: dict[int, str]) -> dict[int, str | None]:
        """Submit ``specs[index]`` under ``ids[index]``, :data:`SUBMIT_BATCH` per script call, each
        batch made while Redis runs the one before; the id each got, or None."""
        indices = list(ids)
        batches = [
            [(ids[index], specs[index]) for index in indices[start : start + SUBMIT_BATCH]]
            for start in range(0, len(indices), SUBMIT_BATCH)
        ]
        created = self.stores.jobs.submit_batches(batches)
        return dict(zip(indices, itertools.chain.from_iterable(created), strict=True))

    def _check_schedulable(self, spec: JobSpec) -> None:
        plan = self.plan(spec.requirements, nodes=spec.distributed.nodes if spec.distributed else 1)
        if not plan.schedulable:
            raise Unschedulable("no connected worker could ever run this job: " + _reasons_text(plan))

    def submit_calls(
        self, function: Callable[..., Any], calls: Iterable[Call], options: CallOptions | None = None
    ) -> list[Job]:
        """Submit one job per call of ``function`` (``(args, kwargs)`` each), many per round trip.
        What ``@gpulayer.remote`` uses; see :mod:`gpulayer.functions`."""
        self.flush()
        return [Job(self, job_id) for job_id in self._calls.submit(function, calls, options or CallOptions())]

    def map_calls(
        self,
        function: Callable[..., Any],
        calls: Iterable[Call],
        options: CallOptions | None = None,
        *,
        ordered: bool = True,
        max_in_flight: int | None = None,
        return_exceptions: bool = False,
    ) -> Iterator[Any]:
        """Submit the calls and yield their values (see :meth:`gpulayer.RemoteFunction.map`)."""
        self.flush()
        return self._calls.map(
            function, calls, options or CallOptions(), ordered, max_in_flight, return_exceptions
        )

    def function_result(
        self, job_id: str, timeout: float | None = None, *, allow_pickle: bool | None = None
    ) -> Any:
        """Wait for a function job to end; return what it returned, or raise the exception it raised
        (or :class:`JobFailed`). :class:`WaitTimeout` after ``timeout`` seconds. ``allow_pickle``
        (None: as the client was made) unpickles the result whole instead of as data only."""
        return self._calls.value(self._calls.ending(self._wait(job_id, timeout)), allow_pickle)

    def _wait(self, job_id: str, timeout: float | None) -> JobRecord:
        """Block until the job ends and return its record; :class:`JobNotFound` if there is none,
        :class:`WaitTimeout` after ``timeout`` seconds. One round trip for a job that has ended (or
        was read ahead), one per :data:`BLOCK_MS` while it runs."""
        self.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            block = _block_ms(deadline, BLOCK_MS)
            done, record = self._ends.peek_end(job_id, block)
            if record is None:
                raise JobNotFound(f"no job {job_id!r} (never submitted, or past its retention)")
            if done:
                return record
            if block is None:
                raise WaitTimeout(f"job {job_id} is still {record.state.value} after {timeout:g} s")

    def as_completed(self, jobs: Iterable[Job | str], timeout: float | None = None) -> Iterator[JobRecord]:
        """Each job's record as it ends, those already ended first: a read of all their done streams
        every :data:`_SWEEP_EVERY` seconds and a blocking read of the first :data:`_FIRST`'s in
        between, and one read of the ended ones' records per turn, not a round trip per job.
        :class:`JobNotFound` at once for one that does not exist; :class:`WaitTimeout` once
        ``timeout`` seconds have passed with some still not ended."""
        self.flush()
        pending = list(dict.fromkeys(job.id if isinstance(job, Job) else job for job in jobs))
        self._ends.forget(pending)
        records = self.stores.jobs.get_many(pending)
        missing = [job_id for job_id, record in zip(pending, records, strict=True) if not record]
        if missing:
            raise JobNotFound(f"no job {missing[0]!r} (never submitted, or past its retention)")
        deadline = None if timeout is None else time.monotonic() + timeout
        next_sweep = 0.0
        while pending:
            # Jobs tend to end in the order given: between sweeps of them all (a read of every done
            # stream), a turn blocks on the first few only. Sweeping them all after each end made
            # Redis read every stream of a long wait once per job: more than the jobs' own cost.
            ended: list[str] = []
            if time.monotonic() >= next_sweep:
                ended = self.stores.jobs.ended_among(pending)
                next_sweep = time.monotonic() + _SWEEP_EVERY
            if not ended:
                block = _block_ms(deadline, _TURN)
                if block is None:
                    raise WaitTimeout(f"{len(pending)} job(s) still not ended after {timeout:g} s")
                ended = self.stores.jobs.ended_among(pending[:_FIRST], block_ms=block)
            finished = set(ended)
            pending = [job_id for job_id in pending if job_id not in finished]
            for job_id, record in zip(ended, self.stores.jobs.get_many(ended), strict=True):
                if record is None:  # ended, then expired before it was read
                    raise JobNotFound(f"no job {job_id!r} (never submitted, or past its retention)")
                yield record

    def wait_all(self, jobs: Iterable[Job | str], timeout: float | None = None) -> list[JobRecord]:
        """The records of all the jobs once each has ended, in the order given (see :meth:`as_completed`)."""
        ids = [job.id if isinstance(job, Job) else job for job in jobs]
        records = {record.id: record for record in self.as_completed(ids, timeout)}
        return [records[job_id] for job_id in ids]

    def get(self, job_id: str) -> Job:
        """The job with this id; :class:`JobNotFound` if there is none."""
        job = Job(self, job_id)
        job.status()
        return job

    def jobs(self, state: JobState | str | None = None, limit: int = 100, offset: int = 0) -> list[JobRecord]:
        """The newest jobs first, all or in one state; ``offset`` skips that many (paging)."""
        self.flush()
        return self.stores.jobs.list(JobState(state) if state else None, limit, offset)

    def job_counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (ended ones until their retention)."""
        self.flush()
        return self.stores.jobs.counts()

    def collect(self, older_than: float | None = None, *, dry_run: bool = False) -> Collected:
        """End now what retention would end later: every job that ended ``older_than`` seconds ago or
        earlier (default: this client's retention, ``GPULAYER_RETENTION_SECONDS``) goes, with its logs
        and outputs; returns what was freed (``dry_run``: what would be, deleting nothing)."""
        self.flush()
        return self.stores.jobs.collect(
            self.settings.retention_seconds if older_than is None else older_than, dry_run
        )

    def workers(self) -> list[WorkerInfo]:
        """The workers connected now, by name, with what their jobs hold."""
        return self.stores.workers.list()

    def machines(self) -> list[Machine]:
        """The machines the autoscaler started (docs/capacity.md), the newest first: those that run,
        and those that stopped in the last day."""
        found = self.stores.capacity.machines().values()
        return sorted(found, key=lambda machine: machine.created, reverse=True)

    def stop_worker(self, name: str, *, requeue: bool = False) -> None:
        """Ask a worker to stop (RQ's shutdown command): it finishes its running jobs first, or with
        ``requeue`` stops them and puts them back in their queues. :class:`WorkerNotFound` if no
        worker of that name is connected."""
        if not any(worker.name == name for worker in self.workers()):
            raise WorkerNotFound(f"no worker named {name!r} is connected")
        payload = {"command": "shutdown", "requeue": requeue}
        self.redis.publish(self.keys.pubsub(name), json.dumps(payload))

    def plan(self, requirements: Requirements | None = None, *, nodes: int = 1, **fields: Any) -> Plan:
        """Where a job with these requirements would run now, and why not on each other worker;
        nothing is submitted. Takes a :class:`Requirements` or its fields; ``nodes``: for a gang job
        with that many nodes."""
        return placement.plan(requirements or validated(Requirements, fields), self.workers(), nodes)


def _block_ms(deadline: float | None, most: int) -> int | None:
    """How long (ms) a blocking read may wait: ``most``, or less before ``deadline`` (monotonic), at
    least 1; None once the deadline has passed."""
    if deadline is None:
        return most
    left = deadline - time.monotonic()
    return max(1, min(most, int(left * 1000))) if left > 0 else None


def _put_away(job_id: str, manifest: archive.Manifest, inputs: ServedInputs | ObjectStore) -> HeldArchive:
    """Job ``job_id``'s inputs archive's record: served by this client, or put in the object store."""
    if isinstance(inputs, ServedInputs):
        return inputs.record
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / INPUTS_ARCHIVE
        size, sha256 = packed(manifest, path)
        urls = inputs.upload(job_id, INPUTS_ARCHIVE, path)
    return HeldArchive("", size, sha256, None, manifest.size, urls.get)


def _reasons_text(plan: Plan) -> str:
    return "; ".join(f"{r.worker}: {r.reason}" if r.worker else r.reason for r in plan.reasons)
