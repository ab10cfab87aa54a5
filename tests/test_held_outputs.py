"""Outputs over what Redis holds: kept on their worker, pulled through Redis a window at a time,
resumed, checked chunk by chunk and whole; a worker gone is one line.

The workers here keep outputs over 1 MiB (GPULAYER_REDIS_OUTPUTS_MAX_BYTES); the jobs write a few MiB.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
import redis

from gpulayer import Client, JobState, OutputsUnavailable, Settings, UntrustedPayload
from gpulayer import access as accesses
from gpulayer.archive_server import WINDOW
from gpulayer.installation import Installation
from gpulayer.signing import ResultSigner, SigningKey, WorkerKey
from gpulayer.store.artifacts import OUTPUTS_ARCHIVE
from gpulayer.store.keys import Keys
from gpulayer.store.transfers import TransferStore
from gpulayer.transfer_seal import Ask, Opener, Sealer

from .conftest import WAIT, Workers, gpulayer

MiB = 1024 * 1024
#: A job writing ``size`` bytes of a seeded random stream as model.bin: what the test can make again.
WRITE = "import random; random.seed({seed}); open('model.bin', 'wb').write(random.randbytes({size}))"


def model(seed: int, size: int) -> bytes:
    random.seed(seed)
    return random.randbytes(size)


def held_job(client: Client, workers: Workers, size: int, seed: int = 1) -> str:
    """A job that wrote ``size`` bytes of output on a worker keeping what is over 1 MiB; its id."""
    workers.env["GPULAYER_REDIS_OUTPUTS_MAX_BYTES"] = "1MiB"
    workers.start("w1", 1)
    job = client.submit(["python3", "-c", WRITE.format(seed=seed, size=size)], outputs=["model.bin"])
    record = job.wait(WAIT)
    assert record.state is JobState.SUCCEEDED, record.reason
    assert record.outputs is not None
    assert record.outputs.held_by == "w1"
    assert (record.outputs.files, record.outputs.bytes) == (1, size)
    return job.id


def transfer_keys(raw_redis: redis.Redis) -> list[bytes]:
    return sorted(raw_redis.keys(f"{Keys('gpulayer').prefix}:transfer:*"))


def test_outputs_over_what_redis_holds_end_succeeded_and_come_back_byte_identical_a_window_at_a_time(
    client: Client, workers: Workers, raw_redis: redis.Redis, tmp_path: Path, home: Path
) -> None:
    job_id = held_job(client, workers, 6 * MiB)
    keys = Keys("gpulayer")
    # Redis holds their record, no byte of them.
    assert raw_redis.hkeys(keys.outputs(job_id)) == [OUTPUTS_ARCHIVE.encode()]
    most: dict[str, int] = {"chunks": 0, "bytes": 0}

    def sample(done: int, total: int) -> None:
        for key in transfer_keys(raw_redis):
            if not key.endswith(b":acks"):
                most["chunks"] = max(most["chunks"], int(raw_redis.llen(key)))
                most["bytes"] = max(most["bytes"], int(raw_redis.memory_usage(key) or 0))

    written = client.get(job_id).download_outputs(tmp_path / "out", progress=sample)
    assert written == [tmp_path / "out" / "model.bin"]
    assert (tmp_path / "out" / "model.bin").read_bytes() == model(1, 6 * MiB)
    assert 0 < most["chunks"] <= WINDOW
    assert most["bytes"] <= WINDOW * MiB + 64 * 1024  # Redis holds no more than the window
    # Nothing left behind: no transfer in Redis, no partial file in the client's home.
    assert transfer_keys(raw_redis) == []
    assert list((home / "downloads").iterdir()) == []
    done = gpulayer(workers.env, "status", job_id)
    assert "kept on worker w1" in done.stdout


def test_a_pull_stopped_midway_resumes_where_it_stopped(
    client: Client, workers: Workers, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    job_id = held_job(client, workers, 5 * MiB, seed=2)

    class Dropped(Exception):
        pass

    def drop(done: int, total: int) -> None:
        if done >= 2 * MiB:
            raise Dropped

    with pytest.raises(Dropped):
        client.get(job_id).download_outputs(tmp_path / "out", progress=drop)
    assert not (tmp_path / "out" / "model.bin").exists()
    client.get(job_id).download_outputs(tmp_path / "out")
    assert (tmp_path / "out" / "model.bin").read_bytes() == model(2, 5 * MiB)
    asked = raw_redis.xrange(Keys("gpulayer").transfers("w1"))
    offsets = [int(fields[b"offset"]) for _, fields in asked]
    assert offsets[0] == 0
    assert offsets[-1] >= 2 * MiB


def test_a_worker_gone_is_one_line_naming_it_and_since_when(
    client: Client, workers: Workers, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    job_id = held_job(client, workers, 2 * MiB)
    workers.stop_all()
    # As if a minute had passed since its last word.
    raw_redis.set(Keys("gpulayer").serving("w1"), "2026-12-04T10:00:00+00:00")
    done = gpulayer(workers.env, "outputs", job_id, "--dest", str(tmp_path / "out"))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"Error: job {job_id}'s outputs are kept on worker w1, which is gone (not heard from since "
        "2026-12-04 10:00:00 UTC): start it again to download them"
    )
    assert not (tmp_path / "out").exists()


def test_a_digest_changed_in_redis_is_refused_and_nothing_is_written(
    client: Client, workers: Workers, raw_redis: redis.Redis, installation: Installation, tmp_path: Path
) -> None:
    job_id = held_job(client, workers, 2 * MiB)
    key = Keys("gpulayer").outputs(job_id)
    meta = json.loads(raw_redis.hget(key, OUTPUTS_ARCHIVE) or b"")
    meta["sha256"] = hashlib.sha256(b"another archive").hexdigest()
    submitter = redis.Redis.from_url(installation.url("submitter"))
    submitter.hset(key, OUTPUTS_ARCHIVE, json.dumps(meta))
    with pytest.raises(UntrustedPayload, match="not signed by the worker that ran attempt 1"):
        client.get(job_id).download_outputs(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_chunk_changed_in_redis_is_refused_and_another_reader_of_redis_cannot_open_one(
    client: Client, workers: Workers, installation: Installation, tmp_path: Path, home: Path
) -> None:
    job_id = held_job(client, workers, 4 * MiB, seed=3)
    # Another submitter: it may read every key, and write them, but holds no key of this transfer.
    other = redis.Redis.from_url(installation.url("submitter"))
    plain = model(3, 4 * MiB)
    keys = Keys("gpulayer")
    seen: dict[str, object] = {}

    def intrude(done: int, total: int) -> None:
        if seen:
            return
        # The transfer's id, as anyone who reads the worker's requests learns it.
        [(_, asked)] = other.xrevrange(keys.transfers("w1"), count=1)
        key = keys.transfer(asked[b"id"].decode())
        chunk = other.lindex(key, 0)
        if chunk is None:
            return
        # Encrypted for the asker alone: not the archive's bytes, and no key of another's opens it.
        assert plain[:64] not in chunk
        stranger = Opener("0" * 32, job_id, OUTPUTS_ARCHIVE, 0)
        with pytest.raises(UntrustedPayload):
            stranger.open(1, chunk)
        seen["chunk"] = chunk
        other.lset(key, 0, bytes([chunk[0] ^ 1]) + chunk[1:])

    with pytest.raises(UntrustedPayload, match="was changed, dropped or sent by someone else"):
        client.get(job_id).download_outputs(tmp_path / "out", progress=intrude)
    assert seen
    assert not (tmp_path / "out").exists()
    assert list((home / "downloads").iterdir()) == []  # what came is not resumed from


def test_a_viewer_is_told_it_may_not_ask_a_worker(
    workers: Workers, home: Path, tmp_path: Path, client: Client
) -> None:
    job_id = held_job(client, workers, 2 * MiB)
    viewer = Client(settings=Settings(home=home), access=accesses.load(home, "viewer"))
    with pytest.raises(OutputsUnavailable, match="may not ask a worker for them"):
        viewer.get(job_id).download_outputs(tmp_path / "out")
    viewer.close()


# --- the seal alone, no Redis --------------------------------------------------------------------
def sealed(identity: str = "w") -> tuple[Opener, Sealer, WorkerKey]:
    key = SigningKey.generate()
    opener = Opener("a" * 32, "job", OUTPUTS_ARCHIVE, 0)
    return opener, Sealer(opener.ask, ResultSigner(identity, key)), WorkerKey(identity, key.public)


def test_a_hello_made_for_another_ask_or_by_another_identity_is_refused() -> None:
    opener, sealer, key = sealed()
    another_ask = Ask("b" * 32, "job", OUTPUTS_ARCHIVE, 0, opener.ask.key)
    other = Sealer(another_ask, ResultSigner("w", SigningKey.generate()))
    with pytest.raises(UntrustedPayload):
        opener.hello(other.hello(10), key)
    _, stranger, _ = sealed("x")
    with pytest.raises(UntrustedPayload, match="not by 'w'"):
        opener.hello(stranger.hello(10), key)
    assert opener.hello(sealer.hello(10), key).size == 10


def test_chunks_out_of_order_or_replayed_are_refused() -> None:
    opener, sealer, key = sealed()
    opener.hello(sealer.hello(2), key)
    first, second = sealer.seal(0, b"a"), sealer.seal(1, b"b")
    assert opener.open(0, first) == b"a"
    with pytest.raises(UntrustedPayload):
        opener.open(1, first)
    assert opener.open(1, second) == b"b"


def test_the_transfer_store_reads_back_what_it_sends(raw_redis: redis.Redis) -> None:
    store = TransferStore(raw_redis, Keys("gpulayer"))
    store.send("c" * 32, b"x")
    assert store.receive("c" * 32, 0.1) == b"x"
    store.ack("c" * 32, 1)
    store.ack("c" * 32, 3)
    assert store.acked("c" * 32, 0.1) == 3
    assert store.receive("c" * 32, 0.1) is None
