"""Fixtures: a real redis-server for the session, real worker processes, a client and the CLI.

The session's Redis is the newest redis-server here (Debian's, where installed), with a Redis user
per shared role and a worker identity, as `gpulayer up` makes them: workers run as that identity,
the client and the CLI as a submitter, the web app as the web role, so every test also checks that no
role needs more than its Redis user may do. ``raw_redis`` (for assertions) is the admin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest
import redis
from click.testing import CliRunner, Result
from flask import Flask
from flask.testing import FlaskClient

from gpulayer import Client, Settings, builds
from gpulayer import access as accesses
from gpulayer import installation as installations
from gpulayer.cli import main
from gpulayer.installation import Installation
from gpulayer.models import IdentityRole, Role
from gpulayer.network import free_port
from gpulayer.options import SubmitKeywords
from gpulayer.server import redis_server_binary, redis_version, start_redis, wait_ready
from gpulayer.service import Service
from gpulayer.store import acl
from gpulayer.store.keys import Keys
from gpulayer.store.rq_names import point_rq_at
from gpulayer.store.scripts import load_library
from gpulayer.web import create_app

#: How long a test waits for a worker to register or a job to end before failing.
WAIT = 30.0

# A shell without job control starts its background commands with SIGINT ignored, and an ignored
# signal stays ignored across exec: the CLI processes the Ctrl-C tests interrupt would never see it.
# Handled here, it is back at its default in every process the tests start.
signal.signal(signal.SIGINT, signal.default_int_handler)


# Every Redis of the session, `gpulayer up`'s included, is the newest Redis here (Debian's, where
# installed), unless GPULAYER_REDIS_SERVER names another: `GPULAYER_REDIS_SERVER=$(which valkey-server)
# pytest` runs the whole suite on Valkey.
builds.pin_newest_redis()


def session_server() -> dict[str, str]:
    """The variable that pins the session's server, for an environment made without GPULAYER_*."""
    pinned = os.environ.get(builds.SERVER_VARIABLE)
    return {builds.SERVER_VARIABLE: pinned} if pinned else {}


@dataclasses.dataclass
class Hub:
    """A redis-server with the users of a new installation, and the identity every worker of the
    tests runs under (as the Compose stack's workers share one)."""

    installation: Installation
    process: subprocess.Popen[bytes]
    #: The access of the worker identity ``worker``, with the URL naming 127.0.0.1.
    worker: accesses.Access

    def worker_on(self, host: str) -> accesses.Access:
        """The worker's access as a machine that reaches Redis at ``host`` sees it."""
        return self.worker.with_url(self.worker.redis_url.replace("@127.0.0.1:", f"@{host}:"))

    def publish(self) -> None:
        """The registry, as the admin keeps it (a test's FLUSHALL empties it)."""
        publish(self.installation)


def start_hub(
    folder: Path, *, bind: str = "127.0.0.1", binary: str | None = None, durable: bool = False
) -> Hub:
    """A redis-server with the users and scripts of a new installation, as `gpulayer up` starts one;
    its URLs name 127.0.0.1 (:meth:`Hub.worker_on` names another of ``bind``)."""
    port = free_port()
    binary = binary or redis_server_binary()
    made, worker = Installation.generate("gpulayer", f"redis://127.0.0.1:{port}/0").enrol("worker", "worker")
    users = made.acl_file(redis_version(binary)[0])
    process = start_redis(folder, port, bind=bind, acl=users, durable=durable, binary=binary)
    wait_ready(made.url("admin"), process)
    admin = redis.Redis.from_url(made.url("admin"))
    load_library(admin, Keys(made.prefix))  # by the admin: the roles may only call the scripts
    admin.close()
    publish(made)
    return Hub(made, process, worker)


def publish(installation: Installation, url: str | None = None, prefix: str | None = None) -> None:
    """Its identities' records in its registry, as every admin command writes them (beside those a
    test added: :func:`enrol`); or in the registry of another Redis (``url``) or prefix, whose
    workers run under them."""
    connection = redis.Redis.from_url(url or installation.url("admin"))
    records = {name: kept.signed for name, kept in installation.valid().items()}
    connection.hset(Keys(prefix or installation.prefix).identities, mapping=records)  # type: ignore[arg-type]
    connection.close()


def enrol(
    installation: Installation, role: IdentityRole, name: str, expires_in: float | None = None
) -> accesses.Access:
    """A new identity on the installation's running Redis, as `gpulayer access add` makes one: its
    Redis user and its record in the registry (until the next test's FLUSHALL)."""
    made, access = installation.enrol(role, name, expires_in)
    keys = Keys(installation.prefix)
    kept = made.identities[name]
    connection = redis.Redis.from_url(installation.url("admin"))
    acl.apply(
        connection, keys, [acl.User(kept.identity.user, role, kept.password_hash)], disable_default=False
    )
    connection.hset(keys.identities, name, kept.signed)
    connection.close()
    return access


@contextlib.contextmanager
def running_hub(folder: Path) -> Iterator[Hub]:
    """:func:`start_hub`, killed at the end."""
    hub = start_hub(folder)
    try:
        yield hub
    finally:
        hub.process.kill()
        hub.process.wait(10)


@pytest.fixture(scope="session")
def session_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("redis")) as hub:
        yield hub


@pytest.fixture(scope="session")
def installation(session_hub: Hub) -> Installation:
    """The session's Redis's installation: its users, keys, passwords and worker identity."""
    return session_hub.installation


@pytest.fixture(scope="session")
def redis_server(installation: Installation) -> str:
    """The admin's URL of the session's Redis."""
    return installation.url("admin")


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """A fresh database for each test (the admin's URL): empty, so a test can assert that nothing was
    written. Its identity registry comes with the first worker started (:class:`Workers`)."""
    connection = redis.Redis.from_url(redis_server)
    connection.flushall()
    connection.close()
    return redis_server


@pytest.fixture
def rq_sees(installation: Installation) -> Iterator[None]:
    """RQ's own classes, in this process, on the installation's keys, as `gpulayer.rq_tools` points
    them for RQ's tools (rq info, rq-dashboard); as they were after the test."""
    undo = point_rq_at(Keys(installation.prefix).rq)
    yield
    undo()


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[redis.Redis]:
    """For assertions about what is in Redis; tests never change our keys through it."""
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


@pytest.fixture
def home(tmp_path: Path, session_hub: Hub, redis_url: str) -> Path:
    """This test's GPULAYER_HOME, holding the access of every shared role but the admin's, and the
    worker identity's (as a machine joined and connected to the installation would): the CLI acts as
    a submitter there."""
    folder = tmp_path / "home"
    for role in ("web", "submitter", "viewer"):
        accesses.save(folder, session_hub.installation.access(role))
    accesses.save(folder, session_hub.worker)
    return folder


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    """Environment for worker processes and CLI runs in this test: they find their role's access in
    the home."""
    inherited = {
        k: v for k, v in os.environ.items() if k not in ("GPULAYER_REDIS_URL", accesses.TOKEN_VARIABLE)
    }
    return {**inherited, "GPULAYER_HOME": str(home), "GPULAYER_KILL_GRACE_SECONDS": "2"}


@pytest.fixture
def admin_env(tmp_path: Path, session_hub: Hub, redis_url: str, env: dict[str, str]) -> dict[str, str]:
    """The installation's admin machine: where `gpulayer access` commands run."""
    home = tmp_path / "admin-home"
    installations.save(home, session_hub.installation)
    session_hub.installation.save_accesses(home)
    return {**env, "GPULAYER_HOME": str(home)}


@pytest.fixture
def client(home: Path) -> Iterator[Client]:
    """A submitter's client."""
    client = Client(settings=Settings(home=home))
    yield client
    client.close()


@pytest.fixture
def web_client(home: Path) -> Iterator[Client]:
    """The HTTP server's client: the web role, which alone (with the admin) reaches API tokens."""
    client = Client(settings=Settings(home=home), access=accesses.load(home, "web"))
    yield client
    client.close()


class Workers:
    """Starts `gpulayer worker start` processes and stops them at the end of the test. ``hub``: whose
    identity registry to publish first (a worker refuses to start under an identity not in it)."""

    def __init__(self, client: Client, env: dict[str, str], logs: Path, hub: Hub | None = None) -> None:
        self.client = client
        self.env = env
        self.logs = logs
        self.hub = hub
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str = "w1", slots: int = 2, *args: str, wait: bool = True, pass_fds: tuple[int, ...] = ()
    ) -> subprocess.Popen[bytes]:
        if self.hub is not None:
            self.hub.publish()
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
                pass_fds=pass_fds,
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
def workers(client: Client, env: dict[str, str], tmp_path: Path, session_hub: Hub) -> Iterator[Workers]:
    started = Workers(client, env, tmp_path / "worker-logs", session_hub)
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


def commands_run(raw_redis: redis.Redis) -> dict[str, int]:
    """How many times Redis has run each command so far, by name."""
    return {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in raw_redis.info("commandstats").items()
    }


def commands_since(raw_redis: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    """The commands run since ``before`` (:func:`commands_run`), but for INFO itself."""
    spent = {name: calls - before.get(name, 0) for name, calls in commands_run(raw_redis).items()}
    spent.pop("info", None)
    return {name: calls for name, calls in spent.items() if calls}


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


# --- `gpulayer up` ----------------------------------------------------------------------------------
def gpulayer(
    env: dict[str, str],
    *args: str,
    input: str | None = None,
    cwd: Path | None = None,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """``gpulayer ARGS`` as a process of its own (started through ``prefix``, e.g. ``setpriv ...``)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "gpulayer", *args],
        env=env,
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def up_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a machine with nothing of GPUlayer's yet; what `gpulayer up` starts there
    is stopped at the end."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "up-home")
    env.update(session_server())
    yield env
    gpulayer(env, "down", "--timeout", "5")
    state = tmp_path / "up-home" / "server.json"
    if state.exists():
        for key in ("redis_pid", "worker_pid", "web_pid"):
            pid = json.loads(state.read_text()).get(key)
            if pid:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()


# --- the web app -----------------------------------------------------------------------------------
@pytest.fixture
def app(web_client: Client) -> Flask:
    return create_app(web_client)


@pytest.fixture
def http(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def tokens(web_client: Client) -> dict[str, str]:
    """A working token of each role, by role."""
    roles: tuple[Role, ...] = ("admin", "submitter", "viewer", "metrics")
    return {role: Service(web_client).create_token(f"t-{role}", role)[0] for role in roles}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit_keywords() -> set[str]:
    """Every keyword Client.submit takes, read from its signature (a new one is covered as it comes):
    its parameters, and the options and requirements it takes as keywords of their own."""
    parameters = inspect.signature(Client.submit).parameters.values()
    named = {p.name for p in parameters if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}
    return named | SubmitKeywords.__optional_keys__


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


@pytest.fixture
def web_server(
    redis_url: str, installation: Installation, tmp_path: Path, env: dict[str, str]
) -> Iterator[tuple[str, Client]]:
    """`gpulayer server` in the web role, its address, and a client in the web role."""
    home = tmp_path / "server-home"
    accesses.save(home, installation.access("web"))
    server_env = {**env, "GPULAYER_HOME": str(home)}
    server_env.pop(accesses.TOKEN_VARIABLE, None)
    port = free_port()
    with open(tmp_path / "server.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "server", "--port", str(port)],
            env=server_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    client = Client(settings=Settings(home=home), access=accesses.load(home, "web"))
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/api/v1/openapi.json"), what="the server")
        yield f"127.0.0.1:{port}", client
    finally:
        process.terminate()
        process.wait(20)
        client.close()


def answers(url: str) -> bool:
    """Whether ``url`` answers an HTTP GET at all."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False
