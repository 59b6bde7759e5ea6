"""Load levels: what one step of a serving benchmark runs, and the generator that runs it.

- ``closed``: ``value`` clients in flight, each sending its next request when its previous one completed
  (trtflow's own generator: LoadGen has no closed loop of several clients);
- ``open``: single-sample requests arriving as a Poisson process of ``value`` per second, from trtflow's own
  generator (`measure.serving.traffic.open_loop`), for where LoadGen is not installed;
- ``loadgen``: an MLPerf scenario driven by LoadGen (`measure.serving.loadgen`): Server (``value`` queries per second),
  Offline, SingleStream or MultiStream, as ``scenario`` says.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Literal

from .loadgen import ScenarioSpec
from .traffic import LoadRun, Server, closed_loop, open_loop


@dataclass(frozen=True)
class Level:
    """One load level: ``value`` clients in flight (closed loop) or arrivals per second (open loop, Server)."""

    mode: Literal["closed", "open", "loadgen"]
    value: float
    request_samples: int
    warmup_s: float
    duration_s: float
    seed: int = 0
    scenario: ScenarioSpec | None = None  # mode loadgen

    @property
    def describe(self) -> str:
        if self.mode == "closed":
            return f"concurrency {int(self.value)}"
        if self.mode == "open" or (self.scenario is not None and self.scenario.scenario == "Server"):
            return f"{self.value:g} requests/s"
        return self.scenario.scenario if self.scenario is not None else self.mode


def run_level(server: Server, level: Level) -> LoadRun:
    gc.collect()  # garbage of the previous level, collected before this one's clock starts
    if level.mode == "closed":
        return closed_loop(server, int(level.value), level.request_samples, level.warmup_s, level.duration_s)
    if level.mode == "loadgen":
        from . import loadgen

        if level.scenario is None:
            raise ValueError("a loadgen level needs its scenario")
        return loadgen.run_sized(server, level.scenario)
    return open_loop(server, level.value, level.request_samples, level.warmup_s, level.duration_s, level.seed)
