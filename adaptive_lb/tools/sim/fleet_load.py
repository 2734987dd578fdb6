"""The fleet's load: one Poisson stream at the fleet's total rate, each arrival given to a
client in proportion to its own rate, the rate growing on a surge
(:class:`~adaptive_lb.tools.sim.fleet.FleetRates`).

Imports the simulator's engine, fleet, scenario and workload only.
"""

from __future__ import annotations

import random
from typing import Any

from adaptive_lb.tools.sim.engine import Engine
from adaptive_lb.tools.sim.fleet import FleetRates
from adaptive_lb.tools.sim.scenario import Scenario
from adaptive_lb.tools.sim.workload import Client, KeyChooser, LoadGenerator

__all__ = ["FleetGenerator"]


class FleetGenerator(LoadGenerator):
    """An open-loop :class:`~adaptive_lb.tools.sim.workload.LoadGenerator` whose clients send
    at rates of their own (``rates``, one per client, requests a second)."""

    def __init__(
        self,
        scenario: Scenario,
        engine: Engine,
        clients: list[Client],
        keys: KeyChooser,
        rng: random.Random,
        rates: list[float],
    ) -> None:
        super().__init__(scenario, engine, clients, keys, rng)
        self.closed = False
        self.rates = FleetRates(scenario.fleet, rates)

    def _arrival(self, _: Any) -> None:
        if not self._can_issue():
            return
        rng = self.rng
        self._issue(self.clients[self.rates.pick(rng.random())])
        gap = int(rng.expovariate(1.0) * self.rates.mean_gap_ns(self.engine.now))
        self.engine.at(self.engine.now + gap, self._arrival, None)
