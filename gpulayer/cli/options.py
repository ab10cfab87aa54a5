"""Click options made from a pydantic model's fields: each option's flag, type, bounds and help come
from the field, written once in the model (gpulayer/options.py), never again here."""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import annotated_types
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .app import F, duration, key_values
from .flags import flag, given, is_duration


def model_options(model: type[BaseModel], files: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """An option per field of ``model``, in its order. Each defaults to None (a flag to False): the
    command passes on only what was given, and the model applies its own defaults. ``files`` names
    text fields given as a file to read instead, with the flag each takes (``--requirements FILE``
    gives ``requirements_text`` the file's text)."""

    def decorate(command: F) -> F:
        for name, field in reversed(model.model_fields.items()):
            flag = (files or {}).get(name)
            command = (_file_option(flag, name, field) if flag else _option(name, field))(command)
        return command

    return decorate


def _file_option(flag: str, name: str, field: FieldInfo) -> Callable[[F], F]:
    def read(ctx: click.Context, param: click.Parameter, path: Path | None) -> str | None:
        try:
            return None if path is None else path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {path}: {exc}") from None

    return click.option(
        "--" + flag,
        name,
        type=click.Path(dir_okay=False, path_type=Path),
        callback=read,
        metavar="FILE",
        help=f"{field.description} Its text is read now and travels in the job.",
    )


#: Where a field's name does not say what its value is.
_METAVARS = {"pip": "SPEC", "profile": "NAME"}


def _option(name: str, field: FieldInfo) -> Callable[[F], F]:
    kind = given(field.annotation)
    text = (field.description or "") + _default(field)
    option = flag(name, field)
    if kind is bool:
        return click.option(option, name, is_flag=True, help=text)
    if typing.get_origin(kind) is Literal:
        return click.option(option, name, type=click.Choice(typing.get_args(kind)), help=text)
    if kind is int:
        return click.option(option, name, type=click.IntRange(*_bounds(field)), help=text)
    if is_duration(field):
        return click.option(option, name, callback=duration, metavar="DURATION", help=text)
    if typing.get_origin(kind) is dict:
        return click.option(
            option, name, multiple=True, metavar="NAME=VALUE", callback=key_values, help=text + " Repeatable."
        )
    if typing.get_origin(kind) is list:  # --output OUTPUT, once per item
        single = name.removesuffix("s")
        metavar = _METAVARS.get(name, single.upper())
        return click.option(option, name, multiple=True, metavar=metavar, help=text + " Repeatable.")
    return click.option(option, name, metavar=_METAVARS.get(name, name.rpartition("_")[2].upper()), help=text)


def _bounds(field: FieldInfo) -> tuple[int | None, int | None]:
    low = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
    high = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
    return typing.cast("int | None", low), typing.cast("int | None", high)


def _default(field: FieldInfo) -> str:
    default = field.get_default(call_default_factory=True)
    if default is None or default is False or default in ([], {}):
        return ""
    shown = f"{default:g}s" if isinstance(default, float) else str(default)
    return f" Default: {shown}."
