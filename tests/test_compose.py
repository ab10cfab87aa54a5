"""The image and the Compose stack, for real: a Docker engine builds compose/Dockerfile, brings up
Redis, the server and two workers from compose/compose.yaml, a job submitted through the API from
this machine survives `docker kill` of its worker, and the stack goes down leaving no volume.

Docker Hub cannot be reached here, so the base image is made from Debian's own packages by
compose/base-image.sh and passed as BASE_IMAGE; Redis runs from that base (Debian's redis-server 7,
as its user redis, who owns /data as in the official image).
Skipped where no engine answers, unless GPULAYER_CONTAINER_TESTS=required (as .ci/run sets it)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gpulayer import tls
from gpulayer.access import Access
from gpulayer.network import free_port
from gpulayer.store.connection import connect

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose" / "compose.yaml"
BASE = "local/gpulayer-base:bookworm-redis-data"
IMAGE = "gpulayer:test"
#: Extra CA certificates of this machine (update-ca-certificates' input): builds need them to reach
#: the package index through this machine's proxy, as corporate ones do.
HOST_CAS = Path("/usr/local/share/ca-certificates")


def _engine() -> bool:
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


if not _engine():
    if os.environ.get("GPULAYER_CONTAINER_TESTS") == "required":
        raise RuntimeError(
            "GPULAYER_CONTAINER_TESTS=required, but no Docker engine (and docker-compose) answers"
        )
    pytest.skip("no Docker engine answers here", allow_module_level=True)


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _base_image() -> None:
    """The base image, made once per machine from Debian's packages, as docs/deploy.md makes it."""
    run(str(ROOT / "compose" / "base-image.sh"), BASE, timeout=1200)


def _build() -> None:
    """The image, from what .dockerignore lets through, with this machine's extra CAs added."""
    with tempfile.TemporaryDirectory() as scratch:
        context = Path(scratch)
        for name in ("pyproject.toml", "README.md", "LICENSE", ".dockerignore"):
            shutil.copy(ROOT / name, context / name)
        for folder in ("gpulayer", "web", "compose/ca-certificates"):
            shutil.copytree(ROOT / folder, context / folder, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "compose" / "Dockerfile", context / "compose" / "Dockerfile")
        for certificate in HOST_CAS.glob("*.crt"):
            shutil.copy(certificate, context / "compose" / "ca-certificates" / certificate.name)
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # no buildx here: the classic builder
        run("docker", "build", "-q", "-f", str(context / "compose" / "Dockerfile"),
            "--build-arg", f"BASE_IMAGE={BASE}", "-t", IMAGE, str(context), env=env)  # fmt: skip


class Stack:
    def __init__(self, project: str, env: dict[str, str], api: str) -> None:
        self.project = project
        self.env = env
        self.api = api
        self.token = ""

    def compose(self, *args: str) -> str:
        return run("docker-compose", "-p", self.project, "-f", str(COMPOSE), *args, env=self.env)

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def until(self, job_id: str, done: Any, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            record: dict[str, Any] = self.call("GET", f"/api/v1/jobs/{job_id}")
            if done(record):
                return record
            assert time.monotonic() < deadline, record
            time.sleep(0.2)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    _base_image()
    _build()
    project = f"gltest{secrets.token_hex(3)}"
    env = {
        **os.environ,
        "GPULAYER_IMAGE": IMAGE,
        "GPULAYER_REDIS_IMAGE": BASE,
        "GPULAYER_API_PORT": str(free_port()),
        "GPULAYER_REDIS_PORT": str(free_port()),
        # Short leases, so the job of a killed worker runs again within seconds.
        "GPULAYER_LEASE_TTL": "3",
        "GPULAYER_HEARTBEAT": "1",
    }
    made = Stack(project, env, f"http://127.0.0.1:{env['GPULAYER_API_PORT']}")
    try:
        made.compose("up", "-d", "--no-build", "--scale", "worker=2", "redis", "server", "worker")
        deadline = time.monotonic() + 60
        # The token once (its name is then taken), then the API: the server may listen after the
        # CLI in its container can already reach Redis.
        while not made.token:
            try:
                made.token = made.compose(
                    "exec",
                    "-T",
                    "server",
                    "gpulayer",
                    "token",
                    "create",
                    "--name",
                    "test",
                    "--role",
                    "submitter",
                ).strip()
            except AssertionError:
                assert time.monotonic() < deadline, "the stack's server container did not answer"
                time.sleep(0.5)
        while True:
            try:
                made.call("GET", "/api/v1/workers")
                break
            except OSError:
                assert time.monotonic() < deadline, "the stack's API did not answer"
                time.sleep(0.5)
        yield made
    finally:
        made.compose("down", "-v", "--remove-orphans")


def test_a_job_submitted_to_the_stack_survives_the_kill_of_its_worker(stack: Stack) -> None:
    deadline = time.monotonic() + 60
    while len(stack.call("GET", "/api/v1/workers")["workers"]) < 2:
        assert time.monotonic() < deadline, "two workers did not register"
        time.sleep(0.2)
    body = {"command": ["sh", "-c", "echo started on $(hostname); sleep 8; echo done"], "retries": 2}
    job_id = stack.call("POST", "/api/v1/jobs", body)["id"]
    running = stack.until(job_id, lambda record: record["state"] == "running")
    first = running["worker"]
    run("docker", "kill", first)  # a worker is named for its container's host name: the container's id
    ended = stack.until(job_id, lambda record: record["state"] in ("succeeded", "failed"))
    assert ended["state"] == "succeeded", ended
    assert ended["worker"] != first
    assert ended["attempt"] == 2
    lines = [line["text"] for line in stack.call("GET", f"/api/v1/jobs/{job_id}/logs")["lines"]]
    assert f"started on {ended['worker']}" in lines
    assert lines[-1] == "done"


def test_a_job_in_the_stack_reads_none_of_its_workers_credentials(stack: Stack) -> None:
    # The worker runs as root only to start jobs as gpulayer; its access (the Redis password of the
    # worker role) is in a folder only root enters, and the job's environment holds none of it.
    probe = (
        "cat /gpulayer/worker/access/worker.json; env | grep -o '^GPULAYER_[A-Z_]*' | sort | xargs; id -un"
    )
    job_id = stack.call("POST", "/api/v1/jobs", {"command": ["sh", "-c", probe], "retries": 0})["id"]
    ended = stack.until(job_id, lambda record: record["state"] in ("succeeded", "failed"))
    lines = [line["text"] for line in stack.call("GET", f"/api/v1/jobs/{job_id}/logs")["lines"]]
    assert any("Permission denied" in line for line in lines), lines
    assert not any("password" in line or "redis" in line for line in lines), lines
    assert lines[-1] == "gpulayer"
    # Only the job's own variables: its id, its attempt, its checkpoint folder.
    assert lines[-2] == "GPULAYER_ATTEMPT GPULAYER_CHECKPOINT_DIR GPULAYER_JOB_ID", lines
    assert ended["state"] == "succeeded"


def test_the_stacks_redis_speaks_only_tls_and_trusts_its_own_ca(stack: Stack, tmp_path: Path) -> None:
    # A worker identity of its own, as another machine gets one (`access add`, as docs/deploy.md runs
    # it), aimed at the port published here.
    token = stack.compose(
        "run", "--rm", "-T", "admin", "access", "add", "worker", "elsewhere", "--host", "127.0.0.1",
    ).split()[-1]  # fmt: skip
    worker = Access.from_token(token)
    port = int(stack.env["GPULAYER_REDIS_PORT"])
    url = worker.redis_url.replace(":6379", f":{port}")
    assert url.startswith("rediss://")
    assert connect(url, ca=worker.ca).ping()
    with pytest.raises(redis.exceptions.ConnectionError):  # plain TCP: nothing answers
        redis.Redis(port=port, socket_timeout=5).ping()
    other_ca = tls.ensure(tmp_path, ["localhost"]).ca.read_text()
    with pytest.raises(redis.exceptions.ConnectionError):  # a Redis of another CA is not trusted
        connect(url, ca=other_ca).ping()


def test_the_stacks_redis_runs_as_its_own_user_not_root(stack: Stack) -> None:
    uid = stack.compose("exec", "-T", "redis", "awk", "/^Uid:/ {print $2}", "/proc/1/status")
    assert uid.strip() not in ("", "0"), uid


def test_the_stack_goes_down_leaving_no_volume_and_its_profiles_are_valid(stack: Stack) -> None:
    # Every profile's services are a valid Compose file (Prometheus and Grafana only exist on Docker
    # Hub: they are checked, not run; tests/test_monitoring.py runs a real Prometheus).
    config = stack.compose("--profile", "monitoring", "--profile", "gpu", "config")
    assert "prometheus" in config
    assert "grafana" in config
    assert "driver: nvidia" in config
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        run("docker", "compose", "-f", str(COMPOSE), "config", "-q", env=stack.env)  # Compose v2 too
    stack.compose("down", "-v", "--remove-orphans")
    left = run("docker", "volume", "ls", "-q", "--filter", f"name={stack.project}").split()
    assert left == []
    assert run("docker", "ps", "-q", "--filter", f"name={stack.project}").split() == []
