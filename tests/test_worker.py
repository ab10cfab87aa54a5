"""The worker as a process: RQ compatibility, restarts under the same name, shutdowns, bad records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from rq.command import send_stop_job_command
from rq.job import Job as RQJob

from gpulayer import Client, JobState
from gpulayer.installation import Installation
from gpulayer.store.scripts import library
from gpulayer.worker.claiming import POLL_INTERVAL
from tests.conftest import Workers, wait_for


def rq_info(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", url, "--raw", *flags],
        capture_output=True,
        text=True,
        check=False,
    )


def test_rq_info_with_the_flag_the_docs_give_shows_the_queue_and_the_worker_to_a_submitter(
    client: Client, workers: Workers, installation: Installation
) -> None:
    workers.start(name="box-a")
    client.submit(["true"]).wait(30)
    # As the submitter's Redis user, which reaches the installation's keys alone: rq info (which
    # cleans the registries it shows) touched nothing outside them.
    info = rq_info(installation.url("submitter"), "--queue-class", "gpulayer.rq_tools.Queue")
    assert info.returncode == 0, info.stderr
    assert "queue gpulayer:default 0, 0 executing, 1 finished, 0 failed" in info.stdout
    assert "worker gpulayer:box-a" in info.stdout
    plain = rq_info(installation.url("admin"))  # RQ's own namespace: nothing of the installation's
    assert (plain.returncode, plain.stdout) == (0, "")


@pytest.mark.usefixtures("rq_sees")
def test_a_job_is_an_rq_job(client: Client, workers: Workers, raw_redis: redis.Redis) -> None:
    workers.start(name="box-a")
    job = client.submit(["echo", "hello world"])
    job.wait(30)
    rq_job = RQJob.fetch(job.id, connection=raw_redis)
    assert rq_job.get_status() == "finished"
    assert rq_job.description == "echo 'hello world'"
    assert rq_job.origin == "gpulayer:default"
    assert rq_job.worker_name == "gpulayer:box-a"
    assert rq_job.started_at is not None
    assert rq_job.ended_at is not None


@pytest.mark.usefixtures("rq_sees")
def test_rqs_own_stop_job_command_cancels_a_running_job(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start()
    job = client.submit(["sleep", "300"])
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    send_stop_job_command(raw_redis, job.id)
    assert job.wait(30).state is JobState.CANCELLED


def test_a_worker_restarted_under_its_name_takes_over_at_once_and_reruns_its_job(
    client: Client, workers: Workers
) -> None:
    first = workers.start(name="w1", slots=1)
    job = client.submit(["sh", "-c", "sleep 1; echo done"])
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert job.status().state is JobState.RUNNING  # nothing noticed yet: the old registration is still there

    workers.start(name="w1", slots=1)
    record = job.wait(30)
    assert record.state is JobState.SUCCEEDED
    assert record.attempt == 2
    lines = [(line.attempt, line.stream, line.text) for line in job.logs()]
    assert (1, "system", "worker w1 restarted; its previous run is gone") in lines
    assert (2, "stdout", "done") in lines
    assert [worker.name for worker in client.workers()] == ["w1"]


def test_a_live_workers_name_is_refused_unless_taken_over_on_purpose(
    client: Client, workers: Workers
) -> None:
    first = workers.start(name="w1", slots=1)
    second = workers.start("w1", 1, wait=False)
    assert second.wait(30) == 1
    said = workers.log("w1").splitlines()
    refusal = f"Error: a worker named 'w1' is running (pid {first.pid} on "
    assert any(
        line.startswith(refusal) and line.endswith("pass --replace to take the name over") for line in said
    )
    assert first.poll() is None
    assert [(worker.name, worker.pid) for worker in client.workers()] == [("w1", first.pid)]
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED  # the first one goes on

    third = workers.start("w1", 1, "--replace")
    assert first.wait(30) == 0  # it saw its name taken, and stopped
    assert [(worker.name, worker.pid) for worker in client.workers()] == [("w1", third.pid)]


def test_sigterm_lets_running_jobs_finish(client: Client, workers: Workers) -> None:
    process = workers.start()
    job = client.submit(["sh", "-c", "echo started; sleep 1; echo finished"])
    # Its process runs (a claimed job is marked running before it starts; one not yet started when
    # the worker is asked to stop goes back to its queue instead).
    wait_for(lambda: any(line.text == "started" for line in job.logs()), what="the job to run")
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    record = job.status()
    assert record.state is JobState.SUCCEEDED
    assert client.workers() == []


def test_a_second_sigterm_stops_jobs_and_puts_them_back_in_their_queue(
    client: Client, workers: Workers
) -> None:
    process = workers.start(name="w1")
    job = client.submit(["sh", "-c", "echo started; sleep 300"])
    wait_for(lambda: any(line.text == "started" for line in job.logs()), what="the job to run")
    process.send_signal(signal.SIGTERM)
    # Only once the first is handled does a second one mean "stop now".
    wait_for(lambda: "then stopping; signal again" in workers.log("w1"), what="the warm shutdown")
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    record = job.status()
    assert record.state is JobState.QUEUED
    assert any("w1 stopped; the job goes back to its queue" in line.text for line in job.logs())

    workers.start(name="w2")
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run again")
    assert job.status().attempt == 2
    assert job.status().worker == "w2"


def test_a_suspended_installation_takes_no_jobs_until_resumed_and_rqs_own_suspend_is_anothers(
    client: Client, workers: Workers, redis_url: str
) -> None:
    def rq(*args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "rq.cli", *args, "--url", redis_url], check=True, capture_output=True
        )

    workers.start()
    rq("suspend")  # RQ's own namespace: another program's RQ workers stop, this installation's do not
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    rq("suspend", "--queue-class", "gpulayer.rq_tools.Queue")
    job = client.submit(["true"])
    time.sleep(POLL_INTERVAL * 1.5)  # the worker was woken by the submit, and has polled since
    assert job.status().state is JobState.QUEUED
    rq("resume", "--queue-class", "gpulayer.rq_tools.Queue")
    assert job.wait(30).state is JobState.SUCCEEDED


def test_burst_mode_exits_when_the_queue_is_empty(client: Client, workers: Workers) -> None:
    jobs = [client.submit(["sleep", "0.2"]) for _ in range(3)]
    process = workers.start("w1", 2, "--burst", wait=False)
    assert process.wait(30) == 0
    assert {job.status().state for job in jobs} == {JobState.SUCCEEDED}


def test_a_burst_worker_runs_what_comes_while_its_jobs_run_then_exits(
    client: Client, workers: Workers
) -> None:
    """As RQ's burst worker looks at its queues again after each job, a burst worker stops only once
    its queues are empty and none of its jobs runs: a job submitted while one runs is run too. (It used
    to stop claiming as soon as a claim came back short: a job that a running job's end claimed then
    went back to its queue as the worker exited, and two burst workers draining a queue left its last
    job queued, one time in six.)"""
    running = client.submit(["sleep", "1"])
    process = workers.start("w1", 2, "--burst", wait=False)
    wait_for(lambda: running.status().state is JobState.RUNNING, what="the first job to start")
    time.sleep(0.3)  # its claim for the other slot has come back empty
    later = client.submit(["true"])
    assert process.wait(30) == 0
    assert running.status().state is JobState.SUCCEEDED
    record = later.status()
    assert (record.state, [attempt.worker for attempt in record.attempts]) == (JobState.SUCCEEDED, ["w1"])


def test_a_job_record_that_fails_validation_fails_the_job_not_the_worker(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    job = client.submit(["true"])
    raw_redis.hset(client.keys.job(job.id), "gl_spec", json.dumps({"command": "not a list"}))
    process = workers.start(slots=1)
    wait_for(lambda: raw_redis.hget(client.keys.job(job.id), "gl_state") == b"failed", what="the job to fail")
    reason = raw_redis.hget(client.keys.job(job.id), "gl_reason")
    assert reason is not None
    assert reason.startswith(b"invalid job record: command: ")
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    assert process.poll() is None


def test_a_restart_removes_job_folders_left_behind_and_nothing_else(workers: Workers, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    (workdir / "0123456789ab-1.gljob" / "sub").mkdir(parents=True)
    (workdir / "home-0123456789ab-1.gljob" / ".local").mkdir(parents=True)  # that job's HOME
    (workdir / "notes.txt").write_text("mine")
    workers.start("w1", 1, "--workdir", str(workdir))
    assert sorted(path.name for path in workdir.iterdir()) == ["notes.txt"]


def test_an_idle_worker_claims_at_most_twice_per_job_it_is_woken_for(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    """One claim on the submit's wake-up and one with the job's end; none after a claim that came back
    short (it used to claim a third time, finding nothing, every job)."""
    workers.start("lone", 2)
    _, claim = library(client.settings.prefix).head("claim", True)
    jobs = 10
    kept = raw_redis.config_get("slowlog-*")  # the session's Redis: as it was, after
    raw_redis.config_set("slowlog-log-slower-than", 0)  # every command is logged
    raw_redis.config_set("slowlog-max-len", 10_000)
    raw_redis.slowlog_reset()
    try:
        for _ in range(jobs):
            assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
        calls = raw_redis.slowlog_get(10_000)
    finally:
        for name, value in kept.items():
            raw_redis.config_set(name, value)
    claims = [call for call in calls if call["command"].startswith(f"FCALL {claim}".encode())]
    assert jobs <= len(claims) <= 2 * jobs + 2  # a quiet poll's claim or two besides
