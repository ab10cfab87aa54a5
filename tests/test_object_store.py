"""Files over what Redis holds go to an S3-compatible store when one is configured: the submitter
uploads the inputs and presigns every URL, workers use plain HTTP with those URLs alone.

The store is moto's standalone server (a real S3 endpoint over HTTP), started here on a free port.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gpulayer import Client, JobState, OutputsUnavailable, Settings, UntrustedPayload
from gpulayer.store.artifacts import INPUTS_ARCHIVE, OUTPUTS_ARCHIVE
from gpulayer.store.keys import Keys

from .conftest import WAIT, Workers

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

MiB = 1024 * 1024
BUCKET = "gpulayer-jobs"
#: A job copying its input model.bin to its output copy.bin, and printing its SHA-256.
COPY = (
    "import hashlib, shutil; shutil.copy('model.bin', 'copy.bin'); "
    "print(hashlib.sha256(open('copy.bin', 'rb').read()).hexdigest())"
)


@pytest.fixture
def store(workers: Workers, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3 server of its own, with the bucket; its endpoint. The submitter's credentials are in
    this process's environment only, set after the workers' was made: they get none."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def s3(endpoint: str) -> object:
    return boto3.client("s3", endpoint_url=endpoint)


def storing_client(home: Path, endpoint: str) -> Client:
    return Client(
        settings=Settings(home=home, redis_outputs_max_bytes=MiB, s3_bucket=BUCKET, s3_endpoint_url=endpoint)
    )


def big_input(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    random.seed(7)
    data = random.randbytes(size)
    (tmp_path / "model.bin").write_bytes(data)
    return tmp_path / "model.bin", data


def stored_job(
    home: Path, endpoint: str, workers: Workers, tmp_path: Path, raw_redis: redis.Redis
) -> tuple[Client, str, bytes]:
    path, data = big_input(tmp_path, 3 * MiB)
    workers.env["GPULAYER_REDIS_OUTPUTS_MAX_BYTES"] = "1MiB"
    workers.start("w1", 1)
    client = storing_client(home, endpoint)
    job = client.submit(["python3", "-c", COPY], inputs=[path], outputs=["copy.bin"])
    assert not job.serves_inputs()
    keys = Keys("gpulayer")
    record = json.loads(raw_redis.hget(keys.inputs(job.id), INPUTS_ARCHIVE) or b"")
    assert record["held"] == ""
    assert record["url"].startswith(endpoint)
    ended = job.wait(WAIT)
    assert ended.state is JobState.SUCCEEDED, ended.reason
    assert [line.text for line in job.logs() if line.stream == "stdout"] == [hashlib.sha256(data).hexdigest()]
    assert ended.outputs is not None
    assert ended.outputs.held_by is None  # in the store, not on the worker
    return client, job.id, data


def test_big_inputs_and_outputs_go_through_the_store_and_workers_hold_no_credentials(
    store: str, workers: Workers, tmp_path: Path, home: Path, raw_redis: redis.Redis
) -> None:
    assert "AWS_SECRET_ACCESS_KEY" not in workers.env  # the workers' environment: no credentials
    client, job_id, data = stored_job(home, store, workers, tmp_path, raw_redis)
    try:
        names = sorted(o["Key"] for o in s3(store).list_objects_v2(Bucket=BUCKET)["Contents"])  # type: ignore[attr-defined]
        assert names == [f"gpulayer/{job_id}/{INPUTS_ARCHIVE}", f"gpulayer/{job_id}/{OUTPUTS_ARCHIVE}"]
        # Redis holds records, no byte of the files; the worker keeps no copy.
        outputs = json.loads(raw_redis.hget(Keys("gpulayer").outputs(job_id), OUTPUTS_ARCHIVE) or b"")
        assert outputs["chunks"] == 0
        assert outputs["url"].startswith(store)
        assert not any((home / "held" / "w1").iterdir())
        written = client.get(job_id).download_outputs(tmp_path / "out")
        assert written == [tmp_path / "out" / "copy.bin"]
        assert (tmp_path / "out" / "copy.bin").read_bytes() == data
    finally:
        client.close()


def test_an_object_changed_in_the_store_is_refused_and_one_gone_is_one_line(
    store: str, workers: Workers, tmp_path: Path, home: Path, raw_redis: redis.Redis
) -> None:
    client, job_id, _ = stored_job(home, store, workers, tmp_path, raw_redis)
    key = f"gpulayer/{job_id}/{OUTPUTS_ARCHIVE}"
    try:
        s3(store).put_object(Bucket=BUCKET, Key=key, Body=b"another archive")  # type: ignore[attr-defined]
        with pytest.raises(UntrustedPayload, match="not the one that was signed"):
            client.get(job_id).download_outputs(tmp_path / "out")
        assert not (tmp_path / "out").exists()
        s3(store).delete_object(Bucket=BUCKET, Key=key)  # type: ignore[attr-defined]
        with pytest.raises(OutputsUnavailable, match="the object store did not send it: HTTP 404"):
            client.get(job_id).download_outputs(tmp_path / "out")
    finally:
        client.close()
