"""The ``gpulayer`` command line: a thin layer over :class:`gpulayer.Client`."""

from .app import main
from .jobs import cancel, list_jobs, logs, outputs, status, submit, wait
from .server import down, up
from .worker import join, worker

for _command in (up, down, worker, join, submit, list_jobs, status, logs, wait, cancel, outputs):
    main.add_command(_command)

__all__ = ["main"]
