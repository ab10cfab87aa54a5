"""RQ's API, with GPUlayer's workers behind it: change ``from rq import Queue`` to
``from gpulayer.rq import Queue`` and the rest of an RQ program stays as it was.

    from gpulayer.rq import Queue

    queue = Queue()                                  # the installation `gpulayer connect` set up
    job = queue.enqueue("tasks.train", 0.1, gpus=1, gpu_memory="24GB")
    job.get_status()                                 # 'queued', 'started', 'finished', ...
    job.latest_result(timeout=600).return_value

Each job is signed with this machine's key, as ``@gpulayer.remote`` signs a call, and runs on a
GPUlayer worker as a call of the function its import path names (``"module.function"``, or a
module-level function, which is named by its path), imported from the project folder shipped with it
(the running script's, or ``source=``) or from the worker's own packages. What it asks of the machine
is GPUlayer's requirements, as keywords: ``gpus``, ``gpu_memory``, ``labels``, ... (those of
:class:`gpulayer.Requirements`, checked by it), given to the queue for all its jobs or to one enqueue.
Its job's queue is the one for those requirements.

What it returned comes back through this module's :class:`Job` (``job.return_value()``,
``job.latest_result()``), checked to be signed by the worker that ran it and unpickled as data, as a
remote function's result is; what it raised shows in RQ's records as RQ's worker writes them
(``job.latest_result().exc_string``, ``job.exc_info``). RQ's options that GPUlayer has no place for
(``depends_on``, callbacks, ``job_id``, ``enqueue_at``, ...) are refused, each with one line naming
what to do instead.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rq import Retry
from rq.job import Job as RQJob
from rq.queue import EnqueueData
from rq.queue import Queue as RQQueue
from rq.results import Result
from rq.utils import parse_timeout

from .client import Client
from .errors import InvalidJobSpec, WaitTimeout
from .functions import default_client
from .models import JobState, QueueSpec, validated
from .options import CallOptions
from .payloads import imported
from .requirements import Requirements

__all__ = ["Job", "Queue"]

#: What a job may ask of the machine it runs on, as keywords: the fields of :class:`Requirements`.
REQUIREMENTS = frozenset(Requirements.model_fields)
#: RQ's options GPUlayer has no place for, each with what to do instead. Given, they are refused.
_REFUSED = {
    "depends_on": "enqueue the next job once the first one's job.latest_result(timeout=...) is in",
    "job_id": "GPUlayer names each job; read job.id",
    "at_front": "jobs run in the order of their queue; ask GPUlayer for a priority with `gpulayer submit`",
    "meta": "pass what the job needs as its arguments",
    "description": "GPUlayer describes a job by its function's path",
    "result_ttl": "results are kept for the installation's retention (GPULAYER_RETENTION_SECONDS)",
    "failure_ttl": "results are kept for the installation's retention (GPULAYER_RETENTION_SECONDS)",
    "ttl": "cancel a job that waited too long: job.cancel() or `gpulayer cancel`",
    "repeat": "enqueue it again",
    "on_success": "act on job.latest_result(timeout=...)",
    "on_failure": "act on job.latest_result(timeout=...)",
    "on_stopped": "act on job.latest_result(timeout=...)",
    "pipeline": "enqueue_many submits many jobs in one round trip",
    "unique": "GPUlayer names each job; read job.id",
    "rate_limit": "a worker runs as many jobs as its CPU slots and GPUs hold",
    "webhooks": "follow the job's state with job.latest_result(timeout=...) or `gpulayer logs --follow`",
}
_UNSCHEDULED = "GPUlayer runs a job as soon as a worker fits it: enqueue it when it is due"


class FunctionPath:
    """A function by its import path, pickled as that path: the worker imports it where the call
    runs (:func:`gpulayer.payloads.imported`); the caller never needs to."""

    def __init__(self, path: str) -> None:
        self.path = path
        # What GPUlayer names a call's job by.
        self.__module__, _, self.__qualname__ = path.rpartition(".")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs here, as the function itself would."""
        return imported(self.path)(*args, **kwargs)

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        return imported, (self.path,)


def function_path(function: str | Callable[..., Any]) -> str:
    """The import path of ``function`` (a path already, or a module-level function); else
    :class:`InvalidJobSpec`, naming what to do."""
    if isinstance(function, str):
        if "." not in function.strip(".") or not all(part.isidentifier() for part in function.split(".")):
            raise InvalidJobSpec(f"invalid job: {function!r} is not an import path (module.function)")
        return function
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if not module or not name or "<" in name or getattr(function, "__self__", None) is not None:
        raise InvalidJobSpec(
            f"invalid job: {function!r} has no import path: enqueue a module-level function, or its "
            'path ("module.function"); for any other callable use @gpulayer.remote'
        )
    if module == "__main__":
        raise InvalidJobSpec(
            f"invalid job: {name} is defined in the script being run, which a worker cannot import: "
            "move it into a module, or use @gpulayer.remote"
        )
    return f"{module}.{name}"


def call_options(options: dict[str, Any], needs: dict[str, Any], source: Path | None) -> CallOptions:
    """GPUlayer's options for a job from RQ's options (RQ's names, as ``enqueue_call`` takes them)
    and its requirements; :class:`InvalidJobSpec` for one GPUlayer has no place for."""
    for name, value in options.items():
        if name not in ("timeout", "retry") and value not in (None, False):
            raise InvalidJobSpec(
                f"invalid job: RQ's {name} is not supported: {_REFUSED.get(name, 'leave it out')}"
            )
    fields: dict[str, Any] = {"requirements": validated(Requirements, needs).model_dump(exclude_unset=True)}
    timeout = parse_timeout(options.get("timeout"))
    if timeout is not None and timeout > 0:
        fields["timeout"] = timeout
    retry = options.get("retry")
    if isinstance(retry, Retry):
        # RQ retries a call that raised and a worker that died: both, after its first interval.
        fields.update(
            retries=retry.max, retry_on="both", retry_delay=retry.intervals[0] if retry.intervals else 0
        )
    if source is not None:
        fields["source"] = source
    return validated(CallOptions, fields)


class Job(RQJob):
    """RQ's job, as GPUlayer keeps it: RQ's fields, status and failures as RQ's own tools read them,
    and what a call returned read through the GPUlayer client, checked to be signed by the worker that
    ran it. ``Job.fetch(id, connection=...)`` finds jobs of the installation the default client
    reaches; a queue's ``job_class`` (and ``queue.fetch_job``) those of the queue's."""

    #: The client this class reads results with; None: the default one (see gpulayer.connect).
    gpulayer_client: Client | None = None

    @classmethod
    def client(cls) -> Client:
        return cls.gpulayer_client or default_client()

    @classmethod
    def key_for(cls, job_id: str) -> str:
        return cls.client().keys.job(job_id)

    def latest_result(self, timeout: int = 0) -> Result | None:
        """How the job's latest attempt ended, once it has (None before), waiting ``timeout`` seconds
        for that: what it returned, checked and unpickled as data (as ``@gpulayer.remote``'s result);
        else why it failed, as RQ's records say it."""
        client = self.client()
        try:
            record = client.get(self.id).wait(timeout)
        except WaitTimeout:
            return None
        worker = client.keys.rq_worker_name(record.worker) if record.worker else ""
        value, text = None, record.reason
        if record.state is JobState.SUCCEEDED:
            value = client.function_result(self.id, 0)
        elif isinstance(stored := self.connection.hget(self.key, "exc_info"), bytes):
            text = zlib.decompress(stored).decode(errors="replace")  # as RQ's records have it
        kind = Result.Type.SUCCESSFUL if record.state is JobState.SUCCEEDED else Result.Type.FAILED
        ended = record.ended_at or datetime.now(timezone.utc)
        return Result(
            self.id,
            kind,
            self.connection,
            # RQ's results are named by their stream entry ("<ms>-<n>"), and one without a name is falsy.
            id=f"{int(ended.timestamp() * 1000)}-{record.attempt}",
            created_at=ended,
            return_value=value,
            exc_string=None if kind is Result.Type.SUCCESSFUL else text,
            worker_name=worker,
            execution_id=str(record.attempt),
        )


class Queue(RQQueue):
    """RQ's queue, whose jobs run on GPUlayer's workers, signed by this machine's key (see the
    module). ``client``: the installation (default: the one ``gpulayer.connect`` or this machine's
    access names); ``source``: the folder shipped for the functions' imports (default: the running
    script's); ``requirements``: what every job of this queue asks for (``gpus=1``, ...), which also
    names the queue. ``name`` is GPUlayer's name of that queue, or RQ's ``"default"``."""

    job_class: type[Job]

    def __init__(
        self,
        name: str = "default",
        connection: Any = None,
        *,
        client: Client | None = None,
        source: str | Path | None = None,
        is_async: bool = True,
        **requirements: Any,
    ) -> None:
        options = {key: requirements.pop(key) for key in list(requirements) if key not in REQUIREMENTS}
        if not is_async:
            raise InvalidJobSpec(
                "invalid job: GPUlayer runs jobs on its workers: call the function to run it here"
            )
        self.gpulayer = client or default_client()
        needs = validated(Requirements, requirements)
        self._requirements = needs.model_dump(exclude_unset=True)
        self._source = Path(source) if source is not None else None
        queue_name = self.gpulayer.keys.queue_for(QueueSpec(requirements=needs))
        if name not in ("default", queue_name):
            raise InvalidJobSpec(
                f"invalid job: GPUlayer names a queue by what its jobs ask for: Queue(gpus=1, ...), not "
                f"{name!r} (this one is {queue_name!r})"
            )
        job_class = type("Job", (Job,), {"gpulayer_client": self.gpulayer})
        super().__init__(
            queue_name, connection=connection or self.gpulayer.redis, job_class=job_class, **options
        )
        self._key = self.gpulayer.keys.queue(queue_name)

    def enqueue(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        """RQ's ``enqueue``: ``f(*args, **kwargs)`` as a job; RQ's own keywords (``job_timeout``,
        ``retry``, ``args``/``kwargs``, ...) and GPUlayer's requirements (``gpus``, ...) are taken
        out of the call's keywords."""
        needs = {name: kwargs.pop(name) for name in REQUIREMENTS & kwargs.keys()}
        return self.enqueue_call(**RQQueue.parse_args(f, *args, **kwargs)._asdict(), **needs)

    def enqueue_call(  # type: ignore[override]
        self,
        func: str | Callable[..., Any],
        args: tuple[Any, ...] | list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """RQ's ``enqueue_call``, with GPUlayer's requirements among ``options``."""
        needs = {name: options.pop(name) for name in REQUIREMENTS & options.keys()}
        [job] = self._submit(func, [(tuple(args or ()), dict(kwargs or {}))], options, needs)
        return job

    def enqueue_many(  # type: ignore[override]
        self,
        job_datas: Iterable[EnqueueData],
        pipeline: Any = None,
        group_id: str | None = None,
        **needs: Any,
    ) -> list[Job]:
        """RQ's ``enqueue_many`` of ``Queue.prepare_data(...)`` calls: each run of calls of one
        function with the same options submitted in one round trip, all asking for ``needs``."""
        if pipeline is not None or group_id is not None:
            name = "pipeline" if pipeline is not None else "group_id"
            raise InvalidJobSpec(f"invalid job: RQ's {name} is not supported: {_REFUSED['pipeline']}")
        jobs: list[Job] = []
        for (func, options), datas in itertools.groupby(job_datas, key=_same_submit):
            calls = [(tuple(data.args or ()), dict(data.kwargs or {})) for data in datas]
            jobs.extend(self._submit(func, calls, dict(options), needs))
        return jobs

    def enqueue_at(self, datetime: Any, f: Any, *args: Any, **kwargs: Any) -> Job:
        raise InvalidJobSpec(f"invalid job: RQ's enqueue_at is not supported: {_UNSCHEDULED}")

    def enqueue_in(self, time_delta: Any, func: Any, *args: Any, **kwargs: Any) -> Job:
        raise InvalidJobSpec(f"invalid job: RQ's enqueue_in is not supported: {_UNSCHEDULED}")

    def _submit(
        self,
        func: str | Callable[..., Any],
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        options: dict[str, Any],
        needs: dict[str, Any],
    ) -> list[Job]:
        """Submit the calls of one function, signed, as GPUlayer's function jobs; RQ's view of each."""
        path = function_path(func)
        gpulayer_options = call_options(options, {**self._requirements, **needs}, self._source)
        submitted = self.gpulayer.submit_calls(FunctionPath(path), calls, gpulayer_options)
        found = self.job_class.fetch_many([job.id for job in submitted], connection=self.connection)
        return [job for job in found if isinstance(job, Job)]


def _same_submit(data: EnqueueData) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """What the jobs of one ``enqueue_many`` submit share: their function and RQ's options."""
    options = {
        name: value for name, value in data._asdict().items() if name not in ("func", "args", "kwargs")
    }
    return data.func, tuple(sorted(options.items(), key=lambda item: item[0]))
