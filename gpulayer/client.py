"""The one way in: the CLI, the SDK and the web API all go through :class:`Client` (a server's tokens,
sessions and monitoring through :class:`gpulayer.service.Service`, over the same stores)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from redis.exceptions import RedisError
from typing_extensions import Unpack

from . import archive, placement, private, submits
from .access import Access
from .calls import Call, Calls
from .errors import (
    ArtifactTooLarge,
    GpulayerError,
    InvalidJobSpec,
    JobNotFinished,
    JobNotFound,
    OutputNotProduced,
    Unschedulable,
    WaitTimeout,
    WorkerNotFound,
)
from .home import private_folder
from .inventory import WorkerInfo
from .models import (
    JobRecord,
    JobSpec,
    JobState,
    LogLine,
    validated,
)
from .network import redact
from .options import CallOptions, SubmitKeywords, SubmitOptions
from .placement import Plan
from .provisioned import GANG, Decision, Machine
from .pulls import Progress, Pull
from .requirements import Requirements
from .settings import Settings
from .store.artifacts import (
    INPUTS_ARCHIVE,
    OUTPUTS_ARCHIVE,
    SOURCE_ARCHIVE,
    MissingArtifact,
)
from .store.connection import BLOCK_MS, connect
from .store.jobs import Collected, new_job_id, under_new_ids
from .store.readahead import ReadAhead
from .store.sender import Sender
from .store.stores import Stores
from .units import format_size
from .unpacking import extract

PathLike = str | os.PathLike[str]
#: Where, in a client's home, outputs a worker keeps are pulled to (and resumed from).
DOWNLOADS = "downloads"
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

    def __repr__(self) -> str:
        return f"Client({redact(self.redis_url)!r})"

    def close(self) -> None:
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
        total = input_files.size + (source_files.size if source_files else 0)
        if total > self.settings.max_job_bytes:
            raise ArtifactTooLarge(
                f"the job's source and inputs hold {format_size(total)}, above the "
                f"{format_size(self.settings.max_job_bytes)} per-job cap (GPULAYER_MAX_JOB_BYTES)"
            )
        uploads = {SOURCE_ARCHIVE: source_files, INPUTS_ARCHIVE: input_files if spec.inputs else None}
        idempotency_key = options.idempotency_key
        if self._sender is not None and not idempotency_key and all(m is None for m in uploads.values()):
            self.stores.jobs.dump(spec)  # its size checked now, not in the background
            job_id = new_job_id()
            self._sender.put(job_id, spec)
        else:
            self.flush()  # after the jobs submitted before it
            [job_id] = under_new_ids(
                1, lambda ids: {0: self._submit_as(ids[0], spec, uploads, idempotency_key)}
            )
        self._ends.submitted((job_id,))
        return Job(self, job_id)

    def _submit_as(
        self,
        job_id: str,
        spec: JobSpec,
        uploads: dict[str, archive.Manifest | None],
        idempotency_key: str | None,
    ) -> str | None:
        """Upload the archives and submit the job under ``job_id``: that id, an existing job's (the
        idempotency key's), or None if the id was taken."""
        staged = any(manifest is not None for manifest in uploads.values())
        upload = secrets.token_hex(4) if staged else ""
        try:
            files = {
                name: self._upload(job_id, upload, name, manifest)
                for name, manifest in uploads.items()
                if manifest is not None
            }
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


class Job:
    """A handle on one job. Cheap to make; every method asks Redis afresh."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobRecord:
        self.client.flush()
        record = self.client.stores.jobs.get(self.id)
        if record is None:
            raise JobNotFound(f"no job {self.id!r} (never submitted, or past its retention)")
        return record

    def wait(self, timeout: float | None = None) -> JobRecord:
        """Block until the job ends and return its record; :class:`WaitTimeout` after ``timeout`` seconds."""
        return self.client._wait(self.id, timeout)

    def logs(self, follow: bool = False, rank: int | None = None) -> Iterator[LogLine]:
        """Its log lines so far; with ``follow``, then each new line as it comes, until the job ends.
        ``rank``: of a gang job, only the lines that rank printed."""
        self.status()
        lines = self.client.stores.logs.lines(self.id, follow=follow)
        return lines if rank is None else (line for line in lines if line.rank == rank)

    def log_page(self, after: str = "0-0", limit: int = 1000) -> list[tuple[str, LogLine]]:
        """Up to ``limit`` stored lines after the line with id ``after`` (``0-0``: from the first),
        each with its id: the cursor of the next page."""
        self.status()
        return self.client.stores.logs.page(self.id, after, limit)

    def log_tail(self, count: int = 50) -> list[tuple[str, LogLine]]:
        """The last ``count`` stored lines, oldest first, each with its id."""
        self.status()
        return self.client.stores.logs.tail(self.id, count)

    def why(self) -> Plan:
        """For a queued job: where it would start now, or why each worker cannot run it; and what the
        autoscaler decided for it, where one runs."""
        spec = self.status().spec
        plan = self._plan(spec, self.client.workers())
        decision = self._capacity(spec)
        return plan.model_copy(update={"capacity": decision.text}) if decision else plan

    def capacity(self) -> Decision | None:
        """What the autoscaler last decided for this queued job, if one runs and it needs a machine."""
        return self._capacity(self.status().spec)

    def _capacity(self, spec: JobSpec) -> Decision | None:
        gang = spec.distributed is not None and spec.distributed.nodes > 1
        return self.client.stores.capacity.decision(
            f"{GANG}{self.id}" if gang else self.client.keys.queue_for(spec.queue)
        )

    def _plan(self, spec: JobSpec, workers: list[WorkerInfo]) -> Plan:
        return placement.plan(spec.requirements, workers, spec.distributed.nodes if spec.distributed else 1)

    def unrunnable(self, grace: float = 0.0) -> Plan | None:
        """The plan of a queued job no connected worker could ever run (its reasons say why, worker
        by worker); None if it is not queued, or some connected worker could run it (busy or not).
        While no worker is connected at all, it looks again for up to ``grace`` seconds: a worker
        started beside the job may not have registered yet. One that joins later is not waited for."""
        deadline = time.monotonic() + grace
        while True:
            record = self.status()
            if record.state is not JobState.QUEUED:
                return None
            workers = self.client.workers()
            plan = self._plan(record.spec, workers)
            if plan.schedulable:
                return None
            if workers or time.monotonic() >= deadline:
                return plan
            time.sleep(_JOIN_POLL)

    @contextlib.contextmanager
    def saying_why_queued(self, after: float, say: Callable[[str], None]) -> Iterator[None]:
        """While the block runs (a wait): if the job is still queued ``after`` seconds in, ``say`` a line
        saying so and each line of :meth:`why`, once. A caller that waits would otherwise see nothing
        of a job no connected worker can start yet."""

        def hint() -> None:
            try:
                if self.status().state is JobState.QUEUED:
                    for line in [f"job {self.id} is still queued:", *self.why().lines()]:
                        say(line)
            except (GpulayerError, RedisError):
                pass  # a hint only: the wait itself reports what went wrong

        timer = threading.Timer(after, hint)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def cancel(self) -> bool:
        """Cancel the job: a queued job ends at once; a running one is stopped by its worker within about
        a second. Returns False, changing nothing, if the job had already ended."""
        self.client.flush()
        outcome = self.client.stores.jobs.cancel(self.id)
        if outcome == "missing":
            raise JobNotFound(f"no job {self.id!r} (never submitted, or past its retention)")
        return outcome in ("cancelled", "requested")

    def outputs_archive(self, dest: IO[bytes], progress: Progress | None = None) -> None:
        """Write the job's outputs, as the gzip-compressed tar archive its worker stored, to ``dest``,
        and check that the worker that ran the attempt which made it signed it: :class:`UntrustedPayload`
        if not (what ``dest`` got must then be thrown away); :class:`OutputNotProduced` if it stored
        none (or they expired); :class:`OutputsUnavailable` if they are kept on a worker that is gone.
        ``progress``: called with the bytes so far and in all as outputs a worker keeps come."""
        with self._outputs(self.status(), f"job {self.id} has no stored outputs", progress) as archive:
            shutil.copyfileobj(archive, dest)

    @contextlib.contextmanager
    def _outputs(self, record: JobRecord, missing: str, progress: Progress | None) -> Iterator[IO[bytes]]:
        """The job's outputs archive, checked, open at its start: read from Redis, or pulled from the
        worker that keeps it into the client's downloads folder (resumed there, removed once read)."""
        stores = self.client.stores
        held = stores.artifacts.held_outputs(self.id, OUTPUTS_ARCHIVE)
        if held is None:
            with tempfile.SpooledTemporaryFile(archive.SPOOL_BYTES) as file:
                try:
                    sha256, seal = stores.artifacts.get_outputs(self.id, OUTPUTS_ARCHIVE, file)
                except MissingArtifact:
                    raise OutputNotProduced(missing) from None
                stores.registry.check_archive(record, OUTPUTS_ARCHIVE, sha256, seal)
                file.seek(0)
                yield file
            return
        sender = stores.registry.check_archive(record, OUTPUTS_ARCHIVE, held.sha256, held.seal)
        downloads = private_folder(self.client.settings.home / DOWNLOADS)
        named = hashlib.sha256(self.id.encode()).hexdigest()[:16]
        partial = downloads / f"{named}-{held.sha256[:16]}.part"
        Pull(stores.transfers, sender, self.id, OUTPUTS_ARCHIVE, held, partial, progress).run()
        with open(partial, "rb") as file:
            yield file
        partial.unlink(missing_ok=True)

    def download_outputs(self, dest: PathLike, progress: Progress | None = None) -> list[Path]:
        """Unpack the job's outputs into ``dest`` (made if missing), each at its path in the job's
        folder (``results/a.csv`` lands in ``dest/results/a.csv``); returns the files written. Only
        an archive signed by the worker that ran the job is unpacked (else :class:`UntrustedPayload`,
        nothing written), and of it only what the job declared as outputs, inside ``dest``. Raises
        :class:`ArchiveError`, having written nothing, if ``dest`` or a folder in it cannot take them,
        and :class:`OutputNotProduced` (after writing the rest) if a declared output was not produced.
        Outputs too large for Redis come from the worker that keeps them (``progress`` is told how far
        along), resuming a pull that stopped; :class:`OutputsUnavailable` if that worker is gone."""
        record = self.status()
        if not record.state.is_terminal:
            raise JobNotFinished(f"job {self.id} is {record.state.value}; outputs are uploaded when it ends")
        if not record.spec.outputs:
            return []
        if record.outputs is None:
            reason = f": {record.reason}" if record.reason else ""
            raise OutputNotProduced(
                f"job {self.id} stored no outputs (it ended {record.state.value}{reason})"
            )
        # Made by the unpacking, once it found room for every file: an unwritable folder is one
        # line, and nothing is half written.
        with self._outputs(record, f"the outputs of job {self.id} have expired", progress) as file:
            written = extract(
                file,
                Path(dest),
                max_bytes=max(self.client.settings.max_job_bytes, record.outputs.bytes),
                replace=True,
                keep=archive.declared(record.spec.outputs),
            )
        if record.outputs.missing:
            raise OutputNotProduced("output not produced: " + ", ".join(record.outputs.missing))
        return written


def _block_ms(deadline: float | None, most: int) -> int | None:
    """How long (ms) a blocking read may wait: ``most``, or less before ``deadline`` (monotonic), at
    least 1; None once the deadline has passed."""
    if deadline is None:
        return most
    left = deadline - time.monotonic()
    return max(1, min(most, int(left * 1000))) if left > 0 else None


#: How long a wait looks for a worker while none is connected before it says that no worker could run
#: the job (s): a worker started beside it (`gpulayer up`'s, a test's) registers well within this.
WORKER_JOIN_GRACE = 10.0
#: How often :meth:`Job.unrunnable` looks for a worker while none is connected (s).
_JOIN_POLL = 0.5


def _reasons_text(plan: Plan) -> str:
    return "; ".join(f"{r.worker}: {r.reason}" if r.worker else r.reason for r in plan.reasons)
