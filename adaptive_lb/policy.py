"""AdaptiveLoadBalancingPolicy: the driver-facing weighted least-loaded policy.

This module is the driver contract and the wiring; the algorithm is
:mod:`adaptive_lb.planner`, the driver's topology events :mod:`adaptive_lb.membership`, the
host bookkeeping :class:`~adaptive_lb.topology.TopologyBook`, the health refresh
:mod:`adaptive_lb.refresher`.

It wraps any driver ``LoadBalancingPolicy`` (the *child*). The child still decides which
hosts are eligible and at what distance; this policy decides in which order the best few
are tried:

1. replicas of the statement's routing key, from an LRU cache (:mod:`adaptive_lb.replicas`);
2. candidates: the live local replicas, filled with random live local hosts up to
   ``sample_size``;
3. each scored ``(in_flight + 1) x rack x replica x health`` penalties
   (:mod:`adaptive_lb.scoring`), ascending, ties broken at random;
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
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from random import Random, random
from time import time_ns
from typing import Any

from attrs import evolve
from cassandra.policies import LoadBalancingPolicy

from adaptive_lb import forks
from adaptive_lb._driver import analyse_child
from adaptive_lb.clock import SYSTEM_CLOCK, Clock
from adaptive_lb.config import Config
from adaptive_lb.counting import counter_value, new_counter
from adaptive_lb.errors import ErrorLog
from adaptive_lb.health import HealthModel
from adaptive_lb.membership import Membership
from adaptive_lb.planner import DECISION_POSITIONS, Planner, PlanRecord, PlanSettings
from adaptive_lb.refresher import HealthRefresh
from adaptive_lb.replicas import ReplicaCache, ReplicaResolver
from adaptive_lb.sampling import Sampler
from adaptive_lb.scoring import HostView
from adaptive_lb.snapshot import PolicySnapshot
from adaptive_lb.stats import HostStats
from adaptive_lb.stats_registry import StatsRegistry
from adaptive_lb.topology import Topology, TopologyBook
from adaptive_lb.tracing import DecisionRecorder, build_decision, current_recording_span
from adaptive_lb.tracking_watch import TrackingWatch

__all__ = ["DECISION_POSITIONS", "AdaptiveLoadBalancingPolicy"]

log = logging.getLogger("adaptive_lb.policy")


class AdaptiveLoadBalancingPolicy(LoadBalancingPolicy):
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
        self.health = HealthModel(
            self._config.health, self._clock, window_s=self._config.tracking.window
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
        """Which of this policy's requests request tracking tracks (:mod:`adaptive_lb.sampling`)."""
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

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config

    @property
    def config_hash(self) -> str:
        """Short content hash of the config in force."""
        return self._config_hash

    @property
    def clock(self) -> Clock:
        """The clock used by tracking and health."""
        return self._clock

    @property
    def topology(self) -> Topology:
        """The current topology snapshot (immutable)."""
        return self._book.topology

    @property
    def replica_cache(self) -> ReplicaCache | None:
        """The replica LRU cache (None before :meth:`populate`)."""
        resolver = self._planner.resolver
        return resolver.cache if resolver is not None else None

    @property
    def _resolver(self) -> ReplicaResolver | None:
        return self._planner.resolver

    @property
    def local_rack(self) -> str | None:
        """The client's rack in force: ``policy.local_rack``, the child's ``local_rack``, or
        the rack learned with ``local_rack: auto`` (None: none known, no rack penalty)."""
        return self._book.local_rack.rack

    @property
    def local_rack_source(self) -> str:
        """Where :attr:`local_rack` comes from: ``configured``, ``child``, ``learned`` or
        ``unknown`` (none yet, or none to learn)."""
        return self._book.local_rack.source

    @property
    def learned_rack(self) -> str | None:
        """The rack learned from measured latency (``local_rack: auto``), or None."""
        return self._book.local_rack.learned

    @property
    def decisions_by_position(self) -> dict[str, int]:
        """Plans made, by the origin of their first host (see
        :data:`adaptive_lb.planner.DECISION_POSITIONS`)."""
        return self._planner.decisions()

    @property
    def internal_errors(self) -> int:
        """Exceptions caught inside adaptive-lb for this policy, every stage together (a
        plan error is answered with the child's plan; see :attr:`errors` by stage)."""
        return self.errors.total

    @property
    def internal_errors_by_stage(self) -> dict[str, int]:
        """:attr:`internal_errors` by stage (every stage listed, zeros included)."""
        return self.errors.counts()

    @property
    def untracked_attempts(self) -> int:
        """Attempts sent to a host this policy does not know (removed after the plan was
        made, or never seen): not tracked, so that no state is created for them."""
        return counter_value(self._untracked_attempts)

    @property
    def unknown_host_events(self) -> int:
        """``on_up`` / ``on_down`` for hosts this policy does not know (never added, or
        already removed): ignored here (and ``on_up`` is not passed to the child)."""
        return counter_value(self._membership.unknown_host_events)

    @property
    def request_tracking(self) -> bool:
        """Request tracking reaches this policy (:func:`adaptive_lb.attach` or
        :func:`adaptive_lb.instrument` hooked a session that plans with it). While False
        every host looks idle and unmeasured; see :mod:`adaptive_lb.tracking_watch`."""
        return self._tracking.attached

    @property
    def untracked_plans(self) -> int:
        """Plans made while no request tracking was attached (one WARNING after a bounded
        number or time: :mod:`adaptive_lb.tracking_watch`)."""
        return self._tracking.untracked_plans

    def tracking_attached(self, attached: bool = True) -> None:
        """Declare that something feeds this policy's statistics per attempt (``attached``)
        or stopped doing so: request tracking does, and the simulator's feedback."""
        self._tracking.attach(attached)

    def inherited_across_fork(self, parent_pid: int) -> None:
        """Called in a child forked after this policy was made (:mod:`adaptive_lb.forks`):
        the session's connections and threads stayed in ``parent_pid``, so the policy no
        longer claims request tracking, forgets its refresh thread and probe sender and drops
        the in-flight counts of the parent's requests, whose answers will never come here."""
        self.forked_from_pid = parent_pid
        self._tracking.detach_all()
        self._refresh.forget_thread()
        self._refresh.probe_sender = None  # the session it probed through is the parent's
        self.health.probing = False
        self.stats.remove_in_flight_source()  # the parent's pools
        for view in self._book.topology.by_id.values():
            view.stats.in_flight = 0

    def record_error(self, stage: str, what: str) -> None:
        """Count an exception caught in ``stage`` (see :data:`adaptive_lb.errors.ERROR_STAGES`)
        and log it at most once a minute per stage; call it from the ``except`` block.
        Exporters, the health refresher and the config watcher report through it."""
        self.errors.record(stage, what)

    def attempt_stats(self, host: Any) -> HostStats | None:
        """The statistics an attempt sent to ``host`` is counted in; None (and counted in
        :attr:`untracked_attempts`) for a host this policy has forgotten or never knew,
        so that tracking never creates state for it."""
        view = self._book.topology.by_id.get(id(host))
        if view is not None:
            return view.stats
        stats = self.stats.peek(host)  # removed since the snapshot, still in flight
        if stats is None:
            next(self._untracked_attempts)
        return stats

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

    # ------------------------------------------------------------------ health

    def refresh_health(self) -> list[Any]:
        """Recompute every known host's health from its statistics window now, and return
        the transitions. Percentiles are computed here, never per request."""
        return self._refresh.refresh()

    def maybe_refresh_health(self) -> list[Any] | None:
        """:meth:`refresh_health` if ``health.refresh_interval`` has passed since the last
        refresh and no other thread is refreshing; None otherwise."""
        return self._refresh.maybe_refresh()

    def start_health_refresh(self) -> None:
        """Refresh health every ``health.refresh_interval`` on a daemon thread (real clock).
        :func:`adaptive_lb.instrument` calls this; the simulator drives
        :meth:`refresh_health` on its virtual clock instead. Idempotent."""
        self._refresh.start(self)

    def stop_health_refresh(self) -> None:
        """Stop the refresh thread (if running) and wait for it."""
        self._refresh.stop()

    def use_prober(
        self,
        send: Any | None,
        replacing: Any | None = None,
        read_load: Any | None = None,
        rng: Random | None = None,
    ) -> None:
        """Send active probes with ``send(order)`` after each health refresh (None: stop),
        and server-load reads with ``read_load(order)`` (:mod:`adaptive_lb.server_load`).
        With ``replacing``, only if that is the sender in place (a closing session must
        not stop another's). ``rng``: draw the probes' jitter and the server-load
        thresholds from it (the simulator seeds one; default: unseeded).
        :class:`adaptive_lb.prober.Prober` calls it."""
        refresh = self._refresh
        with self._book.lock:
            if replacing is not None and refresh.probe_sender is not replacing:
                return
            if rng is not None:
                refresh.seed(rng)
            refresh.probe_sender = send
            refresh.load_reader = read_load if send is not None else None
            self.health.probing = send is not None

    # ------------------------------------------------------------------ snapshot

    def snapshot(self) -> PolicySnapshot:
        """Every known host's numbers as of now (in-flight) and of the last health refresh
        (window counts, percentiles, health), plus cache and error counters."""
        return PolicySnapshot.of(self)

    # ------------------------------------------------------------------ config

    def reload(self, new: Config | str | os.PathLike[str]) -> Config:
        """Swap in a new config atomically (a plan in progress keeps the old one).

        ``new`` is a :class:`Config` or the path of a YAML file. On any error the current
        config stays in force and the error is raised (:class:`adaptive_lb.ConfigError`).
        """
        if isinstance(new, Config):
            config = new
        else:
            from adaptive_lb.config import load_config

            try:
                config = load_config(new)
            except Exception as exc:
                with self._reload_lock:
                    self.config_reloads["failure"] += 1
                # The message only: a ConfigError says what is wrong without echoing
                # secret-bearing values, and a traceback's frames could show them.
                log.error(
                    "adaptive-lb: config reload from %s failed; keeping %s: %s: %s",
                    new,
                    self._config_hash,
                    type(exc).__name__,
                    exc,
                )
                raise
        with self._reload_lock:
            self.config_reloads["success"] += 1
        with self._book.lock:
            old = self._config
            self._config = config
            self._config_hash = config.hash
            self._planner.configure(PlanSettings.of(config, self._chain))
            self.sampler.configure(config.tracking.samples_per_host)
            # Only the window's keys restart the windows (not the sampling rate).
            window_changed = (
                evolve(old.tracking, samples_per_host=config.tracking.samples_per_host)
                != config.tracking
            )
            if old.health != config.health or window_changed:
                self.health.reconfigure(config.health, window_s=config.tracking.window)
            if window_changed:
                self.stats.reconfigure(config.tracking)
            if old.tracing != config.tracing or old.privacy != config.privacy:
                self.decisions.configure(config)
            resolver = self._planner.resolver
            if resolver is not None and (
                old.policy.replica_cache_size != config.policy.replica_cache_size
            ):
                resolver.cache.resize(config.policy.replica_cache_size)
            if (
                old.policy.non_local_rack_penalty != config.policy.non_local_rack_penalty
                or old.policy.local_rack != config.policy.local_rack
                or old.policy.rack_learning != config.policy.rack_learning
            ):
                self._book.rebuild()
        return config

    # ------------------------------------------------------------------ the hot path

    def make_query_plan(
        self, working_keyspace: str | None = None, query: Any = None
    ) -> Iterator[Any]:
        """Yield hosts: the best-scored candidates first, then the rest of the child's plan
        (``policy.enabled: false``: the child's plan itself, exactly).

        See the module docstring for the guarantees. When a span is recording in the
        current context, the decision is recorded on it (see :mod:`adaptive_lb.tracing`).
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
        record = PlanRecord()
        hosts = list(self._planner.make_plan(working_keyspace, query, record))
        if self.decisions.tracer is None:  # a reload disabled tracing meanwhile
            return iter(hosts)
        try:
            decision, events = build_decision(
                record,
                hosts,
                working_keyspace,
                query,
                non_replica_penalty=self._planner.settings.non_replica_penalty,
                config_hash=self._config_hash,
                routing_keys=self._config.privacy.routing_keys,
                pop_transition=self.health.pop_unreported,
            )
            self.decisions.deliver(span, query, decision, events, started_ns)
        except Exception:
            self.errors.record("tracing", "the decision is not recorded on the span")
        return iter(hosts)
