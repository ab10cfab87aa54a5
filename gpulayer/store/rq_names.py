"""RQ's keys for one installation: each of RQ's names moved from ``rq:`` to ``<prefix>:rq:``.

Jobs and workers are RQ's, so RQ's tools see them; but RQ's own names are one namespace for every
program on a Redis. Moved under the prefix, two installations on one Redis, and any other program's
plain RQ, share no key, and a role's Redis user reaches its own installation's keys alone
(``~<prefix>:*``: see :mod:`gpulayer.store.acl`).

Each name is read from where RQ spells it (a class attribute, a module constant, a key function), so
a name RQ changes changes here too. GPUlayer builds its keys from these (:class:`~.keys.Keys`, the
worker) and never changes RQ's classes; RQ's tools, which build keys from RQ's classes and constants
alone, are pointed at an installation for their process by :func:`point_rq_at`.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

from rq import command, executions, results, scheduler, suspension, worker_registration
from rq.group import Group
from rq.job import Job
from rq.queue import Queue
from rq.registry import (
    BaseRegistry,
    CanceledJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    StartedJobRegistry,
)
from rq.worker import BaseWorker, base

#: Where RQ puts every key of its own.
RQ_NAMESPACE = "rq:"


def _registries() -> list[type[BaseRegistry]]:
    """Every registry class RQ defines with a key of its own: RQ 3 added some (ready jobs,
    executions), and RQ's maintenance cleans each, so each must be on the installation's keys."""
    found, todo = [], [BaseRegistry]
    while todo:
        registry = todo.pop()
        todo.extend(registry.__subclasses__())
        if registry.__module__.startswith("rq.") and "key_template" in vars(registry):
            found.append(registry)
    return found


def _cleaning_key(name: str) -> str:
    """RQ's maintenance lock of a queue, as ``Queue.registry_cleaning_key`` spells it."""
    return str(Queue.registry_cleaning_key.fget(types.SimpleNamespace(name=name)))  # type: ignore[attr-defined]


#: RQ's own names, read once, as this module is imported: :func:`point_rq_at` changes where RQ's
#: classes read them, and an installation's names are moved from RQ's own, whatever RQ names now.
#: ``{}`` where RQ puts a job id, a queue name or a worker name.
_OWN = {
    "job": Job.redis_job_namespace_prefix + "{}",
    "results": str(results.Result.get_key("{}")),  # type: ignore[no-untyped-call]
    "queue": Queue.redis_queue_namespace_prefix + "{}",
    "queues": Queue.redis_queues_keys,
    "started": StartedJobRegistry.key_template.format("{}"),
    "finished": FinishedJobRegistry.key_template.format("{}"),
    "failed": FailedJobRegistry.key_template.format("{}"),
    "canceled": CanceledJobRegistry.key_template.format("{}"),
    "worker": BaseWorker.redis_worker_namespace_prefix + "{}",
    "workers": worker_registration.REDIS_WORKER_KEYS,
    "workers_of": worker_registration.WORKERS_BY_QUEUE_KEY % "{}",
    "suspended": suspension.WORKERS_SUSPENDED,
    "pubsub": command.PUBSUB_CHANNEL_TEMPLATE % "{}",
    "cleaning": _cleaning_key("{}"),
}
#: The rest of RQ's names that RQ's tools may reach, by where RQ keeps each, as RQ spells it.
_OTHERS: list[tuple[Any, str, str]] = [
    (Group, "REDIS_GROUP_NAME_PREFIX", Group.REDIS_GROUP_NAME_PREFIX),
    (Group, "REDIS_GROUP_KEY", Group.REDIS_GROUP_KEY),
    (scheduler, "SCHEDULER_KEY_TEMPLATE", scheduler.SCHEDULER_KEY_TEMPLATE),
    (scheduler, "SCHEDULER_LOCKING_KEY_TEMPLATE", scheduler.SCHEDULER_LOCKING_KEY_TEMPLATE),
    *((registry, "key_template", registry.key_template) for registry in _registries()),
    # RQ 3's alone: the maintenance lock of groups, rate limits' index, a worker's executions.
    *(
        (owner, attribute, getattr(owner, attribute))
        for owner, attribute in (
            (Group, "REDIS_GROUP_CLEANING_KEY"),
            (base, "WORKER_EXECUTIONS_KEY_TEMPLATE"),
            (executions, "WORKER_EXECUTIONS_KEY_TEMPLATE"),
            (getattr(sys.modules.get("rq.rate_limit"), "RateLimitRegistry", None), "rl_keys_key"),
        )
        if attribute in vars(owner or object)
    ),
]


@dataclasses.dataclass(frozen=True)
class RQNames:
    """RQ's names in one installation's namespace. Templates hold ``{}`` where RQ puts a job id, a
    queue name or a worker name."""

    #: ``<prefix>:rq:``: what replaces RQ's ``rq:``.
    namespace: str
    #: RQ's job hash, by job id.
    job: str
    #: RQ's stream of a job's results, by job id.
    results: str
    #: RQ's queue (a list of job ids), by queue name.
    queue: str
    #: RQ's set of queue keys.
    queues: str
    #: RQ's registries, by queue name.
    started: str
    finished: str
    failed: str
    canceled: str
    #: RQ's worker hash, by RQ worker name.
    worker: str
    #: RQ's set of live worker keys, and the set of those serving one queue (by queue name).
    workers: str
    workers_of: str
    #: Set by ``rq suspend``: while it exists, no job is claimed.
    suspended: str
    #: A worker's command channel, by RQ worker name.
    pubsub: str
    #: RQ's maintenance lock of a queue's registries, by queue name.
    cleaning: str

    @classmethod
    def of(cls, prefix: str) -> RQNames:
        namespace = f"{prefix}:{RQ_NAMESPACE}"
        return cls(namespace, **{field: _moved(namespace, name) for field, name in _OWN.items()})

    def moved(self, name: str) -> str:
        """Any other of RQ's names (``rq:...``), in this namespace."""
        return _moved(self.namespace, name)


def _moved(namespace: str, name: str) -> str:
    if not name.startswith(RQ_NAMESPACE):
        raise ValueError(f"{name!r} is not one of RQ's names (they start with {RQ_NAMESPACE!r})")
    return namespace + name.removeprefix(RQ_NAMESPACE)


def _moved_if_rqs(names: RQNames, name: str) -> str:
    """``name`` in ``names``' namespace if it is in RQ's own, else as it is (already moved)."""
    return names.moved(name) if name.startswith(RQ_NAMESPACE) else name


def _current_job_id(worker: BaseWorker) -> str | None:
    """The job RQ's view of a worker names: its hash's ``current_job``, which RQ 2 reads and
    GPUlayer's scripts write. (RQ 3 reads an index of executions that only its own worker keeps.)"""
    found = worker.connection.hget(worker.key, "current_job")
    return found.decode() if isinstance(found, bytes) else found


def _current_job(worker: BaseWorker) -> Job | None:
    job_id = _current_job_id(worker)
    return None if job_id is None else worker.job_class.fetch(job_id, worker.connection, worker.serializer)


def point_rq_at(names: RQNames) -> Callable[[], None]:
    """Make RQ's own classes and functions, in this process, read and write ``names``' keys instead of
    RQ's: what RQ's tools (``rq info``, rq-dashboard) and RQ's API need to see an installation, since
    they build keys from RQ's classes and constants alone; and read a worker's current job where
    GPUlayer's scripts write it, under RQ 2 and RQ 3 alike. Returns what undoes it. GPUlayer itself
    never calls this: a process may serve several installations, or use RQ for something else."""
    key_of: Callable[[str], str] = names.results.format
    execution_key = vars(executions.Execution)["key"].fget
    percent = {field: getattr(names, field).replace("{}", "%s") for field in ("workers_of", "pubsub")}
    changes: list[tuple[Any, str, Any]] = [
        (Job, "redis_job_namespace_prefix", names.job.removesuffix("{}")),
        (Queue, "redis_queue_namespace_prefix", names.queue.removesuffix("{}")),
        (Queue, "redis_queues_keys", names.queues),
        (Queue, "registry_cleaning_key", property(lambda queue: names.cleaning.format(queue.name))),
        (BaseWorker, "redis_worker_namespace_prefix", names.worker.removesuffix("{}")),
        (BaseWorker, "redis_workers_keys", names.workers),
        (worker_registration, "REDIS_WORKER_KEYS", names.workers),
        (worker_registration, "WORKERS_BY_QUEUE_KEY", percent["workers_of"]),
        (suspension, "WORKERS_SUSPENDED", names.suspended),
        (command, "PUBSUB_CHANNEL_TEMPLATE", percent["pubsub"]),
        (base, "PUBSUB_CHANNEL_TEMPLATE", percent["pubsub"]),  # imported by name there
        (BaseWorker, "get_current_job_id", _current_job_id),
        (BaseWorker, "get_current_job", _current_job),
        (results.Result, "get_key", classmethod(lambda _cls, job_id: key_of(job_id))),
        # RQ 2 spells an execution's key whole ("rq:execution:..."); RQ 3 from RQ_KEY_PREFIX (below).
        (
            executions.Execution,
            "key",
            property(lambda execution: _moved_if_rqs(names, execution_key(execution))),
        ),
        # RQ 2 also reads it through a function of the module; RQ 3 has none.
        *([(results, "get_key", key_of)] if "get_key" in vars(results) else []),
        *((owner, attribute, names.moved(name)) for owner, attribute, name in _OTHERS),
        # RQ 3 builds some names as it needs them, from its modules' RQ_KEY_PREFIX.
        *(
            (module, "RQ_KEY_PREFIX", names.namespace.removesuffix(":"))
            for name, module in list(sys.modules.items())
            if name.startswith("rq.") and "RQ_KEY_PREFIX" in vars(module)
        ),
    ]
    saved = [(owner, attribute, vars(owner)[attribute]) for owner, attribute, _ in changes]
    for owner, attribute, value in changes:
        setattr(owner, attribute, value)

    def undo() -> None:
        for owner, attribute, value in saved:
            setattr(owner, attribute, value)

    return undo
