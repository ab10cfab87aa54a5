"""Commands about who may do what: `access init` for a Redis the user runs, `access add`, `list` and
`revoke` of each machine's own identity, `access export` of a shared role's access token, and
`connect`, which keeps one on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import get_args
from urllib.parse import urlsplit

import click
import redis

from .. import access as accesses
from .. import home as local
from .. import identities, tls
from .. import installation as installations
from ..client import Client
from ..errors import GpulayerError
from ..models import AccessRole, IdentityRole
from ..settings import Settings, check_redis_url
from .app import duration
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
@click.option(
    "--worker",
    metavar="NAME",
    help="Also make the identity of a worker machine, NAME, its access kept here (access/worker.json) "
    "for the machines that run it, as the Compose stack's workers do.",
)
def init(
    redis_url: str,
    apply: bool,
    ca_file: Path | None,
    redis_major: int,
    aclfile: Path | None,
    tls_dir: Path | None,
    worker: str | None,
) -> None:
    """Set an installation up on a Redis you run: a password per shared role and the job and
    identity key pairs, kept here (this machine is then its admin), and the ACL rules that make its
    users, printed with password hashes only. Apply them as an admin of that Redis, or pass --apply,
    or write them to --aclfile; the next admin command here (`gpulayer up --redis-url`, `gpulayer
    access list`) publishes the identities. The default user is left as it is; turn it off (`ACL
    SETUSER default off`) unless other programs use it."""
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
    made = installations.Installation.generate(settings.prefix, endpoint, ca)
    worker_access = None
    if worker is not None:
        made, worker_access = made.enrol("worker", worker)
    applied = identities.make_on(redis_url, made) if apply else None
    installations.save(home, made)
    made.save_accesses(home)
    if worker_access is not None:
        accesses.save(home, worker_access)
    if aclfile is not None:
        # Password hashes only: readable by the Redis that loads it.
        aclfile.write_text(made.acl_file(redis_major))
        aclfile.chmod(0o644)
        click.echo(
            f"the roles' Redis users are in {aclfile}; their access is kept in {accesses.folder(home)}"
        )
        return
    if applied is not None:
        # Exit 0 even where Redis could not keep them: they are made and work until it restarts, and
        # the installation is kept (a second `access init` would refuse it); the note says what to do.
        _say(applied, "they are made")
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


@access_group.command(name="apply")
@click.option(
    "--redis-url",
    metavar="ADMIN_URL",
    help="How to log in to that Redis as a user allowed ACL SETUSER, when the installation's own admin "
    "user is gone (after a restart that lost the users: redis://default:PASSWORD@HOST:PORT). "
    "Default: the installation's admin.",
)
def apply_command(redis_url: str | None) -> None:
    """Make the installation's Redis users again, as this version makes them, from the machine that
    holds it: each shared role's and valid identity's user (passwords kept, revoked and expired ones
    removed), the installation's scripts and identity registry; then keep them across Redis's
    restarts (its ACL file, else its config file: docs/security.md). Idempotent. Run it after an
    upgrade, or after a restart of your own Redis that lost its users. `gpulayer up` does this itself."""
    _apply(redis_url)


@access_group.command()
def sync() -> None:
    """The same as `gpulayer access apply` (its older name), as the installation's admin."""
    _apply(None)


def _apply(redis_url: str | None) -> None:
    if redis_url is not None:
        check_redis_url(redis_url)
    applied = identities.apply(Settings.from_env().home, redis_url)
    _say(applied, "they are made")
    if applied != "stopped":
        click.echo("the roles' Redis users and the installation's scripts are this version's")


@access_group.command()
@click.argument("role", type=click.Choice(get_args(AccessRole)))
@click.option(
    "--host",
    metavar="HOST[:PORT]",
    help="The address other machines reach Redis at: HOST, HOST:PORT or [v6]:PORT (default: as `up` "
    "prints it; the port, Redis's).",
)
def export(role: AccessRole, host: str | None) -> None:
    """Print a shared ROLE's access token, for another machine (`gpulayer connect` with it). Anyone
    holding it acts as that role: send it as you would a password. A worker has no shared token:
    `gpulayer access add worker NAME` makes each machine its own."""
    if role == "worker":
        raise click.ClickException("a worker's token is its own: `gpulayer access add worker NAME` makes one")
    home = Settings.from_env().home
    installation = installations.load_admin(home)
    click.echo(installation.access(role, _host(home, host)).token())


def _host(home: Path, given: str | None) -> str | None:
    state = local.load(home)
    return given or (join_host(state) if state else None)


@access_group.command()
@click.argument("role", type=click.Choice(get_args(IdentityRole)))
@click.argument("name")
@click.option(
    "--expires",
    callback=duration,
    metavar="DURATION",
    help="From then on nothing it signs is accepted, and the next admin command removes its Redis "
    "user (30d). Default: never.",
)
@click.option(
    "--host",
    metavar="HOST[:PORT]",
    help="The address other machines reach Redis at: HOST, HOST:PORT or [v6]:PORT (default: as `up` "
    "prints it; the port, Redis's).",
)
def add(role: IdentityRole, name: str, expires: float | None, host: str | None) -> None:
    """Make the identity of one machine, NAME, in ROLE: a Redis user of its own (and, for a worker, its
    own key to sign results with), revocable alone (`gpulayer access revoke NAME`). Prints its
    access token, the only time it is shown: `gpulayer join` (a worker) or `gpulayer connect` takes
    it on that machine. Send it as you would a password."""
    home = Settings.from_env().home
    access, applied = identities.add(home, role, name, expires, _host(home, host))
    use = "gpulayer join" if role == "worker" else "gpulayer connect"
    click.echo(
        f"identity {name!r} ({role}): its token, shown this once; on that machine run "
        f"`{accesses.TOKEN_VARIABLE}=<token> {use}` (or `{use} --token-file FILE`)",
        err=True,
    )
    _say(applied, "its Redis user is made")
    click.echo(access.token())


def _say(applied: identities.Applied, what: str) -> None:
    """A note on stderr when Redis did not take the change for good."""
    if applied == "stopped":
        click.echo(f"note: {what} at the next `gpulayer up`", err=True)
    elif applied == "unsaved":
        click.echo(
            "note: Redis cannot keep its users across a restart (no ACL file nor config file to save "
            "them to, or this user may not): after one, run `gpulayer access apply --redis-url "
            "ADMIN_URL` here, or keep them as docs/security.md says",
            err=True,
        )


@access_group.command(name="list")
def list_identities() -> None:
    """Every machine identity: name, role, Redis user, created, expires, state (valid, expired),
    and when a worker under it was last heard from. The Redis users of expired ones are removed."""
    for listed in identities.listing(Settings.from_env().home):
        expires = listed.expires.isoformat(timespec="seconds") if listed.expires else "never"
        seen = listed.last_seen.isoformat(timespec="seconds") if listed.last_seen else "-"
        click.echo(
            f"{listed.name}  {listed.role}  user {listed.user}  created "
            f"{listed.created.isoformat(timespec='seconds')}  expires {expires}  "
            f"{'valid' if listed.valid else 'expired'}  last seen {seen}"
        )


@access_group.command()
@click.argument("name")
def revoke(name: str) -> None:
    """Revoke the identity NAME at once: its Redis user is deleted (its connections cut), nothing it
    signs is accepted any more, and the jobs its workers were running go back to their queues.
    Other machines are not touched."""
    applied, moved = identities.revoke(Settings.from_env().home, name)
    _say(applied, "its Redis user is deleted")
    if applied == "stopped":
        click.echo(f"identity {name!r} revoked")
        return
    back = f"; {moved} running job(s) went back to their queues" if moved else ""
    click.echo(f"identity {name!r} revoked: its Redis user is deleted{back}")


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
    settings = Settings.from_env()
    _check_works(access, settings)
    path = accesses.save(settings.home, access)
    click.echo(f"connected as {accesses.describe(access)}; access kept in {path}")


def _check_works(access: accesses.Access, settings: Settings) -> None:
    """Reach the installation as ``access`` and read its workers, as every role may: a token that
    cannot (a wrong address, a revoked user) is refused here, before it is kept, not at the next
    command."""
    try:
        client = Client(settings=settings, access=access)
    except GpulayerError as exc:  # a URL no client could use (its port, its scheme)
        raise click.ClickException(f"the access token cannot be used, nothing kept: {exc}") from None
    try:
        client.workers()
    except redis.exceptions.RedisError as exc:
        raise click.ClickException(
            f"cannot connect as {accesses.describe(access)}, nothing kept: {exc}"
        ) from None
    finally:
        client.close()
