"""The monitoring that ships in compose/: Prometheus's config checks with promtool, and every
expression of the Grafana dashboard answers from a real Prometheus scraping a real server.
(Prometheus and promtool are Debian's packages, which .ci/run installs.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpulayer import Client, JobState
from gpulayer.network import free_port
from gpulayer.service import Service

from .conftest import Workers, answers, wait_for

COMPOSE = Path(__file__).resolve().parents[1] / "compose"
FAKE_GPU = json.dumps([{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}])
#: What simulated GPUs do not report: these panels stay empty here.
NOT_SIMULATED = ("gpulayer_gpu_memory_used_bytes", "gpulayer_gpu_temperature_celsius")

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Prometheus is not installed (.ci/run installs Debian's prometheus)",
)


@needs_prometheus
def test_the_shipped_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    shutil.copy(COMPOSE / "prometheus.yml", tmp_path / "prometheus.yml")
    (tmp_path / "gpulayer-token").write_text("gl_example\n")  # where the stack mounts the token
    checked = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_prometheus
def test_every_dashboard_expression_answers_from_a_real_scrape(
    client: Client, workers: Workers, web_server: tuple[str, Client], tmp_path: Path
) -> None:
    address, web = web_server
    workers.start("w1", 2, "--fake-gpus", FAKE_GPU)
    token, _ = Service(web).create_token("prometheus", "metrics")
    config = (COMPOSE / "prometheus.yml").read_text().replace("server:8080", address)
    (tmp_path / "prometheus.yml").write_text(config.replace("scrape_interval: 10s", "scrape_interval: 1s"))
    (tmp_path / "gpulayer-token").write_text(token)
    port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        prometheus = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        query = _querier(f"http://127.0.0.1:{port}")
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/-/ready"), what="Prometheus")
        try:
            wait_for(lambda: query('up{job="gpulayer"} == 1'), what="a scrape of the server", timeout=30)
        except AssertionError:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=10) as answer:
                targets = json.load(answer)["data"]["activeTargets"]
            raise AssertionError(f"no scrape: {[t.get('lastError') for t in targets]}") from None
        # Jobs ending between scrapes: rates and quantiles have something to work on.
        for _ in range(4):
            jobs = client.submit_many([["true"]] * 3)
            assert all(r.state is JobState.SUCCEEDED for r in client.wait_all(jobs, timeout=30))
            time.sleep(1.2)
        time.sleep(2.5)  # two more scrapes after the last jobs
        wait_for(lambda: query("gpulayer_workers > 0"), what="the worker in a scrape", timeout=30)
        dashboard = json.loads((COMPOSE / "grafana" / "gpulayer-dashboard.json").read_text())
        expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
        empty = [expression for expression in expressions if not query(expression)]
        assert empty == [e for e in expressions if any(name in e for name in NOT_SIMULATED)], empty
        assert query("sum(gpulayer_queue_depth) + sum(gpulayer_gang_jobs_waiting)")[0]["value"][1] == "0"
        ended = query('sum(gpulayer_jobs_ended_total{state="succeeded"})')
        assert float(ended[0]["value"][1]) >= 12
    finally:
        prometheus.terminate()
        prometheus.wait(20)


def _querier(base: str) -> Any:
    def query(expression: str) -> list[Any]:
        url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=10) as answer:
            found = json.load(answer)
        assert found["status"] == "success", (expression, found)
        return list(found["data"]["result"])

    return query
