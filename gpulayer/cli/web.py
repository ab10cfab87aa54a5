"""Commands about the HTTP API and dashboard: `server`, `dashboard`, and the API tokens (`token
create`, `list`, `revoke`)."""

from __future__ import annotations

import json
import webbrowser
from typing import get_args

import click

from .. import home as local
from ..models import Role
from ..settings import Settings
from .app import duration, open_client, redis_url_option


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@redis_url_option
def server(host: str, port: int, redis_url: str | None) -> None:
    """Serve the HTTP API (see docs/api.md) in the foreground, with gunicorn."""
    # Imported here: only this command needs Flask and gunicorn.
    from ..web import create_app
    from ..web.serve import serve

    client = open_client(redis_url)
    click.echo(
        f"serving the GPUlayer API and dashboard on http://{host}:{port}/ (Redis: {client!r})", err=True
    )
    serve(create_app(client), host, port)


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
    secret, info = open_client(redis_url).create_token(name, role, expires)
    until = f", until {info.expires_at.isoformat(timespec='seconds')}" if info.expires_at else ""
    click.echo(f"token {name!r} ({role}{until}):", err=True)
    click.echo(secret)


@token.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@redis_url_option
def list_tokens(as_json: bool, redis_url: str | None) -> None:
    """The tokens that still work: name, role, created, expires."""
    found = open_client(redis_url).tokens()
    if as_json:
        click.echo(json.dumps([info.model_dump(mode="json") for info in found], indent=2))
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
    open_client(redis_url).revoke_token(name)
    click.echo(f"token {name!r} revoked")
