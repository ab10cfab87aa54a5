"""Fixtures: a real redis-server for the session, real worker processes, a client and the CLI.

The session's Redis is the machine's redis-server when there is one (what most installations run),
else the embedded one GPUlayer ships; `test_embedded.py` exercises the embedded one either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis
from click.testing import CliRunner, Result
from flask import Flask
from flask.testing import FlaskClient

from gpulayer import Client, Settings
from gpulayer.cli import main
from gpulayer.models import Role
from gpulayer.server import free_port, redis_server_binary, start_redis, wait_ready
from gpulayer.web import create_app

#: How long a test waits for a worker to register or a job to end before failing.
WAIT = 30.0


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    binary = shutil.which("redis-server") or redis_server_binary()
    process = start_redis(tmp_path_factory.mktemp("redis"), port, durable=False, binary=binary)
    url = f"redis://127.0.0.1:{port}/0"
    wait_ready(url, process)
    yield url
    process.terminate()
    process.wait(10)


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """A fresh database for each test."""
    connection = redis.Redis.from_url(redis_server)
    connection.flushall()
    connection.close()
    return redis_server


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[redis.Redis]:
    """For assertions about what is in Redis; tests never change our keys through it."""
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def env(redis_url: str, home: Path) -> dict[str, str]:
    """Environment for worker processes and CLI runs in this test."""
    return {
        **os.environ,
        "GPULAYER_REDIS_URL": redis_url,
        "GPULAYER_HOME": str(home),
        "GPULAYER_KILL_GRACE_SECONDS": "2",
    }


@pytest.fixture
def client(redis_url: str, home: Path) -> Iterator[Client]:
    client = Client(redis_url, settings=Settings(home=home))
    yield client
    client.close()


class Workers:
    """Starts `gpulayer worker start` processes and stops them at the end of the test."""

    def __init__(self, client: Client, env: dict[str, str], logs: Path) -> None:
        self.client = client
        self.env = env
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str = "w1", slots: int = 2, *args: str, wait: bool = True
    ) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpulayer",
                    "worker",
                    "start",
                    "--name",
                    name,
                    "--slots",
                    str(slots),
                    *args,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.processes.append(process)
        if wait:
            self.wait_registered(name, process)
        return process

    def wait_registered(self, name: str, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + WAIT
        while not any(w.name == name and w.pid == process.pid for w in self.client.workers()):
            assert process.poll() is None, f"worker {name} exited: {self.log(name)}"
            assert time.monotonic() < deadline, f"worker {name} did not register: {self.log(name)}"
            time.sleep(0.02)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        """SIGTERM (finish running jobs), then again (stop them), then SIGKILL."""
        for grace in (2.0, 10.0, None):
            running = [process for process in self.processes if process.poll() is None]
            for process in running:
                if grace:
                    process.send_signal(signal.SIGTERM)
                else:
                    process.kill()
            for process in running:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(grace or 10.0)


@pytest.fixture
def workers(client: Client, env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    started = Workers(client, env, tmp_path / "worker-logs")
    yield started
    started.stop_all()


@pytest.fixture
def cli(env: dict[str, str]) -> Callable[..., Result]:
    """Run ``gpulayer ARGS`` in this process with the test's environment."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(main, list(args), env=env, input=input, catch_exceptions=False)

    return invoke


def wait_for(predicate: Callable[[], object], timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def kill_machine(pid: int) -> None:
    """SIGKILL a worker and every process under it, its jobs included, as when its machine dies: all
    frozen first, so the worker cannot see one of its jobs die and record it before it dies too."""
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        root.suspend()
        members = [root, *root.children(recursive=True)]
        for member in members[1:]:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.suspend()
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()


# --- the web app -----------------------------------------------------------------------------------
@pytest.fixture
def app(client: Client) -> Flask:
    return create_app(client)


@pytest.fixture
def http(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def tokens(client: Client) -> dict[str, str]:
    """A working token of each role, by role."""
    roles: tuple[Role, ...] = ("admin", "submitter", "viewer", "metrics")
    return {role: client.create_token(f"t-{role}", role)[0] for role in roles}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def served(app: Flask) -> Iterator[str]:
    """The app on a real server thread (websockets need one): its host:port."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    app.extensions["gpulayer.hub"].stop()
