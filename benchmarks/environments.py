"""Jobs that bring their own Python environment: cold and warm, beside ``uv run --with``.

On a private Redis, with GPUlayer workers on this machine (each job's latency is from submit to its
end, as its client sees it):

* plain: ``python -c pass``, a job without an environment, in the worker's own Python;
* cold: the first job of a new spec (``--pip PKG``), a package uv's cache has never seen: the
  worker runs ``uv venv`` and ``uv pip install``; uv's own resolve and install are the floor;
* warm: the next jobs of that spec (``python3 -c 'import PKG'``): the environment is found;
* concurrent: 20 first jobs of another new spec submitted at once to two workers of 10 slots
  each: the worker logs must say it was built exactly once (and found 19 times);
* beside it, on the same machine in the same run: ``uv run --no-project --with PKG python3 -c
  'import PKG'``, cold (a package new to uv's cache) and warm (the same again).

Offline by default: each package is a wheel written by hand into a temporary folder, and uv
(the workers', and ``uv run``) is pointed at it (``UV_FIND_LINKS``) and at no index. Prints the
figures and ratios and saves benchmarks/results/environments.json.

    python benchmarks/environments.py [--warm 20] [--cold 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import uv
from _common import gpulayer_worker, median, percentile, private_installation, registered, save, spawn, stop

from gpulayer import Client, Job, JobState, Settings

#: Concurrent first jobs of one spec.
CONCURRENT = 20


def wheel(folder: Path, name: str) -> str:
    """A pure-Python wheel of package ``name`` in ``folder``; its requirement, pinned."""
    dist = f"{name}-1.0"
    info = "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as made:
        made.writestr(f"{name}/__init__.py", "VALUE = 1\n")
        made.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        made.writestr(f"{dist}.dist-info/WHEEL", info)
        made.writestr(f"{dist}.dist-info/RECORD", "")
    return f"{name}==1.0"


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def ended(job: Job) -> None:
    record = job.wait(600)
    if record.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"job {job.id} {record.state.value}: {record.reason}")


def said(job: Job) -> list[str]:
    """``built`` or ``found``, as the worker wrote it in the job's log."""
    return [
        line.text.split()[3]
        for line in job.logs()
        if line.stream == "system" and line.text.startswith("Python environment ")
    ]


def uv_run(spec: str, name: str, env: dict[str, str]) -> float:
    command = [
        uv.find_uv_bin(),
        "run",
        "--quiet",
        "--no-project",
        "--with",
        spec,
        "python3",
        "-c",
        f"import {name}",
    ]
    return timed(lambda: subprocess.run(command, env=env, check=True, cwd=tempfile.gettempdir()))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm", type=int, default=20, help="warm jobs (and plain ones)")
    parser.add_argument("--cold", type=int, default=3, help="cold first jobs, each of a new package")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_installation() as (url, home):
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        uv_env = {
            "UV_FIND_LINKS": str(wheels),
            "UV_NO_INDEX": "1",
            "UV_OFFLINE": "1",
            "UV_CACHE_DIR": str(Path(tmp) / "uv-cache"),
            "NO_COLOR": "1",
        }
        env = {"GPULAYER_HOME": str(home), "GPULAYER_ENV_CACHE": str(Path(tmp) / "envs"), **uv_env}
        client = Client(url, settings=Settings(home=home))
        workers = [spawn(gpulayer_worker(url, name, 10), env) for name in ("env-a", "env-b")]
        try:
            registered(client, 2)
            results = measure(client, wheels, args.warm, args.cold)
        finally:
            for worker in workers:
                stop(worker)
        runs = {**os.environ, **uv_env}
        results["uv_run_cold"] = [
            uv_run(wheel(wheels, f"uvcold{i}"), f"uvcold{i}", runs) for i in range(args.cold)
        ]
        hot = wheel(wheels, "uvwarm")
        results["uv_run_warm"] = [uv_run(hot, "uvwarm", runs) for _ in range(args.warm + 1)][1:]
    report(results, args)


def measure(client: Client, wheels: Path, warm: int, cold: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    # The worker's own Python (the base of every environment), by its path: a python3 found on this
    # machine's PATH may be a shim (pyenv's costs 80 ms a start) that no environment has.
    plain = [sys.executable, "-c", "pass"]
    ended(client.submit(plain))  # both workers' first job, warmed
    results["plain"] = [timed(lambda: ended(client.submit(plain))) for _ in range(warm)]
    results["cold"] = [one_job(client, wheels, f"glcold{trial}") for trial in range(cold)]
    spec = wheel(wheels, "glwarm")
    first = client.submit(["python3", "-c", "import glwarm"], pip=[spec])
    ended(first)
    results["warm"] = [
        timed(lambda: ended(client.submit(["python3", "-c", "import glwarm"], pip=[spec])))
        for _ in range(warm)
    ]
    spec = wheel(wheels, "glcrowd")
    started = time.perf_counter()
    jobs = client.submit_many([["python3", "-c", "import glcrowd"]] * CONCURRENT, pip=[spec])
    for job in jobs:
        ended(job)
    results["concurrent_first_20"] = [time.perf_counter() - started]
    words = sorted(word for job in jobs for word in said(job))
    if words != ["built"] + ["found"] * (CONCURRENT - 1):
        raise RuntimeError(f"{CONCURRENT} concurrent first jobs: the workers said {words}, not one build")
    workers = {job.status().worker for job in jobs}
    print(
        f"{CONCURRENT} concurrent first jobs on {len(workers)} workers: built once, "
        f"found {CONCURRENT - 1} times"
    )
    return results


def one_job(client: Client, wheels: Path, name: str) -> float:
    """A job of a new package's environment, from submit to its end."""
    spec = wheel(wheels, name)
    return timed(lambda: ended(client.submit(["python3", "-c", f"import {name}"], pip=[spec])))


def report(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    summary = {
        name: {"p50_s": median(times), "p90_s": percentile(times, 0.9)} for name, times in results.items()
    }
    p50 = {name: row["p50_s"] for name, row in summary.items()}
    ratios = {
        "cold_over_uv_run_cold": p50["cold"] / p50["uv_run_cold"],
        "warm_over_uv_run_warm": p50["warm"] / p50["uv_run_warm"],
        "warm_over_plain": p50["warm"] / p50["plain"],
    }
    beyond = {"warm_beyond_plain_ms": (p50["warm"] - p50["plain"]) * 1000, "target_ms": 50.0}
    for name, row in summary.items():
        print(f"{name:<22} p50 {row['p50_s'] * 1000:8.1f} ms   p90 {row['p90_s'] * 1000:8.1f} ms")
    for name, value in {**ratios, **beyond}.items():
        print(f"{name:<28} {value:.3f}")
    path = save(
        "environments",
        {
            "warm_trials": args.warm,
            "cold_trials": args.cold,
            "workers": "2 x 10 slots, this machine",
            "summary": summary,
            "ratios": ratios,
            "beyond": beyond,
            "raw": results,
        },
    )
    print(f"saved {path.name}")


if __name__ == "__main__":
    main()
