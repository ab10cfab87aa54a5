"""The processes a runner follows, and their output cut into log lines: complete lines, long ones
split at the line cap, each with the rank of the gang job that printed it (None for other jobs)."""

from __future__ import annotations

import dataclasses
import os
import re

from .spawning import Started

#: A log line: stream, text, rank.
Line = tuple[str, str, int | None]
_READ = 65536
#: torchrun's prefix on each line a rank prints (``--tee``): its role and local rank.
_TORCHRUN_PREFIX = re.compile(rb"^\[default(\d+)\]:")


@dataclasses.dataclass(eq=False)
class Tracked:
    """One process being followed: a job's command, an executor, a rank of a gang job, or the
    torchrun that starts a node's ranks."""

    process: Started
    #: The rank whose lines these are; None for a job that is not a gang job, or for torchrun.
    rank: int | None = None
    #: For torchrun: the global rank of the node's local rank 0 (its lines carry their local rank).
    torchrun_base: int | None = None
    #: Open output streams.
    streams: int = 2
    #: A pidfd readable once the process exits, where the platform has one.
    notifier: int | None = None
    exited_at: float | None = None
    #: Its return code, once reaped (negative: the signal that killed it).
    returncode: int | None = None
    partial: dict[str, bytes] = dataclasses.field(default_factory=lambda: {"stdout": b"", "stderr": b""})

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def done(self) -> bool:
        """Exited, and its output read to the end."""
        return self.exited_at is not None and not self.streams

    def read(self, fd: int, stream: str, lines: list[Line], cap: int, drain: bool = False) -> bool:
        """Read what one stream has into ``lines``; False at its end (or, draining, once it is empty)."""
        try:
            chunk = os.read(fd, _READ)
        except BlockingIOError:
            return not drain
        if chunk:
            lines.extend(self._split(stream, chunk, cap))
            return True
        self.flush(lines, stream)
        return False

    def flush(self, lines: list[Line], stream: str) -> None:
        """What is left of an unfinished line, as a line."""
        if self.partial[stream]:
            lines.append(self._line(stream, self.partial[stream]))
            self.partial[stream] = b""

    def _split(self, stream: str, chunk: bytes, cap: int) -> list[Line]:
        *complete, rest = (self.partial[stream] + chunk).split(b"\n")
        lines: list[Line] = []
        for raw in complete:
            line = raw.removesuffix(b"\r")
            lines.extend(self._line(stream, line[i : i + cap]) for i in range(0, max(len(line), 1), cap))
        while len(rest) > cap:
            lines.append(self._line(stream, rest[:cap]))
            rest = rest[cap:]
        self.partial[stream] = rest
        return lines

    def _line(self, stream: str, raw: bytes) -> Line:
        if self.torchrun_base is not None:
            prefix = _TORCHRUN_PREFIX.match(raw)
            if prefix:
                return stream, text(raw[prefix.end() :]), self.torchrun_base + int(prefix.group(1))
        return stream, text(raw), self.rank


def text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
