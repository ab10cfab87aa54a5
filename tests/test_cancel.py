"""Cancel: a queued job leaves its queue, a running one loses its processes, an ended one is untouched."""

from __future__ import annotations

from pathlib import Path

import psutil
import redis

from gpulayer import Client, JobState
from tests.conftest import Workers, wait_for


def test_a_queued_job_is_cancelled_and_leaves_its_queue(client: Client, raw_redis: redis.Redis) -> None:
    job = client.submit(["true"])
    assert raw_redis.llen(client.keys.queue(client.keys.queue_name())) == 1
    assert job.cancel() is True
    record = job.status()
    assert record.state is JobState.CANCELLED
    assert record.reason == "cancelled while queued"
    assert record.ended_at is not None
    assert raw_redis.llen(client.keys.queue(client.keys.queue_name())) == 0
    assert job.wait(5).state is JobState.CANCELLED


def test_a_cancelled_queued_job_never_runs(client: Client, workers: Workers, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = client.submit(["touch", str(marker)])
    job.cancel()
    workers.start()
    client.submit(["true"]).wait(30)
    assert not marker.exists()
    assert job.status().state is JobState.CANCELLED


def test_a_running_job_and_the_processes_it_started_are_stopped(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    pids = tmp_path / "pids"
    # A child in the background, and a grandchild that leaves the job's session.
    script = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    job = client.submit(["sh", "-c", script])
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 3, what="the job's processes")
    assert job.cancel() is True
    record = job.wait(30)
    assert record.state is JobState.CANCELLED
    assert record.reason == "cancelled"
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_cancel_of_an_ended_job_changes_nothing(client: Client, workers: Workers) -> None:
    workers.start()
    job = client.submit(["true"])
    before = job.wait(30)
    assert job.cancel() is False
    assert job.status() == before


def test_the_cli_reports_each_cancel_outcome(client: Client, workers: Workers, cli) -> None:  # type: ignore[no-untyped-def]
    queued = client.submit(["true"])
    result = cli("cancel", queued.id)
    assert result.exit_code == 0
    assert result.output.strip() == f"job {queued.id} cancelled"
    result = cli("cancel", queued.id)
    assert result.exit_code == 0
    assert result.output.strip() == f"job {queued.id} had already ended (cancelled); nothing to cancel"
    workers.start()
    running = client.submit(["sleep", "300"])
    wait_for(lambda: running.status().state is JobState.RUNNING, what="the job to run")
    result = cli("cancel", running.id)
    assert result.exit_code == 0
    assert result.output.strip() == f"job {running.id} cancelled"
