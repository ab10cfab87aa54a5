"""Where a worker's CPU goes for one short job: a sampled profile by part of the job's path.

One worker with two slots runs N command jobs of `true` (submitted with ``submit_many``, then
waited on; ``--single``: submitted one by one, each with its own signature to check), while py-spy
samples it (``--gil``: only what holds the interpreter, that is the worker's own CPU, not its
waits). Each sample counts for the first part, in the order below, that one of its frames belongs
to; the worker's CPU per job (from the kernel) is shared out by those counts:

* spawn: the job's process started (``posix_spawn``, else ``subprocess.Popen``; under the lock
  that orders spawns and the hunt for strays);
* end and next claim: ``finish.lua`` and the claim for the freed slot, one round trip;
* seal check: the job's Ed25519 signature checked (once per batch for ``submit_many``);
* supervisor: the selector loop that follows every job's output and exit;
* folders: the job's folder and checkpoint folder made and removed;
* strays: looking for processes the job left behind;
* claim loop: the worker's main loop (claims while idle, starts each claimed job);
* leases and telemetry: the heartbeat thread, the telemetry reporter;
* thread hand-offs: a job passed to its slot thread, a slot thread woken by the supervisor;
* the rest: everything else (threads handing work over, records, logging).

py-spy is installed in the benchmark's environment (``pip install -r benchmarks/requirements.txt``)
and needs to be allowed to read the worker's memory (ptrace).

    python benchmarks/worker_profile.py [--jobs 3000] [--single]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
from _common import gpulayer_worker, private_installation, save, spawn, stop

from gpulayer import Client, JobState, Settings

#: Each part, as the frames (function names py-spy reports) that make it up, first match wins.
PARTS = {
    "spawn": ("JobProcesses.spawn",),
    "end and next claim": ("ExecutionStore.finish",),
    "seal check": ("check_job",),
    "supervisor": ("Supervisor._turn",),
    "folders": ("_remove", "mkdir"),
    "strays": ("kill_strays",),
    "claim loop": ("dequeue_job_and_maintain_ttl",),
    "leases and telemetry": ("LeaseKeeper", "TelemetryReporter"),
    "thread hand-offs": ("ThreadPoolExecutor.submit", "Condition.notify", "Event.set", "Condition.wait"),
}


def _py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: pip install -r benchmarks/requirements.txt")
    return found


def sample(jobs: int, single: bool, folder: Path) -> tuple[Counter[str], float]:
    """The samples of each part, and the worker's CPU per job (ms)."""
    with private_installation() as (url, home):
        client = Client(url, settings=Settings(home=home))
        worker = spawn(gpulayer_worker(url, "profiled", 2), env={"GPULAYER_HOME": str(home)})
        while not client.workers():
            time.sleep(0.01)
        assert client.submit(["true"]).wait(60).state is JobState.SUCCEEDED  # warm: its first job
        raw = folder / "samples.txt"
        record = ["record", "--pid", str(worker.pid), "--gil", "--rate", "500", "--nonblocking"]
        spy = subprocess.Popen(
            [_py_spy(), *record, "--format", "raw", "--output", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
        meter = psutil.Process(worker.pid)
        before = sum(meter.cpu_times()[:2])
        handles = (
            [client.submit(["true"]) for _ in range(jobs)]
            if single
            else client.submit_many([["true"]] * jobs)
        )
        assert all(record.state is JobState.SUCCEEDED for record in client.wait_all(handles, timeout=600))
        cpu_ms = (sum(meter.cpu_times()[:2]) - before) / jobs * 1000
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        stop(worker)
        client.close()
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        part = next(
            (name for name, frames in PARTS.items() if any(frame in stack for frame in frames)), "the rest"
        )
        counts[part] += int(count)
    return counts, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--single", action="store_true", help="submit in a loop: a signature per job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        counts, cpu_ms = sample(args.jobs, args.single, Path(scratch))
    total = sum(counts.values())
    parts = {part: counts[part] / total * cpu_ms for part in [*PARTS, "the rest"]}
    how = "one by one" if args.single else "with submit_many"
    print(f"{args.jobs} jobs of `true` on one worker with 2 slots, submitted {how}")
    print(f"the worker's CPU: {cpu_ms:.2f} ms per job ({total} samples), by part:")
    for part, ms in parts.items():
        print(f"  {part:22} {ms:6.3f} ms  {ms / cpu_ms * 100:5.1f} %")
    result = {"jobs": args.jobs, "single": args.single, "worker_cpu_ms_per_job": cpu_ms, "parts_ms": parts}
    path = save("worker_profile_single" if args.single else "worker_profile", result)
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
