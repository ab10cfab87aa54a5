"""`gpulayer profiles`: the runtime profiles a submit may name, what each sets, where it was tested."""

from __future__ import annotations

import json

import click

from ..profiles import profiles as read_profiles
from ..settings import Settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, by profile name.")
def profiles(as_json: bool) -> None:
    """The runtime profiles (`submit --profile NAME`): GPUlayer's, and those of GPULAYER_PROFILES."""
    table = read_profiles(Settings.from_env().profiles)
    if as_json:
        click.echo(
            json.dumps({name: found.model_dump(mode="json") for name, found in table.items()}, indent=2)
        )
        return
    width = max(len(name) for name in table)
    for name, found in table.items():
        click.echo(f"{name.ljust(width)}  {found.sets()}")
        for line in (found.description, found.tested):
            click.echo(f"{'':{width}}  {line}")
