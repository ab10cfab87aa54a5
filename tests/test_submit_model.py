"""One submit model: every way to submit a job offers the options of :class:`JobOptions` (and the
requirements of :class:`Requirements`) under the same names and defaults, or a stated subset."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import typing
from typing import Any

import click
import pytest

import gpulayer as gl
from gpulayer import agents, functions
from gpulayer.calls import CallOptions
from gpulayer.cli.app import main, requirement_options
from gpulayer.job_options import JobOptions
from gpulayer.requirements import Requirements
from gpulayer.web.api import SubmitRequest
from gpulayer.web.openapi import document

OPTIONS = set(JobOptions.model_fields)
REQUIREMENTS = set(Requirements.model_fields)
#: What a list of jobs submitted together shares: an idempotency key names one job.
SHARED = OPTIONS - {"idempotency_key"}
#: What a remote function's calls take of a command job's options: no files, no command of their own,
#: no name (a call's name is its function's), and no key (each call is a new job).
CALL_OPTIONS = OPTIONS - {"env", "outputs", "name", "idempotency_key", "fail_if_unschedulable"}


def keywords(function: Any) -> dict[str, Any]:
    """The keyword-only parameters of ``function``, with their defaults."""
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def defaults(names: set[str]) -> dict[str, Any]:
    """What the model gives each option when a caller gives none (an empty dict or list as none)."""
    fields = JobOptions.model_fields
    return {name: None if fields[name].default_factory else fields[name].default for name in names}


def test_client_submit_takes_every_option_with_the_models_default() -> None:
    given = keywords(gl.Client.submit)
    # The requirements come as a Requirements (what the API and MCP pass), or as its fields' keywords.
    assert set(given) == OPTIONS | {"source", "inputs", "requirements"}
    assert {name: given[name] for name in OPTIONS} == defaults(OPTIONS) | {"env": None, "outputs": ()}


def test_client_submit_many_takes_every_option_a_list_shares() -> None:
    given = keywords(gl.Client.submit_many)
    assert set(given) == SHARED | {"requirements"}
    assert given == defaults(SHARED) | {"env": None, "outputs": (), "requirements": None}


def test_the_api_body_and_its_openapi_schema_derive_from_the_model() -> None:
    assert issubclass(SubmitRequest, JobOptions)
    assert set(SubmitRequest.model_fields) == OPTIONS | {"command", "requirements"}
    schema = document()["components"]["schemas"]["SubmitRequest"]
    assert set(schema["properties"]) == OPTIONS | {"command", "requirements"}
    for name in OPTIONS:
        assert schema["properties"][name]["description"] == JobOptions.model_fields[name].description


def cli_options(command: click.Command) -> dict[str, click.Parameter]:
    return {param.name: param for param in command.params if param.name}


def test_the_cli_submit_has_an_option_per_field_and_per_requirement() -> None:
    submit = main.commands["submit"]
    params = cli_options(submit)
    local = {"source", "inputs", "wait", "dest", "redis_url", "command", "gpus_per_node"}
    # A parameter's name is the keyword it is passed to Client.submit under.
    assert set(params) == OPTIONS | REQUIREMENTS | local
    assert params["priority"].default == JobOptions.model_fields["priority"].default


def test_plan_and_submit_share_the_requirement_options() -> None:
    @click.command()
    @requirement_options
    def probe(**_: Any) -> None: ...

    assert set(cli_options(probe)) == REQUIREMENTS
    assert set(cli_options(main.commands["plan"])) == REQUIREMENTS | {"redis_url"}


def test_a_remote_functions_options_are_the_models_for_calls() -> None:
    fields = {field.name: field for field in dataclasses.fields(CallOptions)}
    # allow_pickle is no job option: how far the caller trusts workers with what their results hold.
    own = {"requirements", "fresh_process", "source", "allow_pickle"}
    assert set(fields) == CALL_OPTIONS | own
    for name in CALL_OPTIONS:
        assert fields[name].default == JobOptions.model_fields[name].default, name
    # remote()'s keywords: the requirements, the call options, and the client to submit with.
    [_, decorator] = typing.get_overloads(functions.remote)
    assert set(keywords(decorator)) == REQUIREMENTS | (set(fields) - {"requirements"}) | {"client"}


@pytest.mark.parametrize("remote", [False, True])
def test_the_mcp_submit_tool_offers_a_subset_under_the_same_names(remote: bool) -> None:
    server = agents.build(gl.Client("redis://127.0.0.1:1/0"), remote=remote)
    tools = {tool.name: tool for tool in asyncio.run(server.list_tools())}
    given = set(tools["submit_job"].input_schema["properties"])
    files = {"source_archive"} if remote else {"source", "inputs"}
    assert {"command", "requirements", *files} <= given
    assert given - {"command", "requirements", *files} <= OPTIONS
