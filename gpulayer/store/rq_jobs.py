"""How a GPUlayer job is written as an RQ job, so RQ's own tools (``rq info``, rq-dashboard) show it.

The hash is built by RQ's ``Job.to_dict`` so it stays in RQ's format; GPUlayer's fields sit beside
RQ's, prefixed ``gl_``. Timestamps use RQ's format, from the clock of the process that made the change.
"""

from __future__ import annotations

import functools
import math
import shlex
from datetime import datetime
from typing import Any, NoReturn

from redis import Redis
from rq.job import Job, get_current_job
from rq.utils import now

from .keys import Keys
from .rq_names import RQNames

#: The callable RQ sees. Only a GPUlayer worker runs these jobs; a plain ``rq worker`` that takes
#: one runs this instead, which hands the job back to GPUlayer (see :func:`run_on_gpulayer_worker`).
RQ_FUNCTION = f"{__name__}.run_on_gpulayer_worker"
#: Why a job RQ's own API enqueued (unsigned) ends failed, unrun, when a GPUlayer worker pops it.
UNSIGNED = "unsigned: enqueue through gpulayer.rq.Queue"
#: What a plain ``rq worker`` that took a GPUlayer job says, failing it in its own records.
TAKEN_BY_RQ = (
    "this is a GPUlayer job: it runs on `gpulayer worker start`, not on a plain `rq worker`; "
    "it goes back to its queue for one"
)
_DESCRIPTION_MAX = 1000


def run_on_gpulayer_worker(*args: Any, **kwargs: Any) -> NoReturn:
    """What a plain ``rq worker`` runs for a GPUlayer job it took off a queue (it cannot run one: the
    job is signed for GPUlayer's workers). The job is marked taken, then RQ's worker fails it in RQ's
    records; the reaper of a GPUlayer worker then puts it back in its queue (reap.lua), where a
    GPUlayer worker finds it. Outside a worker's job it just raises."""
    job = get_current_job()
    # The job's key is its installation's: "<prefix>:rq:job:<id>".
    suffix = RQNames.of("").job.format(job.id) if job is not None else ""
    if job is not None and job.key.endswith(suffix):
        prefix = job.key.removesuffix(suffix)
        with job.connection.pipeline() as pipe:
            pipe.hset(job.key, "gl_taken_by_rq", job.worker_name or "?")
            pipe.sadd(Keys(prefix).taken_by_rq, job.id)
            pipe.execute()
    raise RuntimeError(TAKEN_BY_RQ)


def timestamp() -> str:
    """Now, in RQ's timestamp format."""
    return format_timestamp(now())


def format_timestamp(moment: datetime) -> str:
    """A UTC time in RQ's timestamp format (``2026-01-31T12:00:00.123456Z``), as RQ's ``utcformat``
    writes it, without its ``strftime``: twice as fast, and every job's changes write a few."""
    return moment.isoformat(timespec="microseconds")[:-6] + "Z"


def parse_timestamp(raw: bytes | None) -> datetime | None:
    """A timestamp in RQ's format (``2026-01-31T12:00:00.123456Z``) as an aware datetime; parsed with
    ``fromisoformat``, thirty times faster than RQ's ``strptime``, as every listed record has five."""
    return datetime.fromisoformat(raw.decode().replace("Z", "+00:00")) if raw else None


@functools.lru_cache(maxsize=8)
def _template(retention: int) -> dict[str, Any]:
    """The fields every new job shares, from RQ's own ``to_dict`` of a prototype job: the callable,
    the TTLs. Empty fields are left out (RQ reads a missing field as empty); per-job fields are
    added by :func:`rq_fields`, the status by the submit script."""
    job = Job.create(RQ_FUNCTION, connection=Redis(), result_ttl=retention, failure_ttl=retention)
    per_job = {"created_at", "enqueued_at", "origin", "description", "timeout", "status"}
    return {key: value for key, value in job.to_dict().items() if value != "" and key not in per_job}


def description(command: list[str]) -> str:
    """How RQ shows the job: its command, as a shell would read it, cut short."""
    return shlex.join(command)[:_DESCRIPTION_MAX]


def rq_fields(
    queue_name: str, command: list[str], timeout: float | None, retention: int, created: datetime
) -> dict[str, Any]:
    """RQ's fields of a new queued job; GPUlayer's state fields are added by the submit script."""
    created_text = format_timestamp(created)
    return {
        **_template(retention),
        "created_at": created_text,
        "enqueued_at": created_text,
        "origin": queue_name,
        "description": description(command),
        "timeout": math.ceil(timeout) if timeout else -1,
    }
