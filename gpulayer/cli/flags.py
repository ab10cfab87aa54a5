"""The flag each field of a submit's models is given as, and a validation error said in flags:
``invalid job: --retry-delay: at most 1h``, not ``retry_delay: Input should be less than or equal
to 3600``."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic.fields import FieldInfo

from ..errors import InvalidJobSpec
from ..options import SubmitOptions
from ..requirements import Requirements
from ..units import format_duration

#: Fields whose flag is not their name's: given once per item, or as a file.
_NAMED = {"labels": "--label", "requirements_text": "--requirements"}
_FIELDS: dict[str, FieldInfo] = {**Requirements.model_fields, **SubmitOptions.model_fields}
#: pydantic's bound errors, said in a bound's words.
_BOUNDS = {
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "more than"),
}


def flag(name: str, field: FieldInfo) -> str:
    """``--retry-delay`` for ``retry_delay``; ``--output`` for the list ``outputs`` (given once per item)."""
    if name in _NAMED:
        return _NAMED[name]
    text = "--" + name.replace("_", "-")
    return text.removesuffix("s") if typing.get_origin(given(field.annotation)) is list else text


def given(annotation: Any) -> Any:
    """The type an option is given as: ``int | None`` is an ``int`` option that may be left out."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        [kind] = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return kind
    return annotation


def is_duration(field: FieldInfo) -> bool:
    """Every float option is a span of time: given as 90, 90s, 15m, 2h."""
    return given(field.annotation) is float


def said_in_flags(error: InvalidJobSpec) -> str | None:
    """The error as the command line's: its flag and, for a bound, the bound (a duration as one);
    None where no flag is at fault."""
    field = _FIELDS.get(error.field or "")
    if field is None or error.field is None or error.problem is None:
        return None
    return f"invalid job: {flag(error.field, field)}: {_problem(field, error.problem)}"


def _problem(field: FieldInfo, problem: Mapping[str, Any]) -> str:
    bound = _BOUNDS.get(str(problem["type"]))
    if bound is None:
        return str(problem["msg"]).removeprefix("Value error, ")
    key, words = bound
    value = problem["ctx"][key]
    return f"{words} {format_duration(value) if is_duration(field) else value}"
