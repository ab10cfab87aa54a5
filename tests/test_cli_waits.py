"""What the CLI says while it waits: outputs brought back, why a job is still queued, Ctrl-C that
stops the waiting and not the job, and the end of a followed log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis
from click.testing import Result

from gpulayer import Client, JobState
from tests.conftest import WAIT, Workers, gpulayer, wait_for

Cli = Callable[..., Result]


def test_submit_wait_brings_the_outputs_back_into_dest(cli: Cli, workers: Workers, tmp_path: Path) -> None:
    workers.start()
    dest = tmp_path / "here"
    result = cli(
        "submit", "--wait", "--dest", str(dest), "--output", "out/*.txt", "--",
        "sh", "-c", "mkdir out && echo hi > out/a.txt",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert (dest / "out" / "a.txt").read_text() == "hi\n"
    assert f"gpulayer: output {dest / 'out' / 'a.txt'}" in result.stderr.splitlines()


def test_submit_wait_of_a_failed_job_says_what_it_could_not_bring_back(
    cli: Cli, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    dest = tmp_path / "here"
    result = cli("submit", "--wait", "--dest", str(dest), "--output", "never.txt", "--", "false")
    assert result.exit_code == 1
    [line] = [line for line in result.stderr.splitlines() if "never.txt" in line]
    assert line.startswith("gpulayer: ")
    assert "gpulayer outputs " in line
    assert list(dest.rglob("*")) == []


def test_a_submit_no_connected_worker_can_run_says_so_and_still_queues_it(
    cli: Cli, client: Client, workers: Workers
) -> None:
    workers.start("cpu-box")
    result = cli("submit", "--gpus", "2", "--", "true")
    assert result.exit_code == 0
    job_id = result.stdout.strip()
    assert client.get(job_id).status().state is JobState.QUEUED
    lines = result.stderr.splitlines()
    assert lines[0] == f"gpulayer: job {job_id} waits in the queue; it cannot start yet:"
    assert lines[1] == "gpulayer: no connected worker could ever run this job:"
    assert lines[2].startswith("gpulayer:   cpu-box: ")


def test_a_wait_no_connected_worker_could_serve_ends_at_once_saying_why(
    cli: Cli, client: Client, workers: Workers
) -> None:
    workers.start("cpu-box")
    started = time.monotonic()
    result = cli("submit", "--wait", "--accelerator", "cuda", "--", "nvidia-smi")
    assert time.monotonic() - started < 5  # not the grace for a worker to join: one is connected
    assert result.exit_code == 1
    job_id = result.stderr.split()[1]
    lines = result.stderr.strip().splitlines()
    assert lines[1] == "gpulayer: no connected worker could ever run this job:"
    assert lines[2].startswith("gpulayer:   cpu-box: ")
    assert lines[-1].startswith(f"Error: job {job_id} stays queued: no connected worker could ever run it")
    assert client.get(job_id).status().state is JobState.QUEUED
    waited = cli("wait", job_id)
    assert waited.exit_code == 1
    assert "gpulayer:   cpu-box: " in waited.stderr


def test_a_wait_with_no_worker_connected_gives_one_a_grace_to_join(
    cli: Cli, client: Client, workers: Workers
) -> None:
    job = client.submit(["true"])
    threading.Timer(1.0, workers.start, ("late",)).start()
    assert cli("wait", job.id).exit_code == 0  # the worker joined within the grace, and ran it


def test_submit_wait_says_why_a_job_is_still_queued_and_ctrl_c_leaves_it_queued(
    env: dict[str, str], client: Client, workers: Workers
) -> None:
    workers.start("only-one")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "submit", "--wait", "--wait-for-capacity", "--nodes", "2",
         "--", "true"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    seen = [process.stderr.readline() for _ in range(3)]
    job_id = seen[0].split()[1]
    assert seen == [
        f"job {job_id} queued\n",
        f"gpulayer: job {job_id} is still queued:\n",
        "gpulayer: no 2 connected workers could ever run this gang job together:\n",
    ]
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=WAIT)
    assert process.returncode == 130
    assert rest.strip().splitlines()[-1] == (
        f"gpulayer: stopped waiting; job {job_id} goes on "
        f"(`gpulayer cancel {job_id}` stops it, `gpulayer logs -f {job_id}` follows it again)"
    )
    assert "Aborted" not in rest
    assert "Traceback" not in rest
    assert client.get(job_id).status().state is JobState.QUEUED


def test_ctrl_c_in_wait_stops_the_waiting_and_the_job_stays_queued(
    env: dict[str, str], client: Client, raw_redis: redis.Redis
) -> None:
    job = client.submit(["true"])  # no worker: it stays queued
    before = {entry["id"] for entry in raw_redis.client_list()}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "wait", "--wait-for-capacity", job.id],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Inside the wait: its connection blocks on the job's done stream.
    wait_for(
        lambda: any(
            entry["id"] not in before and entry.get("cmd") == "xread" for entry in raw_redis.client_list()
        ),
        what="the wait to block",
    )
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=WAIT)
    assert process.returncode == 130
    assert err.strip().splitlines()[-1].startswith(f"gpulayer: stopped waiting; job {job.id} goes on")
    assert job.status().state is JobState.QUEUED


def test_ctrl_c_in_logs_follow_stops_following_and_the_job_goes_on(
    env: dict[str, str], client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "echo started; sleep 60"])
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "logs", "-f", job.id],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline() == "started\n"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=WAIT)
    assert process.returncode == 130
    assert f"gpulayer: stopped waiting; job {job.id} goes on" in err
    assert job.status().state is JobState.RUNNING
    job.cancel()


def test_logs_follow_of_a_job_that_is_cancelled_ends_with_its_end_and_exit_code(
    env: dict[str, str], client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sleep", "60"])
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to start")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "logs", "-f", job.id],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    job.cancel()
    _, err = process.communicate(timeout=WAIT)
    assert process.returncode == 130
    assert err.splitlines()[-1].startswith(f"job {job.id} cancelled")


def test_a_command_with_a_newline_stays_one_row_of_the_jobs_table(
    env: dict[str, str], client: Client
) -> None:
    client.submit(["sh", "-c", "echo a\necho b"])
    table = gpulayer(env, "jobs")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == 2
    assert lines[1].endswith("sh -c 'echo a\\necho b'")
    listed = json.loads(gpulayer(env, "jobs", "--json").stdout)
    assert listed[0]["command"] == ["sh", "-c", "echo a\necho b"]


def test_a_wait_says_why_a_job_is_queued_once_and_only_while_queued(client: Client, workers: Workers) -> None:
    workers.start("cpu-box")
    queued = client.submit(["true"], gpus=1)
    said: list[str] = []
    with queued.saying_why_queued(0.05, said.append):
        wait_for(lambda: len(said) >= 3, what="the hint")
    assert said[:2] == [f"job {queued.id} is still queued:", "no connected worker could ever run this job:"]
    assert said[2].startswith("  cpu-box: ")

    started = client.submit(["true"])
    started.wait(WAIT)
    quiet: list[str] = []
    with started.saying_why_queued(0.01, quiet.append):
        time.sleep(0.3)  # long past the hint's time: it looked, and the job had ended
    assert quiet == []
