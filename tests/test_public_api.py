"""What ``import gpulayer`` offers: a sorted ``__all__`` of names that exist, one error base, and a
``Client`` and ``Job`` whose methods are the ones docs/python.md documents."""

from __future__ import annotations

import re
from pathlib import Path

import gpulayer


def isort_order(name: str) -> tuple[int, str]:
    """The order ruff keeps ``__all__`` in: constants, then classes, then the rest."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_every_name_in_it_exists() -> None:
    assert gpulayer.__all__ == sorted(gpulayer.__all__, key=isort_order)
    assert len(set(gpulayer.__all__)) == len(gpulayer.__all__)
    assert [name for name in gpulayer.__all__ if not hasattr(gpulayer, name)] == []


def test_every_exported_exception_derives_from_gpulayer_error() -> None:
    exported = [getattr(gpulayer, name) for name in gpulayer.__all__]
    errors = [value for value in exported if isinstance(value, type) and issubclass(value, Exception)]
    assert gpulayer.GpulayerError in errors
    assert gpulayer.WaitTimeout in errors
    assert [error for error in errors if not issubclass(error, gpulayer.GpulayerError)] == []


def test_every_error_in_the_errors_module_is_exported() -> None:
    from gpulayer import errors

    defined = {name for name, value in vars(errors).items() if isinstance(value, type)}
    assert defined <= set(gpulayer.__all__)


def documented_methods(heading: str) -> set[str]:
    """The methods the table under ``heading`` in docs/python.md names: its rows ``| `name(...)` |``."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "python.md").read_text()
    section = text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)\(", section, re.MULTILINE))


def public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_a_client_offers_exactly_the_methods_the_docs_list() -> None:
    # What a server needs beyond these lives in gpulayer.service, not on the client.
    assert public_methods(gpulayer.Client) == documented_methods("`Client(")


def test_a_job_offers_exactly_the_methods_the_docs_list() -> None:
    assert public_methods(gpulayer.Job) == documented_methods("`Job`")
