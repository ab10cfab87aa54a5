"""The autoscaler: starts machines for jobs no connected worker could ever run, and stops the ones it
started once they have been idle a while (docs/capacity.md).

Each turn it reads the queues, the waiting gang jobs and the workers, as a client would, and keeps what
it started and decided under its own keys (:class:`gpulayer.store.capacity.CapacityStore`), so that
after a restart it finds its machines again and starts none twice. One autoscaler acts at a time (a
turn it renews in Redis); a second one waits for the first to stop.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Protocol

from redis.exceptions import RedisError

from ..access import Access
from ..inventory import WorkerInfo
from ..provisioned import Decision, Machine
from ..settings import Settings
from ..store.connection import connect
from ..store.stores import Stores
from ..units import format_span
from .config import CapacityConfig, Limits
from .demand import Demand, cheapest_first, demands, fits, per_machine, unmet
from .provider import MachineKind, MachineStatus, Provider, ProviderError

log = logging.getLogger("gpulayer.capacity")
#: Stopped and failed machines stay listed this long (s).
KEEP_ENDED = 86400.0


class Enroller(Protocol):
    """Makes and revokes the identity of each machine (the admin's `access add worker` and
    `access revoke`): a started machine gets its own worker token, and nothing more."""

    def add(self, name: str) -> str:
        """A new worker identity ``name``: its access token."""

    def revoke(self, name: str) -> None:
        """Revoke the identity ``name`` (nothing if there is none)."""


Offer = tuple[str, MachineKind]


class Autoscaler:
    def __init__(
        self,
        stores: Stores,
        providers: Mapping[str, Provider],
        enroller: Enroller,
        config: CapacityConfig,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.stores = stores
        self.providers = dict(providers)
        self.enroller = enroller
        self.config = config
        self.now = clock
        self.me = secrets.token_hex(8)
        #: Each provider that failed: when it may be asked again (monotonic seconds), and why not now.
        self._resting: dict[str, tuple[float, str]] = {}

    @classmethod
    def connect(
        cls,
        access: Access,
        prefix: str,
        providers: Mapping[str, Provider],
        enroller: Enroller,
        config: CapacityConfig,
    ) -> Autoscaler:
        """An autoscaler over Redis as ``access`` (its own identity's: docs/security.md)."""
        stores = Stores.open(connect(access.redis_url, ca=access.ca), Settings(prefix=prefix))
        return cls(stores, providers, enroller, config)

    # --- the loop ---------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Turn until ``stop`` is set, at once when a job is queued or a worker comes or goes, else
        every :attr:`CapacityConfig.interval`; a Redis outage waits, and the loop goes on."""
        pubsub = self.stores.redis.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(self.stores.keys.events, self.stores.keys.gang_wake)
            while not stop.is_set():
                try:
                    self.turn()
                except RedisError as exc:
                    log.warning("capacity: Redis: %s; trying again", exc)
                except Exception:  # a provider's bug: said, and the loop goes on
                    log.exception("capacity: a turn failed; trying again")
                deadline = time.monotonic() + self.config.interval
                while not stop.is_set() and time.monotonic() < deadline:
                    message = pubsub.get_message(timeout=min(0.2, self.config.interval))
                    if message is not None and _wakes(message.get("data")):
                        break
        finally:
            pubsub.close()
            self.stores.capacity.step_down(self.me)

    def turn(self) -> bool:
        """One look at the queues and the machines: whether this autoscaler acted (another may)."""
        if not self.stores.capacity.lead(self.me, int(self.config.lead_ttl * 1000)):
            return False
        machines = self.stores.capacity.machines()
        workers = {worker.name: worker for worker in self.stores.workers.list()}
        for machine in list(machines.values()):
            self._look_after(machine, workers.get(machine.name))
        self._forget_ended(machines)
        live = [machine for machine in machines.values() if machine.live]
        queues, _ = self.stores.queues.list()
        static = [worker for name, worker in workers.items() if name not in machines]
        offers = self._offers()
        decisions = {}
        for demand in demands(queues, self.stores.gangs.waiting(), static):
            decisions[demand.key] = self._serve(demand, offers, live, workers)
        self.stores.capacity.decide(decisions)
        return True

    # --- machines it started ----------------------------------------------------------------------
    def _look_after(self, machine: Machine, worker: WorkerInfo | None) -> None:
        """Move ``machine`` on: joined, failed, never joined, idle long enough to stop, or gone."""
        now = self.now()
        if machine.state == "requested":  # the autoscaler stopped between recording it and its start
            self._stop(machine, "the autoscaler stopped while starting it", failed=True)
        elif machine.state == "stopping":
            self._stop(machine, machine.reason)
        elif machine.state == "starting":
            if worker is not None:
                self._save(machine, state="running", joined=now, idle_since=now)
                return
            status = self._status(machine)
            why = ""
            if status is not None and status.state in ("gone", "failed"):
                why = f"its machine {status.state}: {status.detail}".rstrip(": ")
            elif (now - machine.created).total_seconds() >= self.config.join_timeout:
                why = f"its worker did not join within {format_span(self.config.join_timeout)}"
            if why:
                self._stop(machine, why, failed=True)
                # As a failed start: its provider is not asked again at once, for another that may fail so.
                self._rest(machine.provider, f"{machine.name} of provider {machine.provider} failed: {why}")
        elif machine.state == "running":
            self._look_after_running(machine, worker, now)

    def _look_after_running(self, machine: Machine, worker: WorkerInfo | None, now: datetime) -> None:
        if worker is None:
            status = self._status(machine)
            if status is not None and status.state in ("gone", "failed"):
                self._stop(machine, "its worker left and its machine is gone")
                return
        busy = worker is not None and worker.running > 0
        if busy:
            if machine.idle_since is not None:
                self._save(machine, idle_since=None)
            return
        if machine.idle_since is None:
            self._save(machine, idle_since=now)
        elif (now - machine.idle_since).total_seconds() >= self.config.idle_timeout:
            self._stop(machine, f"idle for {format_span(self.config.idle_timeout)}")

    def _status(self, machine: Machine) -> MachineStatus | None:
        provider = self.providers.get(machine.provider)
        if provider is None:
            return None
        try:
            return provider.status(machine.name)
        except ProviderError as exc:
            log.warning("capacity: %s cannot say how %s stands: %s", machine.provider, machine.name, exc)
            return None

    def _stop(self, machine: Machine, reason: str, failed: bool = False) -> None:
        """Stop ``machine`` and revoke its identity; asked again next turn if its provider fails."""
        self._save(machine, state="stopping", reason=reason)
        provider = self.providers.get(machine.provider)
        if provider is None:
            self._save(machine, reason=f"{reason}; its provider {machine.provider!r} is not configured")
            return
        try:
            provider.stop(machine.name)
        except ProviderError as exc:
            self._save(machine, reason=f"{reason}; stopping it failed ({exc}), trying again")
            return
        self.enroller.revoke(machine.name)
        self._save(machine, state="failed" if failed else "stopped", ended=self.now())
        log.info("capacity: stopped %s (%s)", machine.name, reason)

    def _save(self, machine: Machine, **changes: object) -> None:
        for field, value in changes.items():
            setattr(machine, field, value)
        self.stores.capacity.put(machine)

    def _forget_ended(self, machines: dict[str, Machine]) -> None:
        now = self.now()
        old = [
            name
            for name, machine in machines.items()
            if machine.ended and (now - machine.ended).total_seconds() > KEEP_ENDED
        ]
        self.stores.capacity.forget(old)
        for name in old:
            del machines[name]

    # --- starting machines ------------------------------------------------------------------------
    def _offers(self) -> list[Offer]:
        """Every kind of every provider not resting after a failure, cheapest first."""
        found: list[Offer] = []
        for name, provider in self.providers.items():
            if self._resting.get(name, (0.0, ""))[0] > time.monotonic():
                continue
            try:
                found.extend((name, kind) for kind in provider.kinds())
            except ProviderError as exc:
                self._rest(name, f"provider {name} cannot list its machine kinds: {exc}")
        return cheapest_first(found)

    def _rest(self, provider: str, why: str) -> str:
        """Ask ``provider`` nothing for a while after it failed: the failure, as users are told it."""
        log.warning("capacity: %s", why)
        said = f"{why}; trying again in {format_span(self.config.retry_after)}"
        self._resting[provider] = (time.monotonic() + self.config.retry_after, said)
        return said

    def _failures(self) -> list[str]:
        """Why each provider resting now failed."""
        now = time.monotonic()
        return [said for until, said in self._resting.values() if until > now]

    def _serve(
        self, demand: Demand, offers: list[Offer], live: list[Machine], workers: Mapping[str, WorkerInfo]
    ) -> Decision:
        """Start the machines ``demand`` needs beyond those started for it; say what was done."""
        fitting = [offer for offer in offers if fits(demand.requirements, offer[1])]
        if not fitting and self._failures():  # a resting provider may offer one: not unmet, yet
            return Decision(text="; ".join(self._failures()), at=self.now())
        if not fitting:
            return Decision(text=unmet(demand.requirements, offers), at=self.now(), unmet=True)
        ours = [m for m in live if fits(demand.requirements, MachineKind.model_validate(m.offer))]
        missing = self._missing(demand, fitting[0][1], ours, workers)
        if missing <= 0:
            return self._waiting(ours)
        chosen = self._within_limits(fitting, live, missing, whole=demand.nodes > 1)
        if isinstance(chosen, str):
            return Decision(text=chosen, at=self.now(), machines=[m.name for m in ours])
        started: list[Machine] = []
        for provider, kind in chosen:
            machine = self._start(provider, kind, demand.key)
            if isinstance(machine, str):
                # Said, and tried again next turn on whatever fits then (this provider rests).
                return Decision(text=machine, at=self.now(), machines=[m.name for m in started])
            started.append(machine)
            live.append(machine)
        provider, kind = chosen[0]
        workers_text = "a worker" if len(started) == 1 else f"{len(started)} workers"
        estimate = format_span(kind.boot_seconds)
        text = f"starting {workers_text} of kind {kind.name} on provider {provider} (est. {estimate})"
        return Decision(text=text, at=self.now(), machines=[m.name for m in started])

    def _missing(
        self, demand: Demand, kind: MachineKind, ours: list[Machine], workers: Mapping[str, WorkerInfo]
    ) -> int:
        """How many more machines of ``kind`` the demand needs, beyond the room in ``ours``."""
        if demand.nodes > 1:  # one node per machine, all at once
            return demand.nodes - len(ours)
        room = sum(
            max(
                per_machine(demand.requirements, MachineKind.model_validate(m.offer)) - _running(m, workers),
                0,
            )
            for m in ours
        )
        return math.ceil(max(demand.jobs - room, 0) / per_machine(demand.requirements, kind))

    def _waiting(self, ours: list[Machine]) -> Decision:
        pending = [m for m in ours if m.state in ("requested", "starting")]
        if pending:
            first = pending[0]
            kind = MachineKind.model_validate(first.offer)
            since = format_span((self.now() - first.created).total_seconds())
            text = (
                f"waiting for {first.name}, a worker of kind {first.kind} on provider {first.provider}, "
                f"to join (started {since} ago, est. {format_span(kind.boot_seconds)})"
            )
        else:
            text = "waiting for the workers the autoscaler started: " + ", ".join(m.name for m in ours)
        return Decision(text=text, at=self.now(), machines=[m.name for m in ours])

    def _within_limits(
        self, fitting: list[Offer], live: list[Machine], count: int, whole: bool
    ) -> list[Offer] | str:
        """``count`` machines, each the cheapest offer within every limit (all of them or none when
        ``whole``: a gang job's); or why none may start."""
        planned = list(live)
        chosen: list[Offer] = []
        why = ""
        for _ in range(count):
            for provider, kind in fitting:
                why = self._limit_reached(provider, kind, planned)
                if not why:
                    chosen.append((provider, kind))
                    planned.append(_planned(provider, kind))
                    break
            else:
                break
        if not chosen or (whole and len(chosen) < count):
            return f"no worker started: {why}"
        return chosen

    def _limit_reached(self, provider: str, kind: MachineKind, live: Sequence[Machine]) -> str:
        """Why one more ``kind`` on ``provider`` would pass a limit ('' if it would not)."""
        own = [m for m in live if m.provider == provider]
        for limits, among, where in (
            (self.config.provider_limits(provider), own, f"provider {provider}'s"),
            (self.config.limits, live, "the"),
        ):
            reached = _reached(limits, among, kind)
            if reached:
                return f"{where} limit of {reached} is reached"
        return ""

    def _start(self, provider: str, kind: MachineKind, wanted_by: str) -> Machine | str:
        """Record a machine, make its identity, and ask its provider to start it: the machine, or why
        it could not start (its identity revoked; the provider rests a while)."""
        machine = _planned(provider, kind)
        machine.name = f"{provider}-{kind.name}-{secrets.token_hex(3)}"[:63]
        machine.created, machine.wanted_by = self.now(), wanted_by
        self.stores.capacity.put(machine)  # first: a restart finds it, whatever happens next
        try:
            self.providers[provider].start(machine.name, kind, self.enroller.add(machine.name))
        except ProviderError as exc:
            why = f"provider {provider} failed to start a worker of kind {kind.name}: {exc}"
            self.enroller.revoke(machine.name)
            self._save(machine, state="failed", reason=why, ended=self.now())
            return self._rest(provider, why)
        self._save(machine, state="starting")
        log.info("capacity: started %s (%s on %s) for %s", machine.name, kind.name, provider, wanted_by)
        return machine


def _planned(provider: str, kind: MachineKind) -> Machine:
    return Machine(
        name="",
        provider=provider,
        kind=kind.name,
        offer=kind.model_dump(),
        state="requested",
        created=datetime.now(timezone.utc),
        price_per_hour=kind.price_per_hour,
        gpus=kind.gpus,
    )


def _reached(limits: Limits, live: Sequence[Machine], kind: MachineKind) -> str:
    if limits.machines is not None and len(live) + 1 > limits.machines:
        return f"{limits.machines} machines"
    if limits.gpus is not None and sum(m.gpus for m in live) + kind.gpus > limits.gpus:
        return f"{limits.gpus} GPUs"
    if limits.price_per_hour is not None:
        spent = sum(m.price_per_hour or 0.0 for m in live) + (kind.price_per_hour or 0.0)
        if spent > limits.price_per_hour:
            return f"{limits.price_per_hour:g} an hour"
    return ""


def _running(machine: Machine, workers: Mapping[str, WorkerInfo]) -> int:
    worker = workers.get(machine.name)
    return worker.running if worker is not None else 0


def _wakes(data: object) -> bool:
    """Whether a message says a job was queued, a gang job waits (its id), or a worker came or went."""
    if not isinstance(data, bytes):
        return False
    if not data.startswith(b"{"):
        return True
    try:
        event = json.loads(data)
    except ValueError:
        return False
    return bool(
        event.get("type") == "worker" or (event.get("type") == "job" and event.get("state") == "queued")
    )
