"""Log lines are kept in Redis, bounded, and followed live until the job ends."""

from __future__ import annotations

import threading
from pathlib import Path

from gpulayer import Client, JobState, LogLine, Settings
from tests.conftest import Workers, wait_for


def test_stdout_and_stderr_lines_are_kept_in_order_with_their_stream(
    client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "echo one; sleep 0.1; echo two >&2; sleep 0.1; echo three"])
    job.wait(30)
    assert [(line.stream, line.text) for line in job.logs()] == [
        ("stdout", "one"),
        ("stderr", "two"),
        ("stdout", "three"),
    ]
    assert {line.attempt for line in job.logs()} == {1}


def test_follow_sees_a_line_while_the_job_is_still_running_and_stops_when_it_ends(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    release = tmp_path / "release"
    job = client.submit(["sh", "-c", f"echo first; while [ ! -e {release} ]; do sleep 0.05; done; echo last"])
    seen: list[tuple[LogLine, JobState]] = []

    def follow() -> None:
        for line in job.logs(follow=True):
            seen.append((line, job.status().state))

    follower = threading.Thread(target=follow)
    follower.start()
    wait_for(lambda: seen, what="the first line")
    release.touch()
    follower.join(30)

    assert not follower.is_alive()
    assert [line.text for line, _ in seen] == ["first", "last"]
    assert seen[0][1] is JobState.RUNNING


def test_follow_of_a_job_that_already_ended_prints_everything_and_returns(
    client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "for i in 1 2 3; do echo $i; done"])
    job.wait(30)
    assert [line.text for line in job.logs(follow=True)] == ["1", "2", "3"]


def test_a_job_keeps_only_its_last_lines_and_splits_overlong_ones(
    redis_url: str, home: Path, workers: Workers
) -> None:
    workers.env["GPULAYER_LOG_MAX_LINES"] = "100"
    workers.env["GPULAYER_LOG_LINE_MAX_BYTES"] = "1000"
    workers.start()
    settings = Settings(home=home, log_max_lines=100, log_line_max_bytes=1000)
    client = Client(redis_url, settings=settings)
    job = client.submit(["sh", "-c", "seq 1 500; head -c 2500 /dev/zero | tr '\\0' x; echo"])
    job.wait(30)
    lines = [line.text for line in job.logs()]
    assert len(lines) == 100
    assert lines[-3:] == ["x" * 1000, "x" * 1000, "x" * 500]
    assert lines[:3] == ["404", "405", "406"]


def test_a_line_printed_is_stored_without_waiting_for_the_job_to_end(
    client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "echo now; sleep 30"])
    wait_for(lambda: list(job.logs()), what="the line")
    assert job.status().state is JobState.RUNNING
    job.cancel()
