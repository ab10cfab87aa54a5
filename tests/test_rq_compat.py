"""RQ's own tools agree with GPUlayer: a requeue through RQ's API, RQ's view of what a worker runs,
and why a job failed, read the way rq-dashboard and ``rq`` read them (RQ pointed at the installation's
keys, as ``gpulayer.rq_tools`` points RQ's tools)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
import zlib
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import cloudpickle
import pytest
import redis
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.results import Result
from rq.utils import utcformat
from rq.worker import Worker as RQWorker

import gpulayer as gl
from gpulayer import Client, JobState
from gpulayer.installation import Installation
from gpulayer.models import AccessRole
from gpulayer.network import free_port
from gpulayer.service import Service
from gpulayer.store.keys import Keys
from gpulayer.store.rq_jobs import format_timestamp, parse_timestamp
from gpulayer.store.scripts import prelude
from tests.conftest import Workers, answers, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("rq_sees")


def as_role(installation: Installation, role: AccessRole) -> redis.Redis:
    return redis.Redis.from_url(installation.url(role))


def rq_status(raw_redis: redis.Redis, job_id: str) -> str | None:
    return RQJob.fetch(job_id, connection=raw_redis).get_status(refresh=True)


def latest_result(raw_redis: redis.Redis, job_id: str) -> Result:
    """RQ's latest result of a job, as rq-dashboard reads it (its exc_info)."""
    latest = RQJob.fetch(job_id, connection=raw_redis).latest_result()
    assert latest is not None
    return latest


def current_job(raw_redis: redis.Redis, worker: str) -> str | None:
    """The job RQ's view of the worker names, as rq-dashboard reads it."""
    [found] = [w for w in RQWorker.all(connection=raw_redis) if w.name == f"gpulayer:{worker}"]
    return found.get_current_job_id()


def failed_once(marker: Path) -> list[str]:
    """A command that fails (exit 3) the first time it runs, and succeeds after."""
    return ["sh", "-c", f"if [ -e {marker} ]; then echo second run; else touch {marker}; exit 3; fi"]


# --- a requeue through RQ's API -----------------------------------------------------------------------


def test_a_failed_job_requeued_through_rqs_api_runs_again_as_its_next_attempt(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation, tmp_path: Path
) -> None:
    workers.start()
    job = client.submit(failed_once(tmp_path / "ran"), retries=0)
    assert job.wait(30).state is JobState.FAILED

    # What rq-dashboard's "requeue" does (job.requeue()), with a submitter's Redis user.
    FailedJobRegistry(client.keys.queue_name(), connection=as_role(installation, "submitter")).requeue(job.id)
    wait_for(lambda: job.status().state is JobState.SUCCEEDED, what="the requeued job to run again")

    record = job.wait(5)  # a waiter sees the new end, not the one before
    assert record.state is JobState.SUCCEEDED
    assert record.attempt == 2
    attempts = [(a.attempt, a.outcome, a.exit_code) for a in record.attempts]
    assert attempts == [(1, "failed", 3), (2, "succeeded", 0)]
    lines = [(line.attempt, line.stream, line.text) for line in job.logs()]
    assert (1, "system", "requeued through RQ: it runs again") in lines
    assert (2, "stdout", "second run") in lines
    assert rq_status(raw_redis, job.id) == "finished"
    registries = (FailedJobRegistry, FinishedJobRegistry)
    assert [job.id in r(client.keys.queue_name(), connection=raw_redis) for r in registries] == [False, True]
    assert latest_result(raw_redis, job.id).type is Result.Type.SUCCESSFUL  # no stale failure shows
    assert 0 < raw_redis.ttl(client.keys.job(job.id)) <= client.settings.retention_seconds


def test_a_requeue_through_rq_of_a_job_whose_files_are_gone_is_refused_in_both_views(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation, tmp_path: Path
) -> None:
    (tmp_path / "data.csv").write_text("1,2\n")
    workers.start()
    job = client.submit(["sh", "-c", "exit 3"], inputs=[tmp_path / "data.csv"], retries=0)
    assert job.wait(30).state is JobState.FAILED

    RQJob.fetch(job.id, connection=as_role(installation, "submitter")).requeue()
    wait_for(lambda: rq_status(raw_redis, job.id) == "failed", what="the refusal")

    record = job.status()
    assert (record.state, record.attempt, record.reason) == (JobState.FAILED, 1, "exit code 3")
    assert job.id in FailedJobRegistry(client.keys.queue_name(), connection=raw_redis)
    refusal = "requeue through RQ refused: its files were deleted when it ended; submit it again"
    assert (1, "system", refusal) in [(line.attempt, line.stream, line.text) for line in job.logs()]
    latest = latest_result(raw_redis, job.id)
    assert latest.type is Result.Type.FAILED
    assert (latest.exc_string or "").endswith(refusal)
    assert not raw_redis.lrange(client.keys.queue(client.keys.queue_name()), 0, -1)


def always_fails() -> None:
    raise ValueError("no")


def test_a_requeue_through_rq_of_a_function_call_is_refused_in_both_views(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation, tmp_path: Path
) -> None:
    """A call's arguments are deleted with its job's files when it ends: it cannot run again."""
    workers.start()
    (tmp_path / "project").mkdir()
    handle = gl.remote(always_fails, client=client, source=tmp_path / "project", retries=0).remote()
    with pytest.raises(ValueError, match="no"):
        handle.result(timeout=30)
    job = client.get(handle.id)

    RQJob.fetch(job.id, connection=as_role(installation, "submitter")).requeue()
    wait_for(lambda: rq_status(raw_redis, job.id) == "failed", what="the refusal")

    record = job.status()
    assert (record.state, record.attempt) == (JobState.FAILED, 1)
    refusal = "requeue through RQ refused: its files were deleted when it ended; submit it again"
    assert (1, "system", refusal) in [(line.attempt, line.stream, line.text) for line in job.logs()]
    assert job.id in FailedJobRegistry(client.keys.queue_name(), connection=raw_redis)


def test_a_failed_gang_job_requeued_through_rq_runs_again_on_a_new_gang(
    client: Client, workers: Workers, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    workers.start("g-a", 1)
    workers.start("g-b", 1)
    job = client.submit(failed_once(tmp_path / "ran"), nodes=2, retries=0)
    assert job.wait(30).state is JobState.FAILED
    # No job but gang jobs ever used this queue: no worker serves it, so the reaper takes it up.
    assert client.keys.queue_name() not in [queue.name for queue in Service(client).queues()[0]]

    RQJob.fetch(job.id, connection=raw_redis).requeue()
    wait_for(lambda: job.status().state is JobState.SUCCEEDED, what="the requeued gang job to run again")
    record = job.status()
    assert [(a.attempt, a.outcome) for a in record.attempts] == [(1, "failed"), (2, "succeeded")]
    assert rq_status(raw_redis, job.id) == "finished"


def test_a_viewer_cannot_requeue_a_failed_job_through_rq(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation
) -> None:
    workers.start()
    job = client.submit(["false"], retries=0)
    assert job.wait(30).state is JobState.FAILED
    viewer = as_role(installation, "viewer")
    with pytest.raises(redis.exceptions.NoPermissionError):
        FailedJobRegistry(client.keys.queue_name(), connection=viewer).requeue(job.id)
    assert rq_status(raw_redis, job.id) == "failed"
    assert job.id in FailedJobRegistry(client.keys.queue_name(), connection=raw_redis)
    assert job.status().state is JobState.FAILED


def test_rq_dashboard_with_the_flag_the_docs_give_shows_the_installation_and_requeues_a_failed_job(
    client: Client, workers: Workers, installation: Installation, tmp_path: Path
) -> None:
    pytest.importorskip("rq_dashboard")
    workers.start("w1", 1)
    job = client.submit(failed_once(tmp_path / "ran"), retries=0)
    assert job.wait(30).state is JobState.FAILED
    port = free_port()
    # As a submitter, whose Redis user reaches the installation's keys alone.
    command = ["rq-dashboard", "-c", "gpulayer.rq_tools", "-u", installation.url("submitter")]
    with open(tmp_path / "dashboard.log", "wb") as log:
        dashboard = subprocess.Popen(
            [Path(sys.executable).with_name(command[0]), *command[1:], "-b", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(base), what="rq-dashboard")
        with urllib.request.urlopen(f"{base}/0/data/queues.json", timeout=10) as answer:
            [queue] = json.load(answer)["queues"]
        assert (queue["name"], queue["failed_job_registry_count"]) == (client.keys.queue_name(), 1)
        with urllib.request.urlopen(f"{base}/0/data/workers.json", timeout=10) as answer:
            assert [worker["name"] for worker in json.load(answer)["workers"]] == ["gpulayer:w1"]
        requeue = urllib.request.Request(f"{base}/job/{job.id}/requeue", method="POST")
        with urllib.request.urlopen(requeue, timeout=10) as answer:
            assert json.load(answer) == {"status": "OK"}
    finally:
        dashboard.terminate()
        dashboard.wait(10)
    wait_for(lambda: job.status().state is JobState.SUCCEEDED, what="the job requeued from rq-dashboard")
    assert job.status().attempt == 2


# --- RQ's view of the worker ------------------------------------------------------------------------


def test_rqs_view_of_a_worker_names_the_job_it_started_last_and_idle_once_none_runs(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start(name="w1", slots=2)
    assert current_job(raw_redis, "w1") is None
    first = client.submit(["sleep", "300"])
    wait_for(lambda: current_job(raw_redis, "w1") == first.id, what="RQ to see the first job")
    second = client.submit(["sleep", "300"])
    wait_for(lambda: current_job(raw_redis, "w1") == second.id, what="RQ to see the second job")
    assert first.status().state is JobState.RUNNING

    second.cancel()
    assert second.wait(30).state is JobState.CANCELLED
    assert current_job(raw_redis, "w1") == first.id  # the one still running
    first.cancel()
    assert first.wait(30).state is JobState.CANCELLED
    assert current_job(raw_redis, "w1") is None


def test_rqs_view_of_a_worker_running_part_of_a_gang_job_names_the_gang_job(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("g-a", 1)
    workers.start("g-b", 1)
    job = client.submit(["sleep", "300"], nodes=2)
    wait_for(lambda: job.status().state is JobState.RUNNING, what="every node to start")
    assert [current_job(raw_redis, name) for name in ("g-a", "g-b")] == [job.id, job.id]
    assert RQJob.fetch(job.id, connection=raw_redis).description == "sleep 300"  # what rq-dashboard shows
    job.cancel()
    assert job.wait(30).state is JobState.CANCELLED
    assert [current_job(raw_redis, name) for name in ("g-a", "g-b")] == [None, None]


# --- why a job failed, for RQ ---------------------------------------------------------------------------


def test_a_failed_job_tells_rq_why_as_rqs_worker_would(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start(name="w1")
    job = client.submit(["sh", "-c", "echo starting; echo 'no GPU here: é' >&2; exit 3"], retries=0)
    assert job.wait(30).state is JobState.FAILED

    latest = latest_result(raw_redis, job.id)
    assert (latest.type, latest.worker_name, latest.execution_id) == (Result.Type.FAILED, "gpulayer:w1", "1")
    assert latest.exc_string == (
        f"GPUlayer job {job.id} failed: exit code 3\n"
        "attempt 1 on worker w1, exit code 3\n"
        "last lines of its log:\n"
        "  [stdout] starting\n"
        "  [stderr] no GPU here: é"
    )
    # The job hash's exc_info too, as RQ's failed registry writes it.
    exc_info = raw_redis.hget(client.keys.job(job.id), "exc_info")
    assert isinstance(exc_info, bytes)
    assert zlib.decompress(exc_info).decode() == latest.exc_string


def test_a_job_that_timed_out_tells_rq_so(client: Client, workers: Workers, raw_redis: redis.Redis) -> None:
    workers.start(name="w1")
    job = client.submit(["sleep", "30"], timeout=0.2, retries=0)
    assert job.wait(30).state is JobState.TIMED_OUT
    latest = latest_result(raw_redis, job.id)
    assert latest.type is Result.Type.FAILED
    assert (latest.exc_string or "").startswith(f"GPUlayer job {job.id} timed out: timed out after 0.2 s\n")


def test_a_succeeded_job_leaves_no_result_stream(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start()
    job = client.submit(["true"])
    assert job.wait(30).state is JobState.SUCCEEDED
    assert not raw_redis.exists(client.keys.results(job.id))


def lua_helpers() -> tuple[Callable[[bytes], bytes], Callable[[bytes, int], bytes]]:
    """The scripts' encoder (``base64(zlib_stored(text))``) and ``cut``, run by Lua 5.1 as Redis runs them."""
    lua51 = pytest.importorskip("lupa.lua51")
    folder = resources.files("gpulayer.store") / "lua"
    head = prelude(Keys("teamA")) + (folder / "_lib.lua").read_text()
    probe = "\nreturn function(text) return base64(zlib_stored(text)) end, cut"
    encode, cut = lua51.LuaRuntime(encoding=None).execute(head + probe)
    return encode, cut


@pytest.mark.parametrize("size", [0, 1, 2, 3, 300, 65_535, 65_536, 140_000])
def test_the_scripts_encode_a_failure_as_rq_decodes_it(size: int) -> None:
    encode, _ = lua_helpers()
    text = ("é ünïcode " * (size // 10 + 1)).encode()[:size]
    assert zlib.decompress(base64.b64decode(encode(text))) == text


def test_a_line_cut_short_for_rq_keeps_whole_characters() -> None:
    _, cut = lua_helpers()
    assert cut("aé".encode(), 2) == b"a..."
    assert cut("aé".encode(), 3) == "aé".encode()
    assert cut("aéb".encode(), 3) == "aé...".encode()


def test_the_docs_install_rq_dashboard_with_six_which_it_needs_but_does_not_declare() -> None:
    text = (Path(__file__).parent.parent / "docs" / "jobs.md").read_text()
    [command] = [line for line in text.split("`") if line.startswith("pip install rq-dashboard")]
    assert "six" in command.split()


@pytest.mark.parametrize("micro", [0, 7, 999_999])
def test_timestamps_are_written_as_rqs_utcformat_writes_them(micro: int) -> None:
    moment = datetime(2026, 1, 31, 9, 5, 3, micro, tzinfo=timezone.utc)
    assert format_timestamp(moment) == utcformat(moment)
    assert parse_timestamp(format_timestamp(moment).encode()) == moment
