"""What the autoscaler keeps of the machines it started and of what it decided (docs/capacity.md):
records only, read by `gpulayer capacity`, `gpulayer why` and the autoscaler after its restart."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

#: ``requested``: recorded, its start asked of the provider next; ``starting``: its worker has not
#: joined; ``running``: it has; ``stopping``: asked to stop (again at each turn until the provider
#: has); ``stopped`` and ``failed``: over, kept a day for `gpulayer capacity`.
MachineLife = Literal["requested", "starting", "running", "stopping", "stopped", "failed"]
LIVE: tuple[MachineLife, ...] = ("requested", "starting", "running", "stopping")
#: A gang job's decision is kept under this and its id; a queue's under its name.
GANG = "gang:"


class Machine(BaseModel):
    """One machine the autoscaler started; its name is also its worker's and its identity's."""

    model_config = ConfigDict(extra="forbid")

    name: str
    provider: str
    #: The kind's name, and what it offers (as :class:`gpulayer.capacity.MachineKind` dumps it).
    kind: str
    offer: dict[str, object]
    state: MachineLife
    created: datetime
    joined: datetime | None = None
    #: Since when its worker has held no job (None while it holds one).
    idle_since: datetime | None = None
    ended: datetime | None = None
    price_per_hour: float | None = None
    gpus: int = 0
    #: What it was started for: a queue's name, or ``gang:<job id>``.
    wanted_by: str = ""
    #: Why it stopped or failed, in words.
    reason: str = ""

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def age(self, now: datetime) -> float:
        """How long (s) it has been up, or was until it ended."""
        return ((self.ended or now) - self.created).total_seconds()

    def cost(self, now: datetime) -> float | None:
        """What it has cost so far, where its price is known."""
        if self.price_per_hour is None:
            return None
        return self.price_per_hour * self.age(now) / 3600


class Decision(BaseModel):
    """The autoscaler's last word on the jobs of one queue or one gang job."""

    text: str
    at: datetime
    #: No provider offers a machine that could ever run them.
    unmet: bool = False
    #: The machines started, or being waited for, for them.
    machines: list[str] = []
