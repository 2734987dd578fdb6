"""How the policy follows the cluster's membership: ``populate`` and the driver's topology
events (up, down, add, remove) applied to the child, the topology book, the per-host
statistics and the health model, and the view each host gets in a topology snapshot.

:class:`~adaptive_lb.runtime.policy.AdaptiveLoadBalancingPolicy` owns one :class:`Membership` and
hands each driver event to it; the book calls :meth:`Membership.view` when it builds a
snapshot.

May import: the parts of a policy below it (planner, refresher, health, replicas, topology,
scoring, statistics, the driver's policies, clock, counters) and the driver; never
:mod:`adaptive_lb.runtime.policy`, which owns it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cassandra.policies import LoadBalancingPolicy

from adaptive_lb.core.clock import Clock
from adaptive_lb.core.counting import new_counter
from adaptive_lb.health.model import HealthModel
from adaptive_lb.plan._driver_policies import LOCAL_DISTANCES, cluster_is_open
from adaptive_lb.plan.planner import Planner
from adaptive_lb.plan.replicas import ReplicaResolver
from adaptive_lb.plan.scoring import HostView
from adaptive_lb.plan.topology import TopologyBook
from adaptive_lb.runtime.refresher import HealthRefresh
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.registry import StatsRegistry

__all__ = ["Membership"]

_STARTUP_GRACE_NS = 5 * 1_000_000_000
"""Hosts added within this long of ``populate`` do not start WARMING."""
_BLIP_NS = 1_000_000_000
"""A host down for less than this (the driver bounces the contact point while connecting)
does not start WARMING when it comes back."""


class Membership:
    """The hosts of one policy's cluster as the driver reports them (see the module
    docstring). ``replica_cache_size()`` reads ``policy.replica_cache_size`` from the
    config in force."""

    def __init__(
        self,
        child: LoadBalancingPolicy,
        book: TopologyBook,
        stats: StatsRegistry,
        health: HealthModel,
        clock: Clock,
        planner: Planner,
        refresh: HealthRefresh,
        replica_cache_size: Callable[[], int],
    ) -> None:
        self._child = child
        self._book = book
        self.stats = stats
        self.health = health
        self._clock = clock
        self._planner = planner
        self._refresh = refresh
        self._replica_cache_size = replica_cache_size
        self._metadata: Any = None
        self._cluster: Any = None
        self._populated_ns: int | None = None
        self._down_since: dict[int, int] = {}
        self.unknown_host_events = new_counter()
        """Up / down events for hosts the policy does not know (``next()`` per event)."""

    def populate(self, cluster: Any, hosts: Any) -> None:
        """:meth:`AdaptiveLoadBalancingPolicy.populate
        <adaptive_lb.runtime.policy.AdaptiveLoadBalancingPolicy.populate>`: the child populated, the
        snapshot and the replica resolver built afresh, one open cluster per policy."""
        hosts = list(hosts)
        with self._book.lock:
            self._check_one_cluster(cluster)
            self._child.populate(cluster, hosts)
            if self._populated_ns is None:
                self._populated_ns = self._clock.now_ns()
            if self._metadata is not cluster.metadata or self._planner.resolver is None:
                self._planner.resolver = ReplicaResolver(
                    cluster.metadata, self._replica_cache_size()
                )
            self._cluster = cluster
            self._metadata = cluster.metadata
            self._down_since.clear()
            for host in self._book.reset(hosts):
                self.stats.remove(host)
                self.health.forget(host)

    def _check_one_cluster(self, cluster: Any) -> None:
        previous = self._cluster
        if previous is None or self._metadata is cluster.metadata:
            return
        if cluster_is_open(previous):
            raise ValueError(
                "this AdaptiveLoadBalancingPolicy already serves another Cluster that is "
                "still open; give each Cluster its own policy object"
            )

    def on_up(self, host: Any) -> None:
        """The host is up (see the policy's ``on_up``): live again, WARMING after a
        real outage; an unknown host is counted and ignored."""
        if not self._book.knows(host):
            next(self.unknown_host_events)
            return
        self._child.on_up(host)
        was_live = self._book.is_live(host)
        down_since = self._down_since.pop(id(host), None)
        if not self._book.set_live(host, True, known_only=True) or was_live:
            return
        if down_since is not None:
            # A real outage (not the contact point's bounce while the driver connects).
            if self._clock.now_ns() - down_since >= _BLIP_NS:
                self.health.mark_up(host, self.stats.get(host))
        else:
            self._maybe_warm_up(host)

    def on_down(self, host: Any) -> None:
        """The host is down: not live; an unknown host is counted and ignored."""
        self._child.on_down(host)
        if not self._book.set_live(host, False, known_only=True):
            next(self.unknown_host_events)
            return
        self._down_since.setdefault(id(host), self._clock.now_ns())

    def on_add(self, host: Any) -> None:
        """The host joined: live, WARMING if the cluster is in service."""
        self._child.on_add(host)
        known = self._book.knows(host)
        self._book.set_live(host, True)
        if not known:
            self._maybe_warm_up(host)

    def _maybe_warm_up(self, host: Any) -> None:
        # While the driver connects it adds every host: nothing is being stampeded yet, so
        # no slow start for hosts that appear then.
        populated = self._populated_ns
        if populated is not None and self._clock.now_ns() - populated >= _STARTUP_GRACE_NS:
            self.health.mark_up(host, self.stats.get(host))

    def on_remove(self, host: Any) -> None:
        """The host left: forgotten, its statistics freed."""
        self._child.on_remove(host)
        with self._book.lock:
            self._down_since.pop(id(host), None)
            self._book.remove(host)
            # Under the lock: an on_add of the same host right after must find it gone.
            self.stats.remove(host)
        self.health.forget(host)  # after the removal is published: see HealthModel.refresh

    def view(self, host: Any, live: bool) -> HostView[HostStats]:
        """The view of ``host`` in a new snapshot (called by the book, under its lock)."""
        settings = self._planner.settings
        distance = self._child.distance(host)
        rack = host.rack
        # Configured, the child's, or learned (adaptive_lb.plan.locality).
        local_rack = self._book.local_rack.configure(
            settings.local_rack, settings.local_rack_source, settings.rack_learning
        )
        rack_penalty = 1.0
        if local_rack is not None and rack != local_rack:
            rack_penalty = settings.non_local_rack_penalty
        stats = self.stats.get(host)
        stats.rack_penalty = self._refresh.rack_factor(rack_penalty, rack)
        return HostView(
            host=host,
            stats=stats,
            datacenter=host.datacenter,
            rack=rack,
            is_local=distance in LOCAL_DISTANCES,
            live=live,
            rack_penalty=rack_penalty,
        )
