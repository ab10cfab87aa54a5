"""Job records as the client sees them: create, read, list, cancel, and wait for the end."""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter
from redis import Redis
from redis.client import Pipeline
from rq.utils import now

from ..errors import InvalidJobSpec
from ..models import (
    MAX_SPEC_BYTES,
    SPEC_TOO_LARGE,
    Attempt,
    GangPart,
    JobRecord,
    JobSpec,
    JobState,
    JobUsage,
    OutputSummary,
    ReasonCode,
)
from ..settings import Settings
from ..signing import Keyring, seal_job, seal_jobs
from .keys import Keys
from .rq_jobs import description, format_timestamp, parse_timestamp, rq_fields, timestamp
from .scripts import Scripts

#: Ended ids taken off a batch's list per round trip.
_DRAIN = 1000
#: Job ids gc.lua looks at per call.
_COLLECT = 500
#: Done streams one XREAD reads (of jobs being waited on together).
_SWEEP = 500
_REASON_CODE: TypeAdapter[ReasonCode] = TypeAdapter(ReasonCode)


@functools.lru_cache(maxsize=256)
def parse_spec(raw: bytes) -> JobSpec:
    """A stored spec, parsed once: the calls of one ``map`` share theirs (records share it: read-only)."""
    return JobSpec.model_validate_json(raw)


def submitted(reply: list[Any]) -> str | None:
    """The id a submit script's reply names: the new job's, an idempotent match's, or None (id taken)."""
    created, job_id = reply
    return job_id.decode() if created else None


def new_job_id() -> str:
    """A new job's id: random, so two submitters never wait on each other."""
    return secrets.token_hex(6)


def under_new_ids(count: int, submit: Callable[[dict[int, str]], Mapping[int, str | None]]) -> list[str]:
    """The ids of ``count`` jobs that ``submit`` makes: it is given a new random id for each job still to
    make, by the job's index, and answers with the id each got (:func:`submitted`'s). A job whose id was
    taken (None) is given another; ids are random, so two submitters never wait on each other."""
    made: dict[int, str] = {}
    while len(made) < count:
        answers = submit({index: new_job_id() for index in range(count) if index not in made})
        made.update((index, job_id) for index, job_id in answers.items() if job_id is not None)
    return [made[index] for index in range(count)]


@dataclasses.dataclass
class Collected:
    """What :meth:`JobStore.collect` freed (or would free): ended jobs, their output archives, and
    the bytes Redis held for them."""

    jobs: int = 0
    files: int = 0
    bytes: int = 0


class JobStore:
    def __init__(
        self, redis: Redis, keys: Keys, scripts: Scripts, settings: Settings, keyring: Keyring | None = None
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts
        self._retention = settings.retention_seconds
        self._keyring = keyring or Keyring()
        self._dumped: tuple[JobSpec | None, str] = (None, "")

    def submit(
        self,
        job_id: str,
        spec: JobSpec,
        upload: str,
        files: dict[str, str],
        idempotency_key: str | None = None,
    ) -> str | None:
        """Create the job and queue it, with the files staged under ``upload`` as its own from now on, and
        return its id — or, when ``idempotency_key`` was used by a job that still exists, that job's id.
        None if ``job_id`` is taken. ``files``: the SHA-256 of each, by name, signed with the job."""
        return submitted(
            self._scripts.run(
                "submit", *self._submit_call(job_id, spec, upload, files, idempotency_key, None)
            )
        )

    def submit_many(self, jobs: Sequence[tuple[str, JobSpec]]) -> list[str | None]:
        """Create and queue jobs that carry no files and differ only in their command, in one round
        trip, one script call and under one signature: each job's id, or None where the id was taken
        (that job is not created)."""
        [created] = self.submit_batches([jobs])
        return created

    def submit_batches(self, batches: Sequence[Sequence[tuple[str, JobSpec]]]) -> list[list[str | None]]:
        """:meth:`submit_many` for each batch, a script call each, sent one after the other on one
        connection: each batch is made (dumped, sealed) while Redis runs the one before."""
        replies = self._scripts.stream(("submit_many", *self._batch_call(jobs)) for jobs in batches)
        return [
            [job_id if created else None for (job_id, _), created in zip(jobs, reply, strict=True)]
            for jobs, reply in zip(batches, replies, strict=True)
        ]

    def _batch_call(self, jobs: Sequence[tuple[str, JobSpec]]) -> tuple[list[str], list[object]]:
        first = jobs[0][1]
        queue = first.queue
        queue_name = self._keys.queue_for(queue)
        created = now()
        fields = self._fields(first, queue_name, created)
        del fields["description"], fields["gl_spec"]
        args: list[object] = [queue_name, queue.model_dump_json(), int(created.timestamp() * 1_000_000)]
        args.append(len(fields))
        for pair in fields.items():
            args.extend(pair)
        # Dumped once each: the seals and the script both take the dump (each job's spec is its own).
        dumps = [self.dump(spec) for _, spec in jobs]
        signed: list[tuple[str, str, dict[str, str]]] = [
            (job_id, dumped, {}) for (job_id, _), dumped in zip(jobs, dumps, strict=True)
        ]
        for (job_id, spec), dumped, seal in zip(
            jobs, dumps, seal_jobs(self._keyring.signer(), signed), strict=True
        ):
            args.extend((job_id, description(spec.command), dumped, seal))
        return [self._keys.queue(queue_name)], args

    def seals(self, jobs: Sequence[tuple[str, JobSpec, dict[str, str]]]) -> list[str]:
        """The seals of jobs (id, spec, file digests) to submit together: one signature for all."""
        return seal_jobs(
            self._keyring.signer(), [(job_id, self.dump(spec), files) for job_id, spec, files in jobs]
        )

    def queue_submit(
        self,
        pipe: Pipeline,
        job_id: str,
        spec: JobSpec,
        upload: str,
        files: dict[str, str],
        batch: str,
        seal: str,
    ) -> None:
        """Queue a submit on a pipeline run by :meth:`pipeline`, as one of the jobs of ``batch`` (if
        not empty: when the job ends its id is pushed on the batch's list, see :meth:`ended`), with its
        seal from :meth:`seals`. Read its reply with :func:`submitted`."""
        extra = {"gl_batch": batch} if batch else {}
        call = self._submit_call(job_id, spec, upload, files, None, seal, **extra)
        self._scripts.queue(pipe, "submit", *call)

    def pipeline(self, build: Callable[[Pipeline], object]) -> list[Any]:
        """Many submits (and the uploads that go with them) in one round trip: see
        :meth:`Scripts.pipeline`."""
        return self._scripts.pipeline(build)

    def _submit_call(
        self,
        job_id: str,
        spec: JobSpec,
        upload: str,
        files: dict[str, str],
        idempotency_key: str | None,
        seal: str | None,
        **extra: str,
    ) -> tuple[list[str], list[object]]:
        queue = spec.queue
        queue_name = self._keys.queue_for(queue)
        created = now()
        fields = self._fields(spec, queue_name, created)
        # What a worker checks before it runs anything: this spec, under this id, with these files.
        fields["gl_seal"] = seal or seal_job(self._keyring.signer(), job_id, fields["gl_spec"], files)
        fields.update(extra)
        # Microseconds: jobs submitted within one millisecond still list in order (exact in a double).
        args: list[object] = [
            job_id,
            int(created.timestamp() * 1_000_000),
            queue_name,
            queue.model_dump_json(),
            self._keys.idempotency(idempotency_key) if idempotency_key else "",
        ]
        for pair in fields.items():
            args.extend(pair)
        keys = [
            self._keys.job(job_id),
            self._keys.queue(queue_name),
            self._keys.staged_inputs(job_id, upload),
            self._keys.inputs(job_id),
        ]
        return keys, args

    def _fields(self, spec: JobSpec, queue_name: str, created: datetime) -> dict[str, Any]:
        """The new job's hash, but its seal."""
        fields = rq_fields(queue_name, spec.command, spec.timeout, self._retention, created)
        fields["gl_spec"] = self.dump(spec)
        fields["gl_attempt"] = 0
        # What the scripts need to decide on a retry, without parsing the spec.
        fields.update(gl_retries=spec.retries, gl_retry_on=spec.retry_on, gl_retry_delay=spec.retry_delay)
        if spec.distributed:
            fields["gl_nodes"] = spec.distributed.nodes
        if not (spec.source or spec.inputs or spec.distributed):
            # Nothing to fetch before its process starts (a function's call comes with the claim):
            # the claim marks it running itself, and the worker spares a round trip.
            fields["gl_starts_at_claim"] = 1
        return fields

    def dump(self, spec: JobSpec) -> str:
        """The spec as stored (a batch submits one spec many times: dumped once); :class:`InvalidJobSpec`
        if it is too large to store."""
        # One read of the pair: another thread (a web server's, a client's sender) may replace it.
        cached, dumped = self._dumped
        if cached is not spec:
            dumped = spec.model_dump_json(exclude_defaults=True)
            if len(dumped) > MAX_SPEC_BYTES:
                raise InvalidJobSpec(SPEC_TOO_LARGE)
            self._dumped = (spec, dumped)
        return dumped

    def ended(self, batch: str, timeout: float) -> list[str]:
        """The ids of the batch's jobs that ended since the last call, waiting up to ``timeout``
        seconds for the first."""
        key = self._keys.ended(batch)
        pipe = self._redis.pipeline(transaction=False)
        pipe.blpop([key], timeout=max(timeout, 0.001))
        pipe.lpop(key, _DRAIN)
        first, rest = pipe.execute()
        return [raw.decode() for raw in ([first[1]] if first else []) + (rest or [])]

    def ended_among(self, job_ids: Sequence[str], block_ms: int | None = None) -> list[str]:
        """Those of ``job_ids`` whose job has ended, from their done streams read together (a pipeline
        of one XREAD per :data:`_SWEEP` jobs). ``block_ms``: when none has, wait up to that long for
        one of the first :data:`_SWEEP`."""
        pipe = self._redis.pipeline(transaction=False)
        streams = self._sweep(pipe, job_ids, block_ms)
        return _swept(streams, pipe.execute())

    def _sweep(self, pipe: Pipeline, job_ids: Sequence[str], block_ms: int | None = None) -> dict[str, str]:
        """Queue the XREADs of the jobs' done streams; each stream's job, to read the replies with."""
        done = {self._keys.done(job_id): job_id for job_id in job_ids}
        streams = list(done)
        chunks = [streams[:_SWEEP]] if block_ms is not None else _chunks(streams, _SWEEP)
        for chunk in chunks:
            pipe.xread(dict.fromkeys(chunk, "0-0"), count=1, block=block_ms)
        return done

    def exist(self, job_ids: list[str]) -> list[bool]:
        """Whether each job is still stored (not past its retention), in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(self._keys.job(job_id))
        return [bool(found) for found in pipe.execute()] if job_ids else []

    def get(self, job_id: str) -> JobRecord | None:
        """The job, if it exists."""
        return self._found(job_id, cast(dict[bytes, bytes], self._redis.hgetall(self._keys.job(job_id))))

    def peek_end(
        self, job_id: str, ahead: Sequence[str] = (), block_ms: int | None = None
    ) -> tuple[bool, JobRecord | None, list[str]]:
        """Whether the job has ended, and its record (None if there is none), in one round trip: what a
        wait on a job that has already ended costs. ``block_ms``: if it has not ended, first wait up to
        that long for it to end (the record is read after). In the same round trip, those of ``ahead``
        that have ended (as :meth:`ended_among`)."""
        pipe = self._redis.pipeline(transaction=False)
        # Redis answers a blocked client's next commands once it wakes: the record read after the
        # wait, and the jobs that ended while it waited, cost no round trip of their own.
        pipe.xread({self._keys.done(job_id): "0-0"}, count=1, block=block_ms)
        pipe.hgetall(self._keys.job(job_id))
        streams = self._sweep(pipe, ahead)
        done, raw, *swept = pipe.execute()
        return bool(done), self._found(job_id, raw), _swept(streams, swept)

    def _found(self, job_id: str, raw: dict[bytes, bytes]) -> JobRecord | None:
        """The record of a job hash read by id, or None where there is none. Every job hash under
        the prefix is this installation's, whatever its fields say (a garbled queue included)."""
        return self._record(job_id, raw) if raw else None

    def get_many(self, job_ids: list[str]) -> list[JobRecord | None]:
        """Each job's record, or None for one that does not exist (any more): one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for job_id in job_ids:
            self.queue_get(pipe, job_id)
        return [self.record_of(job_id, raw) for job_id, raw in zip(job_ids, pipe.execute(), strict=True)]

    def queue_get(self, pipe: Pipeline, job_id: str) -> None:
        """Queue a read of the job's record, for :meth:`record_of`."""
        pipe.hgetall(self._keys.job(job_id))

    def record_of(self, job_id: str, raw: dict[bytes, bytes]) -> JobRecord | None:
        """The record a queued read found, or None if the job does not exist (any more)."""
        return self._record(job_id, raw) if raw and b"gl_state" in raw else None

    def cancel(self, job_id: str) -> str:
        """'cancelled', 'requested' (its worker will stop it), 'ended' (nothing to do), or 'missing'."""
        return self.cancel_many([job_id])[0]

    def cancel_many(self, job_ids: list[str]) -> list[str]:
        """:meth:`cancel` for each job, in one round trip."""

        def build(pipe: Pipeline) -> None:
            for job_id in job_ids:
                self._scripts.queue(pipe, "cancel", [self._keys.job(job_id)], [job_id, timestamp()])

        return [str(result.decode()) for result in self._scripts.pipeline(build)]

    def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (ended ones until their ids are pruned), in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for state in JobState:
            pipe.zcard(self._keys.jobs_in(state.value))
        return dict(zip(JobState, pipe.execute(), strict=True))

    def collect(self, older_than: float, dry_run: bool = False) -> Collected:
        """End now what retention would end later, for every job that ended ``older_than`` seconds
        ago or earlier (by Redis's clock): its record, logs, outputs and place in the indexes
        (gc.lua). ``dry_run``: count what would go, deleting nothing."""
        seconds, micros = self._redis.time()
        before = seconds + micros / 1_000_000 - older_than
        cutoff = format_timestamp(datetime.fromtimestamp(before, tz=timezone.utc))
        freed = Collected()
        for state in (state for state in JobState if state.is_terminal):
            index, start = self._keys.jobs_in(state.value), 0
            # Scored by creation: a job that ended by then was created by then.
            while ids := self._redis.zrangebyscore(index, 0, int(before * 1_000_000), start, _COLLECT):
                jobs, files, size = self._scripts.run("gc", [], [cutoff, int(dry_run), *ids])
                freed.jobs, freed.files, freed.bytes = (
                    freed.jobs + jobs,
                    freed.files + files,
                    freed.bytes + size,
                )
                start += len(ids) if dry_run else len(ids) - jobs  # those it deleted left the index
        return freed

    def list(self, state: JobState | None = None, limit: int = 100, offset: int = 0) -> list[JobRecord]:
        """The newest ``limit`` jobs after the first ``offset``, in one state or all. Ids of expired
        jobs are dropped from the index."""
        index = self._keys.jobs_in(state.value) if state else self._keys.jobs
        window = cast(list[bytes], self._redis.zrevrange(index, offset, offset + limit - 1))
        ids = [raw.decode() for raw in window]
        records = self.get_many(ids)
        expired = [job_id for job_id, record in zip(ids, records, strict=True) if record is None]
        if expired:
            self._redis.zrem(index, *expired)
        return [record for record in records if record is not None]

    def _record(self, job_id: str, raw: dict[bytes, bytes]) -> JobRecord:
        """The record as stored; a field that cannot be read (written by something other than
        GPUlayer) is left at its default and named in ``corrupt``, so one such record never breaks a
        listing."""
        fields = _Fields(raw)
        spec = fields.read("gl_spec", lambda text: parse_spec(text.encode()), UNREADABLE_SPEC)
        worker = fields.text("worker_name")
        return JobRecord(
            id=job_id,
            name=spec.name,
            command=spec.command,
            state=fields.read("gl_state", JobState, JobState.FAILED),
            attempt=fields.read("gl_attempt", int, 0),
            worker=self._keys.worker_display_name(worker) if worker else None,
            identity=fields.text("gl_identity"),
            exit_code=fields.read("gl_exit_code", int, None),
            reason=fields.text("gl_reason"),
            reason_code=fields.read("gl_reason_code", _REASON_CODE.validate_python, None),
            queue=fields.text("origin") or "",
            created_at=fields.read("created_at", _timestamp, EPOCH),
            queued_at=fields.read("enqueued_at", _timestamp, None),
            scheduled_at=fields.read("gl_scheduled_at", _timestamp, None),
            started_at=fields.read("started_at", _timestamp, None),
            ended_at=fields.read("ended_at", _timestamp, None),
            outputs=fields.read("gl_outputs", OutputSummary.model_validate_json, None),
            usage=fields.read("gl_usage", JobUsage.model_validate_json, None),
            gpus=fields.read("gl_gpus", _indices, []),
            attempts=fields.read("gl_attempts", _attempts, []),
            retry_at=fields.read("gl_retry_at", _milliseconds, None),
            parts=fields.read("gl_parts", _parts, []),
            spec=spec,
            corrupt=fields.garbled(),
        )


def _indices(text: str) -> list[int]:
    """GPU indices as stored: "0,2"."""
    return [int(index) for index in text.split(",") if index]


#: What a record whose spec cannot be read shows in its place.
UNREADABLE_SPEC = JobSpec(command=["(unreadable)"])
EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)
T = TypeVar("T")


class _Fields:
    """A job hash's fields, each read on its own: one that cannot be read is noted, not raised."""

    def __init__(self, raw: dict[bytes, bytes]) -> None:
        self._raw = raw
        self._garbled: list[str] = []

    def text(self, name: str) -> str | None:
        value = self._raw.get(name.encode())
        return value.decode(errors="replace") if value else None

    def read(self, name: str, parse: Callable[[str], T], default: T) -> T:
        """``parse`` of the field, or ``default`` when it is absent (or empty) or ``parse`` fails."""
        value = self.text(name)
        if value is None:
            return default
        try:
            return parse(value)
        except (ValueError, TypeError, KeyError, OverflowError, AttributeError):
            self._garbled.append(name)
            return default

    def garbled(self) -> str | None:
        """The fields that could not be read, as a line; None if the record is sound."""
        return "unreadable " + ", ".join(self._garbled) if self._garbled else None


def _timestamp(text: str) -> datetime:
    found = parse_timestamp(text.encode())
    if found is None:
        raise ValueError(text)
    return found


def _milliseconds(text: str) -> datetime:
    return datetime.fromtimestamp(int(text) / 1000, tz=timezone.utc)


def _attempts(text: str) -> list[Attempt]:
    return [Attempt.model_validate(entry) for entry in json.loads(text)]


def _parts(text: str) -> list[GangPart]:
    return [
        GangPart(node=node, worker=part["worker"], gpus=_indices(part["gpus"]))
        for node, part in enumerate(json.loads(text))
    ]


def _swept(done: dict[str, str], replies: list[Any]) -> list[str]:
    """The jobs (by done stream: :meth:`JobStore._sweep`'s) whose streams the XREADs found entries in."""
    return [
        done[name.decode()] for reply in replies for name, _ in cast(list[tuple[bytes, Any]], reply or [])
    ]


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[start : start + size] for start in range(0, len(items), size)]
