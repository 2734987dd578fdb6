"""Power of two choices over a peak-EWMA cost: the balancer of Finagle and Linkerd, the
algorithm large fleets run today, as a baseline policy (re-implemented from its published
description, not its code).

Per host, a *peak EWMA* of the round-trip times: an answer slower than the current value
replaces it at once (the peak), a faster one is blended in with weight ``1 - exp(-dt /
decay)`` where ``dt`` is the time since the previous update, and the value decays towards
0 as time passes without answers (``decay``: Finagle's default 10 s). A host's cost is
that latency x (its outstanding requests + 1); a host with requests outstanding and no
latency measured yet costs a large penalty, one with neither costs 0 (so a new host is
tried). For each request two distinct candidates are drawn at random and the cheaper one
goes first.

The candidates are the replicas the child ``TokenAwarePolicy(DCAware...)`` puts at the
head of its plan (the hosts Finagle would balance over are the ones that can serve the
request: for a token-aware client, its replicas); the other replicas and the rest of the
child's plan follow, in the child's order, for retries. Every answer (success or fast
error) is a latency sample, as in Finagle; a client-side timeout is one of the timeout's
length.

Imports the driver's public API, the library's clock and the simulator's baselines only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

from cassandra.policies import LoadBalancingPolicy

from adaptive_lb.core.clock import Clock
from adaptive_lb.tools.sim.baselines import BaselinePolicy

__all__ = ["DECAY_S", "PENALTY", "PeakEwmaP2CPolicy"]

DECAY_S = 10.0
"""Finagle's default ``decayTime``."""
PENALTY = 1e12
"""The cost of a host with requests outstanding and no latency measured (ns x requests)."""


class PeakEwmaP2CPolicy(BaselinePolicy):
    """P2C over peak-EWMA cost among the request's replicas (see the module docstring)."""

    def __init__(
        self,
        child: LoadBalancingPolicy,
        clock: Clock,
        rng: random.Random,
        *,
        decay: float = DECAY_S,
    ) -> None:
        super().__init__(child, clock)
        self._rng = rng
        self._decay_ns = decay * 1e9
        # id(host) -> [peak-EWMA latency ns, its time ns, outstanding requests]
        self._hosts: dict[int, list[float]] = {}

    def _entry(self, host: Any) -> list[float]:
        entry = self._hosts.get(id(host))
        if entry is None:
            entry = self._hosts[id(host)] = [0.0, float(self.clock.now_ns()), 0.0]
        return entry

    def _observe(self, entry: list[float], rtt: float) -> None:
        now = self.clock.now_ns()
        elapsed = max(0.0, now - entry[1])
        entry[1] = now
        if rtt > entry[0]:
            entry[0] = rtt
        else:
            weight = math.exp(-elapsed / self._decay_ns)
            entry[0] = entry[0] * weight + rtt * (1.0 - weight)

    def cost(self, host: Any) -> float:
        """``host``'s cost now: its latency, decayed to now, x (outstanding + 1)."""
        entry = self._entry(host)
        self._observe(entry, 0.0)  # decays towards 0 while nothing is measured
        if entry[0] == 0.0 and entry[2] > 0:
            return PENALTY + entry[2]
        return entry[0] * (entry[2] + 1.0)

    # ------------------------------------------------------------ feedback

    def sent(self, host: Any) -> None:
        """One more request outstanding on ``host``."""
        self._entry(host)[2] += 1

    def _done(self, host: Any, latency_ns: int) -> None:
        entry = self._entry(host)
        entry[2] = max(0.0, entry[2] - 1)
        self._observe(entry, float(latency_ns))

    def success(self, host: Any, latency_ns: int) -> None:
        """An answer: one fewer outstanding, a latency sample."""
        self._done(host, latency_ns)

    def error(self, host: Any, latency_ns: int) -> None:
        """A fast error is an answer too (Finagle observes every response's latency)."""
        self._done(host, latency_ns)

    def timeout(self, host: Any, latency_ns: int) -> None:
        """A timeout: a sample of the timeout's length."""
        self._done(host, latency_ns)

    # ------------------------------------------------------------ plan

    def make_query_plan(self, working_keyspace: Any = None, query: Any = None) -> Iterator[Any]:
        plan = list(self.child.make_query_plan(working_keyspace, query))
        routing_key = getattr(query, "routing_key", None)
        keyspace = getattr(query, "keyspace", None) or working_keyspace
        candidates = len(plan)
        if routing_key is not None and keyspace is not None:
            replicas = {id(h) for h in self.metadata.get_replicas(keyspace, routing_key)}
            candidates = 0
            while candidates < len(plan) and id(plan[candidates]) in replicas:
                candidates += 1
            if candidates == 0:  # no replica up: balance over the whole plan
                candidates = len(plan)
        if candidates < 2:
            return iter(plan)
        rand = self._rng.random
        i = int(rand() * candidates)
        j = int(rand() * (candidates - 1))
        if j >= i:
            j += 1
        if self.cost(plan[j]) < self.cost(plan[i]):
            i, j = j, i
        first, second = plan[i], plan[j]
        rest = [h for k, h in enumerate(plan) if k != i and k != j]
        return iter([first, second, *rest])
