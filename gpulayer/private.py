"""A private installation for one process, as ``ray.init()`` starts a cluster: where no installation
is configured (:class:`~gpulayer.errors.NoInstallation`), the first :class:`~gpulayer.Client` of a
process starts a Redis and a local worker of its own, says so once on stderr, and stops both when the
process exits or SIGTERM stops it, leaving no process and no file behind. `gpulayer up` is the way
to keep one; ``GPULAYER_AUTOSTART=0`` turns this off (a server should find its installation or fail).

Confined as `gpulayer up`'s is: the Redis listens on 127.0.0.1 only, with a user per role and the
default user off; the worker runs under an identity of its own, whose access is kept in a folder
only this user may read (made 700, removed at exit); the admin's password, which the client uses,
never leaves this process's memory, and nothing secret is on a command line or in an environment.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

import psutil

from . import access as accesses
from . import identities
from . import local_processes as processes
from .access import Access
from .errors import NoInstallation, ServerError
from .installation import Installation
from .network import free_port
from .server import redis_server_binary, redis_version, start_redis, wait_ready
from .settings import Settings
from .store.connection import connect
from .store.stores import Stores

#: At exit, how long (s) the worker's running jobs get to finish before they are stopped.
_GRACE = 2.0
_lock = threading.Lock()
_running: Private | None = None


@dataclasses.dataclass
class Private:
    """A private installation's processes, the folder they keep their files in, and its admin's access."""

    folder: Path
    redis: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes] | None
    access: Access
    #: The process that started it: a forked child inherits the exit hook, not the installation.
    owner: int

    def stop(self) -> None:
        """The worker (its jobs and whatever they left), then Redis, then the folder."""
        if self.worker is not None:
            _stop_worker(self.worker)
        self.redis.terminate()
        try:
            self.redis.wait(10)
        except subprocess.TimeoutExpired:
            self.redis.kill()
            self.redis.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def resolve(explicit_url: str | None, settings: Settings) -> Access:
    """How a client reaches its installation (:func:`gpulayer.access.resolve`); where none is
    configured, this process's private one, started the first time."""
    try:
        return accesses.resolve(explicit_url, settings.home)
    except NoInstallation as exc:
        if not settings.autostart:
            raise NoInstallation(f"{exc} (GPULAYER_AUTOSTART=0: no private one is started)") from None
        return access(settings)


def access(settings: Settings) -> Access:
    """The admin's access to this process's private installation, started now if it is not yet
    (:class:`NoInstallation` in one line if it cannot be)."""
    global _running  # noqa: PLW0603 - one per process, as the process is what it lives and ends with
    with _lock:
        if _running is None:
            try:
                _running = _start(settings.prefix)
            except ServerError as exc:
                raise NoInstallation(
                    f"no installation to talk to, and none could be started for this process: {exc}"
                ) from None
            atexit.register(_stop)
            _stop_on_sigterm()
            print(
                "gpulayer: no installation is configured here; started a private one for this process "
                "(a Redis on 127.0.0.1 and a local worker), stopped when it exits. `gpulayer up` keeps "
                "one running; GPULAYER_AUTOSTART=0 turns this off.",
                file=sys.stderr,
                flush=True,
            )
        return _running.access


def _start(prefix: str) -> Private:
    """A Redis with the users of a new installation, and a worker under an identity of its own."""
    binary = redis_server_binary()
    folder = Path(tempfile.mkdtemp(prefix="gpulayer-"))  # 700
    port = free_port()
    name = socket.gethostname()
    made, worker = Installation.generate(prefix, f"redis://127.0.0.1:{port}/0").enrol("worker", name)
    try:
        redis = start_redis(
            folder / "redis",
            port,
            acl=made.acl_file(redis_version(binary)[0]),
            durable=False,
            detach=True,  # a Ctrl-C meant for this process does not stop it under a running call
            binary=binary,
        )
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ServerError(f"cannot start {binary}: {exc.strerror}") from None
    running = Private(folder, redis, None, made.access("admin"), os.getpid())
    try:
        wait_ready(made.url("admin"), redis)
        with contextlib.closing(connect(made.url("admin"))) as admin:
            identities.sync(made, admin)
            accesses.save(folder, worker)
            log = folder / "worker.log"
            running.worker = processes.start(["worker", "start", "--name", name], folder, log)
            listed = Stores.open(admin, Settings(prefix=prefix)).workers
            started = running.worker

            def registered() -> bool:
                return any(found.pid == started.pid for found in listed.list())

            try:
                processes.wait_ready(started, registered, "its worker did not start")
            except ServerError:
                raise ServerError(f"its worker did not start: {_tail(log)}") from None
    except BaseException:
        running.stop()
        raise
    return running


def _tail(log: Path) -> str:
    """The last line of a log about to be removed with its folder."""
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else "it wrote nothing"


def _stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Its jobs get :data:`_GRACE` to finish, then are stopped; whatever they left running is killed."""
    left: list[psutil.Process] = []

    def note_descendants() -> None:
        with contextlib.suppress(psutil.Error):
            left.extend(psutil.Process(worker.pid).children(recursive=True))

    processes.stop(worker.pid, _GRACE, note_descendants)
    worker.wait()
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _stop() -> None:
    global _running  # noqa: PLW0603
    with _lock:
        if _running is not None and _running.owner == os.getpid():
            _running.stop()
        _running = None


def _stop_on_sigterm() -> None:
    """SIGTERM, which ends Python without its exit hooks, stops the installation first, then ends the
    process as it would have. Only where SIGTERM is left at its default (a program's own handler
    exits through the hooks), and from the main thread, where alone a handler can be set."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def stop_then_die(signum: int, frame: FrameType | None) -> None:
        _stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_then_die)
