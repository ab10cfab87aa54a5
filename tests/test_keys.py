"""Key names: each installation's under its prefix, RQ's too (RQ's own names, moved), and Lua spelling
them alike."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

import pytest
import redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import CanceledJobRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from gpulayer.store.keys import Keys
from gpulayer.store.rq_names import point_rq_at
from gpulayer.store.scripts import _NAMES, library, prelude

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


def test_every_key_is_under_the_prefix_rqs_included() -> None:
    for name, key in all_keys(Keys("teamA")).items():
        assert key.startswith("teamA:"), name
    assert Keys("teamA").job(JOB) == f"teamA:rq:job:{JOB}"


def test_two_prefixes_share_no_key() -> None:
    a, b = all_keys(Keys("teamA")), all_keys(Keys("teamB"))
    assert {name for name in a if a[name] == b[name]} == set()


def test_the_worker_display_name_undoes_the_rq_worker_name() -> None:
    keys = Keys("teamA")
    assert keys.worker_display_name(keys.rq_worker_name(WORKER)) == WORKER


def rq_keys(name: str) -> list[str]:
    """The keys RQ's own classes give a job, a queue and its registries."""
    never_connected = redis.Redis(port=1)
    registries = (StartedJobRegistry, FinishedJobRegistry, FailedJobRegistry, CanceledJobRegistry)
    return [
        Job(JOB, connection=never_connected).key,
        Queue(name, connection=never_connected).key,
        *(registry(name, connection=never_connected).key for registry in registries),
    ]


def test_rqs_keys_pointed_at_an_installation_are_its_and_rqs_own_again_after() -> None:
    keys = Keys("teamA")
    name = keys.queue_name()
    templates = keys.lua_templates()
    ours = [keys.job(JOB), keys.queue(name)] + [
        templates[registry][0] + name + templates[registry][1]
        for registry in ("started", "finished", "failed", "canceled")
    ]
    undo = point_rq_at(keys.rq)
    try:
        assert rq_keys(name) == ours
        # GPUlayer's own names never follow RQ's classes: another installation's, made meanwhile.
        assert Keys("teamB").job(JOB) == f"teamB:rq:job:{JOB}"
    finally:
        undo()
    assert rq_keys(name) == [key.replace("teamA:rq:", "rq:") for key in ours]


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
    text = prelude(Keys("teamA"))
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
            "TAKEN_BY_RQ",
            "UNSIGNED",
            "GANG_START_TRIES",
            "NEW_QUEUE",
            "PREFIX",
            "RQ_QUEUES",
            "RQ_WORKERS",
            "RQ_STATUS",
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
    assert 'local RQ_QUEUES = "teamA:rq:queues"\n' in text
    assert 'inputs = {"teamA:files:", ":in"}' in text
    assert 'scheduled = "started"' in text


def test_the_library_and_every_script_parse_as_lua_51_and_take_the_callers_settings_per_call() -> None:
    lua51 = pytest.importorskip("lupa.lua51")
    keys = Keys("teamA")
    folder = resources.files("gpulayer.store") / "lua"
    head = prelude(keys) + (folder / "_lib.lua").read_text()
    lua = lua51.LuaRuntime()
    # A call's arguments, then the caller's log cap and retention: begin() takes those two off.
    probe = (
        "\nlocal argv = {'mine', '123', '456'}\nbegin(argv)"
        "\nreturn key(K.inputs, ARG), JOBS, key(K.wake, ARG), RQ_QUEUES, RQ_STATUS.cancelled,"
        " LOG_MAX_LINES, RETENTION, #argv"
    )
    lua.globals().ARG = JOB
    assert lua.execute(head + probe) == (
        keys.inputs(JOB),
        "teamA:jobs",
        keys.wake(JOB),
        "teamA:rq:queues",
        "canceled",
        123,
        456,
        1,
    )
    scripts = library("teamA")
    assert sorted(scripts.scripts) == sorted(_NAMES)
    for text in scripts.scripts.values():
        lua.compile(text)
    shebang, code = scripts.code.split("\n", 1)
    assert shebang == f"#!lua name={scripts.name}"
    lua.compile(code)


def test_each_installation_and_each_version_of_the_scripts_has_a_library_of_its_own() -> None:
    a, b = library("teamA"), library("team.A")
    assert a.name.startswith("gl_teamA_")
    assert b.name.startswith("gl_team_A_")
    # What each holds (its keys) names it too: prefixes spelt alike in a library's name never meet.
    assert a.name.rsplit("_", 1)[1] != b.name.rsplit("_", 1)[1]
    assert a.head("claim", True) == ("FCALL", f"{a.name}_claim")
    assert a.head("claim", False)[0] == "EVALSHA"
