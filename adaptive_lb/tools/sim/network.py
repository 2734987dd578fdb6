"""The simulated network: how long one message takes from one zone to another.

:class:`Network` holds the scenario's one-way latency matrix between zones (a zone missing
from the matrix is ``inter_dc_us`` away when it is in another datacenter, 0 when in the
same) and multiplies it by a lognormal jitter drawn from its own random stream.

Imports the simulator's scenario only.
"""

from __future__ import annotations

import math
import random

from adaptive_lb.tools.sim.scenario import Scenario

__all__ = ["NS_PER_US", "Network"]

NS_PER_US = 1000


class Network:
    """One-way message latency between zones."""

    __slots__ = ("_base", "_rng", "_sigma")

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        zones = scenario.zones()
        matrix = scenario.network.matrix()
        inter_dc = scenario.network.inter_dc_us
        self._base: dict[tuple[str, str], int] = {}
        for src, src_dc in zones.items():
            for dst, dst_dc in zones.items():
                us = matrix.get(src, {}).get(dst)
                if us is None:
                    us = inter_dc if src_dc != dst_dc else 0.0
                self._base[(src, dst)] = round(us * NS_PER_US)
        self._sigma = scenario.network.jitter
        self._rng = rng

    def base_ns(self, src: str, dst: str) -> int:
        """The matrix value from ``src`` to ``dst`` (ns)."""
        return self._base[(src, dst)]

    def delay(self, src: str, dst: str) -> int:
        """One message's latency from zone ``src`` to zone ``dst`` (ns)."""
        base = self._base[(src, dst)]
        if self._sigma <= 0.0 or base == 0:
            return base
        return int(base * math.exp(self._sigma * self._rng.gauss(0.0, 1.0)))
