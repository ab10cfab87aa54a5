"""Ended jobs expire with their logs and outputs, and leave nothing of their own behind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from click.testing import Result

from gpulayer import Client, Settings
from gpulayer import access as accesses
from gpulayer.installation import Installation
from gpulayer.store.execution import ExecutionStore
from gpulayer.store.scripts import Scripts
from tests.conftest import Workers, wait_for


def test_an_ended_job_expires_with_the_submitters_retention_and_leaves_nothing(
    redis_url: str, home: Path, workers: Workers, raw_redis: redis.Redis
) -> None:
    client = Client(redis_url, settings=Settings(home=home, retention_seconds=1))
    workers.start()
    job = client.submit(["sh", "-c", "echo out; echo x > f"], outputs=["f"])
    job.wait(30)
    assert {key.decode() for key in raw_redis.keys(f"*{job.id}*")} == {
        client.keys.job(job.id),
        client.keys.logs(job.id),
        client.keys.done(job.id),
        client.keys.outputs(job.id),
    }
    assert all(0 < raw_redis.ttl(key) <= 1 for key in raw_redis.keys(f"*{job.id}*"))
    wait_for(lambda: not raw_redis.keys(f"*{job.id}*"), what="the job's keys to expire")

    settings = client.settings
    store = ExecutionStore(raw_redis, client.keys, Scripts(raw_redis, client.keys, settings), "maintenance")
    assert store.prune([client.keys.queue_name()]) == 2  # the index of all jobs, and of succeeded ones
    assert client.jobs() == []
    for key in raw_redis.keys("*"):
        members = raw_redis.zrange(key, 0, -1) if raw_redis.type(key) == b"zset" else []
        assert job.id.encode() not in b" ".join(members), key


def test_a_job_cancelled_while_queued_keeps_no_files(
    client: Client, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    (tmp_path / "data.csv").write_text("1,2\n")
    job = client.submit(["true"], inputs=[tmp_path / "data.csv"])
    assert raw_redis.exists(client.keys.inputs(job.id))
    job.cancel()
    assert not raw_redis.exists(client.keys.inputs(job.id))


def test_gc_ends_now_what_retention_would_end_and_only_the_admin_may(
    cli: Callable[..., Result],
    client: Client,
    workers: Workers,
    home: Path,
    installation: Installation,
    raw_redis: redis.Redis,
) -> None:
    refused = cli("gc")
    assert refused.exit_code == 1
    assert refused.output.strip().splitlines() == [
        "Error: this needs the admin role's access; this machine holds only the submitter, viewer, "
        "web, worker role's (`gpulayer access export ROLE` on the admin's machine makes one)"
    ]
    accesses.save(home, installation.access("admin"))
    workers.start()
    ended = [client.submit(["sh", "-c", "echo out; echo x > f"], outputs=["f"]), client.submit(["false"])]
    for job in ended:
        job.wait(30)
    queued = client.submit(["true"], gpus=8)  # no worker could run it: it never ends
    before = {key for key in raw_redis.keys("*") if any(job.id.encode() in key for job in ended)}

    assert cli("gc", "--older-than", "1h").output.startswith("freed 0 job(s), 0 output archive(s), ")
    dry = cli("gc", "--older-than", "0", "--dry-run").output
    assert dry.startswith("would free 2 job(s), 1 output archive(s), ")
    assert {key for key in raw_redis.keys("*") if any(job.id.encode() in key for job in ended)} == before
    freed = cli("gc", "--older-than", "0").output
    assert freed.replace("freed", "would free", 1) == dry
    for job in ended:
        assert raw_redis.keys(f"*{job.id}*") == []
        for key in raw_redis.keys("*"):
            if raw_redis.type(key) == b"zset":
                assert job.id.encode() not in raw_redis.zrange(key, 0, -1), key
    assert [record.id for record in client.jobs()] == [queued.id]
