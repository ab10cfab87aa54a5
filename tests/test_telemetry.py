"""What the dashboard watches: workers' telemetry and the installation's activity, kept bounded in
Redis; the events websocket; the start-latency and run-time histograms. Real workers, real Redis;
the GPUs are simulated (GPULAYER_FAKE_GPUS): they report 100% while a job holds them."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient
from prometheus_client import CONTENT_TYPE_LATEST
from simple_websocket import Client as Client_
from simple_websocket import ConnectionClosed

from gpulayer import Client, JobState
from gpulayer.inventory import Telemetry
from gpulayer.service import Service
from gpulayer.store.keys import Keys
from gpulayer.store.telemetry import TelemetryStore
from tests.conftest import Workers, auth, wait_for

A100 = json.dumps([{"name": "NVIDIA A100", "memory_gb": 80}])


@pytest.fixture
def fast(workers: Workers) -> Workers:
    """Workers that sample every 0.2 s."""
    workers.env["GPULAYER_TELEMETRY_INTERVAL"] = "0.2"
    return workers


def gpu_use(client: Client, worker: str) -> float | None:
    samples = Service(client).telemetry(60).get(worker, [])
    return samples[-1].gpus[0].utilization if samples else None


def test_workers_sample_their_machine_and_gpus_and_viewers_read_an_hour_of_it(
    client: Client, fast: Workers, http: FlaskClient, tokens: dict[str, str]
) -> None:
    fast.start("w1", 1, "--fake-gpus", A100)
    job = client.submit(["sleep", "60"], gpus=1)
    wait_for(lambda: gpu_use(client, "w1") == 100.0, what="a sample with the GPU busy")
    job.cancel()
    wait_for(lambda: gpu_use(client, "w1") == 0.0, what="a sample with the GPU free again")
    latest = Service(client).telemetry()["w1"][-1]
    assert latest.gpus[0].simulated
    assert latest.gpus[0].memory_total == 80 * 2**30
    assert 0 < latest.memory_used <= latest.memory_total
    assert 0 <= latest.cpu_percent <= 100 * 256

    answer = http.get("/api/v1/telemetry?minutes=5", headers=auth(tokens["viewer"]))
    assert answer.status_code == 200
    assert answer.json is not None
    assert answer.json["interval"] == client.settings.telemetry_interval
    assert answer.json["workers"]["w1"][-1]["gpus"][0]["simulated"] is True
    assert http.get("/api/v1/telemetry?minutes=61", headers=auth(tokens["viewer"])).status_code == 400

    # One worker samples the installation each interval: the cancelled job shows in the activity.
    wait_for(
        lambda: any(s.jobs.get(JobState.CANCELLED) == 1 for s in Service(client).activity()),
        what="an activity sample with the cancelled job",
    )
    answer = http.get("/api/v1/activity", headers=auth(tokens["viewer"]))
    assert answer.json is not None
    assert answer.json["samples"][-1]["jobs"]["cancelled"] == 1
    assert set(answer.json["samples"][-1]["queues"]) == {job.status().queue}


def test_telemetry_streams_are_capped_at_an_hour_and_expire_with_their_worker(
    raw_redis: redis.Redis, client: Client
) -> None:
    store = TelemetryStore(raw_redis, Keys(client.keys.prefix), interval=36.0)  # an hour: 100 samples
    sample = Telemetry(time=0, cpu_percent=1, load=0, memory_used=1, memory_total=2)
    for _ in range(1000):
        store.record("gone", sample)
    key = client.keys.telemetry("gone")
    # Trimmed as Redis trims cheaply: to the cap, plus at most one node of entries.
    assert 100 <= raw_redis.xlen(key) <= 200
    assert 3500 < raw_redis.ttl(key) <= 3600  # type: ignore[operator]
    # Only connected workers are read.
    assert "gone" not in Service(client).telemetry()


def receive(ws: Any, until: Any, timeout: float = 30) -> list[dict[str, Any]]:
    """Events until one satisfies ``until`` (included)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = ws.receive(timeout=1)
        if message is not None:
            got.append(json.loads(message))
            if until(got[-1]):
                return got
    raise AssertionError(f"not seen in {timeout} s; got {got[-5:]}")


def test_the_events_socket_sends_job_states_workers_and_telemetry_and_closes_when_revoked(
    client: Client, web_client: Client, fast: Workers, served: str, tokens: dict[str, str]
) -> None:
    fast.start("w1", 1)
    ws = Client_.connect(f"ws://{served}/ws/events", headers=auth(tokens["viewer"]))
    sample = receive(ws, lambda e: e["type"] == "telemetry" and e["worker"] == "w1")[-1]
    assert Telemetry.model_validate(sample["sample"]).memory_total > 0
    w2 = fast.start("w2", 1)
    receive(ws, lambda e: e == {"type": "worker", "name": "w2", "event": "joined"})

    job = client.submit(["true"], name="evented")
    events = receive(ws, lambda e: e.get("id") == job.id and e["state"] == "succeeded")
    states = [e["state"] for e in events if e["type"] == "job" and e["id"] == job.id]
    assert states == ["queued", "scheduled", "running", "succeeded"]

    w2.send_signal(signal.SIGTERM)
    receive(ws, lambda e: e == {"type": "worker", "name": "w2", "event": "left"})

    Service(web_client).revoke_token("t-viewer")
    with pytest.raises(ConnectionClosed):
        receive(ws, lambda e: False, timeout=10)


def test_metrics_add_start_latency_and_run_time_histograms_and_gpu_use(
    client: Client, fast: Workers, http: FlaskClient, tokens: dict[str, str]
) -> None:
    fast.start("w1", 2, "--fake-gpus", A100)
    for _ in range(3):
        assert client.submit(["sleep", "0.2"]).wait(30).state is JobState.SUCCEEDED
    wait_for(lambda: Service(client).telemetry(60).get("w1"), what="a telemetry sample")

    answer = http.get("/metrics", headers=auth(tokens["metrics"]))
    # One charset: Prometheus 3 refuses the header Flask would otherwise make.
    assert answer.headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert answer.headers["Content-Type"].count("charset") == 1
    text = answer.get_data(as_text=True)
    lines = set(text.splitlines())
    assert 'gpulayer_jobs_ended_total{state="succeeded"} 3.0' in lines
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line[0] != "#"}
    assert "gpulayer_job_start_latency_seconds_count 3.0" in lines
    assert 'gpulayer_job_start_latency_seconds_bucket{le="+Inf"} 3.0' in lines
    assert "gpulayer_job_run_time_seconds_count 3.0" in lines
    # Each ran at least 0.2 s, and less than a minute.
    assert 'gpulayer_job_run_time_seconds_bucket{le="0.1"} 0.0' in lines
    assert 'gpulayer_job_run_time_seconds_bucket{le="60.0"} 3.0' in lines
    gpu = f'gpu="0",simulated="true",uuid="{client.workers()[0].gpus[0].uuid}",worker="w1"'
    assert values[f"gpulayer_gpu_utilization_percent{{{gpu}}}"] == 0
    assert values[f"gpulayer_gpu_memory_total_bytes{{{gpu}}}"] == 80 * 2**30
    assert any(line.startswith('gpulayer_worker_cpu_percent{worker="w1"}') for line in lines)

    # The Grafana dashboard in compose/ asks only for what /metrics serves.
    grafana = Path(__file__).resolve().parents[1] / "compose" / "grafana" / "gpulayer-dashboard.json"
    queries = [t["expr"] for panel in json.loads(grafana.read_text())["panels"] for t in panel["targets"]]
    asked = {name for query in queries for name in re.findall(r"gpulayer_\w+", query)}
    served = {line.split()[2] for line in lines if line.startswith("# HELP ")}
    assert len(asked) >= 10
    assert asked <= served | {f"{name}_{part}" for name in served for part in ("bucket", "count", "sum")}
    # rate() only of what only grows: a gauge's fall (jobs past their retention) reads as a reset.
    kinds = {line.split()[2]: line.split()[3] for line in lines if line.startswith("# TYPE ")}
    rated = {name for query in queries for name in re.findall(r"rate\((gpulayer_\w+)", query)}
    assert rated
    for name in rated:
        family = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert kinds.get(family, kinds.get(name)) in ("counter", "histogram"), name
