"""The ``gpulayer`` command group, and what its commands share: the Redis URL option, the client,
and turning errors into one line and an exit code."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
import redis.exceptions
from pydantic import BaseModel

from .. import __version__
from .. import access as accesses
from ..client import Client
from ..errors import GpulayerError, InvalidJobSpec
from ..models import AccessRole, JobRecord, JobState
from ..network import redact
from ..redis_failures import redis_failure
from ..settings import Settings
from ..units import parse_duration
from .flags import said_in_flags

F = TypeVar("F", bound=Callable[..., Any])
#: Where a command keeps the (redacted) Redis URL it uses, for its error messages.
URL_KEY = "gpulayer.redis_url"

#: How a job's end becomes the exit status of `submit --wait` and `wait`.
EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 130
#: Ctrl-C stopped a wait (as a shell reports SIGINT); the job goes on.
EXIT_INTERRUPTED = 130


def invoked_as() -> str:
    """How this shell runs ``gpulayer`` again: the bare name where PATH finds this one, else the path it
    was started by (a virtualenv's ``.venv/bin/gpulayer``, not on PATH), or ``python -m gpulayer``."""
    started = sys.argv[0]
    if started.endswith("__main__.py"):
        return f"{shlex.quote(sys.executable)} -m gpulayer"
    found = shutil.which("gpulayer")
    if found and os.path.exists(started) and os.path.samefile(found, started):
        return "gpulayer"
    return shlex.quote(started)


class CommandError(click.ClickException):
    """A one-line error with its own exit status."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click reads it per instance


class Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InvalidJobSpec as exc:
            raise CommandError(said_in_flags(exc) or str(exc), exc.exit_code) from None
        except GpulayerError as exc:
            raise CommandError(str(exc), exc.exit_code) from None
        except redis.exceptions.RedisError as exc:
            error = redis_failure(exc, ctx.meta.get(URL_KEY, "the configured URL"))
            raise CommandError(str(error), error.exit_code) from None


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A click callback: seconds from ``90``, ``90s``, ``15m``, ``2h``."""
    try:
        return parse_duration(value) if value is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def key_values(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """A click callback: ``NAME=VALUE`` options (repeatable) as a dict."""
    pairs = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep:
            raise click.BadParameter(f"{value!r} is not NAME=VALUE", ctx, param)
        pairs[name] = setting
    return pairs


def label_option(help: str) -> Callable[[F], F]:
    """``--label KEY=VALUE``, repeatable, as a dict."""
    return click.option(
        "--label", "labels", multiple=True, metavar="KEY=VALUE", callback=key_values, help=help
    )


def requirement_options(command: F) -> F:
    """What a job needs from its machine, as `submit` and `plan` take it (the fields of Requirements)."""
    options = [
        click.option(
            "--accelerator",
            type=click.Choice(["cpu", "cuda", "rocm", "mps", "any"]),
            help="The kind of device (default: cpu, or any when --gpus is given).",
        ),
        click.option(
            "--gpus",
            type=click.IntRange(0, 64),
            help="GPUs the job needs (default 1 for cuda, rocm and mps).",
        ),
        click.option(
            "--gpu-memory", metavar="SIZE", help="Memory each GPU must have, at least (24GB, 40GiB)."
        ),
        click.option(
            "--gpu-name", metavar="PATTERN", help="Regular expression the GPU's name must match (A100|H100)."
        ),
        click.option(
            "--framework",
            "frameworks",
            multiple=True,
            metavar="REQUIREMENT",
            help="Installed package the job needs, with versions (torch>=2.1); repeatable.",
        ),
        click.option(
            "--cpus", type=click.IntRange(0), help="CPU slots it holds (default 1; 0 for a GPU job)."
        ),
        click.option("--memory", metavar="SIZE", help="Memory of the worker it holds while it runs (8GB)."),
        label_option("Worker label it needs, exactly; repeatable."),
        click.option(
            "--target",
            type=click.Choice(["local", "remote", "any"]),
            help="Where it may run: a worker on this machine (local), on another (remote), or any (default).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def redis_url_option(command: F) -> F:
    return click.option(
        "--redis-url",
        envvar="GPULAYER_REDIS_URL",
        metavar="URL",
        help="Redis of the installation, in place of the one this machine's access names (default: "
        "GPULAYER_REDIS_URL, else what `gpulayer up`, `join` or `connect` kept here).",
    )(command)


def open_client(redis_url: str | None, roles: tuple[AccessRole, ...] = accesses.CLIENT_ROLES) -> Client:
    """A client in the strongest of ``roles`` this machine holds (its URL remembered for error messages)."""
    settings = Settings.from_env(redis_url=redis_url)
    access = accesses.resolve(settings.redis_url, settings.home, roles)
    click.get_current_context().meta[URL_KEY] = redact(access.redis_url)
    return Client(settings=settings, access=access)


def echo_json(models: Sequence[BaseModel]) -> None:
    """``models`` as one JSON array, as every listing's ``--json`` prints it."""
    click.echo(json.dumps([model.model_dump(mode="json") for model in models], indent=2))


def listed(models: Sequence[BaseModel], as_json: bool, none: str) -> bool:
    """Whether a listing is printed already: as JSON (``--json``), or as ``none`` where it is empty."""
    if as_json:
        echo_json(models)
    elif not models:
        click.echo(none)
    return as_json or not models


def job_exit_code(record: JobRecord) -> int:
    """0 for success; the job's own exit code if it failed with one; 124 timed out; 130 cancelled; else 1."""
    if record.state is JobState.SUCCEEDED:
        return 0
    if record.state is JobState.TIMED_OUT:
        return EXIT_TIMED_OUT
    if record.state is JobState.CANCELLED:
        return EXIT_CANCELLED
    return record.exit_code or 1


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpulayer")
def main() -> None:
    """Run commands on whichever machine has the GPU or CPU they need, through one Redis."""
