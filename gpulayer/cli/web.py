"""Commands about the HTTP API and dashboard: `server`, `dashboard`, and the API tokens (`token
create`, `list`, `revoke`)."""

from __future__ import annotations

import ipaddress
import ssl
import webbrowser
from pathlib import Path
from typing import get_args

import click

from .. import access as accesses
from .. import home as local
from ..models import AccessRole, Role
from ..service import Service
from ..settings import Settings
from .app import duration, echo_json, open_client, redis_url_option
from .capacity import start_in_background

#: The roles that may reach API tokens in Redis.
_TOKEN_ROLES: tuple[AccessRole, ...] = ("admin", "web")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Serve HTTPS with this certificate (PEM, with its chain); needs --tls-key.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The certificate's private key (PEM).",
)
@click.option(
    "--behind-proxy",
    is_flag=True,
    help="Requests come through one TLS-terminating proxy: trust its X-Forwarded-For/-Proto/-Host.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve plain HTTP on a non-loopback address anyway (tokens and cookies cross in clear).",
)
@redis_url_option
def server(
    host: str,
    port: int,
    tls_cert: Path | None,
    tls_key: Path | None,
    behind_proxy: bool,
    insecure: bool,
    redis_url: str | None,
) -> None:
    """Serve the HTTP API (see docs/api.md) in the foreground, with gunicorn."""
    tls = _tls_files(tls_cert, tls_key)
    if tls is None and not behind_proxy and not insecure and not _loopback(host):
        raise click.ClickException(
            f"refusing to serve plain HTTP on {host}: tokens and session cookies would cross the network "
            "in clear; give --tls-cert and --tls-key, --behind-proxy (a TLS proxy), or --insecure"
        )
    # Imported here: only this command needs Flask and gunicorn.
    from ..web import create_app
    from ..web.serve import serve

    client = open_client(redis_url, ("web", "admin"))
    # Where the admin's home holds a capacity configuration (docs/capacity.md), the server runs the
    # autoscaler too; its providers' credentials stay in this process.
    start_in_background(Settings.from_env().home)
    scheme = "https" if tls is not None else "http"
    where = f"[{host}]" if ":" in host else host
    proxied = ", behind a proxy" if behind_proxy else ""
    click.echo(
        f"serving the GPUlayer API and dashboard on {scheme}://{where}:{port}/{proxied}, "
        f"as {accesses.describe(client.access)}",
        err=True,
    )
    app = create_app(client, behind_proxy=behind_proxy, secure_cookies=tls is not None)
    serve(app, host, port, tls=tls)


def _tls_files(cert: Path | None, key: Path | None) -> tuple[Path, Path] | None:
    """Both or neither; a pair that does not load is refused now, in one line, not by gunicorn."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise click.ClickException("give --tls-cert and --tls-key together")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise click.ClickException(f"cannot serve TLS with {cert} and {key}: {exc}") from None
    return cert, key


def _loopback(host: str) -> bool:
    """Whether only this machine can reach ``host``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--url", help="The server's address. Default: the one `gpulayer up` started on this machine.")
@click.option("--print", "print_only", is_flag=True, help="Print the address; open no browser.")
def dashboard(url: str | None, print_only: bool) -> None:
    """Open the web dashboard in a browser (log in with an API token: see `gpulayer token create`)."""
    if url is None:
        state = local.load(Settings.from_env().home)
        if state is None or not state.web_port or not local.alive(state.web_pid):
            raise click.ClickException(
                "no dashboard is served from this machine: run `gpulayer up`, or give --url"
            )
        url = f"http://127.0.0.1:{state.web_port}/"
    click.echo(url)
    if not print_only and not webbrowser.open(url):
        click.echo("no web browser found here; open the address above in one", err=True)


def _service(redis_url: str | None) -> Service:
    """The token commands' way in: API tokens are the server's, not a :class:`Client`'s."""
    return Service(open_client(redis_url, _TOKEN_ROLES))


@click.group()
def token() -> None:
    """API tokens for the HTTP API and the dashboard."""


@token.command(name="create")
@click.option("--name", required=True, help="A name to list and revoke it by: letters, digits, _ . @ -.")
@click.option("--role", type=click.Choice(get_args(Role)), required=True, help="What it may do.")
@click.option(
    "--expires",
    callback=duration,
    metavar="DURATION",
    help="It stops working after this (30d). Default: never.",
)
@redis_url_option
def create(name: str, role: Role, expires: float | None, redis_url: str | None) -> None:
    """Make a token and print it: the only time it is shown (only its hash is kept)."""
    secret, info = _service(redis_url).create_token(name, role, expires)
    until = f", until {info.expires_at.isoformat(timespec='seconds')}" if info.expires_at else ""
    click.echo(f"token {name!r} ({role}{until}):", err=True)
    click.echo(secret)


@token.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@redis_url_option
def list_tokens(as_json: bool, redis_url: str | None) -> None:
    """The tokens that still work: name, role, created, expires."""
    found = _service(redis_url).tokens()
    if as_json:
        echo_json(found)
        return
    for info in found:
        created = info.created_at.isoformat(timespec="seconds")
        expires = info.expires_at.isoformat(timespec="seconds") if info.expires_at else "never"
        click.echo(f"{info.name}  {info.role}  created {created}  expires {expires}")


@token.command(name="revoke")
@click.argument("name")
@redis_url_option
def revoke(name: str, redis_url: str | None) -> None:
    """Stop a token at once."""
    _service(redis_url).revoke_token(name)
    click.echo(f"token {name!r} revoked")
