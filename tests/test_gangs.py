"""Gang jobs: gang.lua on a real Redis, then real workers acting as separate nodes on this machine."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest
import redis
from click.testing import Result

import gpulayer as gl
from gpulayer import Client, DistributedJob, JobState, Unschedulable
from gpulayer.store.execution import ClaimRequest, ExecutionStore, QueueOffer
from gpulayer.store.gangs import Candidate, GangStore, Hold, Waiting
from gpulayer.store.jobs import parse_spec
from gpulayer.store.keys import Keys
from gpulayer.store.scripts import Scripts
from tests.conftest import Workers, kill_machine, wait_for

# The functions below travel by value, as a script's do, so workers need not import the test suite.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

GiB = 2**30
#: Short leases, so a lost worker shows within seconds.
FAST = ("--lease-ttl", "1.5", "--heartbeat", "0.3")
NOW = Hold(after_ms=0, ttl_ms=10_000)
NEVER = Hold(after_ms=10**9, ttl_ms=10_000)

ALL_REDUCE = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
names = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
seen = {name: os.environ.get(name) for name in names}
print("RESULT", rank, total.item(), repr(seen), flush=True)
assert total.item() == world * (world + 1) / 2
dist.barrier()  # no rank tears its connections down while another still uses them
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # torch's teardown now and then aborts here (see examples/distributed/ddp.py)
"""


# --- gang.lua, on a real Redis --------------------------------------------------------------------


def gang_store(client: Client) -> GangStore:
    return GangStore(client.redis, client.keys, Scripts(client.redis, client.keys, client.settings))


def waiting(client: Client, job_id: str) -> Waiting:
    raw = client.redis.hget(client.keys.job(job_id), "gl_spec")
    assert isinstance(raw, bytes)
    return Waiting(job_id, parse_spec(raw))


def boxes(*names: str, slots: int = 2, gpus: int = 0) -> list[Candidate]:
    return [
        Candidate(name, slots, 8 * GiB, tuple((f"GPU-{name}-{i}", i) for i in range(gpus))) for name in names
    ]


def held_cpus(client: Client, worker: str) -> int:
    return int(client.redis.hget(client.keys.worker_usage(worker), "cpus") or 0)


def occupy(client: Client, worker: str, cpus: int = 1) -> str:
    """A plain job claimed by ``worker`` (no process runs it): it holds ``cpus`` slots there."""
    job = client.submit(["true"], cpus=cpus)
    store = ExecutionStore(
        client.redis, client.keys, Scripts(client.redis, client.keys, client.settings), worker
    )
    queue = client.keys.queue_for(job.status().spec.queue)
    claims, _ = store.claim(ClaimRequest([QueueOffer(queue, 0, cpus, 0)], 1, 2, 8 * GiB, 60_000))
    assert [claim.job_id for claim in claims] == [job.id]
    return job.id


def test_a_gang_job_takes_every_node_or_nothing(client: Client, raw_redis: redis.Redis) -> None:
    gangs = gang_store(client)
    job = client.submit(["true"], nodes=2, cpus=2)
    occupy(client, "w2")
    before = {key: raw_redis.type(key) for key in raw_redis.keys("*")}
    outcome, workers = gangs.place(
        waiting(client, job.id), boxes("w1", "w2"), may_hold=False, hold=NOW, lease_ms=60_000
    )
    assert (outcome, workers) == ("waiting", [])
    assert {key: raw_redis.type(key) for key in raw_redis.keys("*")} == before, "nothing is held"
    assert (held_cpus(client, "w1"), held_cpus(client, "w2")) == (0, 1)
    assert job.status().state is JobState.QUEUED

    outcome, workers = gangs.place(
        waiting(client, job.id), boxes("w1", "w2", "w3"), may_hold=False, hold=NOW, lease_ms=60_000
    )
    assert (outcome, workers) == ("placed", ["w1", "w3"])
    assert [held_cpus(client, name) for name in ("w1", "w2", "w3")] == [2, 1, 2]
    record = job.status()
    assert record.state is JobState.SCHEDULED
    assert [(part.node, part.worker) for part in record.parts] == [(0, "w1"), (1, "w3")]
    assert raw_redis.zcard(client.keys.gangs) == 0
    assert raw_redis.lrange(client.keys.worker_gang("w3"), 0, -1) == [f"{job.id}-1-1".encode()]


def test_gpus_are_reserved_for_every_node_at_once_and_never_shared(client: Client) -> None:
    gangs = gang_store(client)
    first = client.submit(["true"], nodes=2, gpus=2)
    second = client.submit(["true"], nodes=2, gpus=1)
    machines = boxes("g1", "g2", gpus=2) + boxes("g3", gpus=1)
    assert gangs.place(waiting(client, first.id), machines, may_hold=False, hold=NOW, lease_ms=60_000) == (
        "placed",
        ["g1", "g2"],
    )
    # g1 and g2 are full; g3 alone cannot hold two nodes.
    assert gangs.place(waiting(client, second.id), machines, may_hold=False, hold=NOW, lease_ms=60_000) == (
        "waiting",
        [],
    )
    assert client.redis.get(client.keys.gpu("GPU-g3-0")) is None
    holders = {client.redis.get(client.keys.gpu(f"GPU-{name}-{i}")) for name in ("g1", "g2") for i in (0, 1)}
    assert holders == {f"{first.id}-1-0".encode(), f"{first.id}-1-1".encode()}


def test_the_oldest_gang_job_holds_workers_once_it_has_waited_and_they_take_nothing_new(
    client: Client,
) -> None:
    gangs = gang_store(client)
    job = client.submit(["true"], nodes=2, cpus=2)
    occupy(client, "w1")
    later = client.submit(["true"], nodes=2, cpus=1)
    assert gangs.place(
        waiting(client, job.id), boxes("w1", "w2"), may_hold=True, hold=NEVER, lease_ms=60_000
    ) == (
        "waiting",
        [],
    )
    outcome, held = gangs.place(
        waiting(client, job.id), boxes("w1", "w2"), may_hold=True, hold=NOW, lease_ms=60_000
    )
    assert (outcome, held) == ("held", ["w1", "w2"])
    # A held worker takes no job from its queues, and no other gang job gets it.
    plain = client.submit(["true"])
    store = ExecutionStore(
        client.redis, client.keys, Scripts(client.redis, client.keys, client.settings), "w2"
    )
    queue = client.keys.queue_for(plain.status().spec.queue)
    claims, waiting_gangs = store.claim(ClaimRequest([QueueOffer(queue, 0, 1, 0)], 1, 2, 8 * GiB, 60_000))
    assert (claims, waiting_gangs) == ([], 2)
    assert gangs.place(
        waiting(client, later.id), boxes("w1", "w2"), may_hold=True, hold=NOW, lease_ms=60_000
    ) == (
        "waiting",
        [],
    )
    assert plain.status().state is JobState.QUEUED


def test_a_cancelled_gang_job_leaves_the_waiting_set(client: Client, raw_redis: redis.Redis) -> None:
    job = client.submit(["true"], nodes=3)
    assert raw_redis.zcard(client.keys.gangs) == 1
    assert job.cancel()
    assert raw_redis.zcard(client.keys.gangs) == 0
    assert job.status().state is JobState.CANCELLED


# --- submit -----------------------------------------------------------------------------------------


def test_a_gang_job_no_set_of_workers_could_hold_is_refused_on_request_and_waits_otherwise(
    client: Client, workers: Workers, cli: Callable[..., Result]
) -> None:
    workers.start("w1", 1)
    with pytest.raises(Unschedulable, match="needs 2 workers that can each hold one node: 1 could ever"):
        client.submit(["true"], nodes=2, fail_if_unschedulable=True)
    stuck = client.submit(["true"], nodes=2)
    # It holds nothing and blocks nobody: a plain job runs at once.
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    plan = stuck.why()
    assert (plan.schedulable, plan.nodes, plan.reasons[0].reason) == (
        False,
        2,
        "needs 2 workers that can each hold one node: 1 could ever, 1 can now",
    )
    assert stuck.status().state is JobState.QUEUED
    assert cli("why", stuck.id).output.splitlines()[:2] == [
        "no 2 connected workers could ever run this gang job together:",
        "  needs 2 workers that can each hold one node: 1 could ever, 1 can now",
    ]


def test_procs_per_node_defaults_to_the_gpus_per_node(client: Client) -> None:
    gpu_job = DistributedJob(["true"], nodes=2, gpus_per_node=4, accelerator="cuda").submit(client)
    cpu_job = client.submit(["true"], nodes=2)
    assert gpu_job.status().spec.distributed is not None
    assert gpu_job.status().spec.distributed.procs_per_node == 4  # type: ignore[union-attr]
    assert cpu_job.status().spec.distributed.procs_per_node == 1  # type: ignore[union-attr]


def test_bad_gang_options_are_one_line_errors_and_write_nothing(
    cli: Callable[..., Result], raw_redis: redis.Redis
) -> None:
    result = cli("submit", "--nodes", "0", "--", "true")
    assert result.exit_code == 2
    assert "--nodes" in result.output
    result = cli("submit", "--nodes", "2", "--gpus", "1", "--gpus-per-node", "2", "--", "true")
    assert result.exit_code == 2
    assert "give --gpus or --gpus-per-node, not both" in result.output
    assert raw_redis.keys("*") == []


# --- real workers ---------------------------------------------------------------------------------


def script(tmp_path: Path, text: str, name: str = "job.py") -> Path:
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


def results(job_lines: list[str]) -> dict[int, tuple[float, dict[str, str]]]:
    found = {}
    for text in job_lines:
        if text.startswith("RESULT "):
            _, rank, total, seen = text.split(" ", 3)
            found[int(rank)] = (float(total), eval(seen))
    return found


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_a_two_by_two_job_all_reduces_across_two_workers(
    client: Client, workers: Workers, tmp_path: Path, launcher: str
) -> None:
    pytest.importorskip("torch")
    workers.start("node-a", 2)
    workers.start("node-b", 2)
    job = client.submit(
        [sys.executable, "job.py"],
        source=script(tmp_path, ALL_REDUCE),
        nodes=2,
        procs_per_node=2,
        launcher=launcher,  # type: ignore[arg-type]
    )
    record = job.wait(120)
    lines = list(job.logs())
    assert record.state is JobState.SUCCEEDED, [line.text for line in lines]
    assert sorted(part.worker for part in record.parts) == ["node-a", "node-b"]
    by_rank = results([line.text for line in lines])
    assert {rank: total for rank, (total, _) in by_rank.items()} == {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}
    for rank, (_, seen) in by_rank.items():
        assert seen["RANK"] == str(rank)
        assert seen["LOCAL_RANK"] == str(rank % 2)
        assert seen["WORLD_SIZE"] == "4"
        assert seen["LOCAL_WORLD_SIZE"] == "2"
    if launcher == "direct":
        assert [seen["NODE_RANK"] for _, (_, seen) in sorted(by_rank.items())] == ["0", "0", "1", "1"]
    # Each line says its rank, and one rank's lines can be asked for alone.
    assert {line.rank for line in lines if line.text.startswith("RESULT ")} == {0, 1, 2, 3}
    assert [line.text.split()[1] for line in job.logs(rank=3) if line.text.startswith("RESULT")] == ["3"]


def test_each_rank_sees_its_own_simulated_gpu_and_the_cli_prefixes_lines_with_ranks(
    client: Client, workers: Workers, cli: Callable[..., Result]
) -> None:
    two = json.dumps([{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}] * 2)
    workers.start("gpu-a", 1, "--fake-gpus", two)
    workers.start("gpu-b", 1, "--fake-gpus", two)
    job = client.submit(["sh", "-c", 'echo "gpu=$CUDA_VISIBLE_DEVICES"'], nodes=2, gpus=2)
    record = job.wait(30)
    assert record.state is JobState.SUCCEEDED
    assert [part.gpus for part in record.parts] == [[0, 1], [0, 1]]
    seen = {line.rank: line.text for line in job.logs() if line.stream == "stdout"}
    assert seen == {0: "gpu=0", 1: "gpu=1", 2: "gpu=0", 3: "gpu=1"}
    assert "[rank 2] gpu=0" in cli("logs", job.id).output
    assert cli("logs", job.id, "--rank", "1").output.strip() == "gpu=1"


def test_one_rank_failing_stops_every_other_rank_within_three_seconds(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("ff-a", 2)
    workers.start("ff-b", 2)
    pids, died = tmp_path / "pids", tmp_path / "died"
    pids.mkdir()
    text = (
        f'echo $$ > {pids}/$RANK; if [ "$RANK" = 3 ]; then sleep 1; date +%s.%N > {died}; exit 3; fi; '
        "exec sleep 60"
    )
    job = client.submit(["sh", "-c", text], nodes=2, procs_per_node=2, retries=0)
    record = job.wait(30)
    assert (record.state, record.exit_code) == (JobState.FAILED, 3)
    assert record.reason is not None
    assert record.reason.startswith("rank 3: exit code 3 on ff-")
    assert record.ended_at is not None
    assert record.ended_at.timestamp() - float(died.read_text()) < 3.0
    alive = [int(p.read_text()) for p in pids.iterdir() if psutil.pid_exists(int(p.read_text()))]
    assert [pid for pid in alive if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE] == []
    assert all(worker.cpus_used == 0 for worker in client.workers())


def test_cancel_and_timeout_stop_every_rank(client: Client, workers: Workers) -> None:
    workers.start("ct-a", 2)
    workers.start("ct-b", 2)
    cancelled = client.submit(["sleep", "60"], nodes=2, procs_per_node=2)
    wait_for(lambda: cancelled.status().state is JobState.RUNNING, what="all ranks to start")
    assert cancelled.cancel()
    assert cancelled.wait(10).state is JobState.CANCELLED
    timed = client.submit(["sleep", "60"], nodes=2, procs_per_node=2, timeout=1)
    record = timed.wait(30)
    assert record.state is JobState.TIMED_OUT
    assert record.reason is not None
    assert record.reason.startswith("timed out after 1 s")
    assert all(worker.cpus_used == 0 and worker.running == 0 for worker in client.workers())


def test_a_failed_gang_job_with_retries_runs_again_on_a_whole_new_gang(
    client: Client, workers: Workers
) -> None:
    workers.start("rt-a", 1)
    workers.start("rt-b", 1)
    text = 'if [ "$GPULAYER_ATTEMPT" = 1 ] && [ "$RANK" = 1 ]; then exit 4; fi; echo "ok $RANK"'
    job = client.submit(["sh", "-c", text], nodes=2, retries=1, retry_on="exit", retry_delay=0)
    record = job.wait(30)
    assert (record.state, record.attempt) == (JobState.SUCCEEDED, 2)
    assert [(a.outcome, a.exit_code) for a in record.attempts] == [("failed", 4), ("succeeded", 0)]


def test_a_rank_that_cannot_start_sends_the_job_back_then_fails_it(client: Client, workers: Workers) -> None:
    workers.start("ns-a", 1)
    workers.start("ns-b", 1)
    record = client.submit(["no-such-program-here"], nodes=2).wait(30)
    assert record.state is JobState.FAILED
    assert record.reason is not None
    assert record.reason.startswith("could not start 3 times: rank ")
    assert "command not found: no-such-program-here" in record.reason
    assert [attempt.outcome for attempt in record.attempts] == ["unstarted", "unstarted", "failed"]


def test_two_gang_jobs_that_do_not_fit_together_and_a_flood_of_small_jobs_all_finish(
    client: Client, workers: Workers, env: dict[str, str]
) -> None:
    workers.env = {**env, "GPULAYER_GANG_HOLD_AFTER": "1s"}
    for name in ("f1", "f2", "f3"):
        workers.start(name, 2)
    gangs = [client.submit(["sleep", "0.5"], nodes=2, cpus=2) for _ in range(2)]
    flood = [client.submit(["sleep", "0.2"]) for _ in range(30)]
    # More keep coming while the gang jobs wait, as on a busy cluster.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        flood.append(client.submit(["sleep", "0.2"]))
        time.sleep(0.1)
    for job in gangs + flood:
        assert job.wait(60).state is JobState.SUCCEEDED
    first, second = (job.status() for job in gangs)
    # Never both at once: together they need four whole workers of the three. (A job ends with its
    # last part, and each part frees its worker as it ends: the next may start a moment before.)
    spans = sorted((record.started_at, record.ended_at) for record in (first, second))
    (_, first_end), (second_start, _) = spans
    assert first_end is not None
    assert second_start is not None
    assert (first_end - second_start).total_seconds() < 0.25


def test_a_worker_killed_mid_job_takes_its_ranks_with_it_and_the_gang_runs_again(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    doomed = workers.start("doomed", 1, *FAST)
    workers.start("steady", 1, *FAST)
    pids = tmp_path / "pids"
    pids.mkdir()
    text = (
        f'echo $$ > {pids}/$GPULAYER_ATTEMPT-$RANK; [ "$GPULAYER_ATTEMPT" = 1 ] && exec sleep 60; echo done'
    )
    job = client.submit(["sh", "-c", text], nodes=2, retry_delay=0)
    # Each rank's file exists before the shell has written its pid into it: wait for both pids.
    written = lambda: [p for p in pids.iterdir() if p.read_text().strip()]  # noqa: E731
    wait_for(lambda: job.status().state is JobState.RUNNING and len(written()) == 2, what="ranks")
    first_try = {p.name: int(p.read_text()) for p in pids.iterdir()}
    doomed_rank = next(part.node for part in job.status().parts if part.worker == "doomed")
    os.kill(doomed.pid, signal.SIGKILL)  # the worker alone: its rank must not run on unsupervised
    killed = time.monotonic()
    wait_for(lambda: not _running(first_try[f"1-{doomed_rank}"]), timeout=5, what="the rank to die with it")
    # The other machine's rank is stopped once the dead worker's lease (1.5 s) has run out.
    wait_for(
        lambda: not _running(first_try[f"1-{1 - doomed_rank}"]), timeout=10, what="the other rank to stop"
    )
    assert time.monotonic() - killed < 1.5 + 3
    workers.start("spare", 1, *FAST)
    record = job.wait(60)
    assert (record.state, record.attempt) == (JobState.SUCCEEDED, 2)
    assert record.attempts[0].outcome == "lost"
    assert sorted(part.worker for part in record.parts) == ["spare", "steady"]
    assert [pid for pid in first_try.values() if _running(pid)] == []


def test_a_machine_lost_with_no_retry_left_fails_the_gang_job_as_worker_lost(
    client: Client, workers: Workers
) -> None:
    doomed = workers.start("gone", 1, *FAST)
    workers.start("left", 1, *FAST)
    job = client.submit(["sleep", "60"], nodes=2, retries=0)
    wait_for(lambda: job.status().state is JobState.RUNNING, what="ranks")
    kill_machine(doomed.pid)
    record = job.wait(30)
    assert record.state is JobState.FAILED
    assert record.reason == "worker lost: worker gone stopped renewing its lease"
    assert record.reason_code == "worker_lost"
    assert all(worker.running == 0 for worker in client.workers() if worker.name == "left")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_keys_of_gang_jobs_live_under_the_prefix() -> None:
    keys = Keys("p")
    assert [
        keys.gangs,
        keys.gang_wake,
        keys.gangs_placing,
        keys.worker_gang("w"),
        keys.worker_wake("w"),
        keys.held("w"),
    ] == [
        "p:gangs",
        "p:gangs:wake",
        "p:gangs:placing",
        "p:worker:w:gang",
        "p:worker:w:wake",
        "p:worker:w:held",
    ]


def test_a_garbled_gang_job_record_fails_saying_so_and_the_worker_goes_on(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    garbled = client.submit(["true"], nodes=2)
    raw_redis.hset(client.keys.job(garbled.id), "gl_spec", "{not json")
    worker = workers.start("w1", 2)
    workers.start("w2", 2)
    assert client.submit(["true"], nodes=2).wait(30).state is JobState.SUCCEEDED
    record = garbled.wait(30)
    assert (record.state, record.reason) == (JobState.FAILED, "corrupt record: gl_spec is not a job's spec")
    assert raw_redis.zscore(client.keys.gangs, garbled.id) is None
    assert worker.poll() is None
    assert "its record is missing or garbled; it fails" in workers.log("w1") + workers.log("w2")
    assert {w.name: (w.heartbeat, w.address) for w in client.workers()} == {
        "w1": (5.0, "127.0.0.1"),
        "w2": (5.0, "127.0.0.1"),
    }


# --- remote functions as gang jobs ------------------------------------------------------------------


class RankError(Exception):
    """An exception of the caller's own, raised by one rank."""


def all_reduce() -> dict[str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "sum": total.item()}


def fail_on(bad: int) -> str:
    if os.environ["RANK"] == str(bad):
        raise RankError(f"rank {bad} gives up")
    time.sleep(60)
    return "never"


def value(handle: gl.FunctionHandle[Any]) -> Any:
    """The call's value; if it failed, what its ranks printed, to see why."""
    try:
        return handle.result(120)
    except gl.JobFailed:
        raise AssertionError([(line.rank, line.text) for line in handle.logs()]) from None


@pytest.fixture
def remote_gang(client: Client, home: Path, tmp_path: Path, workers: Workers) -> Workers:
    (tmp_path / "project").mkdir()
    workers.start("fa", 2)
    workers.start("fb", 2)
    return workers


def test_a_remote_function_runs_on_every_rank_and_returns_rank_zeros_value(
    client: Client, remote_gang: Workers, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    function = gl.remote(all_reduce, nodes=2, procs_per_node=2, client=client, source=tmp_path / "project")
    assert value(function.remote()) == {"rank": 0, "sum": 10.0}


def test_a_remote_function_that_raises_on_one_rank_raises_it_here_and_stops_the_rest(
    client: Client, remote_gang: Workers, tmp_path: Path
) -> None:
    function = gl.remote(
        fail_on, nodes=2, procs_per_node=2, retries=0, client=client, source=tmp_path / "project"
    )
    handle = function.remote(3)
    with pytest.raises(RankError, match="rank 3 gives up"):
        handle.result(60)
    record = handle.status()
    assert record.state is JobState.FAILED
    assert record.reason is not None
    assert record.reason.startswith("rank 3: RankError: rank 3 gives up on f")
    assert all(worker.running == 0 for worker in client.workers())


def nap_on_every_rank(marks: Path) -> str:
    (marks / os.environ["RANK"]).touch()
    time.sleep(60)
    return "rested"


def test_a_remote_function_whose_worker_is_lost_raises_worker_lost_not_job_failed(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    # The gang's reason says more than a plain job's ("worker lost: ..."): the code says it alike.
    (tmp_path / "project").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    doomed = workers.start("gone", 1, *FAST)
    workers.start("left", 1, *FAST)
    function = gl.remote(nap_on_every_rank, nodes=2, retries=0, client=client, source=tmp_path / "project")
    handle = function.remote(marks)
    wait_for(lambda: len(list(marks.iterdir())) == 2, timeout=60, what="both ranks to run")
    kill_machine(doomed.pid)
    with pytest.raises(gl.WorkerLost, match="its worker was lost"):
        handle.result(30)
    record = handle.status()
    assert (record.state, record.reason_code) == (JobState.FAILED, "worker_lost")
    assert record.reason == "worker lost: worker gone stopped renewing its lease"


def env_rank() -> str:
    return os.environ["RANK"] + "/" + os.environ["WORLD_SIZE"]


def test_a_distributed_job_of_a_function_returns_rank_zeros_value(
    client: Client, remote_gang: Workers, tmp_path: Path
) -> None:
    job = DistributedJob(env_rank, nodes=2, procs_per_node=2, source=tmp_path / "project").submit(client)
    assert value(gl.FunctionHandle(job)) == "0/4"
    assert len(job.status().parts) == 2


def test_a_worker_that_vanishes_between_placement_and_start_sends_the_job_back_to_wait(
    client: Client, workers: Workers, env: dict[str, str]
) -> None:
    workers.start("on", 1, *FAST)
    workers.env = {**env, "GPULAYER_TEST_FAULT": "exit-after-claim"}  # it dies as it takes its part
    doomed = workers.start("doomed", 1, *FAST)
    workers.env = env
    job = client.submit(["true"], nodes=2, retries=0)
    wait_for(lambda: job.status().attempts, what="the first attempt to end")
    first = job.status().attempts[0]
    assert (first.outcome, first.reason) == ("unstarted", "worker doomed stopped renewing its lease")
    assert doomed.wait(5) == 9
    workers.start("spare", 1, *FAST)
    record = job.wait(30)
    assert (record.state, record.attempt) == (JobState.SUCCEEDED, 2)
    assert sorted(part.worker for part in record.parts) == ["on", "spare"]


def test_the_distributed_example_trains_on_two_workers(client: Client, workers: Workers) -> None:
    pytest.importorskip("torch")
    workers.start("ex-a", 2)
    workers.start("ex-b", 2)
    example = Path(__file__).resolve().parent.parent / "examples" / "distributed"
    job = client.submit([sys.executable, "ddp.py"], source=example, nodes=2, procs_per_node=2)
    record = job.wait(120)
    lines = [line.text for line in job.logs()]
    assert record.state is JobState.SUCCEEDED, lines
    assert sum(text.startswith("rank ") for text in lines) == 4
    assert [line.rank for line in job.logs() if line.text.startswith("mean loss over 4 ranks")] == [0]


def test_workers_write_nothing_about_gang_jobs_while_none_wait(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("quiet", 1)
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    assert not raw_redis.exists(client.keys.gangs_placing, client.keys.gangs)
