"""A fleet of clients: hundreds of application processes on one cluster, most of them thin.

A scenario with ``fleet.clients`` set (:class:`FleetSpec`) runs that many clients, spread over
the client zones in turn (instead of ``workload.clients_per_zone`` per zone), each with its
own policy objects as always. Each client has its own rate of requests: a thin one draws
its rate uniformly between ``thin_min_rps`` and ``thin_max_rps``, a thick one (a share
``thick_fraction`` of the fleet, the first of each zone's) sends ``thick_rps``; the fleet's
arrivals are one Poisson stream at the sum of the rates, each arrival given to a client
with probability proportional to its rate (the same as one Poisson stream per client, for
one event per request). ``workload.rate`` is not used: the offered load is the fleet's.

``surge_at`` makes the offered load grow by ``surge_factor`` over ``surge_ramp_s`` seconds
from that time on (linearly), every client's rate alike.

Imports attrs, the config's validators and the simulator's engine only.
"""

from __future__ import annotations

import bisect
import random
from itertools import accumulate

from attrs import define, field

from adaptive_lb.config import validation as check
from adaptive_lb.tools.sim.engine import NS_PER_S

__all__ = ["FleetRates", "FleetSpec", "client_rates", "clients_per_zone"]


@define(frozen=True, slots=True)
class FleetSpec:
    """How many clients, how much each sends, and a surge of the offered load."""

    clients: int = field(default=0, validator=[check.integer, check.ge(0), check.le(5000)])
    """Clients (application processes), each with its own policy objects; 0: no fleet (the
    workload's clients)."""
    thin_min_rps: float = field(default=1.0, validator=[check.number, check.gt(0.0)])
    thin_max_rps: float = field(default=20.0, validator=[check.number, check.gt(0.0)])
    """A thin client's requests a second: drawn uniformly between the two."""
    thick_fraction: float = field(
        default=0.04, validator=[check.number, check.ge(0.0), check.le(1.0)]
    )
    """The share of the clients that are thick."""
    thick_rps: float = field(default=100.0, validator=[check.number, check.gt(0.0)])
    """A thick client's requests a second."""
    surge_at: float | None = field(
        default=None, validator=check.optional(check.number, check.ge(0.0))
    )
    """When the offered load starts to grow (None: it never does)."""
    surge_factor: float = field(default=2.0, validator=[check.number, check.gt(0.0)])
    surge_ramp_s: float = field(default=1.0, validator=[check.number, check.ge(0.0)])

    def __attrs_post_init__(self) -> None:
        if self.thin_max_rps < self.thin_min_rps:
            raise ValueError(
                f"thin_max_rps: must be >= thin_min_rps ({self.thin_min_rps}), "
                f"got {self.thin_max_rps}"
            )


def client_rates(spec: FleetSpec, zones: int, rng: random.Random) -> list[float]:
    """Each client's requests a second, in the order the clients are built (zone by zone,
    ``clients`` spread over ``zones`` in turn, the first of each zone's thick)."""
    rates = []
    low, high = spec.thin_min_rps, spec.thin_max_rps
    for count in clients_per_zone(spec, zones):
        thick = round(count * spec.thick_fraction)
        for i in range(count):
            rates.append(spec.thick_rps if i < thick else rng.uniform(low, high))
    return rates


def clients_per_zone(spec: FleetSpec, zones: int) -> list[int]:
    """How many of the fleet's clients run in each of ``zones`` client zones."""
    return [spec.clients // zones + (1 if z < spec.clients % zones else 0) for z in range(zones)]


class FleetRates:
    """The fleet's arrivals: which client sends the next request, and when."""

    __slots__ = ("_cumulative", "_ramp_ns", "_surge_ns", "base_gap_ns", "factor", "total")

    def __init__(self, spec: FleetSpec, rates: list[float]) -> None:
        self._cumulative = list(accumulate(rates))
        self.total = self._cumulative[-1]
        """Requests a second of the whole fleet (before any surge)."""
        self.base_gap_ns = NS_PER_S / self.total
        self._surge_ns = None if spec.surge_at is None else round(spec.surge_at * NS_PER_S)
        self._ramp_ns = round(spec.surge_ramp_s * NS_PER_S)
        self.factor = spec.surge_factor

    def pick(self, draw: float) -> int:
        """The client of the next request, from a uniform ``draw`` in [0, 1)."""
        return bisect.bisect_right(self._cumulative, draw * self.total)

    def mean_gap_ns(self, now: int) -> float:
        """The mean time between arrivals at ``now`` (the surge counted)."""
        surge = self._surge_ns
        if surge is None or now < surge:
            return self.base_gap_ns
        ramp = 1.0 if self._ramp_ns == 0 else min(1.0, (now - surge) / self._ramp_ns)
        return self.base_gap_ns / (1.0 + (self.factor - 1.0) * ramp)
