"""One submit model: each option's bounds, default and description are written once, in
gpulayer/options.py, and every way to submit a job takes its options from there, under the same
names, or a stated subset."""

from __future__ import annotations

import asyncio
import inspect
import typing
from typing import Any

import click
import pytest

import gpulayer as gl
from gpulayer import agents, functions, submits
from gpulayer.cli.app import main, requirement_options
from gpulayer.models import JobSpec
from gpulayer.options import CallKeywords, CallOptions, CommandOptions, SubmitKeywords, SubmitOptions
from gpulayer.requirements import RequirementKeywords, Requirements
from gpulayer.web.api import SubmitRequest
from gpulayer.web.openapi import document

OPTIONS = set(SubmitOptions.model_fields)
REQUIREMENTS = set(Requirements.model_fields)
#: The requirements the CLI has a flag for: the machine a --target is relative to is the one it runs on.
REQUIREMENT_FLAGS = REQUIREMENTS - {"machine"}


def keys(typed: Any) -> set[str]:
    return set(typed.__optional_keys__ | typed.__required_keys__)


def keywords(function: Any) -> dict[str, Any]:
    """The keyword-only parameters of ``function``, with their defaults."""
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_the_keywords_are_the_models_fields() -> None:
    assert keys(RequirementKeywords) == REQUIREMENTS
    assert keys(SubmitKeywords) == OPTIONS | REQUIREMENTS
    assert keys(CallKeywords) == set(CallOptions.model_fields) - {"requirements"} | REQUIREMENTS
    assert keys(functions.RemoteKeywords) == keys(CallKeywords) | {"client"}


def test_a_jobs_spec_keeps_the_options_fields_as_they_are() -> None:
    """The spec composes the command options: the same fields, bounds and defaults, not a copy."""
    assert issubclass(JobSpec, CommandOptions)
    for name, field in CommandOptions.model_fields.items():
        assert JobSpec.model_fields[name].default == field.default, name
        assert JobSpec.model_fields[name].metadata == field.metadata, name
    spec = JobSpec(command=["true"])
    assert (spec.retries, spec.retry_on, spec.retry_delay) == (2, "lost", 1.0)


def test_client_submit_takes_the_options_as_a_model_or_as_keywords() -> None:
    assert set(keywords(gl.Client.submit)) == {"source", "inputs", "requirements", "options"}
    assert set(keywords(gl.Client.submit_many)) == {"requirements", "options"}
    assert typing.get_type_hints(gl.Client.submit)["options"] == SubmitOptions | None


def test_an_option_given_as_none_takes_its_default() -> None:
    assert SubmitOptions.model_validate({"retries": None, "priority": None}) == SubmitOptions()


def test_the_api_body_and_its_openapi_schema_derive_from_the_model() -> None:
    assert issubclass(SubmitRequest, SubmitOptions)
    assert set(SubmitRequest.model_fields) == OPTIONS | {"command", "requirements"}
    schema = document()["components"]["schemas"]["SubmitRequest"]
    assert set(schema["properties"]) == OPTIONS | {"command", "requirements"}
    for name in OPTIONS:
        assert schema["properties"][name]["description"] == SubmitOptions.model_fields[name].description
    # The bounds the server enforces are the ones it publishes.
    assert (schema["properties"]["priority"]["minimum"], schema["properties"]["priority"]["maximum"]) == (
        -1000,
        1000,
    )
    assert schema["properties"]["retries"]["maximum"] == 100
    assert schema["properties"]["retry_delay"]["maximum"] == 3600
    assert schema["properties"]["retries"]["default"] == 2


def cli_options(command: click.Command) -> dict[str, click.Parameter]:
    return {param.name: param for param in command.params if param.name}


def test_the_cli_submit_has_an_option_per_field_and_per_requirement() -> None:
    submit = main.commands["submit"]
    params = cli_options(submit)
    local = {"source", "inputs", "wait", "wait_for_capacity", "dest", "redis_url", "command", "gpus_per_node"}
    # A parameter's name is the keyword it is passed to Client.submit under.
    assert set(params) == OPTIONS | REQUIREMENT_FLAGS | local
    for name in OPTIONS:
        option = params[name]
        assert isinstance(option, click.Option)
        assert (option.help or "").startswith(SubmitOptions.model_fields[name].description or "?"), name
    priority = params["priority"]
    assert isinstance(priority.type, click.IntRange)
    assert (priority.type.min, priority.type.max) == (-1000, 1000)
    assert "Default: 2." in (cast_option(params["retries"]).help or "")
    assert cast_option(params["outputs"]).opts == ["--output"]
    assert cast_option(params["fail_if_unschedulable"]).is_flag


def cast_option(param: click.Parameter) -> click.Option:
    assert isinstance(param, click.Option)
    return param


def test_plan_and_submit_share_the_requirement_options() -> None:
    @click.command()
    @requirement_options
    def probe(**_: Any) -> None: ...

    assert set(cli_options(probe)) == REQUIREMENT_FLAGS
    assert set(cli_options(main.commands["plan"])) == REQUIREMENT_FLAGS | {"redis_url"}


def test_a_remote_functions_options_share_the_run_options() -> None:
    for name in set(CallOptions.model_fields) & OPTIONS:
        assert CallOptions.model_fields[name].default == SubmitOptions.model_fields[name].default, name
        assert CallOptions.model_fields[name].metadata == SubmitOptions.model_fields[name].metadata, name
    # What a call has no use for: files, a name of its own (its function's), a key naming one job.
    assert OPTIONS - set(CallOptions.model_fields) == {
        "env",
        "outputs",
        "name",
        "idempotency_key",
        "fail_if_unschedulable",
    }


@pytest.mark.parametrize("remote", [False, True])
def test_the_mcp_submit_tools_take_the_model(remote: bool) -> None:
    server = agents.build(gl.Client("redis://127.0.0.1:1/0"), remote=remote)
    tools = {tool.name: tool for tool in asyncio.run(server.list_tools())}
    schema = tools["submit_job"].input_schema
    files = {"source_archive"} if remote else {"source", "inputs"}
    assert set(schema["properties"]) == {"command", "requirements", "options", *files}
    [options, _] = schema["properties"]["options"]["anyOf"]
    assert options == SubmitOptions.model_json_schema()


def test_options_and_requirements_come_as_their_model_or_as_keywords_not_both() -> None:
    options, needs = submits.options_and_needs(None, None, {"retries": 0, "gpus": 1})
    assert (options.retries, needs.gpus) == (0, 1)
    given = SubmitOptions(priority=5)
    assert submits.options_and_needs(given, None, {})[0] is given
    for model, keywords, message in (
        (
            SubmitOptions(),
            {"retries": 0},
            "retries: give a SubmitOptions or its fields as keywords, not both",
        ),
        (Requirements(), {"gpus": 1}, "gpus: give a Requirements or its fields as keywords, not both"),
    ):
        options_given = model if isinstance(model, SubmitOptions) else None
        needs_given = model if isinstance(model, Requirements) else None
        with pytest.raises(gl.InvalidJobSpec, match=f"^invalid job: {message}$"):
            submits.options_and_needs(options_given, needs_given, keywords)
