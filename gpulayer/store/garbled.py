"""Records anything that reaches Redis could have written: each is read on its own, and one that
cannot be read is left out, and said in the log, never raised, so one garbled record breaks neither
a listing nor a worker (a job's own record is read field by field instead: ``JobStore``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("gpulayer")
T = TypeVar("T")
#: What reading a garbled record raises: bad JSON or UTF-8, a failed validation, a missing field.
READ_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)


def readable(parse: Callable[[], T], what: str) -> T | None:
    """``parse()``, or None (and a warning naming ``what``) if the record cannot be read."""
    try:
        return parse()
    except READ_ERRORS as exc:
        log.warning("%s cannot be read, and is left out: %s", what, " ".join(str(exc).split())[:200])
        return None
