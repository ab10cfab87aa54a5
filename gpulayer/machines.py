"""Which machine this is, as a job's ``target`` (local, remote) compares a worker's with its
submitter's: not by host name, which two machines may share (``localhost``, cloned images).

A machine is its running kernel: on Linux its boot id, which differs between any two kernels (and
at each boot) and is the same for every container of one host; elsewhere the machine id the system
keeps, else the host name and hardware address. Published only as a keyed digest: systemd asks that
a machine id itself never be shown.
"""

from __future__ import annotations

import functools
import hashlib
import socket
import uuid
from pathlib import Path

_SOURCES = (
    Path("/proc/sys/kernel/random/boot_id"),
    Path("/etc/machine-id"),
    Path("/var/lib/dbus/machine-id"),
)


@functools.cache
def this_machine() -> str:
    """This machine's identity: 32 hex digits, the same for every process of it."""
    return hashlib.sha256(b"gpulayer machine\0" + _raw_identity().encode()).hexdigest()[:32]


def _raw_identity() -> str:
    for source in _SOURCES:
        try:
            text = source.read_text().strip()
        except OSError:
            continue
        if text:
            return f"{source.name}:{text}"
    return f"host:{socket.gethostname()}:{uuid.getnode():012x}"
