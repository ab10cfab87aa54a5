"""Placement with real worker processes and simulated GPUs (CI has none; GPULAYER_FAKE_GPUS stands in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from gpulayer import Client, JobState, Unschedulable
from tests.conftest import Workers, wait_for

A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}
RTX = {"name": "NVIDIA GeForce RTX 4090", "memory_gb": 24}


def fake(*gpus: dict[str, object]) -> str:
    return json.dumps(list(gpus))


def record_devices(marks: Path) -> list[str]:
    """A job that notes its CUDA_VISIBLE_DEVICES, waits for its siblings, and notes again."""
    script = f'echo "$CUDA_VISIBLE_DEVICES" > {marks}/$GPULAYER_JOB_ID; sleep 1.5'
    return ["sh", "-c", script]


def test_concurrent_jobs_on_one_worker_never_share_a_gpu(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("box", 1, "--fake-gpus", fake(A100, A100, A100, A100))
    marks = tmp_path / "marks"
    marks.mkdir()
    jobs = [client.submit(record_devices(marks), gpus=2), client.submit(record_devices(marks), gpus=1)]
    jobs.append(client.submit(record_devices(marks), gpus=1))
    wait_for(lambda: len(list(marks.iterdir())) == 3, what="three jobs running at once")
    seen = [(marks / job.id).read_text().strip() for job in jobs]
    devices = [device for text in seen for device in text.split(",")]
    assert sorted(devices) == ["0", "1", "2", "3"]
    assert len(seen[0].split(",")) == 2
    for job in jobs:
        assert job.wait(30).state is JobState.SUCCEEDED
    assert sorted(map(str, jobs[0].status().gpus)) == sorted(seen[0].split(","))


def test_a_job_waits_while_every_gpu_is_held_and_then_runs(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("box", 1, "--fake-gpus", fake(A100))
    release = tmp_path / "release"
    holder = client.submit(["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"], gpus=1)
    wait_for(lambda: holder.status().state is JobState.RUNNING, what="the first job to run")
    second = client.submit(["true"], gpus=1)
    plan = second.why()
    assert (plan.worker, plan.schedulable) == (None, True)
    assert [(r.worker, r.reason) for r in plan.reasons] == [("box", "its GPU is busy")]
    assert second.status().state is JobState.QUEUED
    release.touch()
    assert second.wait(30).state is JobState.SUCCEEDED


def test_a_worker_offers_only_the_gpus_it_is_given(client: Client, workers: Workers, tmp_path: Path) -> None:
    workers.start("box", 1, "--fake-gpus", fake(A100, A100, A100, A100), "--gpus", "0,2")
    job = client.submit(["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"], gpus=2)
    assert job.wait(30).state is JobState.SUCCEEDED
    assert [line.text for line in job.logs()] == ["0,2"]
    assert [gpu.index for gpu in client.workers()[0].gpus] == [0, 2]
    assert client.plan(gpus=3).reasons[0].reason == "needs 3 GPUs, has 2"


def test_a_worker_offering_no_gpus_takes_no_gpu_job(client: Client, workers: Workers) -> None:
    workers.start("cpu-only", 2, "--fake-gpus", fake(A100), "--gpus", "none")
    gpu_job = client.submit(["true"], accelerator="cuda")
    cpu_job = client.submit(["sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"'])
    assert cpu_job.wait(30).state is JobState.SUCCEEDED
    assert [line.text for line in cpu_job.logs()] == ["[]"]
    assert gpu_job.status().state is JobState.QUEUED
    assert [r.reason for r in gpu_job.why().reasons] == ["needs cuda, has no GPU"]


def test_each_job_lands_on_the_worker_that_has_what_it_asks_for(client: Client, workers: Workers) -> None:
    workers.start("big", 1, "--fake-gpus", fake(A100), "--label", "zone=eu")
    workers.start("small", 1, "--fake-gpus", fake(RTX), "--label", "zone=us")
    placed = {
        "big": [client.submit(["true"], gpu_memory="40GB"), client.submit(["true"], gpus=1, gpu_name="a100")],
        "small": [
            client.submit(["true"], gpus=1, gpu_name="4090"),
            client.submit(["true"], labels={"zone": "us"}),
        ],
    }
    for worker, jobs in placed.items():
        for job in jobs:
            record = job.wait(30)
            assert record.state is JobState.SUCCEEDED
            assert record.worker == worker, record.spec.requirements
    installed = client.submit(["true"], frameworks=["pydantic>=2", "rq>=2.12"])
    assert installed.wait(30).state is JobState.SUCCEEDED


def test_a_new_requirement_set_is_served_without_restarting_workers(client: Client, workers: Workers) -> None:
    process = workers.start("box", 1, "--fake-gpus", fake(A100, RTX))
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    for requirements in (
        {"gpus": 2},
        {"gpu_name": "rtx"},
        {"frameworks": ["click>=8"]},
        {"gpu_memory": "70GiB"},
    ):
        assert client.submit(["true"], **requirements).wait(30).state is JobState.SUCCEEDED
    assert process.poll() is None


def test_higher_priority_runs_first(client: Client, workers: Workers, tmp_path: Path) -> None:
    workers.start("box", 1)
    release = tmp_path / "release"
    blocker = client.submit(["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"])
    wait_for(lambda: blocker.status().state is JobState.RUNNING, what="the blocker to run")
    low = [client.submit(["true"], priority=0) for _ in range(2)]
    high = [client.submit(["true"], priority=5) for _ in range(2)]
    release.touch()
    records = [job.wait(30) for job in (*low, *high)]
    started = sorted(records, key=lambda record: record.started_at or record.created_at)
    assert [record.spec.priority for record in started] == [5, 5, 0, 0]


def test_equal_priority_queues_take_turns(client: Client, workers: Workers, tmp_path: Path) -> None:
    workers.start("box", 1)
    release = tmp_path / "release"
    blocker = client.submit(["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"])
    wait_for(lambda: blocker.status().state is JobState.RUNNING, what="the blocker to run")
    first = [client.submit(["true"], cpus=1, memory="1KB") for _ in range(3)]
    second = [client.submit(["true"], cpus=1, memory="2KB") for _ in range(3)]
    release.touch()
    records = [job.wait(30) for job in (*first, *second)]
    order = [
        record.id for record in sorted(records, key=lambda record: record.started_at or record.created_at)
    ]
    groups = ["a" if job_id in {job.id for job in first} else "b" for job_id in order]
    # Round robin between the two queues: never three of one in a row.
    assert "aaa" not in "".join(groups)
    assert "bbb" not in "".join(groups)


def test_the_least_busy_worker_takes_the_next_job(client: Client, workers: Workers, tmp_path: Path) -> None:
    workers.start("w1", 2)
    workers.start("w2", 2)
    release = tmp_path / "release"
    hold = ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"]
    first = client.submit(hold)
    wait_for(lambda: first.status().state is JobState.RUNNING, what="the first job to run")
    second = client.submit(hold)
    wait_for(lambda: second.status().state is JobState.RUNNING, what="the second job to run")
    release.touch()
    assert {first.status().worker, second.status().worker} == {"w1", "w2"}


def test_gpus_and_slots_are_given_back_however_a_job_ends(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("box", 2, "--fake-gpus", fake(A100))
    ended = [
        client.submit(["true"], gpus=1, cpus=1, memory="1GB"),
        client.submit(["false"], gpus=1, cpus=1),
        client.submit(["sleep", "30"], gpus=1, timeout=0.3),
        client.submit(["no-such-command"], gpus=1),
    ]
    for job in ended:
        job.wait(30)
    cancelled = client.submit(["sleep", "30"], gpus=1)
    wait_for(lambda: cancelled.status().state is JobState.RUNNING, what="the job to run")
    cancelled.cancel()
    cancelled.wait(30)
    assert raw_redis.keys(client.keys.gpu("*")) == []
    usage = raw_redis.hgetall(client.keys.worker_usage("box"))
    assert {field: int(value) for field, value in usage.items()} == {b"cpus": 0, b"memory": 0}
    box = client.workers()[0]
    assert (box.cpus_used, box.memory_used, box.gpus_busy) == (0, 0, [])


def test_fail_if_unschedulable_refuses_what_no_worker_could_run(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("box", 1, "--fake-gpus", fake(RTX))
    before = raw_redis.dbsize()
    refusal = "no connected worker could ever run this job: box: needs 40 GB per GPU, largest is 24 GiB"
    with pytest.raises(Unschedulable) as refused:
        client.submit(["true"], gpu_memory="40GB", fail_if_unschedulable=True)
    assert str(refused.value) == refusal
    assert raw_redis.dbsize() == before
    assert client.submit(["true"], gpus=1, fail_if_unschedulable=True).wait(30).state is JobState.SUCCEEDED


def test_the_cli_explains_where_jobs_go(client: Client, workers: Workers, cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("plan", "--gpus", "1")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "no connected worker could ever run this job:",
        "  no workers are connected",
    ]
    workers.start("box", 1, "--fake-gpus", fake(RTX), "--label", "zone=eu")
    result = cli("plan", "--accelerator", "mps")
    assert result.exit_code == 1
    assert result.output.splitlines()[1] == "  box: needs mps, has cuda only"
    assert (
        cli("plan", "--gpus", "1").output.splitlines()[0]
        == "would start on box now (the least busy worker that fits)"
    )
    queued = client.submit(["true"], labels={"zone": "us"})
    status = json.loads(cli("status", queued.id, "--json").output)
    assert status["reasons"] == [
        {"worker": "box", "reason": "needs label zone=us, has zone=eu", "codes": ["label"]}
    ]
    why = cli("why", queued.id)
    assert why.output.splitlines() == [
        "no connected worker could ever run this job:",
        "  box: needs label zone=us, has zone=eu",
    ]
    refused = cli("submit", "--label", "zone=us", "--fail-if-unschedulable", "--", "true")
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (
        "Error: no connected worker could ever run this job: box: needs label zone=us, has zone=eu"
    )
    listed = json.loads(cli("workers", "--json").output)
    assert [(w["name"], w["labels"], [g["simulated"] for g in w["gpus"]]) for w in listed] == [
        ("box", {"zone": "eu"}, [True])
    ]


def test_resources_detect_reports_a_machine_without_gpus_plainly_and_marks_simulated_ones() -> None:
    def detect(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpulayer", "resources", "detect", *args],
            capture_output=True, text=True, check=False, env={**_clean_env(), **env},
        )  # fmt: skip

    plain = detect()
    assert plain.returncode == 0, plain.stderr
    assert "gpus:       none (" in plain.stdout
    data = json.loads(detect("--json").stdout)
    assert data["gpus"] == []
    assert data["frameworks"]["pydantic"]
    simulated = json.loads(detect("--json", GPULAYER_FAKE_GPUS=fake(A100, RTX)).stdout)
    assert [(g["name"], g["memory_total"], g["simulated"]) for g in simulated["gpus"]] == [
        ("NVIDIA A100-SXM4-80GB", 80 * 2**30, True),
        ("NVIDIA GeForce RTX 4090", 24 * 2**30, True),
    ]
    assert "(simulated)" in detect(GPULAYER_FAKE_GPUS=fake(A100)).stdout
    bad = detect(GPULAYER_FAKE_GPUS="[{}]")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "Error: GPULAYER_FAKE_GPUS: GPU 0: name: Field required"


def _clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("GPULAYER_")}
