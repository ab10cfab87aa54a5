"""Where a worker's CPU goes for one short job: each part of a job's path, timed by the CPU clock of
the thread that runs it.

One worker with two slots runs N command jobs of `true` (submitted with ``submit_many``, then waited
on; ``--single``: submitted one by one, each with its own signature to check). The worker runs as
``benchmarks/_timed_worker.py``: the functions of each part count the CPU time their thread spends in
them (``time.thread_time``), less their timed callees'; waits (a lock, the GIL, Redis, the child's
exec) count nothing. A sampling profiler counts them: py-spy, which this used before, put a slot
waiting for the lock that ordered spawns among the worker's busiest lines. The parts:

* seal check: the job's Ed25519 signature checked (once per batch for ``submit_many``);
* job record and runner: the claim's record read and a runner made for it;
* folders: the job's folder and its checkpoint folder made and taken away;
* spawn: the job's process started (``posix_spawn``, else ``subprocess.Popen``);
* following its processes: their output and exit, by the slot for their first moments, then by the
  worker's supervisor thread (its own thread's time is in "other threads");
* reap and strays: the exit status collected, and processes the job left behind looked for;
* checkpoint folder: kept while the job runs, and once more at its end;
* end and next claim: ``finish.lua`` and the claim for the freed slot, one round trip;
* the rest of the slot: everything else a slot thread does (the runner's own steps);
* other threads: the worker's CPU outside its slots (its main loop, pub/sub listener, heartbeats,
  telemetry, supervisor).

The timing itself costs two clock reads per timed call (a system call each): its total is the
worker's CPU with the timing, so it reads a little above an untimed worker's.

    python benchmarks/worker_profile.py [--jobs 3000] [--single]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil
from _common import HERE, gpulayer_worker, private_installation, python, save, spawn, stop

from gpulayer import Client, JobState, Settings


def measure(jobs: int, single: bool, folder: Path) -> tuple[dict[str, float], float]:
    """Each part's CPU per job (ms), and the worker's whole CPU per job (ms)."""
    totals = folder / "parts.json"
    with private_installation() as (url, home):
        client = Client(url, settings=Settings(home=home))
        command = gpulayer_worker(url, "profiled", 2)
        worker = spawn(
            [python(), str(HERE / "_timed_worker.py"), str(totals), *command[3:]],
            env={"GPULAYER_HOME": str(home)},
        )
        while not client.workers():
            time.sleep(0.01)
        assert client.submit(["true"]).wait(60).state is JobState.SUCCEEDED  # warm: its first job
        meter = psutil.Process(worker.pid)
        before = sum(meter.cpu_times()[:2])
        commands = [["true"]] * jobs
        handles = [client.submit(command) for command in commands] if single else client.submit_many(commands)
        assert all(record.state is JobState.SUCCEEDED for record in client.wait_all(handles, timeout=600))
        cpu_ms = (sum(meter.cpu_times()[:2]) - before) / jobs * 1000
        stop(worker)
        client.close()
    timed = json.loads(totals.read_text())
    parts = {part: seconds / (jobs + 1) * 1000 for part, (seconds, _) in timed.items()}  # +1: the warm job
    parts["other threads"] = max(cpu_ms - sum(parts.values()), 0.0)
    return parts, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--single", action="store_true", help="submit in a loop: a signature per job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        parts, cpu_ms = measure(args.jobs, args.single, Path(scratch))
    how = "one by one" if args.single else "with submit_many"
    print(f"{args.jobs} jobs of `true` on one worker with 2 slots, submitted {how}")
    print(f"the worker's CPU: {cpu_ms:.3f} ms per job (timed), by part:")
    for part, ms in sorted(parts.items(), key=lambda item: -item[1]):
        print(f"  {part:26} {ms:6.3f} ms  {ms / cpu_ms * 100:5.1f} %")
    result = {"jobs": args.jobs, "single": args.single, "worker_cpu_ms_per_job": cpu_ms, "parts_ms": parts}
    path = save("worker_profile_single" if args.single else "worker_profile", result)
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
