"""Leases, the reaper, retries, fencing, idempotent submit, and bad records — with real workers."""

from __future__ import annotations

import io
import json
import signal
import tarfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

from gpulayer import Client, ConfigError, JobState
from gpulayer.installation import Installation
from gpulayer.models import build_spec
from gpulayer.store.artifacts import INPUTS_ARCHIVE
from gpulayer.store.execution import ClaimRequest, ExecutionStore, QueueOffer
from gpulayer.store.keys import Keys
from gpulayer.store.scripts import Scripts, library, load_library
from gpulayer.worker.claiming import POLL_INTERVAL
from tests.conftest import Workers, kill_machine, wait_for

#: Short leases, so a lost worker shows within seconds.
FAST = ("--lease-ttl", "1.5", "--heartbeat", "0.3")


def blocker(tmp_path: Path, name: str = "release") -> list[str]:
    return ["sh", "-c", f"while [ ! -e {tmp_path / name} ]; do sleep 0.05; done"]


def test_a_failing_command_runs_again_when_asked_to_and_every_attempt_is_kept(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    counter = tmp_path / "count"
    script = f"echo x >> {counter}; n=$(wc -l < {counter}); [ $n -ge 3 ]"
    job = client.submit(["sh", "-c", script], retries=3, retry_on="exit", retry_delay=0.05)
    record = job.wait(30)
    assert record.state is JobState.SUCCEEDED
    assert record.attempt == 3
    assert [(a.attempt, a.outcome, a.exit_code, a.reason) for a in record.attempts] == [
        (1, "failed", 1, "exit code 1"),
        (2, "failed", 1, "exit code 1"),
        (3, "succeeded", 0, None),
    ]
    assert all(a.worker == "w1" and a.started_at and a.ended_at for a in record.attempts)
    retries = [line.text for line in job.logs() if line.stream == "system"]
    assert retries == ["exit code 1; retrying in 0.05 s", "exit code 1; retrying in 0.1 s"]


def test_retries_run_out_and_the_last_failure_stands(client: Client, workers: Workers) -> None:
    workers.start()
    record = client.submit(["sh", "-c", "exit 4"], retries=1, retry_on="both", retry_delay=0).wait(30)
    assert record.state is JobState.FAILED
    assert (record.exit_code, record.reason, record.attempt) == (4, "exit code 4", 2)


def test_by_default_only_a_lost_worker_is_retried_not_an_exit_code(client: Client, workers: Workers) -> None:
    workers.start()
    record = client.submit(["false"]).wait(30)
    assert (record.state, record.attempt, len(record.attempts)) == (JobState.FAILED, 1, 1)


def test_a_job_waiting_out_its_back_off_can_be_cancelled(client: Client, workers: Workers) -> None:
    workers.start()
    job = client.submit(["false"], retries=1, retry_on="exit", retry_delay=60)
    wait_for(lambda: job.status().retry_at is not None, what="the retry to be scheduled")
    assert job.status().state is JobState.QUEUED
    assert job.cancel() is True
    assert job.status().state is JobState.CANCELLED


def test_a_dead_workers_job_runs_again_elsewhere_once_its_lease_expires(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    doomed = workers.start("doomed", 1, *FAST)
    job = client.submit(blocker(tmp_path), retry_delay=0)
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    workers.start("survivor", 1, *FAST)
    kill_machine(doomed.pid)
    wait_for(lambda: job.status().worker == "survivor", what="the job to move")
    (tmp_path / "release").touch()
    record = job.wait(30)
    assert (record.state, record.attempt) == (JobState.SUCCEEDED, 2)
    assert record.attempts[0].outcome == "lost"
    assert record.attempts[0].reason == "worker doomed stopped renewing its lease"
    assert record.attempts[1].worker == "survivor"


def test_a_job_lost_with_no_retry_left_fails_worker_lost(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    doomed = workers.start("doomed", 1, *FAST)
    job = client.submit(blocker(tmp_path), retries=0, gpus=0)
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    workers.start("survivor", 1, *FAST)
    kill_machine(doomed.pid)
    record = job.wait(30)
    assert (record.state, record.reason, record.exit_code) == (JobState.FAILED, "worker lost", None)


def test_a_frozen_worker_comes_back_to_find_its_job_gone_and_writes_nothing(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    frozen = workers.start("frozen", 1, *FAST)
    script = f'sleep 1.5; echo "$GPULAYER_ATTEMPT" >> {ledger}; echo "attempt $GPULAYER_ATTEMPT done"'
    job = client.submit(["sh", "-c", script], retry_delay=0)
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    frozen.send_signal(signal.SIGSTOP)
    try:
        workers.start("thawed", 1, *FAST)
        wait_for(lambda: job.status().attempt == 2, what="the job to be retried")
        wait_for(lambda: job.status().state is JobState.SUCCEEDED, what="the retry to succeed")
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(lambda: "attempt 1 lost the job" in workers.log("frozen"), what="the stale worker to notice")
    record = job.status()
    assert (record.state, record.worker, record.attempt) == (JobState.SUCCEEDED, "thawed", 2)
    assert [a.outcome for a in record.attempts] == ["lost", "succeeded"]
    assert [line.text for line in job.logs() if line.stream == "stdout"] == ["attempt 2 done"]
    assert frozen.poll() is None


def test_stopping_a_worker_lets_its_jobs_finish_or_puts_them_back(
    client: Client, workers: Workers, tmp_path: Path, cli
) -> None:  # type: ignore[no-untyped-def]
    first = workers.start("first", 1)
    job = client.submit(["sh", "-c", "sleep 0.5; echo finished"])
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    assert cli("worker", "stop", "first").output.strip() == "worker first is stopping"
    assert first.wait(30) == 0
    assert job.status().state is JobState.SUCCEEDED

    second = workers.start("second", 1)
    held = client.submit(blocker(tmp_path))
    wait_for(lambda: held.status().state is JobState.RUNNING, what="the job to run")
    client.stop_worker("second", requeue=True)
    assert second.wait(30) == 0
    record = held.status()
    assert (record.state, record.attempts[-1].outcome) == (JobState.QUEUED, "returned")
    result = cli("worker", "stop", "nobody")
    assert (result.exit_code, result.stderr.strip()) == (1, "Error: no worker named 'nobody' is connected")


def test_one_idempotency_key_makes_one_job_however_many_submit_it(
    client: Client, raw_redis: redis.Redis
) -> None:
    ids: list[str] = []

    def submit() -> None:
        ids.append(client.submit(["true"], idempotency_key="nightly-2026-11-29").id)

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 1
    assert len(client.jobs()) == 1
    assert client.submit(["true"], idempotency_key="another").id != ids[0]


def test_a_submit_sent_again_after_its_reply_was_lost_makes_no_second_job(client: Client) -> None:
    # As redis-py sends a command again when the connection drops before the reply (a failover): the
    # first send made the job, the second finds it, and no other id is tried.
    jobs, scripts = client.stores.jobs, client.stores.jobs._scripts
    one = jobs._submit_call("job-one", build_spec(command=["true"]), "", {}, None, None)
    assert [scripts.run("submit", *one) for _ in range(2)] == [[1, b"job-one"]] * 2
    two, three = build_spec(command=["true"]), build_spec(command=["false"])
    batch = jobs._batch_call([("job-two", two), ("job-three", three)])
    assert scripts.stream([("submit_many", *batch)] * 2) == [[1, 1], [1, 1]]
    assert client.job_counts()[JobState.QUEUED] == 3
    # Another submit of a taken id (another job: its own creation time, its own seal) makes nothing.
    assert jobs.submit("job-one", build_spec(command=["true"]), "", {}) is None
    assert jobs.submit_many([("job-two", build_spec(command=["true"]))]) == [None]


def test_a_job_that_leaves_a_daemon_behind_ends_with_it_gone(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    pid_file = tmp_path / "daemon.pid"
    # Double fork and a new session: the daemon leaves the job's process group and its parent. The job
    # ends once the daemon has said where it is (a fixed sleep was too short on a loaded machine:
    # the daemon, still in the job's group, went with it before it wrote its pid).
    daemon_line = f"(setsid sh -c 'echo $$ > {pid_file}; exec sleep 300' &)"
    script = f"{daemon_line}; until [ -s {pid_file} ]; do sleep 0.02; done"
    record = client.submit(["sh", "-c", script]).wait(30)
    assert record.state is JobState.SUCCEEDED
    daemon = int(pid_file.read_text())
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE
    assert "stopped 1 process(es) the job left running" in [
        line.text for line in client.get(record.id).logs()
    ]


def test_a_timeout_leaves_no_process_of_the_job_behind(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    record = client.submit(["sh", "-c", script], timeout=1).wait(30)
    assert record.state is JobState.TIMED_OUT
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("gl_spec", None, "corrupt record: it has no gl_spec"),
        ("gl_spec", "{not json", "invalid job record: "),
        (
            "gl_spec",
            json.dumps({"command": ["true"], "env": {"A": "x" * 2_000_000}}),
            "over the 1048576 allowed",
        ),
    ],
)
def test_a_garbled_job_record_fails_the_job_and_the_worker_goes_on(
    client: Client, workers: Workers, raw_redis: redis.Redis, field: str, value: str | None, reason: str
) -> None:
    job = client.submit(["true"])
    if value is None:
        raw_redis.hdel(client.keys.job(job.id), field)
    else:
        raw_redis.hset(client.keys.job(job.id), field, value)
    process = workers.start(slots=1)
    wait_for(lambda: raw_redis.hget(client.keys.job(job.id), "gl_state") == b"failed", what="the job to fail")
    assert reason in raw_redis.hget(client.keys.job(job.id), "gl_reason").decode()
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    assert process.poll() is None


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (tarfile.TarInfo("/etc/evil"), "would land outside its folder"),
        (tarfile.TarInfo("../evil"), "would land outside its folder"),
        ("symlink", "unsafe archive entry"),
        ("device", "is not a file, folder or link"),
    ],
)
def test_an_unsafe_archive_fails_the_job_with_a_clear_reason(
    client: Client,
    workers: Workers,
    tmp_path: Path,
    raw_redis: redis.Redis,
    member: tarfile.TarInfo | str,
    reason: str,
) -> None:
    # Signed by a submitter, so the worker opens it (an archive changed after submit is refused
    # unopened: see test_security.py).
    digest = client.stores.artifacts.put_inputs("a1a1a1a1a1a1", "up", INPUTS_ARCHIVE, forged_archive(member))
    spec = build_spec(command=["true"], inputs=["data.csv"])
    assert client.stores.jobs.submit("a1a1a1a1a1a1", spec, "up", {INPUTS_ARCHIVE: digest}) == "a1a1a1a1a1a1"
    workers.start()
    record = client.get("a1a1a1a1a1a1").wait(30)
    assert record.state is JobState.FAILED
    assert record.reason is not None
    assert record.reason.startswith("cannot unpack the job's files: ")
    assert reason in record.reason
    assert not (tmp_path.parent / "evil").exists()


def forged_archive(member: tarfile.TarInfo | str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if member == "symlink":
            info = tarfile.TarInfo("escape")
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        elif member == "device":
            info = tarfile.TarInfo("null")
            info.type = tarfile.CHRTYPE
            tar.addfile(info)
        else:
            assert isinstance(member, tarfile.TarInfo)
            member.size = 1
            tar.addfile(member, io.BytesIO(b"x"))
    buffer.seek(0)
    return buffer


def test_after_redis_loses_its_scripts_a_role_says_the_admin_must_load_them_and_all_carry_on_once_loaded(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation
) -> None:
    """The roles may not load the scripts (Redis 7): after a Redis that lost them (a restart without
    persistence), a client says so in one line; a worker waits, as for a Redis out of reach, and
    carries on once the admin has loaded them (what `gpulayer up` and `access sync` do)."""
    process = workers.start()
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    raw_redis.function_flush()
    with pytest.raises(ConfigError, match="the installation's admin loads them with `gpulayer up`"):
        client.submit(["true"])
    time.sleep(POLL_INTERVAL * 1.5)  # the idle worker's claims found no scripts meanwhile
    load_library(raw_redis, Keys(installation.prefix))  # what `up` and `access sync` do, as the admin
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    assert process.poll() is None


def test_batches_sent_one_after_the_other_to_a_redis_that_lost_its_scripts_are_each_made_once(
    installation: Installation, raw_redis: redis.Redis
) -> None:
    admin = Client(access=installation.access("admin"))  # a user who may load the scripts
    admin.submit_many([["true"]])  # the scripts loaded
    raw_redis.function_flush()
    jobs = admin.submit_many([["true"]] * 2500)  # three script calls, each sent before the last's reply
    assert len({job.id for job in jobs}) == 2500
    assert admin.job_counts()[JobState.QUEUED] == 2501
    admin.close()


def test_only_the_calls_redis_refused_for_a_library_it_lost_go_again_once_it_is_loaded(
    client: Client, raw_redis: redis.Redis
) -> None:
    """Calls go in one round trip (a job's end and the next claim). Should Redis lose the library
    midway (flushed; a restart without persistence), the calls before ran and those after were
    refused: only those go again, once the library is loaded (by a user who may: the admin here).
    Here two claims, the library deleted between them: sent again, the first would take a second
    job, and the second claim find the queue empty."""
    first, second = client.submit(["true"]), client.submit(["true"])
    scripts = Scripts(raw_redis, client.keys, client.settings)
    store = ExecutionStore(raw_redis, client.keys, scripts, "w1")
    queue = client.keys.queue_for(first.status().spec.queue)
    call = store._claim_call(ClaimRequest([QueueOffer(queue, 0, 1, 0)], 1, 2, 2**30, 60_000))
    functions = library(client.keys.prefix).name

    def build(pipe: redis.client.Pipeline) -> None:
        scripts.queue(pipe, "claim", *call)
        pipe.execute_command("FUNCTION", "DELETE", functions)
        scripts.queue(pipe, "claim", *call)

    taken, _, again = scripts.pipeline(build)
    assert [reply[1:3] for reply in (taken, again)] == [[first.id.encode(), 1], [second.id.encode(), 1]]
    records = [job.status() for job in (first, second)]
    assert [(record.state, record.attempt) for record in records] == [(JobState.RUNNING, 1)] * 2
    assert raw_redis.function_list(functions)  # loaded again


def test_a_retry_finds_the_checkpoint_folder_the_lost_attempt_kept_on_another_worker(
    client: Client, workers: Workers, env: dict[str, str], tmp_path: Path
) -> None:
    """A job counts in its checkpoint folder; its worker dies; the retry, elsewhere, goes on counting.
    A retry on a non-zero exit starts from the folder as the failed attempt left it too."""
    workers.env = {**env, "GPULAYER_CHECKPOINT_INTERVAL": "0.1"}
    doomed = workers.start("doomed", 1, "--label", "pool=c", *FAST)
    count = (
        'f="$GPULAYER_CHECKPOINT_DIR/n"; n=$(cat "$f" 2>/dev/null || echo 0); echo "from $n"; '
        'while [ "$n" -lt 6 ]; do n=$((n+1)); echo "$n" > "$f.tmp"; mv "$f.tmp" "$f"; sleep 0.3; done'
    )
    job = client.submit(["sh", "-c", count], labels={"pool": "c"}, retries=1)
    kept = client.keys.checkpoint(job.id)
    wait_for(lambda: client.redis.exists(kept), what="a kept checkpoint")
    kill_machine(doomed.pid)
    workers.start("spare", 1, "--label", "pool=c", *FAST)
    record = job.wait(30)
    assert (record.state, record.attempt) == (JobState.SUCCEEDED, 2)
    starts = [int(line.text.split()[1]) for line in job.logs() if line.text.startswith("from ")]
    assert starts[0] == 0
    assert 1 <= starts[1] < 6  # went on from what was kept, not from 0
    assert not client.redis.exists(kept)

    failing = (
        'f="$GPULAYER_CHECKPOINT_DIR/tries"; echo x >> "$f"; n=$(wc -l < "$f"); echo "try $n"; [ "$n" -ge 2 ]'
    )
    again = client.submit(["sh", "-c", failing], labels={"pool": "c"}, retries=1, retry_on="exit")
    assert again.wait(30).state is JobState.SUCCEEDED
    assert [line.text for line in again.logs() if line.text.startswith("try")] == ["try 1", "try 2"]
