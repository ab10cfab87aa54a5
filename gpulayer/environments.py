"""A job's own Python environment, as its spec keeps it: the requirements uv installs into it.

Made at submit from ``pip`` specs, a requirements file's text, a project's ``uv.lock`` or
``pyproject.toml`` and a profile's specs, and read the same way by the worker that builds it. Each
requirement is one PEP 508 line naming a package by name: no URL, no path, no option (``-r``,
``--index-url``, ``-e``): the packages come from the index the worker's machine is configured with,
never from a host the job names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, field_validator

#: The most requirements one environment may list.
MAX_REQUIREMENTS = 1000
#: The longest requirement line taken.
MAX_REQUIREMENT_CHARS = 1000


def requirement_line(text: str) -> str:
    """``text`` as one normalised requirement line; ValueError unless it is a PEP 508 requirement
    naming a package by name (a version, extras and markers allowed; a URL or path not)."""
    try:
        requirement = Requirement(text.strip())
    except InvalidRequirement as exc:
        raise ValueError(f"{text.strip()!r} is not a requirement (PEP 508): {exc}") from None
    if requirement.url:
        raise ValueError(
            f"{text.strip()!r} names a URL: a job's packages come from its worker's package index"
        )
    return str(requirement)


def requirements_file_lines(text: str) -> list[str]:
    """The requirements in a requirements file's ``text``, one a line (comments and blank lines
    skipped, continued lines joined); ValueError for an option line (``-r``, ``--index-url``, ``-e``,
    ...): what a job's packages come from is its worker's, not the job's, to say."""
    lines = []
    for raw in text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ValueError(
                f"{line!r}: a requirements file may list requirements only, no options "
                "(the worker's own package index serves them)"
            )
        lines.append(line)
    return lines


def merged(base: Iterable[str], given: Iterable[str]) -> list[str]:
    """``base``'s requirements with ``given``'s added, a given one replacing base's of the same
    package (a profile's ``torch`` gives way to ``--pip torch==2.5.1``)."""
    given = list(given)
    named = {canonicalize_name(Requirement(text).name) for text in given}
    return [text for text in base if canonicalize_name(Requirement(text).name) not in named] + given


class PythonEnvironment(BaseModel):
    """The Python environment a job runs in: what uv installs into a fresh virtual environment of its
    worker's Python. Two jobs asking for the same requirements share one, built once per machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: PEP 508 requirement lines, normalised, without duplicates, sorted.
    requirements: tuple[str, ...] = Field(min_length=1, max_length=MAX_REQUIREMENTS)

    @field_validator("requirements", mode="before")
    @classmethod
    def _normalised(cls, requirements: object) -> object:
        if not isinstance(requirements, list | tuple) or not all(isinstance(r, str) for r in requirements):
            return requirements  # the field's own type check says what is wrong
        for text in requirements:
            if len(text) > MAX_REQUIREMENT_CHARS:
                raise ValueError(f"a requirement is longer than {MAX_REQUIREMENT_CHARS} characters")
        return tuple(sorted({requirement_line(text) for text in requirements}))

    def key(self, interpreter: str) -> str:
        """What names its build on a machine: the SHA-256 of its requirements and ``interpreter``
        (the Python and platform it is built for)."""
        text = json.dumps({"requirements": self.requirements, "python": interpreter}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self, most: int = 3) -> str:
        """Its requirements on one line, the first ``most`` of them named."""
        shown = ", ".join(self.requirements[:most])
        more = len(self.requirements) - most
        return shown + (f" and {more} more" if more > 0 else "")
