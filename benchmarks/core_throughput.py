"""Core throughput: GPUlayer command jobs beside plain RQ, in the same run, on the same Redis.

Each system gets the same work: N jobs that each run `true` in a subprocess, drained by two
worker processes on this machine. Measured for each:

* submit cost: N submits (enqueues) one after another, before any worker runs, ms per job;
* throughput: jobs / (last job's end - first job's start), from the job records;
* submit -> start on an idle worker: one job at a time, p50 and p95 over `--latency-runs`;
* log delay (GPUlayer only; RQ keeps no job output): from a job printing a line to
  `logs --follow` receiving it, over 100 lines printed 20 ms apart.

Plain RQ runs `rq_tasks.run_command("true")` on its default forking `Worker` and on `SimpleWorker`.
GPUlayer runs with its default of one slot per core, and with one slot per worker (RQ's concurrency).
Workers log at WARNING on both sides, so the numbers measure the queue, not the terminal.

    python benchmarks/core_throughput.py [--jobs 2000] [--latency-runs 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import redis
from _common import (
    dramatiq_tasks_on,
    dramatiq_workers,
    flush,
    gpulayer_worker,
    median,
    percentile,
    private_installation,
    python,
    rq_worker,
    save,
    spawn,
    stop,
    wait_all,
)
from rq import Queue
from rq.job import Job as RQJob

from gpulayer import Client, JobState, Settings

RQ_FUNCTION = "rq_tasks.run_command"


def gpulayer_throughput(url: str, home: Path, jobs: int, workers: int, slots: int) -> dict[str, float]:
    flush(url)
    client = Client(url, settings=Settings(home=home))
    started = time.perf_counter()
    for _ in range(jobs):
        client.submit(["true"])
    submit_ms = (time.perf_counter() - started) / jobs * 1000
    processes = [
        spawn(gpulayer_worker(url, f"w{i}", slots, "--burst"), env={"GPULAYER_HOME": str(home)})
        for i in range(workers)
    ]
    wait_all(processes)
    records = client.jobs(limit=jobs)
    assert len(records) == jobs
    assert {record.state for record in records} == {JobState.SUCCEEDED}
    first = min(record.started_at for record in records if record.started_at)
    last = max(record.ended_at for record in records if record.ended_at)
    client.close()
    return {"submit_ms": submit_ms, "jobs_per_s": jobs / (last - first).total_seconds()}


def rq_throughput(url: str, jobs: int, workers: int, worker_class: str) -> dict[str, float]:
    flush(url)
    connection = redis.Redis.from_url(url)
    queue = Queue("bench", connection=connection)
    started = time.perf_counter()
    ids = [queue.enqueue(RQ_FUNCTION, "true").id for _ in range(jobs)]
    submit_ms = (time.perf_counter() - started) / jobs * 1000
    processes = [spawn(rq_worker(url, worker_class, "--burst")) for _ in range(workers)]
    wait_all(processes)
    records = RQJob.fetch_many(ids, connection=connection)
    assert all(job is not None and job.get_status() == "finished" for job in records)
    first = min(job.started_at for job in records if job and job.started_at)
    last = max(job.ended_at for job in records if job and job.ended_at)
    connection.close()
    return {"submit_ms": submit_ms, "jobs_per_s": jobs / (last - first).total_seconds()}


def gpulayer_end_to_end(
    url: str, home: Path, jobs: int, background: bool = False, containment: str = "auto"
) -> dict[str, float]:
    """What a user's script sees: two workers already running (default slots), ``jobs`` submits
    in a loop, then a wait on each (``background``: by a client with background submits;
    ``containment``: the workers' ``--containment``). With where the CPU went, per job: the
    workers, the jobs' own processes (`true`: the spawn), Redis, and the client."""
    flush(url)
    client = Client(url, settings=Settings(home=home), background_submits=background)
    env = {"GPULAYER_HOME": str(home)}
    slots = os.cpu_count() or 1
    extra = ("--containment", containment)
    workers = [spawn(gpulayer_worker(url, f"e2e{i}", slots, *extra), env=env) for i in range(2)]
    while len(client.workers()) < 2:
        time.sleep(0.01)
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED  # warm, as the peers are
    meters = [psutil.Process(worker.pid) for worker in workers]
    before = _cpu(meters)
    started = time.perf_counter()
    handles = [client.submit(["true"]) for _ in range(jobs)]
    submitted = time.perf_counter()
    assert all(handle.wait(120).state is JobState.SUCCEEDED for handle in handles)
    ended = time.perf_counter()
    spent = _spent(before, _cpu(meters), jobs)
    for worker in workers:
        stop(worker)
    client.close()
    return {"submit_ms": (submitted - started) / jobs * 1000, "jobs_per_s": jobs / (ended - started), **spent}


def _cpu(workers: list[psutil.Process]) -> dict[str, float]:
    """CPU seconds so far: the workers', their jobs' (reaped children), Redis's, this process's, and
    the whole machine's busy time (every core's together, kernel threads too)."""
    times = [worker.cpu_times() for worker in workers]
    me = resource.getrusage(resource.RUSAGE_SELF)
    redis_server = next(p for p in psutil.Process().children() if p.name().startswith("redis-server"))
    machine = psutil.cpu_times()
    return {
        "worker": sum(t.user + t.system for t in times),
        "jobs": sum(t.children_user + t.children_system for t in times),
        "redis": sum(redis_server.cpu_times()[:2]),
        "client": me.ru_utime + me.ru_stime,
        "machine": machine.user + machine.nice + machine.system + machine.irq + machine.softirq,
    }


def _spent(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    return {f"cpu_ms_{part}": (after[part] - before[part]) / jobs * 1000 for part in before}


def rq_end_to_end(url: str, jobs: int) -> dict[str, float]:
    """The same with two RQ ``SimpleWorker`` processes, waiting on each job's result."""
    flush(url)
    connection = redis.Redis.from_url(url)
    queue = Queue("bench", connection=connection)
    workers = [spawn(rq_worker(url, "rq.worker.SimpleWorker")) for _ in range(2)]
    from rq import Worker

    while len(Worker.all(connection=connection)) < 2:
        time.sleep(0.01)
    assert queue.enqueue(RQ_FUNCTION, "true").latest_result(timeout=30) is not None  # warm
    started = time.perf_counter()
    handles = [queue.enqueue(RQ_FUNCTION, "true") for _ in range(jobs)]
    submitted = time.perf_counter()
    assert all(handle.latest_result(timeout=120) is not None for handle in handles)
    ended = time.perf_counter()
    for worker in workers:
        stop(worker, peer=True)
    connection.close()
    return {"submit_ms": (submitted - started) / jobs * 1000, "jobs_per_s": jobs / (ended - started)}


def dramatiq_end_to_end(url: str, jobs: int) -> dict[str, float] | None:
    """The same with Dramatiq, 2 processes x 4 threads, waiting on each message's result; None
    where Dramatiq is not installed (``pip install -r benchmarks/requirements.txt``)."""
    tasks = dramatiq_tasks_on(url)
    if tasks is None:
        return None
    workers = dramatiq_workers(url)
    # The processes that run the actors: the ones Dramatiq's command started.
    started_by = psutil.Process(workers.pid).children(recursive=True)
    meters = [process for process in started_by if process.name().startswith("python")]
    # Warm: a consumer that found its queue empty sleeps, longer each time, up to 1 s.
    assert tasks.run_command.send("true").get_result(block=True, timeout=60_000) == 0
    before = _cpu(meters)
    started = time.perf_counter()
    messages = [tasks.run_command.send("true") for _ in range(jobs)]
    submitted = time.perf_counter()
    assert all(message.get_result(block=True, timeout=120_000) == 0 for message in messages)
    ended = time.perf_counter()
    spent = _spent(before, _cpu(meters), jobs)
    stop(workers, peer=True)
    return {"submit_ms": (submitted - started) / jobs * 1000, "jobs_per_s": jobs / (ended - started), **spent}


def submit_costs(url: str, home: Path, jobs: int) -> dict[str, float]:
    """What one submit costs a script (ms per job, no worker running): GPUlayer's loop of submits,
    the same loop with 100,000 jobs already queued, and ``submit_many``; RQ's enqueue loop and
    ``enqueue_many``; Dramatiq's loop of sends (it has no batch send)."""
    flush(url)
    client = Client(url, settings=Settings(home=home))
    costs = {
        "gpulayer submit": _per_job_ms(lambda: [client.submit(["true"]) for _ in range(jobs)], jobs),
        "gpulayer submit_many": _per_job_ms(lambda: client.submit_many([["true"]] * jobs), jobs),
    }
    for _ in range(100):
        client.submit_many([["true"]] * 1000)
    costs["gpulayer submit, 100k queued"] = _per_job_ms(
        lambda: [client.submit(["true"]) for _ in range(jobs)], jobs
    )
    client.close()
    background = Client(url, settings=Settings(home=home), background_submits=True)
    costs["gpulayer submit, background"] = _per_job_ms(
        lambda: [background.submit(["true"]) for _ in range(jobs)], jobs
    )
    costs["gpulayer background + flush"] = _per_job_ms(
        lambda: ([background.submit(["true"]) for _ in range(jobs)], background.flush()), jobs
    )
    background.close()
    flush(url)
    queue = Queue("bench", connection=redis.Redis.from_url(url))
    costs["rq enqueue"] = _per_job_ms(lambda: [queue.enqueue(RQ_FUNCTION, "true") for _ in range(jobs)], jobs)
    prepared = [Queue.prepare_data(RQ_FUNCTION, ("true",)) for _ in range(jobs)]
    costs["rq enqueue_many"] = _per_job_ms(lambda: queue.enqueue_many(prepared), jobs)
    tasks = dramatiq_tasks_on(url)
    if tasks is not None:
        costs["dramatiq send"] = _per_job_ms(
            lambda: [tasks.run_command.send("true") for _ in range(jobs)], jobs
        )
    return costs


def _per_job_ms(work: Callable[[], object], jobs: int) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) / jobs * 1000


def gpulayer_latency(url: str, home: Path, runs: int) -> dict[str, float]:
    flush(url)
    client = Client(url, settings=Settings(home=home))
    worker = spawn(gpulayer_worker(url, "idle", 2), env={"GPULAYER_HOME": str(home)})
    while not client.workers():
        time.sleep(0.01)
    latencies = []
    for _ in range(runs):
        record = client.submit(["true"]).wait(30)
        assert record.started_at is not None
        latencies.append((record.started_at - record.created_at).total_seconds() * 1000)
    stop(worker)
    client.close()
    return {"p50_ms": median(latencies), "p95_ms": percentile(latencies, 0.95)}


def rq_latency(url: str, runs: int, worker_class: str) -> dict[str, float]:
    flush(url)
    connection = redis.Redis.from_url(url)
    queue = Queue("bench", connection=connection)
    worker = spawn(rq_worker(url, worker_class))
    from rq import Worker

    while not Worker.all(connection=connection):
        time.sleep(0.01)
    latencies = []
    for _ in range(runs):
        job = queue.enqueue(RQ_FUNCTION, "true")
        assert job.latest_result(timeout=30) is not None
        job.refresh()
        assert job.started_at is not None
        assert job.enqueued_at is not None
        latencies.append((job.started_at - job.enqueued_at).total_seconds() * 1000)
    stop(worker, peer=True)
    connection.close()
    return {"p50_ms": median(latencies), "p95_ms": percentile(latencies, 0.95)}


def log_delay(url: str, home: Path, lines: int = 100) -> dict[str, float]:
    """Each line carries the time it was printed; the follower notes when it got it (one clock)."""
    flush(url)
    client = Client(url, settings=Settings(home=home))
    worker = spawn(gpulayer_worker(url, "logs", 1), env={"GPULAYER_HOME": str(home)})
    while not client.workers():
        time.sleep(0.01)
    script = f"import time\nfor _ in range({lines}):\n    print(time.time())\n    time.sleep(0.02)\n"
    job = client.submit([python(), "-c", script])
    delays = [(time.time() - float(line.text)) * 1000 for line in job.logs(follow=True)]
    stop(worker)
    client.close()
    assert len(delays) == lines
    return {"p50_ms": median(delays), "p99_ms": percentile(delays, 0.99)}


PEER = "dramatiq, 2 processes x 4 threads"
#: GPUlayer's end to end run with its workers' containment off: what a cgroup per job costs.
NO_CGROUPS = "gpulayer, containment none"


def end_to_end_rounds(url: str, home: Path, jobs: int, rounds: int) -> dict[str, dict[str, float] | None]:
    """Each system's end-to-end run, ``rounds`` times in turn. This machine's speed drifts by a fifth
    within minutes, and one run of each can show the same code anywhere from 0.76x to 0.88x the peer:
    each ratio is taken within its round, beside the peer's run of that round, and every figure
    kept is the median over the rounds (``vs_dramatiq`` the median ratio). Each system runs one job
    before it is timed: Dramatiq's consumers, idle since their start, would otherwise be asleep."""
    systems: dict[str, Callable[[], dict[str, float] | None]] = {
        "gpulayer": lambda: gpulayer_end_to_end(url, home, jobs),
        "gpulayer, background submits": lambda: gpulayer_end_to_end(url, home, jobs, background=True),
        NO_CGROUPS: lambda: gpulayer_end_to_end(url, home, jobs, containment="none"),
        "rq SimpleWorker": lambda: rq_end_to_end(url, jobs),
        PEER: lambda: dramatiq_end_to_end(url, jobs),
    }
    runs: dict[str, list[dict[str, float] | None]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, run in systems.items():
            runs[name].append(run())
    peers = runs[PEER]
    summary: dict[str, dict[str, float] | None] = {}
    for name, results in runs.items():
        done = [result for result in results if result is not None]
        if not done:
            summary[name] = None
            continue
        row = {field: median([result[field] for result in done]) for field in done[0]}
        if all(peer is not None for peer in peers):
            ratios = [r["jobs_per_s"] / p["jobs_per_s"] for r, p in zip(done, peers, strict=True) if p]
            row["vs_dramatiq"] = median(ratios)
        row["rounds"] = len(done)
        summary[name] = row
    if runs[NO_CGROUPS][0] is not None:
        # What a cgroup per job costs, each round's runs beside each other.
        pairs = zip(runs["gpulayer"], runs[NO_CGROUPS], strict=True)
        costs = [1 - a["jobs_per_s"] / b["jobs_per_s"] for a, b in pairs if a is not None and b is not None]
        summary["containment cost"] = {"fraction": median(costs), "rounds": len(costs)}
    return summary


def print_end_to_end(end_to_end: dict[str, dict[str, float] | None], jobs: int) -> None:
    rounds = next((int(run["rounds"]) for run in end_to_end.values() if run), 0)
    print(f"\nend to end: two workers already running, {jobs} submits in a loop, then a wait on each")
    print(f"(medians of {rounds} rounds; each ratio taken beside the peer's run of its own round)")
    print(f"{'':34} {'submit ms/job':>13} {'jobs/s':>8} {'vs Dramatiq':>11}")
    if end_to_end[PEER] is None:
        print("(Dramatiq not installed: pip install -r benchmarks/requirements.txt)")
    for name, run in end_to_end.items():
        if run is not None and "jobs_per_s" in run:
            ratio = f"{run['vs_dramatiq']:10.2f}x" if "vs_dramatiq" in run else ""
            print(f"{name:34} {run['submit_ms']:13.3f} {run['jobs_per_s']:8.0f} {ratio}")
    parts = ("worker", "jobs", "redis", "client", "machine")
    print(f"\n{'CPU per job (ms)':34} " + "".join(f"{part:>9}" for part in parts))
    for name, run in end_to_end.items():
        if run is not None and "cpu_ms_worker" in run:
            print(f"{name:34} " + "".join(f"{run['cpu_ms_' + part]:9.2f}" for part in parts))
    print("(workers: their processes; jobs: the `true` processes they reaped; machine: all cores' busy time)")
    cost = end_to_end.get("containment cost")
    if cost is not None:
        print(f"\na cgroup per job (containment auto vs none): {cost['fraction']:.1%} of the end to end rate")


def print_submits(submits: dict[str, float]) -> None:
    print("\nsubmit cost, no worker running (ms per job):")
    peer = submits.get("dramatiq send")
    for name, cost in submits.items():
        print(f"{name:34} {cost:8.3f}" + (f"   {cost / peer:5.2f}x Dramatiq's send" if peer else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--latency-runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="end-to-end runs of each system, in turn")
    parser.add_argument(
        "--end-to-end-only", action="store_true", help="only the end-to-end comparison; saves nothing"
    )
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with private_installation() as (url, home):
        end_to_end = end_to_end_rounds(url, home, args.jobs, args.rounds)
        submits = submit_costs(url, home, args.jobs)
        if args.end_to_end_only:
            print_end_to_end(end_to_end, args.jobs)
            print_submits(submits)
            return
        runs = {
            f"gpulayer, 2 workers x {cores} slots": gpulayer_throughput(url, home, args.jobs, 2, cores),
            "gpulayer, 2 workers x 1 slot": gpulayer_throughput(url, home, args.jobs, 2, 1),
            "rq Worker (fork), 2 workers": rq_throughput(url, args.jobs, 2, "rq.worker.Worker"),
            "rq SimpleWorker, 2 workers": rq_throughput(url, args.jobs, 2, "rq.worker.SimpleWorker"),
        }
        latency = {
            "gpulayer": gpulayer_latency(url, home, args.latency_runs),
            "rq Worker (fork)": rq_latency(url, args.latency_runs, "rq.worker.Worker"),
            "rq SimpleWorker": rq_latency(url, args.latency_runs, "rq.worker.SimpleWorker"),
        }
        delay = log_delay(url, home)
    fork = runs["rq Worker (fork), 2 workers"]["jobs_per_s"]
    simple = runs["rq SimpleWorker, 2 workers"]["jobs_per_s"]
    print(f"{args.jobs} jobs running `true`, two worker processes, {cores} CPUs, one Redis")
    print(f"{'':34} {'submit ms/job':>13} {'jobs/s':>8} {'vs RQ fork':>10} {'vs RQ simple':>12}")
    for name, run in runs.items():
        print(f"{name:34} {run['submit_ms']:13.3f} {run['jobs_per_s']:8.0f} "
              f"{run['jobs_per_s'] / fork:9.2f}x {run['jobs_per_s'] / simple:11.2f}x")  # fmt: skip
    print_end_to_end(end_to_end, args.jobs)
    print_submits(submits)
    print(f"\nsubmit -> start on an idle worker, {args.latency_runs} jobs one at a time:")
    for name, result in latency.items():
        print(f"{name:34} p50 {result['p50_ms']:6.2f} ms   p95 {result['p95_ms']:6.2f} ms")
    print(f"\nlog line printed -> received by logs --follow: p50 {delay['p50_ms']:.2f} ms,", end=" ")
    print(f"p99 {delay['p99_ms']:.2f} ms")
    path = save(
        "core_throughput",
        {
            "jobs": args.jobs,
            "end_to_end": end_to_end,
            "submit_ms": submits,
            "throughput": runs,
            "idle_latency": latency,
            "log_delay": delay,
        },
    )
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
