"""Job records as the client sees them: create, read, list, cancel, and wait for the end."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import cast

from redis import Redis
from rq.utils import now

from ..models import Attempt, JobRecord, JobSpec, JobState, OutputSummary
from ..settings import Settings
from .connection import BLOCK_MS
from .keys import Keys
from .rq_jobs import parse_timestamp, rq_fields, timestamp
from .scripts import Scripts


class JobStore:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts
        self._retention = settings.retention_seconds

    def submit(self, job_id: str, spec: JobSpec, idempotency_key: str | None = None) -> str | None:
        """Create the job and queue it, with its uploaded files kept from now on, and return its id —
        or, when ``idempotency_key`` was used by a job that still exists, that job's id. None if
        ``job_id`` is taken."""
        queue = spec.queue
        queue_name = self._keys.queue_for(queue)
        created = now()
        fields = rq_fields(queue_name, spec.command, spec.timeout, self._retention, created)
        fields["gl_spec"] = spec.model_dump_json(exclude_defaults=True)
        fields["gl_attempt"] = 0
        # What the scripts need to decide on a retry, without parsing the spec.
        fields.update(gl_retries=spec.retries, gl_retry_on=spec.retry_on, gl_retry_delay=spec.retry_delay)
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
        keys = [self._keys.job(job_id), self._keys.queue(queue_name), self._keys.inputs(job_id)]
        created_flag, existing = self._scripts.run("submit", keys, args)
        return existing.decode() if created_flag else None

    def get(self, job_id: str) -> JobRecord | None:
        """The job, if it exists and is this installation's (job hashes are shared by every prefix)."""
        raw = cast(dict[bytes, bytes], self._redis.hgetall(self._keys.job(job_id)))
        if not raw or not self._keys.owns_queue(raw.get(b"origin", b"").decode()):
            return None
        return self._record(job_id, raw)

    def list(self, state: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        """The newest ``limit`` jobs, in one state or all. Ids of expired jobs are dropped from the index."""
        index = self._keys.jobs_in(state.value) if state else self._keys.jobs
        ids = [raw.decode() for raw in cast(list[bytes], self._redis.zrevrange(index, 0, limit - 1))]
        pipe = self._redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self._keys.job(job_id))
        records, expired = [], []
        for job_id, raw in zip(ids, pipe.execute(), strict=True):
            if raw and b"gl_state" in raw:
                records.append(self._record(job_id, raw))
            else:
                expired.append(job_id)
        if expired:
            self._redis.zrem(index, *expired)
        return records

    def cancel(self, job_id: str) -> str:
        """'cancelled', 'requested' (its worker will stop it), 'ended' (nothing to do), or 'missing'."""
        result = self._scripts.run("cancel", [self._keys.job(job_id)], [job_id, timestamp()])
        return str(result.decode())

    def wait_done(self, job_id: str, timeout: float | None) -> bool:
        """Block until the job has ended (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        key = self._keys.done(job_id)
        while True:
            block = BLOCK_MS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                block = max(1, min(block, int(left * 1000)))
            if self._redis.xread({key: "0-0"}, count=1, block=block):
                return True

    def _record(self, job_id: str, raw: dict[bytes, bytes]) -> JobRecord:
        def text(field: str) -> str | None:
            value = raw.get(field.encode())
            return value.decode() if value else None

        spec = JobSpec.model_validate_json(raw[b"gl_spec"])
        worker, exit_code, outputs = text("worker_name"), text("gl_exit_code"), text("gl_outputs")
        retry_at = text("gl_retry_at")
        created = parse_timestamp(raw.get(b"created_at"))
        assert created is not None, "every job has created_at"
        return JobRecord(
            id=job_id,
            name=spec.name,
            command=spec.command,
            state=JobState(text("gl_state")),
            attempt=int(text("gl_attempt") or 0),
            worker=self._keys.worker_display_name(worker) if worker else None,
            exit_code=int(exit_code) if exit_code is not None else None,
            reason=text("gl_reason"),
            queue=text("origin") or "",
            created_at=created,
            queued_at=parse_timestamp(raw.get(b"enqueued_at")),
            scheduled_at=parse_timestamp(raw.get(b"gl_scheduled_at")),
            started_at=parse_timestamp(raw.get(b"started_at")),
            ended_at=parse_timestamp(raw.get(b"ended_at")),
            outputs=OutputSummary.model_validate_json(outputs) if outputs else None,
            gpus=[int(index) for index in (text("gl_gpus") or "").split(",") if index],
            attempts=[Attempt.model_validate(entry) for entry in json.loads(text("gl_attempts") or "[]")],
            retry_at=datetime.fromtimestamp(int(retry_at) / 1000, tz=timezone.utc) if retry_at else None,
            spec=spec,
        )
