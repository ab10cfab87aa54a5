"""Imported, this module makes RQ's own tools see one installation: ``rq info --queue-class
gpulayer.rq_tools.Queue``, ``rq-dashboard -c gpulayer.rq_tools``, ``rq suspend``/``rq resume`` with
the same flag, or RQ's API in a script of yours that imports it (docs/workers.md).

An installation's keys, RQ's included, live under its prefix (``<prefix>:rq:...``), but RQ's tools
name keys through RQ's own classes and constants. This points them, for the importing process, at
the installation ``GPULAYER_PREFIX`` names (``gpulayer`` when unset). ``Job``, ``Queue`` and
``Worker`` are RQ's own classes, named here so that RQ's class flags import this module. GPUlayer
itself never imports it.

Given a Sentinel URL in ``GPULAYER_REDIS_URL``, it also holds RQ's ``SENTINEL`` setting, which RQ's CLI
reads from it as a config module (``rq info -c gpulayer.rq_tools``): RQ's own ``--url`` takes no
Sentinel URL.
"""

from __future__ import annotations

from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

from . import sentinel
from .settings import Settings
from .store.rq_names import RQNames, point_rq_at

__all__ = ["Job", "Queue", "Worker"]

_settings = Settings.from_env()
point_rq_at(RQNames.of(_settings.prefix))
if _settings.redis_url and sentinel.is_sentinel(_settings.redis_url):
    _found = sentinel.parse(_settings.redis_url)
    SENTINEL = {
        "INSTANCES": list(_found.sentinels),
        "MASTER_NAME": _found.master,
        "DB": _found.db,
        "USERNAME": _found.username,
        "PASSWORD": _found.password,
        "SSL": _found.tls,
    }
