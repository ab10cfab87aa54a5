"""What a submit asked for, checked before anything is written: a command's arguments, the options
and needs given as models or as keywords, and the spec they make together."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .archive import Manifest
from .environments import PythonEnvironment, merged, requirement_line, requirements_file_lines
from .errors import InvalidJobSpec
from .models import Distributed, JobSpec, M, build_spec, validated
from .options import EnvironmentOptions, SubmitOptions
from .profiles import profile
from .projects import project_requirements
from .requirements import Requirements


def argv(command: str | Sequence[str]) -> list[str]:
    """A command as its arguments: a string is split as a shell would."""
    try:
        return shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError as exc:  # an unclosed quote
        raise InvalidJobSpec(f"invalid job: command: {exc}") from None


_NO_NEEDS = Requirements()


#: The options of a submit that gives none: made once, as most submits give none.
_NO_OPTIONS = SubmitOptions()
_OPTION_NAMES = frozenset(SubmitOptions.model_fields)


def options_and_needs(
    options: SubmitOptions | None,
    requirements: Requirements | None,
    keywords: Mapping[str, Any],
    profiles: Path | None = None,
) -> tuple[SubmitOptions, Requirements]:
    """What a submit asked for, checked (:class:`InvalidJobSpec`): its options and its needs, each
    given as its model or as its fields among ``keywords``; the needs its profile sets (from
    GPUlayer's and ``profiles``, a user's file) under those given as fields."""
    given = {name: value for name, value in keywords.items() if name in _OPTION_NAMES}
    fields = {name: value for name, value in keywords.items() if name not in _OPTION_NAMES}
    chosen = _model_or_fields(SubmitOptions, options, given, _NO_OPTIONS)
    if chosen.profile is not None and requirements is None:
        fields = needs_of_profile(chosen.profile, profiles, fields)
    return chosen, _model_or_fields(Requirements, requirements, fields, _NO_NEEDS)


def needs_of_profile(name: str, profiles: Path | None, given: Mapping[str, Any]) -> dict[str, Any]:
    """The requirement fields the profile ``name`` sets, with ``given`` over them."""
    return {**profile(name, profiles).requirement_fields(), **given}


def environment(
    options: EnvironmentOptions, source: Path | None, profiles: Path | None = None
) -> PythonEnvironment | None:
    """The Python environment the options ask for (None: the worker's own), checked: the profile's
    packages, with those given (``pip``, the requirements file's, the project's) over them."""
    if not options.brings_environment:
        return None
    given = [*options.pip]
    if options.project_env:
        given += project_requirements(source)
    try:
        given += requirements_file_lines(options.requirements_text or "")
        given = [requirement_line(text) for text in given]
    except ValueError as exc:
        raise InvalidJobSpec(f"invalid job: requirements: {exc}") from None
    base = profile(options.profile, profiles).pip if options.profile else ()
    lines = merged(base, given)
    return validated(PythonEnvironment, {"requirements": lines}) if lines else None


def command_spec(
    argv: list[str],
    options: SubmitOptions,
    requirements: Requirements,
    *,
    source: bool = False,
    inputs: Sequence[str] = (),
    environment: PythonEnvironment | None = None,
) -> JobSpec:
    """A command job's spec, checked (:class:`InvalidJobSpec`)."""
    return build_spec(
        command=argv,
        source=source,
        inputs=list(inputs),
        requirements=requirements,
        distributed=Distributed.of(requirements, options),
        environment=environment,
        **options.kept(),
    )


def _model_or_fields(model: type[M], given: M | None, fields: Mapping[str, Any], default: M) -> M:
    """``given``, or ``model`` made of ``fields`` (``default`` for none), checked; not both."""
    if given is None:
        return validated(model, fields) if fields else default
    if fields:
        raise InvalidJobSpec(
            f"invalid job: {', '.join(fields)}: give a {model.__name__} or its fields as keywords, not both"
        )
    return given


def no_input_over_the_source(source: Manifest, inputs: Manifest) -> None:
    """An input lands in the job's folder beside the source: it may not take a source file's place."""
    for name, path in inputs.members.items():
        shipped = source.members.get(name)
        if shipped is not None and not (shipped.is_dir() and path.is_dir()):
            raise InvalidJobSpec(f"invalid job: the input {name!r} would replace the source's {name!r}")
