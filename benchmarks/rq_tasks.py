"""The plain-RQ side of the benchmarks: the same work as a GPUlayer command job, as an RQ function."""

import subprocess


def run_command(*command: str) -> int:
    """Run a command in a subprocess, as a GPUlayer worker does, and return its exit code."""
    return subprocess.run(command, check=False).returncode


def noop(x: object) -> object:
    """A call that does nothing but return its argument: what `sdk_map.py` measures."""
    return x
