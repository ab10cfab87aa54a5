"""Sizes and durations as people write them, and sizes as people read them."""

from __future__ import annotations

import pytest

from gpulayer.units import format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("24GB", 24 * 10**9),
        ("1GiB", 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5 GB", 1_500_000_000),
        ("2kb", 2000),
        ("7KiB", 7 * 1024),
        ("1TB", 10**12),
        ("100B", 100),
        ("123", 123),
        (" 64 MB ", 64 * 10**6),
        (4096, 4096),
    ],
)
def test_a_size_is_read_in_decimal_or_binary_units(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-5MB", "5 XB", "GB", "1.2.3GB", "5 MB extra"])
def test_a_size_that_is_not_one_raises_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not a size: .* \(examples: 512MB, 24GB, 1GiB\)$"):
        parse_size(text)


def test_a_fractional_size_is_not_cut_short_by_float_rounding() -> None:
    assert parse_size("4.1GB") == 4_100_000_000
    assert parse_size("8.2GB") == 8_200_000_000


def test_a_binary_prefix_without_b_is_binary_or_refused() -> None:
    try:
        size = parse_size("10Mi")
    except ValueError:
        return
    assert size == 10 * 2**20


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("30d", 2_592_000.0), ("1.5h", 5400.0)],
)
def test_a_duration_is_read_in_seconds_minutes_hours_or_days(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_number_is_already_a_duration_in_seconds() -> None:
    assert parse_duration(12) == 12.0
    assert parse_duration(0.5) == 0.5


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5w", "2 hours", "m"])
def test_a_duration_that_is_not_one_raises_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not a duration: .* \(examples: 90, 90s, 15m, 2h, 30d\)$"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (3 * 2**20 + 2**19, "3.5 MiB"),
        (2**30, "1.0 GiB"),
        (5 * 2**40, "5.0 TiB"),
    ],
)
def test_a_size_is_shown_in_binary_units_with_one_decimal(size: int, text: str) -> None:
    assert format_size(size) == text


def test_a_size_just_under_a_unit_is_not_shown_as_1024_of_the_smaller_one() -> None:
    assert format_size(2**20 - 1) == "1.0 MiB"
