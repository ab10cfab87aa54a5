"""Commands about who may do what: `access init` for a Redis the user runs, `access export` of a
role's access token, and `connect`, which keeps one on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import get_args
from urllib.parse import urlsplit

import click

from .. import access as accesses
from .. import home as local
from .. import installation as installations
from .. import tls
from ..models import AccessRole
from ..settings import Settings
from .server import join_host


@click.group(name="access")
def access_group() -> None:
    """The roles of an installation: their Redis users, keys and access tokens (docs/security.md)."""


@access_group.command()
@click.option(
    "--redis-url",
    required=True,
    metavar="URL",
    help="Your Redis, as every machine reaches it (redis://, or rediss:// for TLS); with --apply, an "
    "admin's URL of it.",
)
@click.option("--apply", is_flag=True, help="Make the Redis users now, through --redis-url.")
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="For rediss://: the PEM of the only CA its certificate may be signed by (default: the system's).",
)
@click.option(
    "--redis-major",
    type=click.IntRange(6),
    default=7,
    show_default=True,
    help="Redis's major version, for the rules printed (6.2 lacks some commands 7 must deny).",
)
@click.option(
    "--aclfile",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the users as a Redis ACL file instead (its default user off), for a Redis that "
    "starts with --aclfile FILE, as the Compose stack's does.",
)
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Make the installation's own CA and a certificate for its Redis, and put what Redis needs "
    "(ca.pem, redis.pem, redis.key) in this folder, for a Redis that speaks TLS only, as the Compose "
    "stack's does. Needs a rediss:// URL; every access then trusts that CA alone.",
)
def init(
    redis_url: str,
    apply: bool,
    ca_file: Path | None,
    redis_major: int,
    aclfile: Path | None,
    tls_dir: Path | None,
) -> None:
    """Set an installation up on a Redis you run: a password per role and both key pairs, kept here
    (this machine is then its admin), and the ACL rules that make its users, printed with password
    hashes only. Apply them as an admin of that Redis, or pass --apply, or write them to --aclfile.
    The default user is left as it is; turn it off (`ACL SETUSER default off`) unless other
    programs use it."""
    if apply and aclfile:
        raise click.UsageError("give --apply or --aclfile, not both")
    if tls_dir is not None and (apply or ca_file):
        raise click.UsageError(
            "--tls-dir makes the CA of a Redis not yet started: not with --apply or --ca-file"
        )
    if tls_dir is not None and urlsplit(redis_url).scheme != "rediss":
        raise click.UsageError("--tls-dir needs a rediss:// URL: that Redis speaks TLS only")
    settings = Settings.from_env(redis_url=redis_url)  # checks the URL before anything is made
    home = local.private_folder(settings.home)
    if installations.load(home) is not None:
        raise click.ClickException(
            f"{home} already holds an installation; use another GPULAYER_HOME, or remove "
            f"{home / installations.FILE} and {accesses.folder(home)} to start over"
        )
    ca = ca_file.read_text() if ca_file else None
    endpoint = installations.endpoint_of(redis_url)  # a database no role could reach: refused, nothing made
    if tls_dir is not None:  # never with --ca-file (above)
        ca = _redis_tls(home, redis_url, tls_dir)
    if apply:
        made = installations.create_on(redis_url, settings.prefix, ca)
    else:
        made = installations.Installation.generate(settings.prefix, endpoint, ca)
    installations.save(home, made)
    made.save_accesses(home)
    if aclfile is not None:
        # Password hashes only: readable by the Redis that loads it.
        aclfile.write_text(made.acl_file(redis_major))
        aclfile.chmod(0o644)
        click.echo(
            f"the roles' Redis users are in {aclfile}; their access is kept in {accesses.folder(home)}"
        )
        return
    if apply:
        click.echo(f"the roles' Redis users are made; their access is kept in {accesses.folder(home)}")
        return
    click.echo("# Run these as an admin of that Redis (redis-cli), then `gpulayer up --redis-url URL`:")
    for line in made.acl_commands(redis_major):
        click.echo(line)


def _redis_tls(home: Path, redis_url: str, folder: Path) -> str:
    """The installation's CA (kept here with its key, as `gpulayer up` keeps its own) and a
    certificate for its Redis; what Redis needs copied into ``folder``, private. The CA's PEM."""
    host = urlsplit(redis_url).hostname or "127.0.0.1"
    files = tls.ensure(home, [host, "localhost", "127.0.0.1"])
    local.private_folder(folder)
    for path in (files.ca, files.cert, files.key):
        local.write_private(folder / path.name, path.read_bytes())
    return files.ca.read_text()


@access_group.command()
def sync() -> None:
    """Bring the installation's Redis up to this version of GPUlayer, as its admin: the roles' Redis
    users with this version's rules (their passwords kept) and the installation's scripts, which on
    Redis 7 only the admin may load. `gpulayer up` does this itself; run it after an upgrade, where
    a Redis of your own (or the Compose stack's) runs without `up`."""
    installations.sync(_installation(Settings.from_env()))
    click.echo("the roles' Redis users and the installation's scripts are this version's")


@access_group.command()
@click.argument("role", type=click.Choice(get_args(AccessRole)))
@click.option("--host", help="The address other machines reach Redis at (default: as `up` prints it).")
def export(role: AccessRole, host: str | None) -> None:
    """Print ROLE's access token, for another machine (`gpulayer join` for a worker, `gpulayer
    connect` for the rest). Anyone holding it acts as that role: send it as you would a password."""
    settings = Settings.from_env()
    installation = _installation(settings)
    state = local.load(settings.home)
    click.echo(installation.access(role, host or (join_host(state) if state else None)).token())


def _installation(settings: Settings) -> installations.Installation:
    """The installation this machine is the admin of."""
    installation = installations.load(settings.home)
    if installation is None:
        raise click.ClickException(
            "this machine holds no installation: run this where `gpulayer up` (or `access init`) ran"
        )
    return installation


@click.command()
@click.option(
    "--token-file",
    metavar="FILE|-",
    help=f"The access token, from a file or - (stdin). Default: {accesses.TOKEN_VARIABLE}.",
)
def connect(token_file: str | None) -> None:
    """Keep an access token on this machine (in $GPULAYER_HOME/access), so every command here reaches
    that installation in its role: a submitter's or a viewer's for the CLI and SDK, the web role's for
    `gpulayer server`. (A worker's goes to `gpulayer join`.)"""
    access = accesses.read_token(token_file)
    path = accesses.save(Settings.from_env().home, access)
    click.echo(f"connected as {accesses.describe(access)}; access kept in {path}")
