"""AdaptiveLoadBalancingPolicy: the driver-facing weighted least-loaded policy.

This module is the driver contract and the wiring; the algorithm is
:mod:`adaptive_lb.plan.planner`, the driver's topology events :mod:`adaptive_lb.runtime.membership`,
the host bookkeeping :class:`~adaptive_lb.plan.topology.TopologyBook`, the health refresh
:mod:`adaptive_lb.runtime.refresher`, and what the policy offers besides the driver contract (its
readings, snapshot, reloads, health refresh and probe controls)
:class:`~adaptive_lb.runtime.policy_controls.PolicyControls`, which it inherits.

It wraps any driver ``LoadBalancingPolicy`` (the *child*). The child still decides which
hosts are eligible and at what distance; this policy decides in which order the best few
are tried:

1. replicas of the statement's routing key, from an LRU cache (:mod:`adaptive_lb.plan.replicas`);
2. candidates: the live local replicas, filled with random live local hosts up to
   ``sample_size``;
3. each scored ``(in_flight + 1) x rack x replica x health`` penalties
   (:mod:`adaptive_lb.plan.scoring`), ascending, ties broken at random;
4. then the rest of the child's plan minus the hosts already yielded.

``policy.enabled: false`` turns the ordering off: each plan is the child's, untouched.

Guarantees:

* The hosts yielded are exactly the child's plan, each once: candidates come from the
  hosts the child considers live and local, and the rest of the plan excludes them.
* The child's ``make_query_plan`` is called at most once per plan. A stock
  ``TokenAwarePolicy`` child is looked through: its replica work is done here (cached) and
  the rest of the plan comes from its own child.
* An exception inside this policy never reaches the driver: it is counted
  (:attr:`AdaptiveLoadBalancingPolicy.internal_errors`), logged at most once a minute, and
  the child's plan is used. An exception raised by the child reaches the caller, as it
  would without this policy.
* The hot path takes no Python lock (the replica cache is ``functools.lru_cache``, in C),
  reads an immutable topology snapshot rebuilt only on topology events, and computes no
  percentile.

May import: every layer of the library below it (the top one); never a tool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from itertools import chain
from random import random
from time import time_ns
from typing import Any

from cassandra.policies import LoadBalancingPolicy

from adaptive_lb.config import Config
from adaptive_lb.core import forks
from adaptive_lb.core.clock import SYSTEM_CLOCK, Clock
from adaptive_lb.core.counting import new_counter
from adaptive_lb.core.errors import ErrorLog
from adaptive_lb.health.model import HealthModel
from adaptive_lb.plan._driver_policies import analyse_child
from adaptive_lb.plan.planner import DECISION_POSITIONS, Planner, PlanRecord, PlanSettings
from adaptive_lb.plan.scoring import HostView
from adaptive_lb.plan.topology import TopologyBook
from adaptive_lb.runtime.membership import Membership
from adaptive_lb.runtime.policy_controls import PolicyControls
from adaptive_lb.runtime.refresher import HealthRefresh
from adaptive_lb.runtime.tracking_watch import TrackingWatch
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.registry import StatsRegistry
from adaptive_lb.stats.sampling import Sampler
from adaptive_lb.telemetry.tracing import DecisionRecorder, build_decision, current_recording_span

__all__ = ["DECISION_POSITIONS", "AdaptiveLoadBalancingPolicy"]

log = logging.getLogger("adaptive_lb.policy")


class AdaptiveLoadBalancingPolicy(LoadBalancingPolicy, PolicyControls):
    """Reorders the head of any child policy's plan by measured load and health.

    :param child: the policy to wrap, e.g. ``TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))``.
    :param config: settings (:class:`adaptive_lb.config.Config`); defaults when None.
    :param clock: monotonic clock for tracking and health (tests and the simulator inject one).
    :param tracer_provider: OpenTelemetry TracerProvider for decision spans (default: global).

    Use it wherever the driver takes a load-balancing policy::

        Cluster(load_balancing_policy=AdaptiveLoadBalancingPolicy(child))
        ExecutionProfile(load_balancing_policy=AdaptiveLoadBalancingPolicy(child))
    """

    def __init__(
        self,
        child: LoadBalancingPolicy,
        config: Config | None = None,
        *,
        clock: Clock | None = None,
        tracer_provider: Any | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(child, LoadBalancingPolicy):
            raise TypeError(f"child must be a cassandra LoadBalancingPolicy, got {child!r}")
        self._child = child
        self._chain = analyse_child(child)
        self._config = config if config is not None else Config()
        self._config_hash = self._config.hash
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.now_ns = self._clock.now_ns
        """The policy's monotonic clock, in ns (request tracking times attempts with it)."""
        self.errors = ErrorLog(self._clock, log)
        """Internal errors by stage (plan, tracing, health refresh, snapshot...), each
        logged at most once a minute per stage."""
        self.stats = StatsRegistry(self._config.tracking, self._clock)
        """Per-host live statistics (in-flight, latency window, health penalty)."""
        tracking = self._config.tracking
        self.health = HealthModel(
            self._config.health, self._clock, tracking.window, tracking.intervals
        )
        """Turns the statistics into health states and penalties (see :meth:`refresh_health`)."""
        base = self._chain.base
        self._book = TopologyBook(self._view, lambda: getattr(base, "local_dc", None))
        self._refresh = HealthRefresh(
            self.health, self._book, lambda: self._config.policy.rack_proximity_cap
        )
        self._planner = Planner(
            child,
            self._chain,
            self._book,
            PlanSettings.of(self._config, self._chain),
            lambda: self.errors.record("plan", "the child's plan is used instead"),
        )
        self._membership = Membership(
            child,
            self._book,
            self.stats,
            self.health,
            self._clock,
            self._planner,
            self._refresh,
            lambda: self._config.policy.replica_cache_size,
        )
        self.decisions = DecisionRecorder(self._config, tracer_provider, self.errors.record)
        """Where decisions are recorded (tracer, ratio, hand-over to request spans)."""
        self.sampler = Sampler(
            self._config.tracking.samples_per_host,
            lambda: len(self._book.topology.local),
            self.now_ns,
        )
        """Which of this policy's requests request tracking tracks
        (:mod:`adaptive_lb.stats.sampling`)."""
        self._untracked_attempts = new_counter()
        self._tracking = TrackingWatch(self._clock, log)
        self._reload_lock = threading.Lock()
        self.config_reloads = {"success": 0, "failure": 0}
        """Reloads through :meth:`reload`, by result."""
        self.forked_from_pid: int | None = None
        """Set in a process forked after this policy was made: the pid it came from (see
        :meth:`inherited_across_fork`)."""
        forks.watch(self)

    # ------------------------------------------------------------------ properties

    @property
    def child(self) -> LoadBalancingPolicy:
        """The wrapped policy."""
        return self._child

    # ------------------------------------------------------------------ driver contract

    def populate(self, cluster: Any, hosts: Any) -> None:
        """Populate the child, then build the topology snapshot and the replica resolver
        afresh from ``hosts`` (statistics of hosts no longer listed are forgotten).

        One policy serves one ``Cluster``: the driver populates it again when it is also
        used by another execution profile of the same cluster, which is fine; populating it
        for a second cluster while the first is still open raises ``ValueError`` (its plans
        would mix the two clusters' hosts). Once the first cluster is shut down (or
        garbage-collected) the policy may be reused for another one."""
        self._membership.populate(cluster, hosts)

    def distance(self, host: Any) -> int:
        """The child's distance."""
        return self._child.distance(host)

    def check_supported(self) -> None:
        """The child's check."""
        return self._child.check_supported()

    def on_up(self, host: Any) -> None:
        """Tell the child, then mark the host live in the snapshot; a host coming back
        starts WARMING (its penalty decays to 1 over ``health.slow_start``).

        A host this policy does not know (never added, or already removed) is ignored and
        not passed to the child: a late up event must not bring a removed host back (the
        stock DCAwareRoundRobinPolicy would add it to its plans again). Counted in
        :attr:`unknown_host_events`."""
        self._membership.on_up(host)

    def on_down(self, host: Any) -> None:
        """Tell the child, then mark the host not live in the snapshot (a host this policy
        does not know is counted in :attr:`unknown_host_events` and ignored)."""
        self._membership.on_down(host)

    def on_add(self, host: Any) -> None:
        """Tell the child, then add the host (live, like the stock policies do); a host
        joining a cluster in service starts WARMING."""
        self._membership.on_add(host)

    def on_remove(self, host: Any) -> None:
        """Tell the child, then forget the host and free its statistics."""
        self._membership.on_remove(host)

    def refresh_topology(self) -> None:
        """Rebuild the snapshot from scratch: call it after changing something the child's
        distances depend on outside of topology events (e.g. a HostFilterPolicy predicate)."""
        self._book.rebuild()

    def _view(self, host: Any, live: bool) -> HostView[HostStats]:
        # The view of ``host`` in a new snapshot (called by the book, under its lock).
        return self._membership.view(host, live)

    # ------------------------------------------------------------------ the hot path

    def make_query_plan(
        self, working_keyspace: str | None = None, query: Any = None
    ) -> Iterator[Any]:
        """Yield hosts: the best-scored candidates first, then the rest of the child's plan
        (``policy.enabled: false``: the child's plan itself, exactly).

        See the module docstring for the guarantees. When a span is recording in the
        current context, the decision is recorded on it (see :mod:`adaptive_lb.telemetry.tracing`).
        """
        if self._tracking.sources == 0:
            self._tracking.note_plan()
        decisions = self.decisions
        if decisions.tracer is not None:
            span = current_recording_span()
            if span is not None or decisions.without_parent:
                # The request's span starts here: the plan is the driver's first step.
                started_ns = time_ns()
                if decisions.ratio >= 1.0 or random() < decisions.ratio:
                    return self._traced_plan(span, working_keyspace, query, started_ns)
                decisions.deliver(span, query, None, [], started_ns)
        return self._planner.make_plan(working_keyspace, query)

    def _traced_plan(
        self, span: Any | None, working_keyspace: str | None, query: Any, started_ns: int
    ) -> Iterator[Any]:
        decisions = self.decisions
        ratio = decisions.candidates_ratio
        candidates = ratio >= 1.0 or (ratio > 0.0 and random() < ratio)
        record = PlanRecord(brief=not candidates)
        # The record is complete once the first host is out: the rest stays lazy, as the
        # driver reads it (usually the first host only).
        plan = iter(self._planner.make_plan(working_keyspace, query, record))
        first = next(plan, None)
        hosts = plan if first is None else chain((first,), plan)
        if decisions.tracer is None:  # a reload disabled tracing meanwhile
            return hosts
        try:
            decision, events = build_decision(
                record,
                () if first is None else (first,),
                working_keyspace,
                query,
                non_replica_penalty=self._planner.settings.non_replica_penalty,
                config_hash=self._config_hash,
                routing_keys=self._config.privacy.routing_keys,
                pop_transition=self.health.pop_unreported,
                candidates=candidates,
            )
            decisions.deliver(span, query, decision, events, started_ns)
        except Exception:
            self.errors.record("tracing", "the decision is not recorded on the span")
        return hosts
