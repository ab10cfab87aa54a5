"""Chaos: workers killed at random, a crash inside the dequeue window, Redis killed, a poison pill.
Real Redis, real worker processes, short leases; every job must end the way it should."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import redis

from gpulayer import Client, JobState, Settings
from gpulayer.installation import Installation
from gpulayer.network import free_port
from gpulayer.server import start_redis, wait_ready
from tests.conftest import WAIT, Workers, kill_machine, publish, wait_for

FAST = ("--lease-ttl", "1.5", "--heartbeat", "0.3")


def all_ended(client: Client, count: int) -> bool:
    ended = sum(len(client.jobs(state=state, limit=count)) for state in ("succeeded", "failed", "cancelled"))
    return ended >= count


def test_a_kill_9_storm_loses_no_job_and_records_none_as_succeeded_twice(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script = f'echo "$GPULAYER_JOB_ID" >> {ledger}; sleep 0.1'
    jobs = [client.submit(["sh", "-c", script], retries=20, retry_delay=0.1) for _ in range(500)]
    names = ["w1", "w2", "w3"]
    processes = {name: workers.start(name, 2, *FAST) for name in names}
    rng = random.Random(4)
    kills = 0
    deadline = time.monotonic() + 180
    while not all_ended(client, len(jobs)):
        assert time.monotonic() < deadline, "the jobs did not all end"
        time.sleep(rng.uniform(1, 3))
        name = rng.choice(names)
        kill_machine(processes[name].pid)
        processes[name].wait()
        kills += 1
        processes[name] = workers.start(name, 2, *FAST)
    records = [job.status() for job in jobs]
    assert kills >= 1
    failed = [(r.id, r.reason, r.attempts) for r in records if r.state is not JobState.SUCCEEDED]
    assert not failed, failed
    assert all([a.outcome for a in record.attempts].count("succeeded") == 1 for record in records)
    assert set(ledger.read_text().split()) == {job.id for job in jobs}


def test_a_worker_that_dies_right_after_claiming_loses_no_job(client: Client, workers: Workers) -> None:
    jobs = [client.submit(["true"], retry_delay=0) for _ in range(100)]
    workers.env["GPULAYER_TEST_FAULT"] = "exit-after-claim"
    for round_ in range(25):
        names = [f"crash-{round_}-{i}" for i in range(4)]
        crashing = [workers.start(name, 1, *FAST, wait=False) for name in names]
        codes = [process.wait(WAIT) for process in crashing]
        assert codes == [9, 9, 9, 9], [
            workers.log(name) for name, code in zip(names, codes, strict=True) if code != 9
        ]
    # A job with no files to fetch is running from its claim on (the claim marks it so).
    assert {job.status().state for job in jobs} == {JobState.RUNNING}
    del workers.env["GPULAYER_TEST_FAULT"]
    workers.start("healthy", 2, *FAST)
    records = [job.wait(WAIT) for job in jobs]
    assert {record.state for record in records} == {JobState.SUCCEEDED}
    assert {(record.attempt, record.attempts[0].outcome) for record in records} == {(2, "lost")}


def test_redis_killed_mid_run_loses_no_job_acknowledged_a_second_before(
    tmp_path: Path, env: dict[str, str], installation: Installation
) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    data = tmp_path / "durable-redis"
    redis_process = start_redis(data, port, durable=True)
    wait_ready(url, redis_process)
    publish(installation, url)  # its workers run under the session's worker identity
    client = Client(url, settings=Settings(home=tmp_path / "home"))
    fleet = Workers(client, {**env, "GPULAYER_REDIS_URL": url}, tmp_path / "logs")
    acknowledged: list[tuple[str, float]] = []
    stop = threading.Event()

    def submit_steadily() -> None:
        while not stop.is_set():
            try:
                acknowledged.append((client.submit(["sh", "-c", "sleep 0.05"]).id, time.monotonic()))
            except Exception:  # Redis is down: not acknowledged, nothing to check
                time.sleep(0.05)
            time.sleep(0.01)

    try:
        fleet.start("w1", 2, "--lease-ttl", "4", "--heartbeat", "0.5")
        fleet.start("w2", 2, "--lease-ttl", "4", "--heartbeat", "0.5")
        submitter = threading.Thread(target=submit_steadily)
        submitter.start()
        time.sleep(2)
        crashed_at = time.monotonic()
        redis_process.kill()
        redis_process.wait()
        time.sleep(1)
        redis_process = start_redis(data, port, durable=True)
        wait_ready(url, redis_process)
        time.sleep(2)
        stop.set()
        submitter.join()
        safe = [job_id for job_id, at in acknowledged if at < crashed_at - 1]
        assert len(safe) > 20
        assert {client.get(job_id).wait(60).state for job_id in safe} == {JobState.SUCCEEDED}
    finally:
        stop.set()
        fleet.stop_all()
        redis_process.kill()
        redis_process.wait()


def test_a_job_that_kills_its_worker_fails_after_its_retries_and_the_others_succeed(
    client: Client, workers: Workers
) -> None:
    processes = {name: workers.start(name, 2, *FAST) for name in ("w1", "w2")}
    poison = client.submit(["sh", "-c", "kill -9 $PPID"], retry_delay=0)
    normal = [client.submit(["true"], retries=10, retry_delay=0) for _ in range(100)]
    restarts = 0
    deadline = time.monotonic() + 120
    while not all_ended(client, 101):
        assert time.monotonic() < deadline, "the jobs did not all end"
        for name, process in processes.items():
            if process.poll() is not None:
                restarts += 1
                processes[name] = workers.start(name, 2, *FAST)
        time.sleep(0.1)
    record = poison.status()
    assert (record.state, record.reason) == (JobState.FAILED, "worker lost")
    assert [a.outcome for a in record.attempts] == ["lost", "lost", "lost"]
    assert restarts == 3
    assert {job.status().state for job in normal} == {JobState.SUCCEEDED}


def test_cancel_reaches_a_job_whose_worker_missed_the_message(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    """The cancel is flagged on the job too: a worker that missed the stop-job message (its pub/sub
    connection was down) finds it at its next heartbeat."""
    worker = workers.start("w1", 1, *FAST)
    job = client.submit(["sleep", "300"])
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    # Frozen, the worker cannot subscribe again before the cancel is published (it would at once).
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        raw_redis.client_kill_filter(_type="pubsub")
        assert raw_redis.pubsub_numsub(client.keys.pubsub("w1")) == [(client.keys.pubsub("w1").encode(), 0)]
        job.cancel()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert job.wait(30).state is JobState.CANCELLED
