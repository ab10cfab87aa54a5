"""Imported, this module makes RQ's own tools see one installation: ``rq info --queue-class
gpulayer.rq_tools.Queue``, ``rq-dashboard -c gpulayer.rq_tools``, ``rq suspend``/``rq resume`` with
the same flag, or RQ's API in a script of yours that imports it (docs/workers.md).

An installation's keys, RQ's included, live under its prefix (``<prefix>:rq:...``), but RQ's tools
name keys through RQ's own classes and constants. This points them, for the importing process, at
the installation ``GPULAYER_PREFIX`` names (``gpulayer`` when unset). ``Job``, ``Queue`` and
``Worker`` are RQ's own classes, named here so that RQ's class flags import this module. GPUlayer
itself never imports it.
"""

from __future__ import annotations

from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

from .settings import Settings
from .store.rq_names import RQNames, point_rq_at

__all__ = ["Job", "Queue", "Worker"]

point_rq_at(RQNames.of(Settings.from_env().prefix))
