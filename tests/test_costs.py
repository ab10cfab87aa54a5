"""What a short job costs Redis, counted rather than timed: the commands of its submit, claim and
end, and of a wait on it once it has ended (docs/performance.md)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import redis

from gpulayer import Client, JobState
from gpulayer.service import Service
from tests.conftest import WAIT, Workers, commands_run, commands_since

JOBS = 200


def test_a_short_job_costs_redis_75_commands_in_3_script_calls_and_a_wait_on_it_one_read(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("w1", 2)
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED  # the scripts are loaded
    before = commands_run(raw_redis)
    jobs = [client.submit(["true"]) for _ in range(JOBS)]
    polls = 1
    deadline = time.monotonic() + WAIT
    while sum(Service(client).ended_counts().values()) < JOBS + 1:  # one HGETALL each
        assert time.monotonic() < deadline, "the jobs did not end"
        polls += 1
        time.sleep(0.01)
    ran = commands_since(raw_redis, before)
    ran["hgetall"] -= polls
    # A submit, a claim and an end with the next claim: three script calls per job, and what runs
    # inside them (the worker's heartbeats and telemetry meanwhile count too).
    assert ran["fcall"] <= 3.05 * JOBS, ran
    assert sum(ran.values()) <= 75 * JOBS, sorted(ran.items(), key=lambda item: -item[1])
    before = commands_run(raw_redis)
    assert all(job.wait(WAIT).state is JobState.SUCCEEDED for job in jobs)
    waited = commands_since(raw_redis, before)
    # Each record read once; the done streams read together, ahead of the waits.
    assert waited["hgetall"] == JOBS, waited
    assert waited["xread"] <= JOBS / 10, waited
    assert sum(waited.values()) <= 1.2 * JOBS, waited


def test_a_wait_on_a_running_job_is_one_round_trip_that_blocks_then_reads_its_record(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("w1", 1)
    job = client.submit(["sleep", "1"])
    deadline = time.monotonic() + WAIT
    while job.status().state is not JobState.RUNNING:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.01)
    before = commands_run(raw_redis)
    with watching(raw_redis) as seen:
        record = job.wait(WAIT)
    waited = commands_since(raw_redis, before)
    assert record.state is JobState.SUCCEEDED
    assert record.ended_at is not None
    # A blocking read of its done stream, and its record read once Redis wakes the wait: no poll,
    # no second round trip for the record. (The worker's own blocking reads of the requests for
    # outputs it keeps, ``...:transfers``, go on meanwhile: not the wait's.)
    reads = [
        command for command in seen if command.upper().startswith("XREAD") and ":transfers" not in command
    ]
    assert len(reads) == 1, reads
    assert waited.get("hgetall", 0) == 1, waited


@contextlib.contextmanager
def watching(raw_redis: redis.Redis) -> Iterator[list[str]]:
    """Every command Redis runs while the block runs, as MONITOR shows it."""
    seen: list[str] = []
    done = threading.Event()
    with raw_redis.monitor() as monitor:

        def listen() -> None:
            for command in monitor.listen():
                seen.append(command["command"])
                if done.is_set():
                    return

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        time.sleep(0.1)  # MONITOR is on before the block's first command
        try:
            yield seen
        finally:
            done.set()
            raw_redis.ping()  # one more command, so that the listener sees it is done
            thread.join(5)
