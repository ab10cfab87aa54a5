"""`gpulayer mcp`: GPUlayer's tools for coding agents, over the Model Context Protocol."""

from __future__ import annotations

import click

from .app import open_client, redis_url_option


@click.command(name="mcp")
@click.option(
    "--read-only",
    is_flag=True,
    help="Offer only the tools that change nothing: workers, plans, jobs, logs, waits.",
)
@redis_url_option
def mcp(read_only: bool, redis_url: str | None) -> None:
    """Serve GPUlayer to a coding agent on stdio, as a Model Context Protocol server (for example
    `claude mcp add gpulayer -- gpulayer mcp`): list workers, plan, submit, wait, read logs, cancel,
    download outputs. Needs the mcp extra (pip install 'gpulayer[mcp]'); see docs/agents.md."""
    try:
        from ..agents import build
    except ImportError:
        raise click.ClickException(
            "the MCP server needs the mcp extra: pip install 'gpulayer[mcp]'"
        ) from None
    build(open_client(redis_url), read_only=read_only).run("stdio")
