"""Key names: each installation's under its prefix, RQ's where RQ looks, and Lua spelling them alike."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

import pytest
import redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import CanceledJobRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from gpulayer import Settings
from gpulayer.store.keys import Keys
from gpulayer.store.scripts import _NAMES, prelude

JOB, WORKER = "0123abcd4567", "gpu-box-1"


def all_keys(keys: Keys, job_id: str = JOB, worker: str = WORKER) -> dict[str, str]:
    """Every key and channel name a Keys makes, for one job id and one worker."""
    return {
        "jobs": keys.jobs,
        "queues": keys.queues,
        "new_queue": keys.new_queue,
        "wake": keys.wake(keys.queue_name()),
        "gpu": keys.gpu("GPU-8f2c"),
        "worker_usage": keys.worker_usage(worker),
        "rq_queues": keys.rq_queues,
        "rq_workers": keys.rq_workers,
        "rq_suspended": keys.rq_suspended,
        "job": keys.job(job_id),
        "jobs_in": keys.jobs_in("queued"),
        "logs": keys.logs(job_id),
        "done": keys.done(job_id),
        "inputs": keys.inputs(job_id),
        "outputs": keys.outputs(job_id),
        "staged_outputs": keys.staged_outputs(job_id, 2),
        "worker_jobs": keys.worker_jobs(worker),
        "queue_name": keys.queue_name(),
        "queue": keys.queue(keys.queue_name("a100", priority=5)),
        "rq_worker_name": keys.rq_worker_name(worker),
        "rq_worker": keys.rq_worker(worker),
        "pubsub": keys.pubsub(worker),
    }


def test_every_key_is_under_the_prefix_or_in_rqs_namespace() -> None:
    for name, key in all_keys(Keys("teamA")).items():
        assert key.startswith(("teamA:", "rq:")), name


def test_two_prefixes_never_share_a_key_of_their_own() -> None:
    a, b = all_keys(Keys("teamA")), all_keys(Keys("teamB"))
    shared = {name for name in a if a[name] == b[name]}
    # RQ's own: its global sets, and the job hash (jobs are RQ jobs; ids are random). An installation
    # tells its jobs from another's by their queue (tests/test_prefixes.py).
    assert shared == {"job", "rq_queues", "rq_workers", "rq_suspended"}


def test_the_worker_display_name_undoes_the_rq_worker_name() -> None:
    keys = Keys("teamA")
    assert keys.worker_display_name(keys.rq_worker_name(WORKER)) == WORKER


def test_queue_and_registry_keys_are_those_rq_itself_uses() -> None:
    keys = Keys("teamA")
    name = keys.queue_name()
    never_connected = redis.Redis(port=1)
    templates = keys.lua_templates()
    assert keys.job(JOB) == Job(JOB, connection=never_connected).key
    assert keys.queue(name) == Queue(name, connection=never_connected).key
    for template, registry in [
        ("started", StartedJobRegistry),
        ("finished", FinishedJobRegistry),
        ("failed", FailedJobRegistry),
        ("canceled", CanceledJobRegistry),
    ]:
        head, tail = templates[template]
        assert head + name + tail == registry(name, connection=never_connected).key


def test_lua_templates_rejoin_to_the_key_python_makes() -> None:
    keys = Keys("teamA")
    methods: dict[str, Callable[[str], str]] = {
        "job": keys.job,
        "queue": keys.queue,
        "jobs_in": keys.jobs_in,
        "logs": keys.logs,
        "done": keys.done,
        "inputs": keys.inputs,
        "outputs": keys.outputs,
        "worker_jobs": keys.worker_jobs,
        "worker_usage": keys.worker_usage,
        "gpu": keys.gpu,
        "wake": keys.wake,
        "worker_gang": keys.worker_gang,
        "worker_wake": keys.worker_wake,
        "held": keys.held,
        "rq_worker": lambda worker: keys.rq_worker(worker.removeprefix("teamA:")),
        "pubsub": lambda worker: keys.pubsub(worker.removeprefix("teamA:")),
    }
    templates = keys.lua_templates()
    for name, method in methods.items():
        head, tail = templates[name]
        value = keys.rq_worker_name(WORKER) if name in ("rq_worker", "pubsub") else JOB
        assert head + value + tail == method(value), name
    assert all("{}" not in head + tail for head, tail in templates.values())


def test_the_prelude_defines_every_constant_the_scripts_use() -> None:
    text = prelude(Keys("teamA"), Settings(prefix="teamA", log_max_lines=123, retention_seconds=456))
    assert [line.split(" = ")[0] for line in text.splitlines()] == [
        f"local {name}"
        for name in (
            "K",
            "JOBS",
            "QUEUES",
            "LEASES",
            "DELAYED",
            "GANGS",
            "GANG_WAKE",
            "GANG_ORIGINS",
            "GANG_START_TRIES",
            "NEW_QUEUE",
            "PREFIX",
            "RQ_QUEUES",
            "RQ_STATUS",
            "LOG_MAX_LINES",
            "RETENTION",
            "EVENTS",
            "START_LATENCY",
            "START_BUCKETS",
            "RUN_TIME",
            "RUN_BUCKETS",
            "ENDED_COUNTS",
            "FINAL",
            "WORKER_LOST",
        )
    ]
    assert 'local EVENTS = "teamA:events"\n' in text
    assert "local START_BUCKETS = {2, 5, 10, " in text
    assert 'local JOBS = "teamA:jobs"\n' in text
    assert 'local QUEUES = "teamA:queues"\n' in text
    assert 'local PREFIX = "teamA:"\n' in text
    assert 'local RQ_QUEUES = "rq:queues"\n' in text
    assert 'inputs = {"teamA:files:", ":in"}' in text
    assert 'scheduled = "started"' in text
    assert "local LOG_MAX_LINES = 123\n" in text
    assert "local RETENTION = 456\n" in text


def test_the_prelude_and_every_script_parse_as_lua_51() -> None:
    lua51 = pytest.importorskip("lupa.lua51")
    keys = Keys("teamA")
    folder = resources.files("gpulayer.store") / "lua"
    head = prelude(keys, Settings(prefix="teamA", retention_seconds=456)) + (folder / "_lib.lua").read_text()
    lua = lua51.LuaRuntime()
    probe = (
        "\nreturn key(K.inputs, ARG), JOBS, key(K.wake, ARG), RQ_QUEUES,"
        " RQ_STATUS.cancelled, LOG_MAX_LINES, RETENTION"
    )
    lua.globals().ARG = JOB
    assert lua.execute(head + probe) == (
        keys.inputs(JOB),
        "teamA:jobs",
        keys.wake(JOB),
        "rq:queues",
        "canceled",
        10_000,
        456,
    )
    for name in _NAMES:
        lua.compile(head + (folder / f"{name}.lua").read_text())
