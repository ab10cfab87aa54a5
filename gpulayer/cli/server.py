"""`gpulayer up` and `gpulayer down`: the embedded Redis and a local worker, started and stopped."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import click

from .. import home as local
from ..client import Client
from ..errors import ServerError
from ..server import address_towards, free_port, shutdown_redis, start_redis, wait_ready
from ..settings import Settings
from ..signing import ensure_secret
from ..store.connection import redact
from .app import duration, redis_url_option

#: How long `up` waits for its worker to register, and for its web server to answer.
_WORKER_START = 20.0
#: The port `up` serves the HTTP API on, when it is free.
WEB_PORT = 8080
#: The token `up` makes (once) for the dashboard.
ADMIN_TOKEN = "admin"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command()
@redis_url_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Port of the embedded Redis (default: the last one used here, else a free one).",
)
@click.option(
    "--bind",
    help="Address the embedded Redis listens on (default 127.0.0.1; 0.0.0.0 lets other "
    "machines join; it always has a password).",
)
@click.option("--name", help="Name of the local worker (default: this host's name).")
@click.option(
    "--slots", type=click.IntRange(min=1), help="CPU slots of the local worker (default: CPU cores)."
)
@click.option(
    "--gpus", metavar="INDICES|none", help="GPUs the local worker offers: 0,1 or none (default: all)."
)
@click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    help=f"Port of the HTTP API on 127.0.0.1 (default {WEB_PORT}, or a free one if it is taken).",
)
def up(
    redis_url: str | None,
    port: int | None,
    bind: str | None,
    name: str | None,
    slots: int | None,
    gpus: str | None,
    web_port: int | None,
) -> None:
    """Start GPUlayer here: an embedded Redis (unless --redis-url is given), a local worker and the
    HTTP API, all in the background. Prints the `gpulayer join` line that adds another machine, and,
    the first time, an admin token."""
    settings = Settings.from_env(redis_url=redis_url)
    state = local.load(settings.home)
    if state and local.alive(state.worker_pid) and (not state.embedded or local.alive(state.redis_pid)):
        changes = any(option is not None for option in (redis_url, port, bind, name, slots, gpus, web_port))
        click.echo(
            "GPUlayer is already up here" + ("; run `gpulayer down` first to change it." if changes else ".")
        )
        _summary(state, settings.home)
        return
    if settings.redis_url:
        state = local.LocalState(redis_url=settings.redis_url, embedded=False)
    else:
        state = _start_embedded(settings.home, state, port, bind)
    local.save(settings.home, state)
    ensure_secret(settings.home)
    state.worker_name = name or socket.gethostname()
    state.worker_pid = _start_worker(settings.home, state.redis_url, state.worker_name, slots, gpus)
    local.save(settings.home, state)
    state.web_port = web_port or (WEB_PORT if _port_free(WEB_PORT) else free_port())
    state.web_pid = _start_web(settings.home, state.redis_url, state.web_port)
    local.save(settings.home, state)
    click.echo("GPUlayer is up.")
    _summary(state, settings.home)
    token = _admin_token(state.redis_url)
    if token:
        click.echo("An admin token for the API and dashboard (shown this once; `gpulayer token` makes more):")
        click.echo(f"  {token}")


@click.command()
@click.option(
    "--timeout",
    callback=duration,
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="How long running jobs get to finish before they are stopped and put back in their queues.",
)
def down(timeout: float) -> None:
    """Stop what `gpulayer up` started here: the local worker (letting running jobs finish), then the
    embedded Redis (its data stays for the next `up`)."""
    settings = Settings.from_env()
    state = local.load(settings.home)
    if state is None or not any(
        local.alive(pid) for pid in (state.worker_pid, state.redis_pid, state.web_pid)
    ):
        click.echo("GPUlayer is not running here.")
        return
    if state.web_pid and local.alive(state.web_pid):
        os.kill(state.web_pid, signal.SIGTERM)
        if not _wait_gone(state.web_pid, 10.0):
            _kill(state.web_pid)
        click.echo("web server stopped")
    if state.worker_pid and local.alive(state.worker_pid):
        _stop_worker(state.worker_pid, timeout)
        click.echo(f"worker {state.worker_name} stopped")
    if state.embedded and state.redis_pid and local.alive(state.redis_pid):
        shutdown_redis(state.redis_url)
        if not _wait_gone(state.redis_pid, 10.0):
            _kill(state.redis_pid)
        click.echo("embedded Redis stopped (data kept)")
    state.worker_pid = state.redis_pid = state.web_pid = None
    local.save(settings.home, state)


def _start_embedded(
    home: Path, previous: local.LocalState | None, port: int | None, bind: str | None
) -> local.LocalState:
    """Start the embedded Redis, or keep the one still running; the password and port persist across `up`s."""
    reuse = previous if previous and previous.embedded else None
    if reuse and local.alive(reuse.redis_pid):
        if port not in (None, reuse.port) or bind not in (None, reuse.bind):
            raise ServerError(
                f"the embedded Redis runs on {reuse.bind}:{reuse.port}; run `gpulayer down` to change it"
            )
        return reuse
    password = (_password(reuse.redis_url) if reuse else None) or secrets.token_urlsafe(24)
    port = port or (reuse.port if reuse else None) or free_port()
    bind = bind or (reuse.bind if reuse else "127.0.0.1")
    host = "127.0.0.1" if bind in ("0.0.0.0", "::", *_LOOPBACK) else bind
    url = f"redis://:{password}@{host}:{port}/0"
    process = start_redis(home / "redis", port, bind=bind, password=password, durable=True, detach=True)
    try:
        wait_ready(url, process)
    except ServerError as exc:
        raise ServerError(f"{exc}; see {home / 'redis' / 'redis.log'}") from None
    return local.LocalState(redis_url=url, embedded=True, port=port, bind=bind, redis_pid=process.pid)


def _password(url: str) -> str | None:
    return urlsplit(url).password


def _start_worker(home: Path, url: str, name: str, slots: int | None, gpus: str | None) -> int:
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "gpulayer", "worker", "start", "--name", name]
    if slots:
        command += ["--slots", str(slots)]
    if gpus:
        command += ["--gpus", gpus]
    with open(logs / "worker.log", "ab") as log_file:
        # The URL travels in the environment, not the command line, where `ps` would show its password.
        process = subprocess.Popen(
            command,
            env={**os.environ, "GPULAYER_REDIS_URL": url},
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = Client(url)
    deadline = time.monotonic() + _WORKER_START
    while not any(worker.name == name and worker.pid == process.pid for worker in client.workers()):
        if process.poll() is not None or time.monotonic() > deadline:
            _kill(process.pid)
            raise ServerError(f"the local worker did not start; see {logs / 'worker.log'}")
        time.sleep(0.05)
    client.close()
    return process.pid


def _start_web(home: Path, url: str, port: int) -> int:
    """`gpulayer server` on 127.0.0.1:``port`` in the background, once it answers."""
    logs = home / "logs"
    with open(logs / "web.log", "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "server", "--port", str(port)],
            env={**os.environ, "GPULAYER_REDIS_URL": url},
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + _WORKER_START
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            _kill(process.pid)
            raise ServerError(f"the web server did not start; see {logs / 'web.log'}")
        time.sleep(0.05)
    return process.pid


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _port_free(port: int) -> bool:
    return not _answers(port)


def _admin_token(url: str) -> str | None:
    """A new admin token, the first time (none named admin works); None after."""
    client = Client(url)
    try:
        if any(token.name == ADMIN_TOKEN for token in client.tokens()):
            return None
        token, _ = client.create_token(ADMIN_TOKEN, "admin")
        return token
    finally:
        client.close()


def _stop_worker(pid: int, timeout: float) -> None:
    os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, timeout):
        return
    click.echo(f"jobs still running after {timeout:g} s: stopping them and putting them back in their queues")
    os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, 15.0):
        _kill(pid)


def _wait_gone(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ended within ``timeout`` (a zombie counts as ended: init reaps it when it will)."""
    deadline = time.monotonic() + timeout
    while local.alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _summary(state: local.LocalState, home: Path) -> None:
    if state.embedded:
        click.echo(
            f"  Redis:   {redact(state.redis_url)}  (embedded; data in {home / 'redis'}, "
            "append-only file synced every second)"
        )
    else:
        click.echo(f"  Redis:   {redact(state.redis_url)}")
    click.echo(f"  Worker:  {state.worker_name} (pid {state.worker_pid}; log {home / 'logs' / 'worker.log'})")
    if state.web_port:
        click.echo(f"  API:     http://127.0.0.1:{state.web_port}/api/v1  (log {home / 'logs' / 'web.log'})")
        click.echo(f"  Web:     http://127.0.0.1:{state.web_port}/  (`gpulayer dashboard` opens it)")
    click.echo("")
    join_url = state.redis_url
    if state.embedded and state.bind in ("0.0.0.0", "::"):
        # The address on the default route: what other machines most likely reach this one at.
        join_url = join_url.replace("@127.0.0.1:", f"@{address_towards('10.255.255.255', 1)}:", 1)
    click.echo("To add another machine, run there:")
    click.echo(f"  gpulayer join {join_url} --secret {ensure_secret(home).decode()}")
    if state.embedded and state.bind in _LOOPBACK:
        click.echo(
            "  (this Redis listens on 127.0.0.1 only; run `gpulayer down && gpulayer up --bind 0.0.0.0` "
            "to accept other machines)"
        )
    click.echo("")
    click.echo("Try:  gpulayer submit --wait -- echo hello")
