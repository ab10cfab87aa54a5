"""RQ's API on GPUlayer (:mod:`gpulayer.rq`), and plain RQ on an installation: RQ's own CLI and API,
against the session's real Redis and real workers. CI runs this file under RQ 2 and RQ 3 (``.ci/run``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from rq import Queue as PlainQueue
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry
from rq.results import Result

from gpulayer import Client, InvalidJobSpec, JobState
from gpulayer.installation import Installation
from gpulayer.rq import Job, Queue
from gpulayer.settings import Settings
from gpulayer.signing import Keyring, SigningKey
from gpulayer.store.rq_jobs import UNSIGNED
from tests.conftest import Workers, wait_for

pytestmark = pytest.mark.usefixtures("rq_sees")
WAIT = 60


@pytest.fixture
def queue(client: Client, tmp_path: Path) -> Queue:
    """A queue whose jobs ship an empty project: the functions they call are the standard library's."""
    (tmp_path / "project").mkdir()
    return Queue(client=client, source=tmp_path / "project")


def test_a_job_enqueued_through_gpulayers_queue_runs_on_a_worker_and_rq_reads_its_value(
    client: Client, workers: Workers, queue: Queue
) -> None:
    workers.start("w1", 1)
    job = queue.enqueue("operator.add", 2, 3)
    assert isinstance(job, Job)
    assert job.latest_result(timeout=WAIT) is not None
    assert job.return_value() == 5
    assert job.get_status(refresh=True) == "finished" == client.get(job.id).status().state.rq_status
    latest = job.latest_result()
    assert latest is not None
    assert (latest.type, latest.worker_name) == (Result.Type.SUCCESSFUL, "gpulayer:w1")
    # Found again through the queue, and through the Job class, as RQ's users find jobs.
    fetched = queue.fetch_job(job.id)
    assert fetched is not None
    assert fetched.return_value() == 5
    assert queue.job_class.fetch(job.id, connection=queue.connection).get_status() == "finished"


def test_what_a_job_raised_is_in_rqs_records_and_its_status_agrees_with_gpulayers(
    client: Client, workers: Workers, queue: Queue, raw_redis: redis.Redis
) -> None:
    workers.start("w1", 1)
    job = queue.enqueue_call("json.loads", args=("not json",))
    latest = job.latest_result(timeout=WAIT)
    assert latest is not None
    assert latest.type is Result.Type.FAILED
    assert "JSONDecodeError" in (latest.exc_string or "")
    assert job.return_value() is None
    record = client.get(job.id).status()
    assert record.state is JobState.FAILED
    assert job.get_status(refresh=True) == "failed" == record.state.rq_status
    # RQ's own Job, as rq-dashboard reads it, says so too.
    assert "JSONDecodeError" in (RQJob.fetch(job.id, connection=raw_redis).latest_result().exc_string or "")
    assert job.id in FailedJobRegistry(queue.name, connection=raw_redis)


def test_enqueue_many_submits_each_prepared_call_and_requirements_name_the_queue(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("w1", 2)
    queue = Queue(client=client, source=tmp_path, cpus=1)
    datas = [Queue.prepare_data("operator.mul", (n, n)) for n in range(5)]
    jobs = queue.enqueue_many(datas)
    assert [job.latest_result(timeout=WAIT) is not None for job in jobs] == [True] * 5
    assert [job.return_value() for job in jobs] == [0, 1, 4, 9, 16]
    assert {job.origin for job in jobs} == {queue.name}
    assert queue.name == client.keys.queue_name(client.get(jobs[0].id).status().spec.requirements.capability)


def test_what_gpulayer_has_no_place_for_is_refused_in_one_line_naming_the_alternative(
    client: Client, queue: Queue
) -> None:
    from datetime import datetime, timedelta, timezone

    with pytest.raises(InvalidJobSpec, match="enqueue it when it is due"):
        queue.enqueue_at(datetime.now(timezone.utc), "operator.add", 1, 2)
    with pytest.raises(InvalidJobSpec, match="enqueue it when it is due"):
        queue.enqueue_in(timedelta(seconds=5), "operator.add", 1, 2)
    with pytest.raises(InvalidJobSpec, match="depends_on is not supported: enqueue the next job"):
        queue.enqueue("operator.add", 1, 2, depends_on="x")
    with pytest.raises(InvalidJobSpec, match="cannot ask for GPUs"):
        queue.enqueue("operator.add", 1, 2, gpu_memory="lots")
    with pytest.raises(InvalidJobSpec, match="not an import path"):
        queue.enqueue("add", 1, 2)
    with pytest.raises(InvalidJobSpec, match="GPUlayer names a queue by what its jobs ask for"):
        Queue("high", client=client)
    assert client.jobs() == []


def test_a_job_enqueued_through_gpulayers_queue_with_a_key_that_is_not_trusted_is_refused(
    workers: Workers, home: Path, tmp_path: Path, raw_redis: redis.Redis
) -> None:
    workers.start("w1", 1)
    stranger = Client(settings=Settings(home=home))
    stranger.stores.jobs._keyring = Keyring(job_key=SigningKey.generate())  # a key anyone can make
    try:
        job = Queue(client=stranger, source=tmp_path).enqueue("os.system", "touch pwned")
        latest = job.latest_result(timeout=WAIT)
        assert latest is not None
        assert latest.type is Result.Type.FAILED
        record = stranger.get(job.id).status()
        assert record.reason == "refused: the job is signed with another installation's key; it was not run"
        assert job.get_status(refresh=True) == "failed"
    finally:
        stranger.close()


def test_a_plain_rq_job_on_a_gpulayer_queue_ends_failed_unrun_saying_how_to_enqueue_it(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    client.submit(["true"]).wait(WAIT)  # the default queue is served
    marker = tmp_path / "ran"
    submitter = redis.Redis.from_url(installation.url("submitter"))
    plain = PlainQueue(client.keys.queue_name(), connection=submitter).enqueue("os.system", f"touch {marker}")
    wait_for(lambda: plain.get_status(refresh=True) == "failed", what="the plain job to fail")
    assert plain.id in FailedJobRegistry(client.keys.queue_name(), connection=raw_redis)
    latest = RQJob.fetch(plain.id, connection=raw_redis).latest_result()
    assert latest is not None
    assert (latest.type, latest.exc_string) == (Result.Type.FAILED, UNSIGNED)
    assert not marker.exists()
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED  # the worker is fine


def rq_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """RQ's own CLI, pointed at the installation as the docs say (``-c gpulayer.rq_tools``)."""
    command = [sys.executable, "-m", "rq.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_plain_rq_worker_that_takes_a_gpulayer_job_puts_it_back_for_a_gpulayer_worker(
    client: Client, workers: Workers, env: dict[str, str], installation: Installation
) -> None:
    job = client.submit(["echo", "ran on GPUlayer"])
    queue = client.keys.queue_name()
    taken = rq_cli(
        env, "worker", "--burst", "-c", "gpulayer.rq_tools", "-u", installation.url("submitter"), queue
    )
    assert taken.returncode == 0, taken.stderr
    assert "not on a plain `rq worker`" in taken.stdout + taken.stderr
    assert job.status().state is JobState.QUEUED  # never lost in GPUlayer's view
    workers.start("w1", 1)
    record = job.wait(WAIT)
    assert record.state is JobState.SUCCEEDED
    lines = [line.text for line in job.logs()]
    assert any(line.startswith("taken by ") and line.endswith("back in its queue") for line in lines)
    assert "ran on GPUlayer" in lines
    assert not client.redis.exists(client.keys.taken_by_rq)


def test_deleting_a_running_job_through_rq_frees_its_slot(
    client: Client, workers: Workers, installation: Installation
) -> None:
    workers.start("w1", 1)
    job = client.submit(["sleep", "300"])
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    # What rq-dashboard's Delete does, as a submitter.
    RQJob.fetch(job.id, connection=redis.Redis.from_url(installation.url("submitter"))).delete()
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED
    [worker] = client.workers()
    assert (worker.cpus_used, worker.memory_used) == (0, 0)


def test_rq_info_works_for_a_viewer(
    client: Client, workers: Workers, env: dict[str, str], installation: Installation
) -> None:
    workers.start("w1", 1)
    client.submit(["false"], retries=0).wait(WAIT)
    info = rq_cli(
        env, "info", "--queue-class", "gpulayer.rq_tools.Queue", "-u", installation.url("viewer"), "--raw"
    )
    assert info.returncode == 0, info.stderr
    assert "queue gpulayer:default 0, 0 executing, 0 finished, 1 failed" in info.stdout


def test_the_worker_imports_a_function_named_by_its_path_only_where_it_runs() -> None:
    from gpulayer.payloads import imported

    assert imported("os.path.join") is os.path.join
    with pytest.raises(ImportError):
        imported("no_such_module_here.f")
