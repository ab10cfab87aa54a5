"""Remote functions: ``.map`` over many no-op calls, and one call's round trip, beside plain RQ.

Each system gets the same work, on the same Redis, with two worker processes on this machine:

* map: N calls of a function that returns its argument, from the first submit to the last result
  back in the caller (GPUlayer ``f.map(range(N))``; RQ: N enqueues, then each job's result in order),
  calls per second, the median of ``--repeats`` rounds (this shared machine is noisy);
* round trip: one call at a time on an idle worker, from submit to its value back in the caller
  (``f.remote(x).result()``; RQ: ``enqueue`` then ``latest_result``), p50 and p95;
* cold start (GPUlayer only): the first call on a newly registered worker, which starts its Python
  executor;
* what results as data cost (GPUlayer only): the same map with ``allow_pickle=True``, round by round
  beside the default (the allow-list), and, in this process alone, microseconds per result of
  typical kinds unpickled as data against ``pickle.loads`` of the pickle a worker wrote before.

GPUlayer runs with one slot per worker (RQ's concurrency) and with one slot per core; RQ with its
default forking ``Worker`` and with ``SimpleWorker``. Workers log at WARNING on both sides.

    python benchmarks/sdk_map.py [--calls 2000] [--latency-runs 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import numpy
import redis
import torch
from _common import (
    dramatiq_tasks_on,
    dramatiq_workers,
    flush,
    gpulayer_worker,
    median,
    percentile,
    private_installation,
    rq_worker,
    save,
    spawn,
    stop,
)
from rq import Queue, Worker

import gpulayer as gl
from gpulayer import Client, Settings
from gpulayer.payloads import dump_result
from gpulayer.unpickling import OwnCode, Policy, loads_data

RQ_FUNCTION = "rq_tasks.noop"


def noop(x: int) -> int:
    return x


def timed(rounds: int, *runs: Callable[[], None]) -> list[float]:
    """The median time of ``rounds`` runs of each of ``runs``, in seconds; the runs take turns in
    each round, so a slow minute of the machine falls on all of them."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for run, taken in zip(runs, times, strict=True):
            started = time.perf_counter()
            run()
            taken.append(time.perf_counter() - started)
    return [median(taken) for taken in times]


def gpulayer_run(url: str, home: Path, calls: int, runs: int, repeats: int, slots: int) -> dict[str, float]:
    flush(url)
    client = Client(url, settings=Settings(home=home))
    f = gl.remote(noop, client=client)
    env = {"GPULAYER_HOME": str(home)}
    first = spawn(gpulayer_worker(url, "w0", slots), env=env)
    while not client.workers():
        time.sleep(0.005)
    started = time.perf_counter()
    cold = f.remote(0).result(timeout=60)
    cold_ms = (time.perf_counter() - started) * 1000
    second = spawn(gpulayer_worker(url, "w1", slots), env=env)
    while len(client.workers()) < 2:
        time.sleep(0.005)
    assert cold == 0
    # Warm both workers' executors, as any session past its first calls has them.
    assert list(f.map(range(8 * slots))) == list(range(8 * slots))

    trusting = f.options(allow_pickle=True)

    def mapped() -> None:
        assert list(f.map(range(calls))) == list(range(calls))

    def mapped_allowing_pickle() -> None:
        assert list(trusting.map(range(calls))) == list(range(calls))

    seconds, seconds_allowing_pickle = timed(repeats, mapped, mapped_allowing_pickle)
    stop(second)
    latencies = []
    for i in range(runs):
        started = time.perf_counter()
        assert f.remote(i).result(timeout=30) == i
        latencies.append((time.perf_counter() - started) * 1000)
    stop(first)
    client.close()
    return {
        "calls_per_s": calls / seconds,
        "calls_per_s_allow_pickle": calls / seconds_allowing_pickle,
        "p50_ms": median(latencies),
        "p95_ms": percentile(latencies, 0.95),
        "cold_start_ms": cold_ms,
    }


def rq_run(url: str, calls: int, runs: int, repeats: int, worker_class: str) -> dict[str, float]:
    flush(url)
    connection = redis.Redis.from_url(url)
    queue = Queue("bench", connection=connection)
    workers = [spawn(rq_worker(url, worker_class)) for _ in range(2)]
    while len(Worker.all(connection=connection)) < 2:
        time.sleep(0.005)

    def mapped() -> None:
        jobs = [queue.enqueue(RQ_FUNCTION, i) for i in range(calls)]
        values = []
        for job in jobs:
            result = job.latest_result(timeout=60)
            assert result is not None
            values.append(result.return_value)
        assert values == list(range(calls))

    [seconds] = timed(repeats, mapped)
    stop(workers.pop(), peer=True)
    latencies = []
    for i in range(runs):
        started = time.perf_counter()
        result = queue.enqueue(RQ_FUNCTION, i).latest_result(timeout=30)
        assert result is not None
        assert result.return_value == i
        latencies.append((time.perf_counter() - started) * 1000)
    stop(workers.pop(), peer=True)
    connection.close()
    return {
        "calls_per_s": calls / seconds,
        "p50_ms": median(latencies),
        "p95_ms": percentile(latencies, 0.95),
    }


def dramatiq_run(url: str, calls: int, repeats: int) -> dict[str, float] | None:
    """Dramatiq's no-op rate: ``calls`` sends, then each result in order, 2 processes x 4 threads;
    None where Dramatiq is not installed (``pip install -r benchmarks/requirements.txt``)."""
    tasks = dramatiq_tasks_on(url)
    if tasks is None:
        return None
    workers = dramatiq_workers(url)
    assert tasks.noop.send(0).get_result(block=True, timeout=60_000) == 0

    def mapped() -> None:
        messages = [tasks.noop.send(i) for i in range(calls)]
        assert [message.get_result(block=True, timeout=60_000) for message in messages] == list(range(calls))

    [seconds] = timed(repeats, mapped)
    stop(workers, peer=True)
    return {"calls_per_s": calls / seconds}


def results_of_each_kind() -> dict[str, Any]:
    """What remote functions typically return."""
    when = datetime.datetime(2026, 12, 4, tzinfo=datetime.timezone.utc)
    return {
        "an int": 7,
        "a dict of 10 metrics": {f"metric{i}": i / 3 for i in range(10)},
        "100 records (dicts of str, int, float, datetime, Decimal)": [
            {
                "name": f"run{i}",
                "step": i,
                "loss": i / 7,
                "at": when,
                "cost": decimal.Decimal(i),
            }
            for i in range(100)
        ],
        "a numpy array of 100,000 floats": numpy.arange(100_000, dtype=numpy.float64),
        "a torch tensor of 100,000 floats": torch.arange(100_000, dtype=torch.float32),
        "an exception": ValueError("bad input"),
    }


def unpickling_costs(rounds: int = 2000) -> dict[str, dict[str, float]]:
    """Microseconds per result: as a client unpickled it before (``pickle.loads`` of what cloudpickle
    wrote on the worker) and as data now (:func:`loads_data` of what ``dump_result`` writes)."""
    policy = Policy(OwnCode(frozenset))
    costs = {}
    for kind, value in results_of_each_kind().items():
        before, now = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), dump_result(value)
        count = max(20, rounds // max(1, len(now) // 10_000))
        [whole, data] = timed(
            5,
            lambda before=before, count=count: [pickle.loads(before) for _ in range(count)],
            lambda now=now, count=count: [loads_data(now, policy) for _ in range(count)],
        )
        costs[kind] = {"pickle_us": whole / count * 1e6, "data_us": data / count * 1e6, "bytes": len(now)}
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--latency-runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with private_installation() as (url, home):
        runs = {
            "gpulayer, 2 workers x 1 slot": gpulayer_run(
                url, home, args.calls, args.latency_runs, args.repeats, 1
            ),
            f"gpulayer, 2 workers x {cores} slots": gpulayer_run(
                url, home, args.calls, args.latency_runs, args.repeats, cores
            ),
            "rq Worker (fork), 2 workers": rq_run(
                url, args.calls, args.latency_runs, args.repeats, "rq.worker.Worker"
            ),
            "rq SimpleWorker, 2 workers": rq_run(
                url, args.calls, args.latency_runs, args.repeats, "rq.worker.SimpleWorker"
            ),
        }
        dramatiq = dramatiq_run(url, args.calls, args.repeats)
    fork = runs["rq Worker (fork), 2 workers"]
    simple = runs["rq SimpleWorker, 2 workers"]
    print(f"{args.calls} calls of a no-op function, two worker processes, {cores} CPUs, one Redis")
    print(
        f"{'':34} {'calls/s':>8} {'vs fork':>8} {'vs simple':>9} {'p50 ms':>7} {'p95 ms':>7} {'vs simple':>9}"
    )
    for name, run in runs.items():
        print(f"{name:34} {run['calls_per_s']:8.0f} {run['calls_per_s'] / fork['calls_per_s']:7.2f}x "
              f"{run['calls_per_s'] / simple['calls_per_s']:8.2f}x {run['p50_ms']:7.2f} {run['p95_ms']:7.2f} "
              f"{simple['p50_ms'] / run['p50_ms']:8.2f}x")  # fmt: skip
    if dramatiq is None:
        print("(Dramatiq not installed: pip install -r benchmarks/requirements.txt)")
    else:
        print(f"{'dramatiq, 2 processes x 4 threads':34} {dramatiq['calls_per_s']:8.0f}")
        for name, run in runs.items():
            print(f"{name}: {run['calls_per_s'] / dramatiq['calls_per_s']:.2f}x Dramatiq's no-op rate")
    for name, run in runs.items():
        if "cold_start_ms" in run:
            print(f"{name}: first call on a new worker (starts its executor): {run['cold_start_ms']:.0f} ms")
            print(f"{name}: allow_pickle=True {run['calls_per_s_allow_pickle']:.0f} calls/s, results as data "
                  f"{run['calls_per_s'] / run['calls_per_s_allow_pickle']:.2f}x that")  # fmt: skip
    costs = unpickling_costs()
    print(f"\n{'one result, µs to unpickle':58} {'pickle':>8} {'as data':>8} {'bytes':>9}")
    for kind, cost in costs.items():
        print(f"{kind:58} {cost['pickle_us']:8.1f} {cost['data_us']:8.1f} {cost['bytes']:9.0f}")
    path = save(
        "sdk_map",
        {
            "calls": args.calls,
            "latency_runs": args.latency_runs,
            "repeats": args.repeats,
            "runs": runs,
            "dramatiq": dramatiq,
            "unpickling_us": costs,
        },
    )
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
