"""What ``import gpulayer`` offers: a sorted ``__all__`` of names that exist, and one error base."""

from __future__ import annotations

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
