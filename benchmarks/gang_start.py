"""Gang start: from submit until every rank of a 2 x 2 job is running, each rank recording when it
started, beside torchrun started by hand in the same run.

* GPUlayer, ``--launcher direct``: two idle workers on this machine act as the two nodes; each
  starts its two ranks itself, with torchrun's environment.
* GPUlayer, ``--launcher torchrun``: the same workers; each starts torchrun (static rendezvous),
  which starts its two ranks.
* Floors, started by hand in this process: ``torchrun --nnodes 1 --nproc-per-node 4``, and four
  plain processes (what the direct launcher does, without a queue).

Every rank is the same small Python program that writes the time it started into a file named for
its rank; a trial's time is the last rank's start minus the submit (or the launch).

    python benchmarks/gang_start.py [--trials 10]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import gpulayer_worker, median, percentile, private_installation, registered, save, spawn, stop

from gpulayer import Client, JobState, Settings

RANK = (
    "import os, time; t = time.time(); "
    "open(os.path.join(os.environ['GANG_DIR'], os.environ['RANK']), 'w').write(repr(t))"
)
WORLD = 4


def last_start(folder: Path) -> float:
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < WORLD:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(list(folder.iterdir()))} of {WORLD} ranks started")
        time.sleep(0.005)
    time.sleep(0.01)  # the last file's write
    return max(float(path.read_text()) for path in folder.iterdir())


def gpulayer_trial(client: Client, launcher: str, folder: Path) -> float:
    """Submit a 2 x 2 job; seconds until its last rank started."""
    begun = time.time()
    job = client.submit(
        [sys.executable, "-c", RANK],
        nodes=2,
        procs_per_node=2,
        launcher=launcher,  # type: ignore[arg-type]
        env={"GANG_DIR": str(folder)},
    )
    record = job.wait(120)
    if record.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"{launcher} job {job.id} {record.state.value}: {record.reason}")
    return last_start(folder) - begun


def by_hand(command: list[str], folder: Path, processes: int) -> float:
    env = {**os.environ, "GANG_DIR": str(folder)}
    begun = time.time()
    started = [
        subprocess.Popen(
            command, env={**env, "RANK": str(rank)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for rank in range(processes)
    ]
    for process in started:
        process.wait(120)
    return last_start(folder) - begun


def torchrun_by_hand(folder: Path) -> float:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={WORLD}",
               "--no-python", sys.executable, "-c", RANK]  # fmt: skip
    return by_hand(command, folder, 1)


def trials(count: int, run: Callable[[Path], float]) -> list[float]:
    times = []
    for _ in range(count):
        with tempfile.TemporaryDirectory() as tmp:
            times.append(run(Path(tmp)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with private_installation() as (url, home):
        client = Client(url, settings=Settings(home=home))
        env = {"GPULAYER_HOME": str(home)}
        nodes = [spawn(gpulayer_worker(url, name, 2), env) for name in ("node-a", "node-b")]
        try:
            registered(client, 2)
            for launcher in ("direct", "torchrun"):
                gpulayer_trial(client, launcher, Path(tempfile.mkdtemp()))  # warm up
                results[f"gpulayer_{launcher}"] = trials(
                    args.trials, functools.partial(gpulayer_trial, client, launcher)
                )
        finally:
            for node in nodes:
                stop(node)
    results["processes_by_hand"] = trials(
        args.trials, lambda f: by_hand([sys.executable, "-c", RANK], f, WORLD)
    )
    results["torchrun_by_hand"] = trials(args.trials, torchrun_by_hand)
    summary = {
        name: {"p50_s": median(times), "p90_s": percentile(times, 0.9)} for name, times in results.items()
    }
    ratios = {
        "direct_over_processes_by_hand": summary["gpulayer_direct"]["p50_s"]
        / summary["processes_by_hand"]["p50_s"],
        "direct_over_torchrun_by_hand": summary["gpulayer_direct"]["p50_s"]
        / summary["torchrun_by_hand"]["p50_s"],
        "torchrun_launcher_over_torchrun_by_hand": summary["gpulayer_torchrun"]["p50_s"]
        / summary["torchrun_by_hand"]["p50_s"],
    }
    beyond = {
        "direct_beyond_processes_by_hand_s": summary["gpulayer_direct"]["p50_s"]
        - summary["processes_by_hand"]["p50_s"],
        "torchrun_launcher_beyond_torchrun_by_hand_s": summary["gpulayer_torchrun"]["p50_s"]
        - summary["torchrun_by_hand"]["p50_s"],
    }
    for name, row in summary.items():
        print(f"{name:<22} p50 {row['p50_s'] * 1000:8.1f} ms   p90 {row['p90_s'] * 1000:8.1f} ms")
    for name, value in {**ratios, **beyond}.items():
        print(f"{name:<42} {value:.3f}")
    path = save("gang_start", {"trials": args.trials, "world": "2 nodes x 2 ranks", "summary": summary,
                               "ratios": ratios, "beyond": beyond, "raw": results})  # fmt: skip
    print(
        json.dumps(
            {"saved": str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else path.name}
        )
    )


if __name__ == "__main__":
    main()
