"""Commands that run a worker on this machine: `worker start`, and `join` for another machine."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..store.connection import connect
from ..worker import Worker
from .app import redis_url_option, resolve


def _worker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--name",
            help="Worker name (default: this host's name). A restart under the same name takes over at once.",
        ),
        click.option("--slots", type=click.IntRange(min=1), help="Jobs run at once (default: CPU cores)."),
        click.option("--burst", is_flag=True, help="Exit once the queues are empty and running jobs ended."),
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


def run_worker(
    redis_url: str | None,
    name: str | None,
    slots: int | None,
    burst: bool,
    workdir: Path | None,
    log_level: str,
) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    settings, url = resolve(redis_url)
    connection = connect(url)
    worker = Worker(
        connection,
        settings,
        name=name or socket.gethostname(),
        slots=slots or os.cpu_count() or 1,
        workdir=workdir,
    )
    worker.work(burst=burst, logging_level=log_level.upper())


@click.group()
def worker() -> None:
    """Run a worker on this machine."""


@worker.command()
@redis_url_option
@_worker_options
def start(
    redis_url: str | None,
    name: str | None,
    slots: int | None,
    burst: bool,
    workdir: Path | None,
    log_level: str,
) -> None:
    """Run a worker in the foreground: it takes jobs until stopped. SIGTERM or Ctrl+C lets running jobs
    finish; a second one stops them and puts them back in their queues."""
    run_worker(redis_url, name, slots, burst, workdir, log_level)


@click.command()
@click.argument("redis_url", metavar="REDIS_URL")
@_worker_options
def join(
    redis_url: str, name: str | None, slots: int | None, burst: bool, workdir: Path | None, log_level: str
) -> None:
    """Add this machine to an installation: run a worker against its Redis (the line `gpulayer up` prints)."""
    run_worker(redis_url, name, slots, burst, workdir, log_level)
