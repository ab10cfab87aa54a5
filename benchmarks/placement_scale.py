"""Placement at scale: submit cost and a worker's claim time as the queues grow, beside plain RQ.

1,000 simulated workers are registered (real `gpulayer.worker.Worker` registrations, no
processes) with varied GPUs; 100,000 jobs are queued over 50 requirement sets. At 1k, 10k and 100k
queued jobs it measures:

* submit: the mean of the last 1,000 submits before that depth (one `Client.submit` each);
* claim: the time a worker serving all 50 queues takes to claim its next job (the Lua claim its
  loop runs, reserving GPUs), mean over 200 claims, each job given back afterwards (untimed);
* plan: reading all 1,000 workers and explaining where a job would run (what `status` and `why` do
  for a queued job), mean over 20.

Plain RQ gets the same depths over 50 queues: `Queue.enqueue` for submit, `Queue.dequeue_any` over
all 50 queues for the claim (RQ has no placement; it pops whatever comes first).

    python benchmarks/placement_scale.py [--jobs 100000] [--workers 1000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from _common import flush, private_redis, save
from rq import Queue

from gpulayer import Client, Settings
from gpulayer.access import Access
from gpulayer.installation import Installation
from gpulayer.inventory import Offer
from gpulayer.resources import parse_fake_gpus
from gpulayer.store.execution import ClaimRequest
from gpulayer.worker import Worker

MILESTONES = (1_000, 10_000, 100_000)
WINDOW = 1_000
CLAIMS = 200
GiB = 2**30
#: The keys jobs are signed and checked with, and the identity the simulated workers register under.
INSTALLATION, WORKER = Installation.generate("gpulayer", "redis://127.0.0.1/0").enrol("worker", "sim")
KEYS = WORKER.keyring
MACHINES = [
    [("NVIDIA H100 80GB HBM3", 80)] * 8,
    [("NVIDIA A100-SXM4-40GB", 40)] * 4,
    [("NVIDIA GeForce RTX 4090", 24)] * 2,
    [("NVIDIA L4", 24)],
    [],
]


def requirement_sets() -> list[dict[str, object]]:
    """50 distinct requirement sets that one well-equipped worker can all serve."""
    sets = []
    for gpus, memory, name, framework in itertools.product(
        (1, 2), (None, "16GB", "24GB"), (None, "A100", "H100", "4090", "L4", "A100|H100"), (None, "rq>=2")
    ):
        fields: dict[str, object] = {"gpus": gpus}
        if memory:
            fields["gpu_memory"] = memory
        if name:
            fields["gpu_name"] = name
        if framework:
            fields["frameworks"] = [framework]
        sets.append(fields)
    return sets[:50]


def register_fleet(connection: redis.Redis, settings: Settings, count: int) -> None:
    rng = random.Random(7)
    for i in range(count):
        name = f"sim-{i:04d}"
        kinds = rng.choice(MACHINES)
        gpus = parse_fake_gpus(json.dumps([{"name": n, "memory_gb": m} for n, m in kinds]), name)
        labels = {"zone": rng.choice(("eu", "us"))}
        Worker(
            connection,
            settings,
            keyring=KEYS,
            identity="sim",
            name=name,
            offer=Offer(slots=8, memory=64 * GiB, gpus=gpus, labels=labels),
        ).register_birth()


def claimer(connection: redis.Redis, settings: Settings) -> Worker:
    kinds = [("NVIDIA H100 80GB HBM3", 80), ("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA GeForce RTX 4090", 24)]
    kinds += [("NVIDIA L4", 24)]
    gpus = parse_fake_gpus(
        json.dumps([{"name": n, "memory_gb": m} for n, m in kinds for _ in range(2)]), "claimer"
    )
    offer = Offer(slots=8, memory=64 * GiB, gpus=gpus, frameworks={"rq": "2.12.0"})
    worker = Worker(connection, settings, keyring=KEYS, identity="sim", name="claimer", offer=offer)
    worker.register_birth()
    return worker


def fill(submit: Callable[[int], object], queued: int, milestone: int) -> tuple[int, float]:
    """Submit until ``milestone`` jobs are queued; returns that count and the mean ms of the last WINDOW."""
    while queued < milestone - WINDOW:
        submit(queued)
        queued += 1
    started = time.perf_counter()
    while queued < milestone:
        submit(queued)
        queued += 1
    return queued, (time.perf_counter() - started) / WINDOW * 1000


def gpulayer_side(url: str, home: Path, jobs: int, workers: int) -> dict[str, dict[str, float]]:
    flush(url)
    settings = Settings(home=home)
    connection = redis.Redis.from_url(url)
    register_fleet(connection, settings, workers)
    worker = claimer(connection, settings)
    client = Client(settings=settings, access=Access(role="admin", redis_url=url, keys=INSTALLATION.keys))
    sets = requirement_sets()
    results: dict[str, dict[str, float]] = {}
    queued = 0
    for milestone in MILESTONES:
        if milestone > jobs:
            break
        queued, submit_ms = fill(lambda n: client.submit(["true"], **sets[n % len(sets)]), queued, milestone)
        worker._served.update(worker.store.queue_registry)
        spent = 0.0
        for _ in range(CLAIMS):
            started = time.perf_counter()
            request = ClaimRequest(worker._served.claim_order(), 1, 8, 64 * GiB, 60_000)
            claimed, _ = worker.store.claim(request)
            spent += time.perf_counter() - started
            assert len(claimed) == 1
            # Given back so the depth stays as measured; not timed.
            worker.store.requeue("returned", "benchmark", [claimed[0].job_id])
        claim_ms = spent / CLAIMS * 1000
        requirements = client.jobs(limit=1)[0].spec.requirements
        started = time.perf_counter()
        for _ in range(20):
            client.plan(requirements)
        plan_ms = (time.perf_counter() - started) / 20 * 1000
        results[str(milestone)] = {"submit_ms": submit_ms, "claim_ms": claim_ms, "plan_ms": plan_ms}
        print(f"gpulayer at {milestone:>7} queued: submit {submit_ms:.3f} ms, claim {claim_ms:.3f} ms "
              f"(claim), plan {plan_ms:.1f} ms over {workers + 1} workers")  # fmt: skip
    client.close()
    return results


def rq_side(url: str, jobs: int) -> dict[str, dict[str, float]]:
    flush(url)
    connection = redis.Redis.from_url(url)
    queues = [Queue(f"set-{i}", connection=connection) for i in range(50)]
    results: dict[str, dict[str, float]] = {}
    queued = 0
    for milestone in MILESTONES:
        if milestone > jobs:
            break
        queued, submit_ms = fill(
            lambda n: queues[n % 50].enqueue("rq_tasks.run_command", "true"), queued, milestone
        )
        spent = 0.0
        for _ in range(CLAIMS):
            started = time.perf_counter()
            job, queue = Queue.dequeue_any(queues, None, connection=connection)  # type: ignore[misc]
            spent += time.perf_counter() - started
            queue.enqueue_job(job, at_front=True)
        claim_ms = spent / CLAIMS * 1000
        results[str(milestone)] = {"submit_ms": submit_ms, "claim_ms": claim_ms}
        print(f"rq       at {milestone:>7} queued: submit {submit_ms:.3f} ms,", end=" ")
        print(f"claim {claim_ms:.3f} ms (dequeue)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp)) as url:
        ours = gpulayer_side(url, Path(tmp) / "home", args.jobs, args.workers)
        theirs = rq_side(url, args.jobs)
    print(f"\n{'queued':>8} {'submit ms':>10} {'rq':>7} {'ratio':>6} {'claim ms':>9} {'rq':>7} {'ratio':>6}")
    for depth, result in ours.items():
        rq = theirs[depth]
        submit_ratio, claim_ratio = result["submit_ms"] / rq["submit_ms"], result["claim_ms"] / rq["claim_ms"]
        print(f"{depth:>8} {result['submit_ms']:10.3f} {rq['submit_ms']:7.3f} {submit_ratio:5.2f}x", end=" ")
        print(f"{result['claim_ms']:9.3f} {rq['claim_ms']:7.3f} {claim_ratio:5.2f}x")
    first, last = ours[str(MILESTONES[0])], ours[list(ours)[-1]]
    print(f"\nflatness, largest depth vs 1k: submit {last['submit_ms'] / first['submit_ms']:.2f}x, "
          f"claim {last['claim_ms'] / first['claim_ms']:.2f}x (aim: within 1.5x)")  # fmt: skip
    path = save(
        "placement_scale", {"workers": args.workers, "jobs": args.jobs, "gpulayer": ours, "rq": theirs}
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
