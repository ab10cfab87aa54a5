"""`Client(background_submits=True)`: submits sent by a thread, many per round trip, against the
session's real Redis and real worker processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gpulayer import Client, InvalidJobSpec, JobNotFound, JobState, Settings, SubmitFailed
from gpulayer import access as accesses
from gpulayer.models import JobSpec
from gpulayer.store.jobs import new_job_id
from gpulayer.store.sender import Sender

from .conftest import WAIT, Workers


@pytest.fixture
def background(home: Path) -> Iterator[Client]:
    client = Client(settings=Settings(home=home), background_submits=True)
    yield client
    client.close()


def _script_calls(raw_redis: redis.Redis) -> int:
    stats = raw_redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("fcall", "evalsha", "eval"))


def test_a_loop_of_background_submits_makes_every_job_as_given_in_order_in_few_script_calls(
    background: Client, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    raw_redis.config_resetstat()
    shapes = [{"env": {"N": str(index // 50)}, "name": f"run{index // 50}"} for index in range(200)]
    handles = [background.submit(["echo", str(index)], **shape) for index, shape in enumerate(shapes)]
    (tmp_path / "data.txt").write_text("x")
    with_file = background.submit(["cat", "data.txt"], inputs=[tmp_path / "data.txt"])  # the usual path
    background.flush()
    calls = _script_calls(raw_redis)
    records = [handle.status() for handle in handles]
    assert [record.spec.command for record in records] == [["echo", str(index)] for index in range(200)]
    assert [(record.spec.env, record.spec.name) for record in records] == [
        (shape["env"], shape["name"]) for shape in shapes
    ]
    listed = [record.id for record in background.jobs(limit=300)][::-1]  # oldest first
    assert listed == [handle.id for handle in handles] + [with_file.id]
    # Four shapes: at least one script call each, never one per job.
    assert 4 <= calls < 50


def test_background_jobs_run_and_their_handles_wait_like_any_job(
    background: Client, workers: Workers
) -> None:
    workers.start("w1", slots=2)
    handles = [background.submit(["sh", "-c", f"echo {index}"]) for index in range(30)]
    records = background.wait_all(handles, timeout=WAIT)
    assert all(record.state is JobState.SUCCEEDED for record in records)
    assert handles[7].wait(WAIT).state is JobState.SUCCEEDED
    assert [line.text for line in handles[7].logs()] == ["7"]


def test_a_refused_background_submit_is_raised_at_the_flush_and_leaves_nothing(
    home: Path, client: Client
) -> None:
    viewing = accesses.load(home, "viewer")
    viewer = Client(settings=Settings(home=home), access=viewing, background_submits=True)
    try:
        job = viewer.submit(["true"])  # returns: the refusal comes from Redis, later
        refused = r"1 job\(s\) submitted in the background were not made"
        with pytest.raises(SubmitFailed, match=refused) as raised:
            viewer.flush()
        assert raised.value.job_ids == [job.id]
        assert isinstance(raised.value.__cause__, Exception)
        viewer.flush()  # raised once, then done with
    finally:
        viewer.close()
    with pytest.raises(JobNotFound):
        client.get(job.id)
    assert client.jobs() == []


def test_a_spec_too_large_to_store_is_refused_at_the_submit_not_in_the_background(background: Client) -> None:
    with pytest.raises(InvalidJobSpec, match="over 1 MiB"):
        background.submit(["true"], env={"BIG": "x" * (1 << 20)})
    assert background.jobs() == []


def test_a_script_that_ends_without_closing_its_client_still_has_its_jobs_made(
    env: dict[str, str], client: Client
) -> None:
    script = (
        "import gpulayer\n"
        "client = gpulayer.Client(background_submits=True)\n"
        "print(client.submit(['true']).id)\n"
        "for index in range(99):\n"
        "    client.submit(['echo', str(index)])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert run.returncode == 0, run.stderr
    assert client.get(run.stdout.strip()).status().state is JobState.QUEUED
    assert client.job_counts()[JobState.QUEUED] == 100


def test_a_loop_faster_than_redis_waits_while_so_many_submits_are_still_to_send(
    client: Client, raw_redis: redis.Redis
) -> None:
    sender = Sender(client.stores.jobs, batch=2, most_waiting=4)
    spec = JobSpec(command=["true"])
    raw_redis.client_pause(2000, all=False)  # Redis runs no script for 2 s: the sender is held
    loop = threading.Thread(target=lambda: [sender.put(new_job_id(), spec) for _ in range(20)])
    loop.start()
    loop.join(0.5)
    assert loop.is_alive()  # without the bound, all 20 would be in memory by now
    loop.join(WAIT)
    sender.close()
    assert client.job_counts()[JobState.QUEUED] == 20
