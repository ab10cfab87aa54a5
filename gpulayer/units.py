"""Byte sizes and durations as people write them: ``24GB``, ``512MiB``, ``1.5 GB``, ``90s``, ``30d``."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGTP])(I)?)?B?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(text: str | int) -> int:
    """Bytes from ``"24GB"``; decimal units (GB = 10**9) and binary ones (GiB or Gi = 2**30) both work."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 512MB, 24GB, 1GiB)")
    number, unit, binary = match.groups()
    power = "KMGTP".index(unit.upper()) + 1 if unit else 0
    multiplier: int = (1024 if binary else 1000) ** power
    return round(float(number) * multiplier)


def parse_duration(text: str | float) -> float:
    """Seconds from ``"90"``, ``"90s"``, ``"15m"``, ``"2h"`` or ``"30d"``."""
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (examples: 90, 90s, 15m, 2h, 30d)")
    number, unit = match.groups()
    return float(number) * _SECONDS[unit.lower()]


def format_duration(seconds: float) -> str:
    """``"1h"``, ``"90s"``, ``"1.5d"``: in the largest unit of at least one, as :func:`parse_duration`
    reads it."""
    for unit in ("d", "h", "m"):
        if seconds >= _SECONDS[unit]:
            return f"{seconds / _SECONDS[unit]:g}{unit}"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """``"3.2 MiB"``: binary units, one decimal."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if round(value, 1) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_span(seconds: float) -> str:
    """``45 s``, ``2 min``, ``1.5 h``: a span of time as people say it."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
