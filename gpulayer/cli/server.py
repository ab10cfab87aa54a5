"""`gpulayer up` and `gpulayer down`: the embedded Redis and a local worker, started and stopped."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from .. import access as accesses
from .. import builds, identities, sentinel, tls
from .. import home as local
from .. import installation as installations
from .. import local_processes as processes
from ..client import Client
from ..errors import ConfigError, ServerError
from ..installation import Installation
from ..network import address_towards, free_port
from ..server import (
    shutdown_redis,
    start_redis,
    supports_tls,
    wait_ready,
)
from ..service import Service
from ..settings import Settings
from .app import duration, invoked_as, redis_url_option

#: The port `up` serves the HTTP API on, when it is free.
WEB_PORT = 8080
#: The token `up` makes (once) for the dashboard.
ADMIN_TOKEN = "admin"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command()
@redis_url_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Port of the embedded Redis (default: the last one used here, else a free one).",
)
@click.option(
    "--bind",
    help="Address the embedded Redis listens on (default 127.0.0.1). Any other address lets other "
    "machines join, over TLS only, with a CA made for this installation.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="With --bind, plain TCP instead of TLS: passwords and jobs cross the network readable.",
)
@click.option("--name", help="Name of the local worker (default: this host's name).")
@click.option(
    "--slots", type=click.IntRange(min=1), help="CPU slots of the local worker (default: CPU cores)."
)
@click.option(
    "--gpus", metavar="INDICES|none", help="GPUs the local worker offers: 0,1 or none (default: all)."
)
@click.option(
    "--run-as", metavar="USER", help="Run the local worker's jobs as this user (see `worker start`)."
)
@click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    help=f"Port of the HTTP API on 127.0.0.1 (default {WEB_PORT}, or a free one if it is taken).",
)
@click.option(
    "--redis-server",
    envvar=builds.SERVER_VARIABLE,
    metavar="PATH",
    help="The redis-server or valkey-server to start as the embedded Redis (also read from "
    f"{builds.SERVER_VARIABLE}); refused if it cannot read the data there. Without it: the newest here "
    "that reads the data, of the family that wrote it if one does (docs/deploy.md#valkey).",
)
def up(
    redis_url: str | None,
    port: int | None,
    bind: str | None,
    insecure: bool,
    name: str | None,
    slots: int | None,
    gpus: str | None,
    run_as: str | None,
    web_port: int | None,
    redis_server: str | None,
) -> None:
    """Start GPUlayer here: an embedded Redis (unless --redis-url is given), a local worker (with an
    identity of its own, named after it) and the HTTP API, all in the background, each with a Redis
    user of its own. Says how to add another machine (`gpulayer access add worker NAME`), and, the
    first time, prints an admin token."""
    settings = Settings.from_env(redis_url=redis_url)
    given = click.get_current_context().get_parameter_source("redis_server") is ParameterSource.COMMANDLINE
    if given and settings.redis_url:
        raise click.UsageError("--redis-server picks the embedded Redis: not with --redis-url")
    home = local.private_folder(settings.home)
    previous = local.load(home)
    options = (redis_url, port, bind, name, slots, gpus, run_as, web_port, redis_server if given else None)
    changes = any(option is not None for option in options)
    if previous and _all_running(previous):
        click.echo(
            "GPUlayer is already up here" + ("; run `gpulayer down` first to change it." if changes else ".")
        )
        _summary(previous, home)
        return
    if previous and changes and _any_running(previous):
        raise ServerError("part of GPUlayer still runs here: run `gpulayer down` first to change it")
    if settings.redis_url:
        installation = _external(home, settings.redis_url, settings.prefix)
        state = local.LocalState(embedded=False)
    else:
        where = Where(port, bind, insecure, redis_server)
        installation, state = _start_embedded(home, previous, settings.prefix, where)
    installation.save_accesses(home)
    if previous:
        _carry_over(previous, state)
    if not local.alive(state.worker_pid):
        state.worker_name = name or state.worker_name or socket.gethostname()
    local.save(home, state)
    assert state.worker_name is not None, "a worker that runs was named when it started"
    # Also what brings Redis in step with the installation (this version's users, scripts and identities,
    # in a Redis kept from before too), as each admin command does.
    installation = identities.local_worker(home, installation, state.worker_name)
    if not local.alive(state.worker_pid):
        state.run_as, state.slots = run_as or state.run_as, slots or state.slots
        state.gpus = gpus or state.gpus
        state.worker_pid = _start_worker(home, installation, state.worker_name, state)
        local.save(home, state)
    if not local.alive(state.web_pid):
        state.web_port = web_port or (WEB_PORT if _port_free(WEB_PORT) else free_port())
        state.web_pid = _start_web(home, state.web_port)
        local.save(home, state)
    click.echo("GPUlayer is up.")
    _summary(state, home)
    token = _admin_token(installation)
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
    if state is None or not _any_running(state):
        click.echo("GPUlayer is not running here.")
        return
    if state.web_pid and local.alive(state.web_pid):
        os.kill(state.web_pid, signal.SIGTERM)
        if not processes.wait_gone(state.web_pid, 10.0):
            processes.kill(state.web_pid)
        click.echo("web server stopped")
    if state.worker_pid and local.alive(state.worker_pid):
        _stop_worker(state.worker_pid, timeout)
        click.echo(f"worker {state.worker_name} stopped")
    if state.embedded and state.redis_pid and local.alive(state.redis_pid):
        admin = accesses.load(settings.home, "admin")
        if admin is not None:
            shutdown_redis(admin.redis_url, admin.ca)
        if not processes.wait_gone(state.redis_pid, 10.0):
            processes.kill(state.redis_pid)
        click.echo("embedded Redis stopped (data kept)")
    state.worker_pid = state.redis_pid = state.web_pid = None
    local.save(settings.home, state)


@dataclasses.dataclass(frozen=True)
class Where:
    """How `up` was asked to run the embedded Redis: its port and address, plain TCP off loopback, and
    which server (a path; None: :func:`gpulayer.builds.choose` picks)."""

    port: int | None
    bind: str | None
    insecure: bool
    server: str | None


def _start_embedded(
    home: Path, previous: local.LocalState | None, prefix: str, asked: Where
) -> tuple[Installation, local.LocalState]:
    """Start the embedded Redis with a user per role, or keep the one still running; passwords, keys
    and port persist across `up`s."""
    reuse = previous if previous and previous.embedded else None
    kept = installations.load_current(home)
    if kept is not None and kept.prefix != prefix:
        raise ConfigError(f"this home's installation uses the prefix {kept.prefix!r}, not {prefix!r}")
    if reuse and kept and local.alive(reuse.redis_pid):
        if asked.port not in (None, reuse.port) or asked.bind not in (None, reuse.bind):
            raise ServerError(
                f"the embedded Redis runs on {reuse.bind}:{reuse.port}; run `gpulayer down` to change it"
            )
        return kept, reuse
    port = asked.port or (reuse.port if reuse else None) or free_port()
    bind = asked.bind or (reuse.bind if reuse else "127.0.0.1")
    data = home / "redis"
    # Never a server that cannot read what is there: it would start empty and hide it all.
    writer = builds.load_record(home) or builds.written_by(data)
    build = builds.choose(data, writer, asked.server, [] if asked.server else builds.candidates())
    binary, version = build.binary, build.version
    if bind not in LOOPBACK and version[0] < 7:
        raise ServerError(
            f"{binary} is {build}, whose roles can run any Lua (it has no "
            "functions to confine them to): it serves this machine only; install Redis 7 (Debian's "
            f"redis-server) for --bind {bind}"
        )
    secure = bind not in LOOPBACK and not asked.insecure
    if secure and not supports_tls(binary):
        raise ServerError(
            f"{binary} was built without TLS, which --bind {bind} needs: install Redis with TLS "
            "(Debian's redis-server), or pass --insecure for plain TCP"
        )
    host = "127.0.0.1" if bind in ("0.0.0.0", "::", *LOOPBACK) else bind
    endpoint = f"{'rediss' if secure else 'redis'}://{host}:{port}/0"
    files = tls.ensure(home, tls.machine_names(bind)) if secure else None
    ca = tls.ca_pem(home) if secure else None
    installation = (kept or Installation.generate(prefix, endpoint)).model_copy(
        update={"endpoint": endpoint, "ca": ca}
    )
    installations.save(home, installation)
    users = installation.acl_file(version[0])
    local.private_folder(data)
    process = start_redis(
        data, port, bind=bind, acl=users, tls=files, durable=True, detach=True, binary=binary
    )
    try:
        wait_ready(installation.url("admin"), process, ca=ca)
    except ServerError as exc:
        raise ServerError(f"{exc}; see {data / 'redis.log'}") from None
    builds.save_record(home, build)  # the data is this build's now: it may write a newer format
    return installation, local.LocalState(embedded=True, port=port, bind=bind, redis_pid=process.pid)


def _carry_over(previous: local.LocalState, state: local.LocalState) -> None:
    """What still runs of an earlier `up` (a worker or web server whose partner died) is kept, not
    started twice: a second worker would fight over the name, a second server leak on its port. A
    worker that died is started again as it was."""
    state.worker_name, state.run_as = previous.worker_name, previous.run_as
    state.slots, state.gpus = previous.slots, previous.gpus
    state.worker_pid = previous.worker_pid if local.alive(previous.worker_pid) else None
    if local.alive(previous.web_pid):
        state.web_pid, state.web_port = previous.web_pid, previous.web_port


def _all_running(state: local.LocalState) -> bool:
    return all(local.alive(pid) for pid in _pids(state))


def _any_running(state: local.LocalState) -> bool:
    return any(local.alive(pid) for pid in _pids(state))


def _pids(state: local.LocalState) -> list[int | None]:
    return [state.worker_pid, state.web_pid, *([state.redis_pid] if state.embedded else [])]


def _external(home: Path, redis_url: str, prefix: str) -> Installation:
    """The installation of a Redis the user runs: the one `gpulayer access init` made for it, or a new
    one whose roles are made on it now (``redis_url`` must then be allowed ACL SETUSER)."""
    kept = installations.load_current(home)
    if kept is not None and _same_server(kept.endpoint, redis_url):
        return kept
    installation = Installation.generate(prefix, installations.endpoint_of(redis_url))
    identities.make_on(redis_url, installation)
    installations.save(home, installation)
    return installation


def _same_server(one: str, other: str) -> bool:
    if sentinel.is_sentinel(one) or sentinel.is_sentinel(other):
        return installations.endpoint_of(one) == installations.endpoint_of(other)
    a, b = urlsplit(one), urlsplit(other)
    return (a.hostname, a.port or 6379, a.path or "/0") == (b.hostname, b.port or 6379, b.path or "/0")


def _start_worker(home: Path, installation: Installation, name: str, state: local.LocalState) -> int:
    """The local worker ``name``, offering what ``state`` says, as the worker role (its access is in
    the home; nothing secret on its command line or in its environment)."""
    args = ["worker", "start", "--name", name]
    if state.slots:
        args += ["--slots", str(state.slots)]
    if state.gpus:
        args += ["--gpus", state.gpus]
    if state.run_as:
        args += ["--run-as", state.run_as]
    log = home / "logs" / "worker.log"
    process = processes.start(args, home, log)
    client = Client(access=installation.access("admin"))

    def registered() -> bool:
        return any(worker.name == name and worker.pid == process.pid for worker in client.workers())

    try:
        processes.wait_ready(process, registered, f"the local worker did not start; see {log}")
    finally:
        client.close()
    return process.pid


def _start_web(home: Path, port: int) -> int:
    """`gpulayer server` on 127.0.0.1:``port`` in the background (as the web role), once it answers."""
    log = home / "logs" / "web.log"
    process = processes.start(["server", "--port", str(port)], home, log)
    processes.wait_ready(process, lambda: _answers(port), f"the web server did not start; see {log}")
    return process.pid


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _port_free(port: int) -> bool:
    return not _answers(port)


def _admin_token(installation: Installation) -> str | None:
    """A new admin token, the first time (none named admin works); None after."""
    client = Client(access=installation.access("admin"))
    service = Service(client)
    try:
        if any(token.name == ADMIN_TOKEN for token in service.tokens()):
            return None
        token, _ = service.create_token(ADMIN_TOKEN, "admin")
        return token
    finally:
        client.close()


def _stop_worker(pid: int, timeout: float) -> None:
    processes.stop(
        pid,
        timeout,
        lambda: click.echo(
            f"jobs still running after {timeout:g} s: stopping them and putting them back in their queues"
        ),
    )


def join_host(state: local.LocalState) -> str | None:
    """Where other machines most likely reach this one's Redis: the address on the default route, for
    a wildcard bind; None to keep the endpoint's."""
    if state.embedded and state.bind in ("0.0.0.0", "::"):
        return address_towards("10.255.255.255", 1)
    return None


def _summary(state: local.LocalState, home: Path) -> None:
    installation = installations.load(home)
    if installation is None:
        raise ConfigError(f"{home / installations.FILE} is missing: run `gpulayer down`, then `gpulayer up`")
    admin = installation.access("admin")
    where = accesses.describe(admin).split(" at ", 1)[1].rstrip(")")
    if state.embedded:
        click.echo(
            f"  Redis:   {where}  (embedded {builds.load_record(home) or ''}; a user per role; data in "
            f"{home / 'redis'}, append-only file synced every second)"
        )
    else:
        click.echo(f"  Redis:   {where}  (a user per role)")
    click.echo(f"  Worker:  {state.worker_name} (pid {state.worker_pid}; log {home / 'logs' / 'worker.log'})")
    if state.web_port:
        click.echo(f"  API:     http://127.0.0.1:{state.web_port}/api/v1  (log {home / 'logs' / 'web.log'})")
        click.echo(f"  Web:     http://127.0.0.1:{state.web_port}/  (`gpulayer dashboard` opens it)")
    click.echo("")
    click.echo("To add another machine, make it a worker identity of its own here (revocable alone with")
    click.echo("`gpulayer access revoke NAME`); run the join line it prints on that machine:")
    click.echo(f"  {invoked_as()} access add worker NAME")
    if state.embedded and state.bind in LOOPBACK:
        click.echo(
            "  (this Redis listens on 127.0.0.1 only; run `gpulayer down && gpulayer up --bind 0.0.0.0` "
            "to accept other machines, over TLS)"
        )
    elif not state.run_as:
        click.echo(
            "  Note: the local worker runs every job as you, so a job of another machine's submitter "
            f"could read this installation's keys in {home}; run `gpulayer up --run-as USER` as root, "
            "or run workers on other machines only."
        )
    click.echo("")
    click.echo(f"Try:  {invoked_as()} submit --wait -- echo hello")
