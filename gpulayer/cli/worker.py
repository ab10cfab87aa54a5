"""Commands that run a worker on this machine: `worker start`, and `join` for another machine."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import click

from .. import access as accesses
from .. import home as local
from ..inventory import Offer
from ..machines import this_machine
from ..network import redact
from ..resources import detect
from ..settings import CONTAINMENT_MODES, Settings
from ..units import format_size
from ..worker import open_worker
from ..worker.identity import RunAs, describe
from .app import URL_KEY, F, duration, label_option, open_client, redis_url_option

log = logging.getLogger("gpulayer.worker")


def _worker_options(command: F) -> F:
    options = [
        click.option(
            "--name",
            help="Worker name (default: this host's name). A restart under the same name takes over at once.",
        ),
        click.option(
            "--slots",
            type=click.IntRange(min=1),
            help="CPU slots: CPU jobs run at once (default: CPU cores). GPU jobs hold GPUs instead.",
        ),
        click.option(
            "--gpus",
            metavar="INDICES|none",
            help="GPUs to offer, in nvidia-smi numbering: 0,1 or none (default: all of them).",
        ),
        click.option(
            "--fake-gpus",
            envvar="GPULAYER_FAKE_GPUS",
            metavar="JSON",
            help="Simulated GPUs to offer instead of real ones, for tests: "
            '[{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}].',
        ),
        label_option("A label jobs can ask for with --label; repeatable."),
        click.option(
            "--lease-ttl",
            type=click.FloatRange(min=0, min_open=True),
            help="Seconds a job's lease lasts unrenewed before another worker may take it (default: "
            f"GPULAYER_LEASE_TTL, else {Settings.lease_ttl:g}).",
        ),
        click.option(
            "--heartbeat",
            type=click.FloatRange(min=0, min_open=True),
            help="Seconds between heartbeats, each renewing every lease (default: GPULAYER_HEARTBEAT, "
            f"else {Settings.heartbeat:g}).",
        ),
        click.option(
            "--kill-grace",
            callback=duration,
            metavar="DURATION",
            help="After SIGTERM, how long a job's processes get before SIGKILL (default 10s).",
        ),
        click.option(
            "--advertise-addr",
            metavar="HOST",
            help="Where other machines reach this one, for the ranks of gang jobs (default: this "
            "machine's address on its route to Redis).",
        ),
        click.option(
            "--run-as",
            metavar="USER",
            help="Run every job process as this user (the worker must be root), so jobs can read "
            "neither this worker's files nor its environment. Job folders then go in --workdir "
            "(default /var/lib/gpulayer/PREFIX-NAME).",
        ),
        click.option(
            "--containment",
            type=click.Choice(CONTAINMENT_MODES),
            help="How jobs are contained: a cgroup per job with its limits (cgroup2, cgroup1), none, or "
            "auto: cgroup v2 where delegated, else v1, else none (default: GPULAYER_CONTAINMENT, else auto).",
        ),
        click.option("--burst", is_flag=True, help="Exit once the queues are empty and running jobs ended."),
        click.option(
            "--replace",
            is_flag=True,
            help="Take over --name even from a worker that still runs (it stops); without it, a live "
            "worker's name is refused.",
        ),
        click.option(
            "--workdir",
            type=click.Path(file_okay=False, path_type=Path),
            help="Where job folders are made (default: $GPULAYER_HOME/work/NAME).",
        ),
        click.option(
            "--log-level",
            default="INFO",
            show_default=True,
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def run_worker(redis_url: str | None, options: dict[str, Any], access: accesses.Access | None = None) -> None:
    """Run a worker as ``access`` (default: the worker's access kept here; ``redis_url`` replaces its URL)."""
    level = options["log_level"].upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings.from_env(
        redis_url=redis_url,
        kill_grace_seconds=options["kill_grace"],
        lease_ttl=options["lease_ttl"],
        heartbeat=options["heartbeat"],
        containment=options["containment"],
    )
    access = access or accesses.resolve(settings.redis_url, settings.home, roles=("worker",))
    click.get_current_context().meta[URL_KEY] = redact(access.redis_url)
    name = options["name"] or socket.gethostname()
    run_as = RunAs.lookup(options["run_as"]) if options["run_as"] else None
    local.private_folder(settings.home)
    found = detect(fake_gpus=options["fake_gpus"], gpus=options["gpus"], owner=name)
    worker = open_worker(
        access,
        settings,
        name=name,
        offer=Offer(
            slots=options["slots"] or found.cpus,
            memory=found.memory,
            gpus=found.gpus,
            labels=options["labels"],
            frameworks=found.frameworks,
            machine=this_machine(),
        ),
        workdir=options["workdir"],
        run_as=run_as,
        advertise_addr=options["advertise_addr"],
    )
    gpus = ", ".join(f"{g.index} {g.name}" + (" (simulated)" if g.simulated else "") for g in found.gpus)
    log.info(
        "worker %s (at %s) offers %d CPU slots, %s of memory, GPUs: %s",
        name,
        worker.address,
        worker.offer.slots,
        format_size(worker.offer.memory),
        gpus or f"none ({found.why_no_gpus})",
    )
    if worker.offer.containment and worker.offer.containment.startswith("none"):
        log.warning("containment: %s", worker.offer.containment)
    else:
        log.info("containment: %s", worker.offer.containment)
    worker.check_identity()
    worker.check_name(replace=options["replace"])
    _say_who_jobs_run_as(run_as)
    worker.work(burst=options["burst"], logging_level=level)


def _say_who_jobs_run_as(run_as: RunAs | None) -> None:
    log.info("jobs run %s", describe(run_as))
    if run_as is None and os.geteuid() == 0:
        log.warning(
            "this worker runs as root without --run-as: every job runs as root, and can read this "
            "worker's access and keys; start it with --run-as USER"
        )
    if run_as is not None and (why := run_as.can_run(sys.executable)):
        log.warning(
            "%s cannot start this worker's Python (%s): function jobs will fail; install GPUlayer "
            "where that user can read it",
            run_as.user,
            why,
        )


@click.group()
def worker() -> None:
    """Run a worker on this machine."""


@worker.command()
@redis_url_option
@_worker_options
def start(redis_url: str | None, **options: Any) -> None:
    """Run a worker in the foreground: it takes jobs it can run until stopped. SIGTERM or Ctrl+C lets
    running jobs finish; a second one stops them and puts them back in their queues."""
    run_worker(redis_url, options)


@worker.command()
@click.argument("name")
@click.option("--requeue", is_flag=True, help="Stop its running jobs now and put them back in their queues.")
@redis_url_option
def stop(name: str, requeue: bool, redis_url: str | None) -> None:
    """Stop a worker, wherever it runs: it takes no new jobs and exits once its running jobs end (or,
    with --requeue, at once, its jobs back in their queues)."""
    open_client(redis_url).stop_worker(name, requeue=requeue)
    click.echo(f"worker {name} is stopping" + (" (running jobs go back to their queues)" if requeue else ""))


@click.command()
@click.option(
    "--token-file",
    metavar="FILE|-",
    help=f"The worker's access token, from a file or - (stdin). Default: {accesses.TOKEN_VARIABLE}, "
    "else the access an earlier join kept here.",
)
@_worker_options
def join(token_file: str | None, **options: Any) -> None:
    """Add this machine to an installation as a worker: with the token of its own identity, which
    `gpulayer access add worker NAME` prints on the admin's machine (never on the command line, where
    every user of this machine could read it). The access is kept in
    $GPULAYER_HOME/access/worker.json, so a later `gpulayer join` (or `worker start`) needs none."""
    settings = Settings.from_env()
    given = token_file or accesses.TOKEN_VARIABLE in os.environ
    access = accesses.read_token(token_file) if given else accesses.resolve(None, settings.home, ("worker",))
    if access.role != "worker":
        raise click.ClickException(f"this access token is a {access.role}'s, not a worker's")
    if given:
        path = accesses.save(settings.home, access)
        click.echo(f"joined as {accesses.describe(access)}; access kept in {path}", err=True)
    run_worker(None, options, access)
