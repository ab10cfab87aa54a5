"""What a script call costs on Redis 7: FCALL of the installation's function library (the roles may
run no other Lua) against EVALSHA of the same script (as GPUlayer called them before, and still does
on Redis 6.2, which has no functions).

In one run, on a private Redis 7, ``--jobs`` short jobs go through the script calls each job makes:
its submit, then its claim and its end, the end and the next claim in one round trip as a worker
sends them. Each way in turn, ``--rounds`` rounds, the median kept:

* the caller's time per job for its three calls (round trips, signing and the client's work
  included), µs; and the jobs per second that makes through one client and one worker loop;
* Redis's own CPU per call (INFO commandstats: FCALL's or EVALSHA's usec_per_call, the script's
  commands included): what a busy hub spends;
* the peer: RQ's ``Queue.enqueue`` of a job on the same Redis, in the same run.

    python benchmarks/script_calls.py [--jobs 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import redis
from _common import flush, median, private_installation, save
from rq import Queue

from gpulayer import Client, JobState, Settings
from gpulayer.store.execution import ClaimRequest, QueueOffer


def lifecycle_us(url: str, home: object, jobs: int, functions: bool) -> tuple[float, float]:
    """µs of the caller's time per job (submit, claim, end), and Redis's µs per script call."""
    client = Client(url, settings=Settings(home=home))  # type: ignore[arg-type]
    scripts = client.stores.scripts
    scripts._functions = functions  # EVALSHA: as on a Redis without functions (6.2)
    store = client.stores.execution("bench")
    request = ClaimRequest([QueueOffer(client.keys.queue_name(), 0, 1, 0)], 1, 2, 2**30, 60_000)
    client.submit(["true"])  # the queue registered, the library or scripts loaded: not timed
    admin = redis.Redis.from_url(url)
    admin.config_resetstat()
    started = time.perf_counter()
    for _ in range(jobs):
        client.submit(["true"])
    [claim], _ = store.claim(request)
    for _ in range(jobs):
        _, following = store.finish(
            claim, JobState.SUCCEEDED, exit_code=0, reason=None, outputs=None, seconds=0.0, then=request
        )
        assert following is not None
        claims, _ = following
        if claims:
            [claim] = claims
    spent = (time.perf_counter() - started) / jobs * 1e6
    stats = admin.info("commandstats")[f"cmdstat_{'fcall' if functions else 'evalsha'}"]
    client.close()
    admin.close()
    return spent, stats["usec"] / stats["calls"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"fcall": [], "evalsha": []}
    enqueue: list[float] = []
    with private_installation() as (url, home):
        for _ in range(options.rounds):
            for way, found in runs.items():
                flush(url)
                found.append(lifecycle_us(url, home, options.jobs, way == "fcall"))
            flush(url)
            queue = Queue("bench", connection=redis.Redis.from_url(url))
            started = time.perf_counter()
            for _ in range(options.jobs):
                queue.enqueue("rq_tasks.run_command", "true")
            enqueue.append((time.perf_counter() - started) / options.jobs * 1e6)
    job = {way: median([run[0] for run in found]) for way, found in runs.items()}
    call = {way: median([run[1] for run in found]) for way, found in runs.items()}
    result = {
        "jobs": options.jobs,
        "rounds": options.rounds,
        "per_job_us": job,
        "jobs_per_s": {way: 1e6 / us for way, us in job.items()},
        "redis_us_per_call": call,
        "rq_enqueue_us": median(enqueue),
        "fcall_over_evalsha": {
            "per_job": job["fcall"] / job["evalsha"],
            "redis": call["fcall"] / call["evalsha"],
        },
        "runs": runs,
    }
    for way in runs:
        print(
            f"{way.upper():8} {job[way]:7.1f} µs per job (submit, claim, end; {1e6 / job[way]:6.0f} jobs/s), "
            f"Redis {call[way]:5.1f} µs per call"
        )
    print(f"RQ enqueue (same run): {median(enqueue):7.1f} µs per job")
    print(
        f"FCALL / EVALSHA: {job['fcall'] / job['evalsha']:.2f}x per job, "
        f"{call['fcall'] / call['evalsha']:.2f}x of Redis's CPU per call"
    )
    print(f"saved {save('script_calls', result)}")


if __name__ == "__main__":
    main()
