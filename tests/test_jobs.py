"""A command job from submit to outputs, through a real Redis and real worker processes."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import Result

from gpulayer import Client, JobNotFound, JobState, OutputNotProduced, WaitTimeout
from gpulayer.errors import InvalidJobSpec
from gpulayer.service import Service
from tests.conftest import WAIT, Workers, wait_for

PY = sys.executable


def test_a_job_ships_its_source_and_inputs_and_brings_back_its_outputs(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    source = tmp_path / "app"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "shout.py").write_text("def shout(text):\n    return text.upper()\n")
    (source / "main.py").write_text(
        "import json, os, pathlib\n"
        "from pkg.shout import shout\n"
        "data = pathlib.Path('table.csv').read_text()\n"
        "pathlib.Path('results').mkdir()\n"
        "pathlib.Path('results/shouted.csv').write_text(shout(data))\n"
        "pathlib.Path('results/env.json').write_text(json.dumps({\n"
        "    'job': os.environ['GPULAYER_JOB_ID'], 'attempt': os.environ['GPULAYER_ATTEMPT'],\n"
        "    'greeting': os.environ['GREETING'], 'cwd': os.getcwd(), 'listing': sorted(os.listdir('.'))}))\n"
        "print('done')\n"
    )
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "table.csv").write_text("a,b\n1,2\n")
    workers.start()

    job = client.submit(
        [PY, "main.py"],
        source=source,
        inputs=[inputs / "table.csv"],
        outputs=["results/*.csv", "results/env.json"],
        env={"GREETING": "hello"},
        name="round trip",
    )
    record = job.wait(timeout=30)

    assert record.state is JobState.SUCCEEDED, record.reason
    assert record.exit_code == 0
    assert record.name == "round trip"
    assert record.outputs is not None
    assert record.outputs.files == 2
    written = job.download_outputs(tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == [
        "results/env.json",
        "results/shouted.csv",
    ]
    assert (tmp_path / "out" / "results" / "shouted.csv").read_text() == "A,B\n1,2\n"
    seen = json.loads((tmp_path / "out" / "results" / "env.json").read_text())
    assert seen["job"] == job.id
    assert seen["attempt"] == "1"
    assert seen["greeting"] == "hello"
    assert seen["listing"] == ["main.py", "pkg", "results", "table.csv"]
    assert [line.text for line in job.logs()] == ["done"]


def test_each_job_gets_a_fresh_folder_that_is_removed_afterwards(
    client: Client, workers: Workers, home: Path
) -> None:
    workers.start(slots=1)
    first = client.submit(["sh", "-c", "touch leftover && pwd"]).wait(30)
    second = client.submit(["sh", "-c", "ls"])
    second.wait(30)
    assert first.state is JobState.SUCCEEDED
    assert [line.text for line in second.logs()] == []
    # What is left are empty folders kept for later jobs, named after none.
    left = list((home / "work" / "w1").iterdir())
    assert all(folder.is_dir() and not any(folder.iterdir()) for folder in left)
    assert not any(job_id in folder.name for folder in left for job_id in (first.id, second.id))


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A folder outside the worker's, for a link to point to: nothing in it may be touched."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("kept")
    yield target
    assert (target / "precious").read_text() == "kept"


def test_a_link_a_job_put_in_its_folders_place_is_removed_and_what_it_points_to_kept(
    client: Client, workers: Workers, home: Path, elsewhere: Path
) -> None:
    workers.start(slots=1)
    swap = f'd=$(pwd); cd /; rmdir "$d" && ln -s {elsewhere} "$d"'
    assert client.submit(["sh", "-c", swap]).wait(WAIT).state is JobState.SUCCEEDED
    assert not any(entry.is_symlink() for entry in (home / "work" / "w1").iterdir())


def test_a_link_left_among_job_folders_is_removed_when_the_worker_starts_not_followed(
    workers: Workers, home: Path, elsewhere: Path
) -> None:
    # As a job that swapped its folder for a link leaves it when its worker is killed.
    work = home / "work" / "w1"
    work.mkdir(parents=True)
    (work / "0123456789ab-1.gljob").symlink_to(elsewhere, target_is_directory=True)
    workers.start(slots=1)
    assert not (work / "0123456789ab-1.gljob").is_symlink()


def test_a_folder_a_job_left_open_to_all_is_private_again_for_the_next(
    client: Client, workers: Workers
) -> None:
    workers.start(slots=1)
    opened = client.submit(["sh", "-c", 'chmod 777 . "$GPULAYER_CHECKPOINT_DIR"']).wait(30)
    assert opened.state is JobState.SUCCEEDED
    for _ in range(3):  # whichever kept folder the next job gets
        job = client.submit(["sh", "-c", 'stat -c %a . "$GPULAYER_CHECKPOINT_DIR"'])
        job.wait(30)
        assert [line.text for line in job.logs()] == ["700", "700"]


def test_the_record_keeps_each_state_timestamp_the_worker_and_the_attempt(
    client: Client, workers: Workers
) -> None:
    workers.start(name="box-a")
    record = client.submit(["true"]).wait(30)
    assert record.state is JobState.SUCCEEDED
    assert record.worker == "box-a"
    assert record.attempt == 1
    assert record.queued_at is not None
    assert record.scheduled_at is not None
    assert record.started_at is not None
    assert record.ended_at is not None
    assert (
        record.created_at <= record.queued_at <= record.scheduled_at <= record.started_at <= record.ended_at
    )
    assert record.reason is None


def test_a_failing_command_keeps_its_exit_code_and_the_reason(client: Client, workers: Workers) -> None:
    workers.start()
    record = client.submit(["sh", "-c", "exit 3"]).wait(30)
    assert record.state is JobState.FAILED
    assert record.exit_code == 3
    assert record.reason == "exit code 3"


def test_a_missing_command_fails_the_job_and_the_worker_goes_on(client: Client, workers: Workers) -> None:
    process = workers.start(slots=1)
    missing = client.submit(["no-such-command-anywhere", "--flag"]).wait(30)
    after = client.submit(["true"]).wait(30)
    assert missing.state is JobState.FAILED
    assert missing.reason == "command not found: no-such-command-anywhere"
    assert missing.exit_code == 127
    assert after.state is JobState.SUCCEEDED
    assert process.poll() is None


def test_a_program_is_found_on_the_jobs_own_path_and_again_once_it_moved(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    """The worker remembers where a program was on a PATH (sparing the child a failed execve per
    folder before it); one that moved since is found where it is now."""
    workers.start(slots=1)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
    tool = first / "mytool"
    tool.write_text("#!/bin/sh\necho from first\n")
    tool.chmod(0o755)
    path = f"{first}:{second}:/usr/bin:/bin"
    job = client.submit(["mytool"], env={"PATH": path})
    assert job.wait(30).state is JobState.SUCCEEDED
    assert [line.text for line in job.logs()] == ["from first"]
    tool.rename(second / "mytool")
    moved = client.submit(["mytool"], env={"PATH": path})
    assert moved.wait(30).state is JobState.SUCCEEDED
    assert [line.text for line in moved.logs()] == ["from first"]  # the same file, now in second/


def test_a_job_past_its_timeout_is_stopped_and_ends_timed_out(client: Client, workers: Workers) -> None:
    workers.start()
    job = client.submit(["sleep", "60"], timeout=0.5)
    record = job.wait(30)
    assert record.state is JobState.TIMED_OUT
    assert record.reason == "timed out after 0.5 s"
    assert any("timed out" in line.text and line.stream == "system" for line in job.logs())


def test_a_jobs_own_kill_grace_gives_it_that_long_after_sigterm(client: Client, workers: Workers) -> None:
    """The worker's grace is 2 s here (conftest); a job that needs longer to clean up asks for it."""
    workers.start()
    cleanup = ["sh", "-c", 'trap "sleep 3; echo cleaned; exit 0" TERM; sleep 60 & wait']
    slow, hurried = client.submit(cleanup, timeout=0.5, kill_grace=30), client.submit(cleanup, timeout=0.5)
    assert slow.wait(30).state is hurried.wait(30).state is JobState.TIMED_OUT
    assert [line.text for line in slow.logs() if line.stream == "stdout"] == ["cleaned"]
    assert [line.text for line in hurried.logs() if line.stream == "stdout"] == []


def test_a_local_target_runs_on_this_machines_worker_and_a_remote_one_says_why_it_waits(
    client: Client, workers: Workers, cli: Callable[..., Result]
) -> None:
    workers.start("w1")
    here = client.submit(["echo", "here"], target="local")
    assert here.wait(30).state is JobState.SUCCEEDED
    elsewhere = client.submit(["echo", "elsewhere"], target="remote")
    why = elsewhere.why()
    assert (why.worker, why.schedulable) == (None, False)
    assert [(r.worker, r.reason) for r in why.reasons] == [
        ("w1", "target remote: it is on the same machine as the submitter")
    ]
    assert elsewhere.status().state is JobState.QUEUED
    planned = cli("plan", "--target", "remote")
    assert planned.exit_code == 1
    assert "  w1: target remote: it is on the same machine as the submitter" in planned.output.splitlines()
    submitted = cli("submit", "--wait", "--target", "local", "--", "echo", "from the CLI")
    assert submitted.exit_code == 0
    assert "from the CLI" in submitted.output.splitlines()


def test_an_output_that_was_not_produced_fails_the_job_and_names_it(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "echo ok > made.txt"], outputs=["made.txt", "never/*.bin"])
    record = job.wait(30)
    assert record.state is JobState.FAILED
    assert record.reason == "output not produced: never/*.bin"
    with pytest.raises(OutputNotProduced, match=r"output not produced: never/\*\.bin"):
        job.download_outputs(tmp_path / "out")
    assert (tmp_path / "out" / "made.txt").read_text() == "ok\n"


def test_two_workers_share_one_queue(client: Client, workers: Workers) -> None:
    workers.start(name="w1", slots=1)
    workers.start(name="w2", slots=1)
    jobs = [client.submit(["sleep", "0.3"]) for _ in range(8)]
    records = [job.wait(60) for job in jobs]
    assert {record.state for record in records} == {JobState.SUCCEEDED}
    assert {record.worker for record in records} == {"w1", "w2"}


def test_a_worker_runs_up_to_its_slots_at_once(client: Client, workers: Workers, tmp_path: Path) -> None:
    workers.start(slots=3)
    marks = tmp_path / "marks"
    marks.mkdir()
    script = f"touch {marks}/$GPULAYER_JOB_ID; sleep 1; ls {marks} | wc -l"
    jobs = [client.submit(["sh", "-c", script]) for _ in range(3)]
    for job in jobs:
        assert job.wait(30).state is JobState.SUCCEEDED
    # Each job counted the others' marks while it slept: all three ran together.
    assert {next(iter(job.logs())).text.strip() for job in jobs} == {"3"}


def test_jobs_lists_newest_first_and_filters_by_state(client: Client, workers: Workers) -> None:
    workers.start()
    ok = client.submit(["true"])
    bad = client.submit(["false"])
    ok.wait(30)
    bad.wait(30)
    assert [record.id for record in client.jobs()] == [bad.id, ok.id]
    assert [record.id for record in client.jobs(state="failed")] == [bad.id]
    assert [record.id for record in client.jobs(state=JobState.SUCCEEDED)] == [ok.id]
    assert client.jobs(state="running") == []


def test_waiting_on_many_jobs_reads_their_ends_together_in_the_order_asked(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("w1", 2)
    jobs = [client.submit(["true"]) for _ in range(60)] + [client.submit(["sh", "-c", "exit 3"])]
    records = client.wait_all(jobs, timeout=WAIT)
    assert [record.id for record in records] == [job.id for job in jobs]
    assert [record.state for record in records] == [JobState.SUCCEEDED] * 60 + [JobState.FAILED]
    # All ended now: waiting again costs one read of their done streams, not one per job.
    before = raw_redis.info("commandstats")["cmdstat_xread"]["calls"]
    assert len(client.wait_all(jobs)) == 61
    assert raw_redis.info("commandstats")["cmdstat_xread"]["calls"] - before == 1


def test_a_loop_of_waits_on_jobs_that_ended_meanwhile_reads_ahead_instead_of_once_per_job(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    jobs = [client.submit(["true"]) for _ in range(100)] + [client.submit(["sh", "-c", "exit 3"])]
    workers.start("w1", 2)
    wait_for(lambda: sum(Service(client).ended_counts().values()) == 101, what="all the jobs to end")
    before = _xreads(raw_redis)
    records = [job.wait(WAIT) for job in jobs]
    assert [record.id for record in records] == [job.id for job in jobs]
    assert [record.state for record in records] == [JobState.SUCCEEDED] * 100 + [JobState.FAILED]
    # Each wait that asks reads ahead twice as far as the last (1, 3, 7, ... jobs): 7 of 101 ask,
    # each with its own done stream and the next ones' in two XREADs.
    assert _xreads(raw_redis) - before <= 14
    # Read ahead once: a second wait asks again.
    before = _xreads(raw_redis)
    assert jobs[50].wait(WAIT).state is JobState.SUCCEEDED
    assert _xreads(raw_redis) - before >= 1


def test_a_wait_on_many_running_jobs_blocks_on_the_first_few_between_sweeps_of_all(
    client: Client, raw_redis: redis.Redis
) -> None:
    jobs = client.submit_many([["true"]] * 200)  # no worker: none ends
    reads: list[tuple[int, bool]] = []  # each XREAD: how many done streams, whether it blocked
    with raw_redis.monitor() as monitor:

        def watch() -> None:
            while "stop watching" not in (command := monitor.next_command()["command"]):
                if command.startswith("XREAD"):
                    reads.append((command.count(":done:"), "BLOCK" in command))

        watcher = threading.Thread(target=watch)
        watcher.start()
        with pytest.raises(WaitTimeout):
            client.wait_all(jobs, timeout=1.0)
        redis.Redis(connection_pool=raw_redis.connection_pool).echo("stop watching")
        watcher.join(WAIT)
    blocking = [streams for streams, blocked in reads if blocked]
    sweeps = [streams for streams, blocked in reads if not blocked]
    # A turn blocks on the first 64; all 200 are read at most once per turn (every 0.1 s), not at
    # every turn and again in the blocking read, as after each job's end.
    assert set(blocking) == {64}
    assert set(sweeps) == {200}
    assert len(sweeps) <= len(blocking) + 1


def _xreads(raw_redis: redis.Redis) -> int:
    return int(raw_redis.info("commandstats").get("cmdstat_xread", {}).get("calls", 0))


def test_as_completed_yields_each_job_as_it_ends_and_says_when_time_runs_out(
    client: Client, workers: Workers
) -> None:
    workers.start("w1", 2)
    slow, quick = client.submit(["sleep", "1"]), client.submit(["true"])
    assert [record.id for record in client.as_completed([slow, quick], timeout=WAIT)] == [quick.id, slow.id]
    stuck = client.submit(["sleep", "30"])
    with pytest.raises(WaitTimeout, match=r"1 job\(s\) still not ended after 0\.3 s"):
        list(client.as_completed([stuck], timeout=0.3))
    with pytest.raises(JobNotFound):
        client.wait_all(["ffffffffffff"])


def test_submit_many_queues_every_command_once_and_in_order(client: Client, workers: Workers) -> None:
    jobs = client.submit_many([["echo", str(index)] for index in range(40)], env={"X": "1"}, retries=0)
    assert len({job.id for job in jobs}) == 40
    # Listed newest first, in the order they were given.
    assert [record.id for record in client.jobs(limit=40)] == [job.id for job in reversed(jobs)]
    workers.start("w1", 2)
    records = {record.id: record for record in client.wait_all(jobs, timeout=WAIT)}
    for index, job in enumerate(jobs):
        assert records[job.id].state is JobState.SUCCEEDED
        assert records[job.id].spec.env == {"X": "1"}
        assert [line.text for line in job.logs()] == [str(index)]


def test_submit_many_checks_every_command_before_it_writes_anything(client: Client) -> None:
    with pytest.raises(InvalidJobSpec, match="the command is empty"):
        client.submit_many([["echo", "fine"], [" "], ["true"]])
    with pytest.raises(InvalidJobSpec, match="NUL"):
        client.submit_many(["true", ["echo", "a\0b"]])
    assert client.jobs() == []
    assert client.submit_many([]) == []
