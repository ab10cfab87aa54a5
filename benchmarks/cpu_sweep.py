"""A CPU sweep: 50 calls of a BLAS-heavy function with ``.map`` on two local workers, beside the same
calls in a plain loop in this process.

Each call fits one configuration of a ridge regression on a fixed random problem (a Gram matrix and a
linear solve: about 0.1-0.3 s of BLAS on one core), as a scikit-learn hyperparameter sweep does. Both
workers run on this machine with one slot per core, as the other benchmarks' do, so the machine runs
twice as many calls at once as it has cores. In the same rounds, the sweep runs again as it did before
jobs got thread variables: each call lets BLAS use every core (set inside the call with threadpoolctl;
a benchmark's switch, not a setting), so the calls running at once start a thread per core each.
The plain loop runs twice, as a user would (BLAS on every core) and on one thread, a reference
that a busy machine does not slow as much. Times are the median of ``--repeats`` rounds, the runs
taking turns in each.

    python benchmarks/cpu_sweep.py [--calls 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy
from _common import flush, gpulayer_worker, median, private_installation, save, spawn, stop
from threadpoolctl import threadpool_limits

import gpulayer as gl
from gpulayer import Client, Settings

#: Rows and columns of the problem's matrix.
SIZE = 1200


def fit(alpha: float) -> float:
    """One configuration of the sweep: the training error of a ridge regression with ``alpha``."""
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((SIZE, SIZE))
    y = rng.standard_normal((SIZE, 20))
    weights = numpy.linalg.solve(x.T @ x + alpha * numpy.eye(SIZE), x.T @ y)
    return float(numpy.square(x @ weights - y).mean())


def fit_on_every_core(alpha: float) -> float:
    """:func:`fit` with BLAS on every core of the machine: what each call did before (benchmark only)."""
    with threadpool_limits(os.cpu_count() or 1):
        return fit(alpha)


def one_thread(run: Callable[[], list[float]]) -> list[float]:
    with threadpool_limits(1):
        return run()


def seconds_of(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def timed(rounds: int, runs: dict[str, Callable[[], list[float]]]) -> dict[str, float]:
    """The median seconds of each run over ``rounds``, the runs taking turns in each round; each
    run's values must be the plain loop's."""
    expected: list[float] | None = None
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            values = run()
            times[name].append(time.perf_counter() - started)
            expected = expected or values
            assert numpy.allclose(values, expected), name
    return {name: median(taken) for name, taken in times.items()}


def sweep(url: str, home: Path, calls: int, repeats: int) -> dict[str, float]:
    flush(url)
    client = Client(url, settings=Settings(home=home))
    cores = os.cpu_count() or 1
    env = {"GPULAYER_HOME": str(home)}
    workers = [spawn(gpulayer_worker(url, f"w{n}", cores), env=env) for n in range(2)]
    while len(client.workers()) < 2:
        time.sleep(0.01)
    remote, every_core = gl.remote(fit, client=client), gl.remote(fit_on_every_core, client=client)
    alphas = [0.1 * (n + 1) for n in range(calls)]
    # Warm every slot's executor (and its numpy), as any session past its first calls has them.
    list(remote.map(alphas[: 4 * cores]))
    seconds = timed(
        repeats,
        {
            "local loop": lambda: [fit(alpha) for alpha in alphas],
            "local loop, BLAS on one thread": lambda: one_thread(lambda: [fit(alpha) for alpha in alphas]),
            "gpulayer .map": lambda: list(remote.map(alphas)),
            "gpulayer .map, BLAS on every core (before)": lambda: list(every_core.map(alphas)),
        },
    )
    for worker in workers:
        stop(worker)
    client.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with threadpool_limits(1):
        one_call = min(seconds_of(lambda: fit(1.0)) for _ in range(3))
    with private_installation() as (url, home):
        seconds = sweep(url, home, args.calls, args.repeats)
    local = seconds["local loop"]
    print(f"{args.calls} calls of a {SIZE}x{SIZE} ridge fit ({one_call:.2f} s each on one core), "
          f"{os.cpu_count()} CPUs; two workers x one slot per core")  # fmt: skip
    for name, taken in seconds.items():
        print(f"{name:44} {taken:7.2f} s  {local / taken:5.2f}x the local loop's speed")
    path = save(
        "cpu_sweep",
        {
            "calls": args.calls,
            "size": SIZE,
            "repeats": args.repeats,
            "one_call_single_thread_s": one_call,
            "seconds": seconds,
            "speed_vs_local_loop": {name: local / taken for name, taken in seconds.items()},
        },
    )
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
