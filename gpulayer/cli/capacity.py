"""`gpulayer capacity`: the machines the autoscaler started, and `capacity run`, the autoscaler itself
(which `gpulayer server` also runs where the admin's home holds a capacity configuration)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from .. import access as accesses
from .. import identities
from .. import installation as installations
from ..capacity import Autoscaler, CapacityConfig, load
from ..capacity import config as configs
from ..errors import ConfigError
from ..settings import Settings
from ..units import format_span
from .app import listed, open_client, redis_url_option

#: The autoscaler's own identity: a Redis user that reads the installation and writes its own keys.
IDENTITY = "autoscaler"


class HomeEnroller:
    """Each machine's worker identity, made and revoked as `gpulayer access add worker` and `access
    revoke` do, on the admin's machine whose home this is."""

    def __init__(self, home: Path, host: str | None) -> None:
        self.home = home
        self.host = host

    def add(self, name: str) -> str:
        access, _ = identities.add(self.home, "worker", name, host=self.host)
        return access.token()

    def revoke(self, name: str) -> None:
        with contextlib.suppress(ConfigError):  # none made: a start that failed before it
            identities.revoke(self.home, name)


def autoscaler(home: Path, config: CapacityConfig) -> Autoscaler:
    """The autoscaler of the installation whose admin's home is ``home``: its Redis connection as its
    own identity (made the first time), its providers loaded from ``config``."""
    installation = installations.load_admin(home)
    access = accesses.load(home, "capacity")
    if access is None or access.identity not in installation.identities:
        if IDENTITY in installation.identities:
            identities.revoke(home, IDENTITY)  # this home lost its access: a new one replaces it
        access, _ = identities.add(home, "capacity", IDENTITY)
        accesses.save(home, access)
    providers = {name: load(name, config.provider_options(name)) for name in config.providers}
    enroller = HomeEnroller(home, config.redis_host)
    return Autoscaler.connect(access, installation.prefix, providers, enroller, config)


def start_in_background(home: Path) -> threading.Event | None:
    """The autoscaler in a thread of this process, where ``home`` holds a capacity configuration: the
    event that stops it; None where there is none."""
    config = configs.load(home)
    if config is None:
        return None
    scaler = autoscaler(home, config)
    stop = threading.Event()
    threading.Thread(target=scaler.run, args=(stop,), name="gpulayer-capacity", daemon=True).start()
    click.echo(f"running the autoscaler ({configs.path(home)}: {', '.join(config.providers)})", err=True)
    return stop


@click.group(invoke_without_command=True)
@click.pass_context
def capacity(ctx: click.Context) -> None:
    """Capacity on demand (docs/capacity.md): alone, the machines the autoscaler started."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_machines)


@capacity.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@redis_url_option
def list_machines(as_json: bool = False, redis_url: str | None = None) -> None:
    """The machines the autoscaler started, running or stopped in the last day: state, kind and
    provider, age, cost so far, and why it stopped."""
    found = open_client(redis_url).machines()
    if listed(found, as_json, "the autoscaler has started no machine (in the last day)"):
        return
    now = datetime.now(timezone.utc)
    for machine in found:
        age = format_span(machine.age(now))
        cost = machine.cost(now)
        spent = f"${cost:.2f}" if cost is not None else "cost unknown"
        click.echo(f"{machine.name}  {machine.state}  {machine.kind} on {machine.provider}  {age}  {spent}")
        if machine.reason:
            click.echo(f"  {machine.reason}")


@capacity.command(name="run")
def run_command() -> None:
    """Run the autoscaler in the foreground, on the admin's machine, with the configuration in
    $GPULAYER_HOME/capacity.toml (or GPULAYER_CAPACITY). Ctrl+C stops it; the machines it started go
    on, and it finds them again when it runs next."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    home = Settings.from_env().home
    config = configs.load(home)
    if config is None:
        raise click.ClickException(f"no capacity configuration at {configs.path(home)} (docs/capacity.md)")
    scaler = autoscaler(home, config)
    stop = threading.Event()

    def stopping(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    click.echo(f"autoscaler running with providers: {', '.join(scaler.providers) or 'none'}", err=True)
    scaler.run(stop)
