"""The agent skill in docs/skills/gpulayer/SKILL.md: its front matter is what agents load, and
every command it shows parses with the CLI as it is (options, choices, durations, sizes)."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import click
import pytest

from gpulayer.cli import main

SKILL = Path(__file__).resolve().parents[1] / "docs" / "skills" / "gpulayer" / "SKILL.md"


def commands() -> list[list[str]]:
    text = SKILL.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    found = [
        shlex.split(line) for block in blocks for line in block.splitlines() if line.startswith("gpulayer ")
    ]
    return [[part.replace("JOB_ID", "0123456789ab") for part in command[1:]] for command in found]


def parse(args: list[str]) -> click.Command:
    """The command ``args`` names, its options and arguments parsed as the CLI would; nothing runs."""
    command: click.Command = main
    context = main.make_context("gpulayer", list(args))
    while isinstance(command, click.Group):
        with warnings.catch_warnings():  # Click 9 puts them in args; until then, protected_args
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*context.protected_args, *context.args]
        _, found, rest = command.resolve_command(context, rest)
        assert found is not None
        command = found
        context = command.make_context(command.name or "", rest, parent=context)
    return command


def test_the_skill_has_the_front_matter_agents_load() -> None:
    front = re.match(r"---\nname: (.+)\ndescription: (.+)\n---\n", SKILL.read_text())
    assert front is not None
    assert front.group(1) == "gpulayer"
    assert 50 < len(front.group(2)) <= 1024


def test_every_command_the_skill_shows_parses() -> None:
    shown = commands()
    assert len(shown) >= 20
    names = {parse(args).name for args in shown}
    assert {"submit", "plan", "why", "logs", "outputs", "status", "wait", "workers", "cancel"} <= names


def test_a_wrong_option_in_the_skill_would_be_caught() -> None:
    with pytest.raises(click.NoSuchOption, match="--gpu"):
        parse(["submit", "--gpu", "2", "--", "true"])
