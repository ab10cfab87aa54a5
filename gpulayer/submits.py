"""What a submit asked for, checked before anything is written: a command's arguments, the options
and needs given as models or as keywords, and the spec they make together."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from .archive import Manifest
from .errors import InvalidJobSpec
from .models import Distributed, JobSpec, M, build_spec, validated
from .options import SubmitOptions
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
    options: SubmitOptions | None, requirements: Requirements | None, keywords: Mapping[str, Any]
) -> tuple[SubmitOptions, Requirements]:
    """What a submit asked for, checked (:class:`InvalidJobSpec`): its options and its needs, each
    given as its model or as its fields among ``keywords``."""
    given = {name: value for name, value in keywords.items() if name in _OPTION_NAMES}
    fields = {name: value for name, value in keywords.items() if name not in _OPTION_NAMES}
    return _model_or_fields(SubmitOptions, options, given, _NO_OPTIONS), _model_or_fields(
        Requirements, requirements, fields, _NO_NEEDS
    )


def command_spec(
    argv: list[str],
    options: SubmitOptions,
    requirements: Requirements,
    *,
    source: bool = False,
    inputs: Sequence[str] = (),
) -> JobSpec:
    """A command job's spec, checked (:class:`InvalidJobSpec`)."""
    return build_spec(
        command=argv,
        source=source,
        inputs=list(inputs),
        requirements=requirements,
        distributed=Distributed.of(requirements, options),
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
