"""The Dramatiq side of the end-to-end benchmark: the same work as a GPUlayer command job, as a
Dramatiq actor with its result kept (so a caller can wait on it), on the Redis in
``BENCH_REDIS_URL``. Dramatiq is installed in the benchmark's environment only
(``pip install -r benchmarks/requirements.txt``), never as GPUlayer's dependency."""

import os
import subprocess

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
broker.add_middleware(Results(backend=RedisBackend(url=os.environ["BENCH_REDIS_URL"])))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0)
def run_command(*command: str) -> int:
    """Run a command in a subprocess, as a GPUlayer worker does, and return its exit code."""
    return subprocess.run(command, check=False).returncode


@dramatiq.actor(store_results=True, max_retries=0)
def noop(x: int) -> int:
    """The no-op of the remote-functions benchmark."""
    return x
