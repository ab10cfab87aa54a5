"""Recovery: from a worker's SIGKILL (with its jobs, as when its machine dies) until its job runs
again on another worker, beside plain RQ's abandoned-job handling, in the same run.

GPUlayer: a worker runs a long job, a second worker idles; the first is killed with everything
under it; measured until the job's next attempt starts on the second (its ``started_at``). With
the default lease (15 s, renewed every 5 s) and with a short one (3 s, every 1 s).

Plain RQ, with its defaults: the same with two `rq worker`s (the forking `Worker`) and the job
enqueued with `Retry(max=1)` (without it RQ never runs an abandoned job again; it fails it). RQ
notices only when a surviving worker's maintenance (every 10 minutes, between blocking pops of
up to 405 s) cleans the started registry after the job's 90 s heartbeat TTL: expect many minutes
per trial, so it runs fewer trials.

    python benchmarks/recovery.py [--trials 20] [--rq-trials 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil
import redis
from _common import RESULTS, flush, median, percentile, private_redis, python, save, spawn
from rq import Queue, Retry

from gpulayer import Client, JobState, Settings


def kill_machine(pid: int) -> float:
    root = psutil.Process(pid)
    members = [*root.children(recursive=True), root]
    killed_at = time.time()
    for member in members:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            continue
    return killed_at


def gpulayer_trials(url: str, home: Path, trials: int, lease: float, beat: float) -> list[float]:
    flush(url)
    client = Client(url, settings=Settings(home=home))
    counter = iter(range(10**6))

    def start() -> tuple[str, psutil.Process]:
        name = f"w{next(counter)}"
        options = [
            "--slots",
            "1",
            "--lease-ttl",
            str(lease),
            "--heartbeat",
            str(beat),
            "--log-level",
            "WARNING",
        ]
        command = [
            python(),
            "-m",
            "gpulayer",
            "worker",
            "start",
            "--redis-url",
            url,
            "--name",
            name,
            *options,
        ]
        process = spawn(command, env={"GPULAYER_HOME": str(home)})
        while not any(worker.name == name and worker.pid == process.pid for worker in client.workers()):
            time.sleep(0.02)
        return name, psutil.Process(process.pid)

    fleet = dict([start(), start()])
    times = []
    for trial in range(trials):
        job = client.submit(["sleep", "600"], retries=1)
        while (record := job.status()).state is not JobState.RUNNING:
            time.sleep(0.01)
        victim = record.worker
        assert victim is not None
        killed_at = kill_machine(fleet.pop(victim).pid)
        while (record := job.status()).attempt < 2 or record.state is not JobState.RUNNING:
            time.sleep(0.01)
        assert record.started_at is not None
        times.append(record.started_at.timestamp() - killed_at)
        job.cancel()
        job.wait(30)
        fleet.update([start()])
        print(f"gpulayer, lease {lease:g} s: trial {trial + 1}: {times[-1]:.2f} s", flush=True)
    for process in fleet.values():
        kill_machine(process.pid)
    client.close()
    return times


def rq_trials(url: str, trials: int, timeout: float) -> list[float | None]:
    flush(url)
    connection = redis.Redis.from_url(url)
    queue = Queue("recovery", connection=connection)
    worker = [python(), "-m", "rq.cli", "worker", "--url", url, "--logging_level", "WARNING", "recovery"]
    times: list[float | None] = []
    for trial in range(trials):
        fleet = [spawn(worker), spawn(worker)]
        time.sleep(3)  # both are up and blocking on the queue
        job = queue.enqueue("rq_tasks.run_command", "sleep", "3600", retry=Retry(max=1), job_timeout=-1)
        while job.get_status(refresh=True) != "started":
            time.sleep(0.05)
        first, pid = _rq_worker_running(connection, job.id)
        killed_at = kill_machine(pid)
        rerun = None
        while time.time() < killed_at + timeout:
            job.refresh()
            if job.get_status() == "started" and job.worker_name != first and job.started_at:
                rerun = job.started_at.timestamp() - killed_at
                break
            time.sleep(0.5)
        times.append(rerun)
        said = f"{rerun:.1f} s" if rerun else f"not rerun within {timeout:g} s"
        print(f"rq: trial {trial + 1}: {said}", flush=True)
        for process in fleet:
            if process.poll() is None:
                kill_machine(process.pid)
    connection.close()
    return times


def _rq_worker_running(connection: redis.Redis, job_id: str) -> tuple[str, int]:
    """The name and pid of the RQ worker whose hash says it runs ``job_id``."""
    while True:
        for key in connection.smembers("rq:workers"):
            if connection.hget(key, "current_job") == job_id.encode():
                return key.decode().removeprefix("rq:worker:"), int(connection.hget(key, "pid") or 0)
        time.sleep(0.05)


def record(name: str, result: dict[str, float]) -> None:
    """Merge one result into results/recovery.json, read afresh: two runs may save in turn."""
    saved = RESULTS / "recovery.json"
    results = json.loads(saved.read_text()).get("results", {}) if saved.exists() else {}
    results[name] = result
    save("recovery", {"results": results})


def summary(times: list[float]) -> dict[str, float]:
    return {"p50_s": median(times), "p95_s": percentile(times, 0.95), "trials": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rq-trials", type=int, default=1)
    parser.add_argument("--rq-timeout", type=float, default=1500)
    args = parser.parse_args()
    # Each side is saved as soon as it is measured, merged into what is saved already: RQ's side
    # takes many minutes a trial, so the two can run apart (--trials 0, or --rq-trials 0).
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp)) as url:
        home = Path(tmp) / "home"
        if args.trials:
            record(
                "gpulayer, lease 15 s (default)", summary(gpulayer_trials(url, home, args.trials, 15.0, 5.0))
            )
            record("gpulayer, lease 3 s", summary(gpulayer_trials(url, home, args.trials, 3.0, 1.0)))
        if args.rq_trials:
            rq = rq_trials(url, args.rq_trials, args.rq_timeout)
            reran = [t for t in rq if t is not None]
            nan = {"p50_s": float("nan"), "p95_s": float("nan"), "trials": float(len(rq))}
            record(
                "rq Worker, defaults, Retry(max=1)",
                {**(summary(reran) if reran else nan), "not_rerun": len(rq) - len(reran)},
            )
    results = json.loads((RESULTS / "recovery.json").read_text())["results"]
    print("\nfrom SIGKILL of a worker until its job runs again on another:")
    for name, result in results.items():
        print(f"{name:36} p50 {result['p50_s']:7.2f} s   p95 {result['p95_s']:7.2f} s", end="   ")
        print(f"({result['trials']:g} trials)")
    ours, theirs = (
        results.get("gpulayer, lease 15 s (default)"),
        results.get("rq Worker, defaults, Retry(max=1)"),
    )
    if ours and theirs and theirs["p50_s"] == theirs["p50_s"]:
        print(f"\nratio, RQ / GPUlayer default (p50): {theirs['p50_s'] / ours['p50_s']:.1f}x")


if __name__ == "__main__":
    main()
