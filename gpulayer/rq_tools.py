"""Imported, this module makes RQ's own tools see one installation: ``rq info --queue-class
gpulayer.rq_tools.Queue``, ``rq-dashboard -c gpulayer.rq_tools``, ``rq suspend``/``rq resume`` with
the same flag, or RQ's API in a script of yours that imports it (docs/workers.md).

An installation's keys, RQ's included, live under its prefix (``<prefix>:rq:...``), but RQ's tools
name keys through RQ's own classes and constants. This points them, for the importing process, at
the installation ``GPULAYER_PREFIX`` names (``gpulayer`` when unset). ``Job``, ``Queue`` and
``Worker`` are RQ's own classes, named here so that RQ's class flags import this module. GPUlayer
itself never imports it.

RQ's tools clean RQ's registries as they read them (``rq info`` does before it shows anything): a
write, which a viewer's Redis user may not make. Here a cleaning refused for want of permission is
skipped, so a viewer reads what RQ shows; GPUlayer's workers keep the registries clean.

Given a Sentinel URL in ``GPULAYER_REDIS_URL``, it also holds RQ's ``SENTINEL`` setting, which RQ's CLI
reads from it as a config module (``rq info -c gpulayer.rq_tools``): RQ's own ``--url`` takes no
Sentinel URL.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import redis.exceptions
from rq import registry, worker_registration
from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

from . import sentinel
from .settings import Settings
from .store.rq_names import RQNames, point_rq_at

__all__ = ["Job", "Queue", "Worker"]


def _unless_refused(clean: Callable[..., Any]) -> Callable[..., Any]:
    """``clean``, skipped when Redis refuses its writes to this user (a viewer's)."""

    @functools.wraps(clean)
    def clean_if_allowed(*args: Any, **kwargs: Any) -> Any:
        try:
            return clean(*args, **kwargs)
        except redis.exceptions.NoPermissionError:
            return None

    return clean_if_allowed


def _cleaners() -> list[tuple[Any, str]]:
    """Where RQ's tools clean: each registry class's ``cleanup``, and the module functions ``rq info``
    calls (also where its CLI imported them by name)."""
    found, todo = [], [registry.BaseRegistry]
    while todo:
        kind = todo.pop()
        todo.extend(kind.__subclasses__())
        if "cleanup" in vars(kind):
            found.append((kind, "cleanup"))
    modules = (registry, worker_registration, sys.modules.get("rq.cli.cli"))
    names = ("clean_registries", "clean_worker_registry")
    return found + [(module, name) for module in modules for name in names if name in vars(module or object)]


for _owner, _name in _cleaners():
    setattr(_owner, _name, _unless_refused(vars(_owner)[_name]))

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
