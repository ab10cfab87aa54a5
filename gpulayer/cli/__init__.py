"""The ``gpulayer`` command line: a thin layer over :class:`gpulayer.Client`."""

from .access import access_group, connect
from .agents import mcp
from .app import main
from .capacity import capacity
from .jobs import cancel, gc, list_jobs, logs, outputs, status, submit, wait
from .placement import plan, resources, why, workers
from .profiles import profiles
from .server import down, up
from .web import dashboard, server, token
from .worker import join, worker

_COMMANDS = (
    up,
    down,
    worker,
    join,
    connect,
    access_group,
    workers,
    capacity,
    resources,
    submit,
    plan,
    profiles,
    list_jobs,
    status,
    why,
    logs,
    wait,
    cancel,
    outputs,
    gc,
    server,
    dashboard,
    token,
    mcp,
)
for _command in _COMMANDS:
    main.add_command(_command)

__all__ = ["main"]
