"""The baseline policies: other drivers' adaptive load balancing, to compare against.

Two algorithms of other drivers, re-implemented from their published descriptions (not
their code), as driver ``LoadBalancingPolicy`` subclasses that wrap a child
(``TokenAwarePolicy(DCAware...)``) and learn from the simulator's completions (``sent`` /
``success`` / ``error`` / ``timeout``, the simulator's
:class:`~adaptive_lb.tools.sim.workload.Feedback` protocol).

* :class:`LatencyAwarePolicy` -- the DataStax C++ driver's and scylla-rust-driver's
  latency awareness: a time-decayed average latency per host
  (``weight = ln(d + 1) / d`` with ``d`` = time since the previous sample / ``scale``,
  100 ms); the minimum over hosts with at least ``min_measured`` (50) samples is
  recomputed every ``update_rate`` (100 ms); a host whose average exceeds
  ``exclusion_threshold`` (2.0) x that minimum is moved to the end of the plan, unless it
  has not been measured for ``retry_period`` (10 s), then it is tried again. Fast errors do
  not update the average (scylla-rust-driver's rule: they are no latency measure).
  The C++ driver composes it as ``TokenAware(LatencyAware(DCAware))``, which would leave
  the replicas unfiltered; here it wraps ``TokenAware(DCAware)`` as the Rust driver applies
  it, to replicas too -- the stronger variant.
* :class:`SlowReplicaAvoidancePolicy` -- the Java driver 4 ``DefaultLoadBalancingPolicy``:
  replicas shuffled; a replica is *unhealthy* when it has >= 10 requests in flight and
  fewer than 2 responses in the last 200 ms; unhealthy replicas go to the back of the
  replicas when fewer than half are unhealthy; a replica up for less than 60 s and among
  the first two goes to the back 3 times out of 4; otherwise the first two replicas are
  swapped if the first has more in flight.

Imports the driver's public API and the library's clock only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

from cassandra.policies import LoadBalancingPolicy

from adaptive_lb.core.clock import Clock

__all__ = ["BaselinePolicy", "LatencyAwarePolicy", "SlowReplicaAvoidancePolicy"]

_NS = 1_000_000_000


class BaselinePolicy(LoadBalancingPolicy):
    """A baseline policy: delegates the driver contract to a child; subclasses reorder its
    plan."""

    def __init__(self, child: LoadBalancingPolicy, clock: Clock) -> None:
        super().__init__()
        self.child = child
        self.clock = clock
        self.metadata: Any = None

    def populate(self, cluster: Any, hosts: Any) -> None:
        self.metadata = cluster.metadata
        self.child.populate(cluster, hosts)

    def distance(self, host: Any) -> int:
        return self.child.distance(host)

    def on_up(self, host: Any) -> None:
        self.child.on_up(host)

    def on_down(self, host: Any) -> None:
        self.child.on_down(host)

    def on_add(self, host: Any) -> None:
        self.child.on_add(host)

    def on_remove(self, host: Any) -> None:
        self.child.on_remove(host)

    def check_supported(self) -> None:
        self.child.check_supported()


class LatencyAwarePolicy(BaselinePolicy):
    """Time-decayed latency average per host; slow hosts moved to the end of the plan."""

    def __init__(
        self,
        child: LoadBalancingPolicy,
        clock: Clock,
        *,
        exclusion_threshold: float = 2.0,
        scale: float = 0.1,
        retry_period: float = 10.0,
        update_rate: float = 0.1,
        min_measured: int = 50,
    ) -> None:
        super().__init__(child, clock)
        self.exclusion_threshold = exclusion_threshold
        self.scale_ns = scale * _NS
        self.retry_period_ns = round(retry_period * _NS)
        self.update_rate = update_rate
        self.min_measured = min_measured
        self._threshold_to_account = (30 * min_measured) // 100
        # id(host) -> [average ns (-1: none yet), samples, timestamp ns]
        self._latency: dict[int, list[float]] = {}
        self.min_average = -1.0

    # ------------------------------------------------------------ feedback

    def sent(self, host: Any) -> None:
        """Nothing to count on send."""

    def success(self, host: Any, latency_ns: int) -> None:
        self._update(host, latency_ns)

    def error(self, host: Any, latency_ns: int) -> None:
        """Fast errors are no latency measure."""

    def timeout(self, host: Any, latency_ns: int) -> None:
        self._update(host, latency_ns)

    def _update(self, host: Any, latency_ns: int) -> None:
        now = self.clock.now_ns()
        entry = self._latency.get(id(host))
        if entry is None:
            entry = self._latency[id(host)] = [-1.0, 0, now]
        average, measured, timestamp = entry
        if measured < self._threshold_to_account:
            entry[0] = -1.0
        elif average < 0:
            entry[0] = float(latency_ns)
        else:
            delay = now - timestamp
            if delay <= 0:
                return
            scaled = delay / self.scale_ns
            weight = math.log(scaled + 1.0) / scaled
            entry[0] = (1.0 - weight) * latency_ns + weight * average
        entry[1] = measured + 1
        entry[2] = now

    def tick(self) -> None:
        """Recompute the minimum average (every ``update_rate``)."""
        now = self.clock.now_ns()
        best = math.inf
        for average, measured, timestamp in self._latency.values():
            if (
                average >= 0
                and measured >= self.min_measured
                and now - timestamp <= self.retry_period_ns
            ):
                best = min(best, average)
        if best != math.inf:
            self.min_average = best

    # ------------------------------------------------------------ plan

    def make_query_plan(self, working_keyspace: Any = None, query: Any = None) -> Iterator[Any]:
        minimum = self.min_average
        now = self.clock.now_ns()
        skipped = []
        limit = self.exclusion_threshold * minimum
        for host in self.child.make_query_plan(working_keyspace, query):
            entry = self._latency.get(id(host))
            if (
                minimum < 0
                or entry is None
                or entry[1] < self.min_measured
                or now - entry[2] > self.retry_period_ns
                or entry[0] <= limit
            ):
                yield host
            else:
                skipped.append(host)
        yield from skipped


class SlowReplicaAvoidancePolicy(BaselinePolicy):
    """The Java driver 4 default policy's replica ordering (see the module docstring)."""

    MIN_IN_FLIGHT = 10
    RESPONSE_INTERVAL_NS = 200_000_000
    NEWLY_UP_NS = 60 * _NS

    def __init__(self, child: LoadBalancingPolicy, clock: Clock, rng: random.Random) -> None:
        super().__init__(child, clock)
        self._rng = rng
        self._in_flight: dict[int, int] = {}
        self._responses: dict[int, list[int]] = {}
        self._up_times: dict[int, int] = {}

    def on_up(self, host: Any) -> None:
        self._up_times[id(host)] = self.clock.now_ns()
        super().on_up(host)

    # ------------------------------------------------------------ feedback

    def sent(self, host: Any) -> None:
        key = id(host)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def _release(self, host: Any) -> None:
        key = id(host)
        self._in_flight[key] = max(0, self._in_flight.get(key, 0) - 1)

    def _responded(self, host: Any) -> None:
        times = self._responses.setdefault(id(host), [])
        times.append(self.clock.now_ns())
        if len(times) > 2:
            del times[0]

    def success(self, host: Any, latency_ns: int) -> None:
        self._release(host)
        self._responded(host)

    def error(self, host: Any, latency_ns: int) -> None:
        self._release(host)
        self._responded(host)

    def timeout(self, host: Any, latency_ns: int) -> None:
        self._release(host)

    def _unhealthy(self, host: Any, now: int) -> bool:
        if self._in_flight.get(id(host), 0) < self.MIN_IN_FLIGHT:
            return False
        times = self._responses.get(id(host))
        if times is None or len(times) < 2:
            return True
        return times[0] < now - self.RESPONSE_INTERVAL_NS

    # ------------------------------------------------------------ plan

    def make_query_plan(self, working_keyspace: Any = None, query: Any = None) -> Iterator[Any]:
        plan = list(self.child.make_query_plan(working_keyspace, query))
        routing_key = getattr(query, "routing_key", None)
        keyspace = getattr(query, "keyspace", None) or working_keyspace
        if routing_key is None or keyspace is None or len(plan) < 2:
            return iter(plan)
        replica_ids = {id(h) for h in self.metadata.get_replicas(keyspace, routing_key)}
        count = 0
        while count < len(plan) and id(plan[count]) in replica_ids:
            count += 1
        if count < 2:
            return iter(plan)
        now = self.clock.now_ns()
        newest: Any = None
        newest_time = -1
        unhealthy: list[int] = []
        for i in range(count):
            host = plan[i]
            up = self._up_times.get(id(host))
            if up is not None and now - up < self.NEWLY_UP_NS and up > newest_time:
                newest, newest_time = host, up
            if newest is None and self._unhealthy(host, now):
                unhealthy.append(i)
        in_flight = self._in_flight
        if newest is None and unhealthy and len(unhealthy) < count / 2:
            bad = [plan[i] for i in unhealthy]
            good = [plan[i] for i in range(count) if i not in unhealthy]
            plan[:count] = good + bad
        elif (
            newest is not None
            and (plan[0] is newest or plan[1] is newest)
            and self._rng.randint(1, 4) != 4
        ):
            head = [h for h in plan[:count] if h is not newest]
            plan[:count] = [*head, newest]
        elif in_flight.get(id(plan[1]), 0) < in_flight.get(id(plan[0]), 0):
            plan[0], plan[1] = plan[1], plan[0]
        return iter(plan)
