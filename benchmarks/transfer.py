"""How fast outputs a worker keeps come through Redis, and how much of Redis they take meanwhile.

One archive of ``--size`` random bytes (256 MiB by default: 1 GiB takes a minute a way on two shared
cores; ``--size 1GiB`` for the issue's figure) is kept in a worker-held folder and served by the
worker's own :class:`OutputServer`, in a process of its own, to a client's :class:`Pull` (sealed
chunks, a window of 4 in flight, each acked), on a private Redis. Beside it, on the same machine:

* ``cat``: the same file through ``cat | cat > /dev/null`` (a pipe: the most the machine moves);
* ``redis-py``: the same 1 MiB chunks SET then GET then DEL one at a time with redis-py (Redis's own
  cost per chunk, no sealing, no flow control).

Each reports MB/s (10^6 bytes per second); the pull also reports the Redis memory high-water mark
above what Redis held before (``INFO memory``'s ``used_memory``, sampled every 5 ms; the issue's
target: at most 16 MiB).

Then each way through real jobs, on a private installation with a GPUlayer worker on this machine
(each rate is the file's size over what a job with it took beyond the same job without it):

* inputs served by their submitter: ``submit --input`` of the file, pulled by the worker through
  Redis before the job runs (the Redis high-water mark again);
* the S3 path, against moto's standalone server (the only S3 server installable here), when moto
  and boto3 are: the same input, which the client puts in the store and the worker reads there; and
  an output of that size, which the worker puts there and the client reads back.

    python benchmarks/transfer.py [--size 256MiB] [--no-jobs]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from _common import gpulayer_worker, private_installation, private_redis, registered, save, spawn, stop

from gpulayer import Client, Job, JobState, Settings
from gpulayer.pulls import Pull
from gpulayer.signing import ResultSigner, SigningKey, WorkerKey, seal_archive
from gpulayer.store.artifacts import OUTPUTS_ARCHIVE, HeldArchive
from gpulayer.store.stores import Stores
from gpulayer.transfer_seal import CHUNK
from gpulayer.units import parse_size
from gpulayer.worker.files import Held
from gpulayer.worker.serving import OutputServer

JOB = "benchjob0001"
WORKER = "bench"
MB = 1e6


def serve(url: str, home: str, key: str) -> None:
    """The worker's side, in this process until it is killed."""
    settings = Settings(home=home)
    stores = Stores.open(redis.Redis.from_url(url), settings)
    signer = ResultSigner(WORKER, SigningKey.from_text(key))
    server = OutputServer(stores, Held.of(settings, WORKER), signer, settings)
    server.start()
    threading.Event().wait()


def make_archive(held: Held, size: int) -> tuple[Path, str]:
    path, keep = held.outputs.writing(JOB, OUTPUTS_ARCHIVE)
    digest = hashlib.sha256()
    with open(path, "wb") as file:
        for start in range(0, size, 1 << 24):
            block = os.urandom(min(1 << 24, size - start))
            digest.update(block)
            file.write(block)
    return keep(), digest.hexdigest()


class MemoryWatch:
    """Redis's ``used_memory`` high-water mark above where it started, sampled in a thread."""

    def __init__(self, connection: redis.Redis) -> None:
        self._redis = connection
        self.base = self.peak = int(connection.info("memory")["used_memory"])
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, int(self._redis.info("memory")["used_memory"]))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak - self.base


def pull_through_redis(url: str, home: Path, path: Path, sha256: str, key: SigningKey) -> tuple[float, int]:
    settings = Settings(home=home)
    connection = redis.Redis.from_url(url)
    stores = Stores.open(connection, settings)
    connection.hset(stores.keys.job(JOB), "status", "finished")  # the server keeps what a job still has
    size = path.stat().st_size
    seal = seal_archive(ResultSigner(WORKER, key), JOB, 1, OUTPUTS_ARCHIVE, sha256)
    held = HeldArchive(WORKER, size, sha256, seal)
    partial = home / "pulled.part"
    while stores.transfers.last_served(WORKER) is None:
        time.sleep(0.05)
    watch = MemoryWatch(redis.Redis.from_url(url))
    started = time.perf_counter()
    Pull(stores.transfers, WorkerKey(WORKER, key.public), JOB, OUTPUTS_ARCHIVE, held, partial).run()
    seconds = time.perf_counter() - started
    high = watch.stop()
    assert partial.stat().st_size == size
    partial.unlink()
    return size / seconds / MB, high


def cat_pipe(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["sh", "-c", f"cat '{path}' | cat > /dev/null"], check=True)
    return path.stat().st_size / (time.perf_counter() - started) / MB


def redis_py_chunks(url: str, path: Path) -> float:
    connection = redis.Redis.from_url(url)
    started = time.perf_counter()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            connection.set("bench:chunk", chunk)
            assert connection.get("bench:chunk") == chunk
            connection.delete("bench:chunk")
    return path.stat().st_size / (time.perf_counter() - started) / MB


def ended(job: Job) -> None:
    record = job.wait(600)
    if record.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"job {job.id} {record.state.value}: {record.reason}")


def timed_job(client: Client, command: list[str], **options: object) -> float:
    """Seconds from a submit to the job's end (its outputs downloaded, where it has any)."""
    started = time.perf_counter()
    job = client.submit(command, **options)  # type: ignore[arg-type]
    ended(job)
    if options.get("outputs"):
        with tempfile.TemporaryDirectory() as dest:
            job.download_outputs(dest)
    return time.perf_counter() - started


def through_jobs(path: Path, size: int) -> dict[str, object]:
    """Each way through real jobs: served inputs, and the S3 path where moto and boto3 are installed."""
    found: dict[str, object] = {}
    with private_installation() as (url, home):
        env = {"GPULAYER_HOME": str(home)}
        worker = spawn(gpulayer_worker(url, "bench", 2), env)
        client = Client(url, settings=Settings(home=home))
        try:
            registered(client, 1)
            bare = min(timed_job(client, ["true"]) for _ in range(3))
            watch = MemoryWatch(redis.Redis.from_url(url))
            served = timed_job(client, ["true"], inputs=[path])
            found["served_inputs_mb_s"] = round(size / max(served - bare, 1e-6) / MB, 1)
            found["served_inputs_redis_high_water_bytes"] = watch.stop()
            found.update(through_s3(url, home, path, size, bare))
        finally:
            client.close()
            stop(worker)
    return found


def through_s3(url: str, home: Path, path: Path, size: int, bare: float) -> dict[str, object]:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return {"s3": "not measured: moto and boto3 are not installed (pip install 'moto[server]' boto3)"}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        client = Client(url, settings=Settings(home=home, s3_bucket="bench", s3_endpoint_url=endpoint))
        try:
            into = timed_job(client, ["true"], inputs=[path])
            made = f"head -c {size} /dev/urandom > out.bin"
            small = timed_job(client, ["sh", "-c", "head -c 1 /dev/urandom > out.bin"], outputs=["out.bin"])
            out = timed_job(client, ["sh", "-c", made], outputs=["out.bin"])
        finally:
            client.close()
    finally:
        server.stop()
    return {
        # Each through the store twice: put by one side, read by the other.
        "s3_inputs_mb_s": round(size / max(into - bare, 1e-6) / MB, 1),
        "s3_outputs_mb_s": round(size / max(out - small, 1e-6) / MB, 1),
        "s3_server": "moto's standalone server, in this process",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="256MiB", help="the archive's size (default 256MiB)")
    parser.add_argument("--no-jobs", action="store_true", help="only the pull and its baselines")
    parser.add_argument("--serve", nargs=3, metavar=("URL", "HOME", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    size = parse_size(args.size)
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp)) as url:
        home = Path(tmp) / "home"
        held = Held.of(Settings(home=home), WORKER)
        path, sha256 = make_archive(held, size)
        server = spawn([sys.executable, __file__, "--serve", url, str(home), key.text])
        try:
            pull_mbs, high = pull_through_redis(url, home, path, sha256, key)
        finally:
            server.kill()
            server.wait()
        cat_mbs = cat_pipe(path)
        redis_mbs = redis_py_chunks(url, path)
        each_way = {} if args.no_jobs else through_jobs(path, size)
    result = {
        "size_bytes": size,
        "chunk_bytes": CHUNK,
        "worker_held_pull_mb_s": round(pull_mbs, 1),
        "redis_high_water_bytes": high,
        "cat_pipe_mb_s": round(cat_mbs, 1),
        "redis_py_set_get_mb_s": round(redis_mbs, 1),
        **each_way,
    }
    print(f"worker-held pull:   {pull_mbs:8.1f} MB/s, Redis high-water +{high / 2**20:.1f} MiB")
    print(f"cat | cat:          {cat_mbs:8.1f} MB/s")
    print(f"redis-py SET/GET:   {redis_mbs:8.1f} MB/s")
    for name, value in each_way.items():
        print(f"{name}: {value}")
    print(f"saved {save('transfer', result)}")


if __name__ == "__main__":
    main()
