"""A worker's side of a job: claim, start, log, finish, heartbeat, give back.

Every write a worker makes about a job names its attempt; the scripts apply it only while that
attempt still owns the job, so a worker that lost a job cannot overwrite what happened after.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Literal, cast

from redis import Redis
from redis.client import Pipeline

from ..models import JobSpec, JobState, JobUsage, OutputSummary, QueueSpec
from .garbled import readable
from .keys import Keys
from .rq_jobs import timestamp
from .scripts import Scripts


@dataclasses.dataclass(frozen=True)
class Part:
    """What makes a claim one node's part of a gang job: the gang job, and which node this is."""

    job_id: str
    node: int


@dataclasses.dataclass(frozen=True)
class Claim:
    """A job this worker took: which attempt it is, the spec as stored, and the GPUs it holds."""

    job_id: str
    attempt: int
    spec_json: bytes
    queue: str
    #: Indices (nvidia-smi numbering) of the GPUs reserved for it on this worker.
    gpus: tuple[int, ...] = ()
    #: Set for a part of a gang job (``job_id`` is then the part's own id).
    part: Part | None = None
    #: The submitter's seal over the job (the gang job's, for a part), as stored; empty if it has none.
    seal: bytes = b""
    #: The claim marked it running too (it has no files to fetch first): no start to record.
    started: bool = False
    #: For a job the claim started: its input files' hash, read with the claim (a function's call).
    inputs: dict[bytes, bytes] = dataclasses.field(default_factory=dict)

    @property
    def target(self) -> str:
        """The job users know: the gang job for a part, else this one."""
        return self.part.job_id if self.part else self.job_id

    def misplaced(self, spec: JobSpec, queue: str) -> str | None:
        """Why the job may not run as claimed, by what its submitter signed (``spec``), or None. A
        seal binds a job's spec, not where it waits: anyone who writes the queues (a worker's
        credentials) could push its id into another queue, for a worker of other means to take (a
        cancelled 1-GPU job into the CPU queue). So a job runs only from ``queue``, the one its
        signed requirements and priority name, or, a gang job, only as a part placed on the
        worker; either way with the GPUs they ask for."""
        if self.part is None and spec.distributed is not None:
            return "it is a gang job, taken from a queue: a gang job runs only as parts placed on workers"
        if self.part is not None and spec.distributed is None:
            return "it was handed to this worker as a gang job's part, but it is no gang job"
        if self.part is None and self.queue != queue:
            return f"it was taken from queue {self.queue}, not {queue}, the one its signed requirements name"
        if len(self.gpus) != spec.requirements.gpus:
            asked = spec.requirements.gpus
            return f"it was given {len(self.gpus)} GPU(s), not the {asked} its signed requirements ask for"
        return None


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat learned: whether this process still holds its name, and which of its jobs
    were cancelled, or are no longer its own."""

    alive: bool
    cancelled: list[str]
    lost: list[str]


#: What finish.lua answers: this attempt lost the job; the job ended; it will run again.
Finished = Literal["lost", "ended", "retry"]
_FINISHED: tuple[Finished, Finished, Finished] = ("lost", "ended", "retry")


@dataclasses.dataclass(frozen=True)
class QueueOffer:
    """One queue a worker serves, as the claim script needs it: what each of its jobs takes, and
    which of the worker's GPUs may serve it, best first."""

    name: str
    gpus: int
    cpus: int
    memory: int
    #: (uuid, index) of each GPU a job of this queue may use.
    eligible: tuple[tuple[str, int], ...] = ()

    @functools.cached_property
    def args(self) -> tuple[object, ...]:
        """As the claim script reads it (made once: every claim of a job's end sends it)."""
        return (self.name, self.gpus, self.cpus, self.memory, gpu_list(self.eligible))


def gpu_list(gpus: Iterable[tuple[str, int]]) -> str:
    """(uuid, index) pairs as the claim and gang scripts read them: "uuid=index,uuid=index"."""
    return ",".join(f"{uuid}={index}" for uuid, index in gpus)


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    """What a claim asks for: see :meth:`ExecutionStore.claim`."""

    queues: Sequence[QueueOffer]
    limit: int
    slots: int
    memory: int
    lease_ms: int


#: Jobs a claim took, and how many gang jobs wait for workers.
Claimed = tuple[list["Claim"], int]


class ExecutionStore:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, worker: str, identity: str = "") -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts
        self.worker = worker
        #: The worker identity its claims are recorded under: whose signature their results need.
        self.identity = identity
        self.rq_name = keys.rq_worker_name(worker)
        self._jobs_key = keys.worker_jobs(worker)
        self._worker_key = keys.rq_worker(worker)
        self._usage_key = keys.worker_usage(worker)
        self._claim_keys = [
            keys.rq_suspended,
            self._jobs_key,
            self._usage_key,
            keys.worker_gang(worker),
            keys.held(worker),
        ]

    def claim(self, request: ClaimRequest) -> Claimed:
        """Take the parts of gang jobs placed on this worker, and up to ``request.limit`` queued jobs
        that fit in what is free of its CPU slots, memory and GPUs, serving its queues in the order
        given; each holds a lease of ``request.lease_ms``. With how many gang jobs wait for workers."""
        return _claimed(self._scripts.run("claim", *self._claim_call(request)))

    def _claim_call(self, request: ClaimRequest) -> tuple[list[str], list[object]]:
        args: list[object] = [
            request.limit,
            self.rq_name,
            timestamp(),
            request.slots,
            request.memory,
            request.lease_ms,
            self.identity,
        ]
        for queue in request.queues:
            args.extend(queue.args)
        return self._claim_keys, args

    def queue_registry(self) -> dict[str, QueueSpec]:
        """Every queue that has had a job, with what its jobs ask for."""
        raw = cast(dict[bytes, bytes], self._redis.hgetall(self._keys.queues))
        found = {
            name.decode(errors="replace"): readable(
                partial(QueueSpec.model_validate_json, spec), f"queue {name!r}"
            )
            for name, spec in raw.items()
        }
        return {name: spec for name, spec in found.items() if spec is not None}

    def start(
        self, claim: Claim, also: Callable[[Pipeline], object] | None = None, master: str = ""
    ) -> tuple[str, list[Any]]:
        """'ok': the job is now running; 'cancel': it was cancelled meanwhile; 'stale': it is not ours.
        With the replies of what ``also`` queued, in the same round trip (the call a function job
        runs). ``master``: for node 0 of a gang job, where its rank 0 listens ("host:port")."""
        args = [claim.job_id, self.rq_name, claim.attempt, timestamp(), master]

        def build(pipe: Pipeline) -> None:
            self._scripts.queue(pipe, "start", [self._keys.job(claim.job_id)], args)
            if also is not None:
                also(pipe)

        status, *replies = self._scripts.pipeline(build)
        return status.decode(), replies

    def master(self, claim: Claim) -> str | None:
        """Where rank 0 of the gang job this part belongs to listens, once node 0 has said it."""
        assert claim.part is not None
        value = self._redis.hget(self._keys.job(claim.part.job_id), "gl_master")
        return value.decode() if isinstance(value, bytes) else None

    def append_logs(self, claim: Claim, lines: Iterable[tuple[str, str, int | None]]) -> bool:
        """Store ``(stream, text, rank)`` lines (rank None but for a gang job's ranks); False, storing
        nothing, if the job is no longer this attempt's."""
        return bool(self._scripts.run("append_logs", *self._log_call(claim, lines)))

    def append_logs_of(self, batches: list[tuple[Claim, list[tuple[str, str, int | None]]]]) -> list[bool]:
        """:meth:`append_logs` for several jobs in one round trip: whether each is still its attempt's."""
        if len(batches) == 1:
            return [self.append_logs(*batches[0])]

        def build(pipe: Pipeline) -> None:
            for claim, lines in batches:
                self._scripts.queue(pipe, "append_logs", *self._log_call(claim, lines))

        return [bool(reply) for reply in self._scripts.pipeline(build)]

    def _log_call(
        self, claim: Claim, lines: Iterable[tuple[str, str, int | None]]
    ) -> tuple[list[str], list[object]]:
        args: list[object] = [claim.job_id, self.rq_name, claim.attempt]
        for stream, text, rank in lines:
            args.extend((stream, text, "" if rank is None else rank))
        return [self._keys.job(claim.job_id)], args

    def keep_checkpoint(self, claim: Claim) -> bool:
        """Make the attempt's staged checkpoint archive the job's (a gang job's, for a part); False,
        dropping it, if the attempt no longer owns the job."""
        keys = [
            self._keys.job(claim.job_id),
            self._keys.staged_checkpoint(claim.target, claim.attempt),
            self._keys.checkpoint(claim.target),
        ]
        return bool(self._scripts.run("keep_checkpoint", keys, [self.rq_name, claim.attempt]))

    def finish(
        self,
        claim: Claim,
        state: JobState | Literal["unstarted"],
        *,
        exit_code: int | None,
        reason: str | None,
        outputs: OutputSummary | None,
        seconds: float,
        usage: JobUsage | None = None,
        before: Callable[[Pipeline], object] | None = None,
        then: ClaimRequest | None = None,
    ) -> tuple[Finished, Claimed | None]:
        """End the attempt: the job ends, or runs again (a retry on a non-zero exit), or, when the
        attempt no longer owns the job, nothing is written. ``before`` may queue the attempt's last
        staged outputs, to go in the same round trip; ``usage``, what the attempt used, is kept with
        it (and for a part, added to its gang job's). A part of a gang job ends the same way, and the
        gang job decides (``unstarted``: the part could not start its ranks). ``then``: claim the next
        jobs in the same round trip, once what this one held is free (what the claim took, else None)."""
        keys = [
            self._keys.job(claim.job_id),
            self._worker_key,
            self._keys.staged_outputs(claim.job_id, claim.attempt),
            self._keys.outputs(claim.target),
        ]
        args = [
            claim.job_id,
            self.rq_name,
            claim.attempt,
            state.value if isinstance(state, JobState) else state,
            "" if exit_code is None else exit_code,
            reason or "",
            timestamp(),
            outputs.model_dump_json() if outputs else "",
            f"{seconds:.6f}",
            usage.model_dump_json() if usage else "",
        ]

        calls = [("finish", keys, args)]
        if then is not None:
            calls.append(("claim", *self._claim_call(then)))

        def build(pipe: Pipeline) -> None:
            if before is not None:
                before(pipe)
            for call in calls:
                self._scripts.queue(pipe, *call)

        replies = self._scripts.calls(calls) if before is None else self._scripts.pipeline(build)
        if then is None:
            return _FINISHED[int(replies[-1])], None
        return _FINISHED[int(replies[-2])], _claimed(replies[-1])

    def heartbeat(
        self, incarnation: str, ttl: int, lease_ms: int, running: Iterable[tuple[str, int]]
    ) -> Heartbeat:
        """Keep this worker's registration alive and renew the leases of ``running`` (job id, attempt)."""
        args: list[object] = [incarnation, ttl, timestamp(), self.rq_name, lease_ms]
        for job_id, attempt in running:
            args.extend((job_id, attempt))
        alive, cancelled, lost = self._scripts.run("heartbeat", [self._worker_key], args)
        return Heartbeat(bool(alive), [i.decode() for i in cancelled], [i.decode() for i in lost])

    def reap(self, limit: int = 100) -> int:
        """Act on expired leases (their jobs lost their worker) and on retries whose back-off is over."""
        return int(self._scripts.run("reap", [], [limit, timestamp()]))

    def prune(self, queue_names: Sequence[str], oldest: int = 2000) -> int:
        """Drop expired jobs' ids from the indexes, looking at the ``oldest`` of each; returns how many."""
        return int(self._scripts.run("prune", [], [oldest, *queue_names]))

    def forget(self, claim: Claim) -> bool:
        """Free what the claimed job held on this worker if its record was deleted through RQ while it
        ran (rq-dashboard's Delete); whether it was (else the job was taken over: nothing to free)."""
        keys = [self._keys.job(claim.job_id), self._worker_key]
        return bool(self._scripts.run("forget", keys, [claim.job_id, self.rq_name]))

    def requeue(self, mode: Literal["lost", "returned"], message: str, job_ids: Sequence[str] = ()) -> int:
        """Take jobs off this worker (all it holds when none are named): ``lost`` counts as a lost
        worker (a retry is used, or the job fails); ``returned`` puts them back, no retry used."""
        args = [self.rq_name, mode, message, timestamp(), *job_ids]
        return int(self._scripts.run("requeue", [self._jobs_key], args))


def _claimed(reply: list[Any]) -> Claimed:
    """What claim.lua answers, as claims (nine values each, after the count of waiting gang jobs)."""
    gangs, *flat = reply
    return [
        Claim(
            flat[i].decode(),
            int(flat[i + 1]),
            flat[i + 2],
            flat[i + 3].decode(),
            tuple(int(index) for index in flat[i + 4].decode().split(",") if index),
            _part(flat[i + 5].decode()),
            flat[i + 6] or b"",
            flat[i + 7] == b"1",
            dict(zip(flat[i + 8][::2], flat[i + 8][1::2], strict=True)),
        )
        for i in range(0, len(flat), 9)
    ], int(gangs)


def _part(text: str) -> Part | None:
    """The part a claim reply names as "gang job id:node", if any."""
    job_id, _, node = text.rpartition(":")
    return Part(job_id, int(node)) if job_id else None
