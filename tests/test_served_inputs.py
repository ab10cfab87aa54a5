"""Inputs over what Redis holds: served by their submitter, pulled by the worker through Redis a
window at a time, checked against the job's signature; a submitter gone fails the job in one line.

The clients here serve inputs over 1 MiB (GPULAYER_REDIS_OUTPUTS_MAX_BYTES); the inputs are a few MiB.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path

import redis

from gpulayer import Client, Job, JobState, Settings
from gpulayer.archive_server import WINDOW
from gpulayer.installation import Installation
from gpulayer.served_inputs import SERVING
from gpulayer.store.artifacts import INPUTS_ARCHIVE
from gpulayer.store.keys import Keys

from .conftest import WAIT, Workers, gpulayer

MiB = 1024 * 1024
#: A job printing the SHA-256 of its input ``model.bin``.
DIGEST = "import hashlib; print(hashlib.sha256(open('model.bin', 'rb').read()).hexdigest())"


def big_input(tmp_path: Path, size: int, seed: int = 1) -> tuple[Path, str]:
    random.seed(seed)
    data = random.randbytes(size)
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def printed(job: Job) -> list[str]:
    return [line.text for line in job.logs() if line.stream == "stdout"]


def serving_client(home: Path) -> Client:
    return Client(settings=Settings(home=home, redis_outputs_max_bytes=MiB))


def test_inputs_over_what_redis_holds_are_pulled_from_their_submitter_a_window_at_a_time(
    workers: Workers, raw_redis: redis.Redis, tmp_path: Path, home: Path
) -> None:
    path, digest = big_input(tmp_path, 5 * MiB)
    keys = Keys("gpulayer")
    client = serving_client(home)
    try:
        job = client.submit(["python3", "-c", DIGEST], inputs=[path])
        assert job.serves_inputs()
        # Redis holds their record, no byte of them.
        assert raw_redis.hkeys(keys.inputs(job.id)) == [INPUTS_ARCHIVE.encode()]
        record = json.loads(raw_redis.hget(keys.inputs(job.id), INPUTS_ARCHIVE) or b"")
        assert record["chunks"] == 0
        assert record["held"].startswith("submitter-")
        most = {"chunks": 0}
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                for key in raw_redis.keys(f"{keys.prefix}:transfer:*"):
                    if not key.endswith(b":acks"):
                        most["chunks"] = max(most["chunks"], int(raw_redis.llen(key)))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        workers.start("w1", 1)
        job.serve_inputs(WAIT)
        sampling.set()
        sampler.join()
        ended = job.wait(WAIT)
        assert ended.state is JobState.SUCCEEDED, ended.reason
        assert printed(job) == [digest]
        assert 0 < most["chunks"] <= WINDOW
        # Served until the job ran, then the submitter's copy is gone.
        assert list((home / SERVING).iterdir()) == []
    finally:
        client.close()


def test_the_cli_submit_serves_until_a_worker_has_pulled_them_and_says_so(
    workers: Workers, env: dict[str, str], tmp_path: Path, client: Client
) -> None:
    path, digest = big_input(tmp_path, 2 * MiB, seed=2)
    workers.start("w1", 1)
    limited = {**env, "GPULAYER_REDIS_OUTPUTS_MAX_BYTES": "1MiB"}
    done = gpulayer(limited, "submit", "--input", str(path), "--", "python3", "-c", DIGEST)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert "until a worker has pulled them: keep this running" in done.stderr
    job = client.get(job_id)
    ended = job.wait(WAIT)
    assert ended.state is JobState.SUCCEEDED, ended.reason
    assert printed(job) == [digest]


def test_a_submitter_gone_before_a_worker_pulled_them_fails_the_job_in_one_line(
    workers: Workers, raw_redis: redis.Redis, tmp_path: Path, home: Path
) -> None:
    path, _ = big_input(tmp_path, 2 * MiB, seed=3)
    keys = Keys("gpulayer")
    client = serving_client(home)
    job = client.submit(["python3", "-c", DIGEST], inputs=[path])
    client.close()  # stops serving
    record = json.loads(raw_redis.hget(keys.inputs(job.id), INPUTS_ARCHIVE) or b"")
    # As if a minute had passed since its last word.
    raw_redis.set(keys.serving(record["held"]), "2026-12-04T10:00:00+00:00")
    workers.start("w1", 1)
    reader = Client(settings=Settings(home=home))
    try:
        ended = reader.get(job.id).wait(WAIT)
    finally:
        reader.close()
    assert ended.state is JobState.FAILED
    assert ended.reason == (
        f"cannot fetch the job's inputs: job {job.id}'s {INPUTS_ARCHIVE} is kept by its submitter, which is "
        "gone (not heard from since 2026-12-04 10:00:00 UTC): submit it again, and keep the submit "
        "running until the job runs"
    )


def test_a_digest_changed_in_the_record_is_refused_before_a_byte_comes(
    workers: Workers, raw_redis: redis.Redis, tmp_path: Path, home: Path, installation: Installation
) -> None:
    path, _ = big_input(tmp_path, 2 * MiB, seed=4)
    key = Keys("gpulayer").inputs
    client = serving_client(home)
    try:
        job = client.submit(["python3", "-c", DIGEST], inputs=[path])
        record = json.loads(raw_redis.hget(key(job.id), INPUTS_ARCHIVE) or b"")
        record["sha256"] = hashlib.sha256(b"other inputs").hexdigest()
        submitter = redis.Redis.from_url(installation.url("submitter"))
        submitter.hset(key(job.id), INPUTS_ARCHIVE, json.dumps(record))
        submitter.close()
        workers.start("w1", 1)
        ended = job.wait(WAIT)
    finally:
        client.close()
    assert ended.state is JobState.FAILED
    assert (ended.reason or "").startswith("refused: ")
    assert printed(job) == []
