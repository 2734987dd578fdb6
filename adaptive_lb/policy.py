"""AdaptiveLoadBalancingPolicy: the driver-facing weighted least-loaded policy.

It wraps any driver ``LoadBalancingPolicy`` (the *child*). The child still decides which
hosts are eligible and at what distance; this policy decides in which order the best few
are tried:

1. replicas of the statement's routing key, from an LRU cache (:mod:`adaptive_lb.replicas`);
2. candidates: the live local replicas, filled with random live local hosts up to
   ``sample_size``;
3. each scored ``(in_flight + 1) x rack x replica x health`` penalties
   (:mod:`adaptive_lb.scoring`), ascending, ties broken at random;
4. then the rest of the child's plan minus the hosts already yielded.

Guarantees:

* The hosts yielded are exactly the child's plan, each once: candidates come from the
  hosts the child considers live and local, and the rest of the plan excludes them.
* The child's ``make_query_plan`` is called at most once per plan. A stock
  ``TokenAwarePolicy`` child is looked through: its replica work is done here (cached) and
  the rest of the plan comes from its own child.
* An exception inside this policy never reaches the driver: it is counted
  (:attr:`AdaptiveLoadBalancingPolicy.internal_errors`), logged at most once a minute, and
  the child's plan is used.
* The hot path takes no Python lock (the replica cache is ``functools.lru_cache``, in C),
  reads an immutable topology snapshot rebuilt only on topology events, and computes no
  percentile.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterator
from operator import attrgetter
from random import random
from typing import Any

from attrs import define
from cassandra import ConsistencyLevel
from cassandra.policies import LoadBalancingPolicy

from adaptive_lb._driver import LOCAL_DISTANCES, ChildChain, analyse_child
from adaptive_lb.clock import SYSTEM_CLOCK, Clock
from adaptive_lb.config import Config
from adaptive_lb.errors import ErrorLog
from adaptive_lb.health import HealthModel
from adaptive_lb.proximity import rack_proximity
from adaptive_lb.refresher import HealthRefresher
from adaptive_lb.replicas import ReplicaResolver
from adaptive_lb.scoring import TIE_JITTER, HostView, order_lwt, rank
from adaptive_lb.snapshot import HostSnapshot, PolicySnapshot
from adaptive_lb.stats import StatsRegistry
from adaptive_lb.topology import Topology
from adaptive_lb.tracing import Candidate, Decision, DecisionTracer, current_recording_span

__all__ = ["DECISION_POSITIONS", "AdaptiveLoadBalancingPolicy"]

DECISION_POSITIONS = ("replica", "non_replica", "local", "child", "fallback")


log = logging.getLogger("adaptive_lb.policy")

_STARTUP_GRACE_NS = 5 * 1_000_000_000
"""Hosts added within this long of ``populate`` do not start WARMING."""
_BLIP_NS = 1_000_000_000
"""A host down for less than this (the driver bounces the contact point while connecting)
does not start WARMING when it comes back."""


@define(frozen=True, slots=True)
class _PlanSettings:
    """The few config values the hot path reads, published as one reference."""

    sample_size: int
    non_replica_penalty: float
    non_local_rack_penalty: float
    token_aware: bool
    lwt_deterministic: bool
    local_rack: str | None

    @classmethod
    def of(cls, config: Config, chain: ChildChain) -> _PlanSettings:
        p = config.policy
        local_rack = p.local_rack
        if local_rack is None:
            local_rack = getattr(chain.base, "local_rack", None) or None
        return cls(
            sample_size=p.sample_size,
            non_replica_penalty=p.non_replica_penalty,
            non_local_rack_penalty=p.non_local_rack_penalty,
            token_aware=p.token_aware,
            lwt_deterministic=p.lwt_deterministic,
            local_rack=local_rack,
        )


# A statement is treated as a lightweight transaction when scylla-driver's ``is_lwt()`` says
# so (conditional prepared statements) or when it reads at SERIAL / LOCAL_SERIAL
# (cassandra-driver reports no LWT flag).
_SERIAL = frozenset((ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL))
_INFINITY = float("inf")
_HOST = attrgetter("host")


def _count_value(counter: itertools.count) -> int:  # type: ignore[type-arg]
    """The next value of ``counter`` without advancing it: ``repr(itertools.count(n))`` is
    ``"count(n)"``. An ``itertools.count`` is the counter of choice on the hot path: one
    C-level ``next()`` is atomic, with no Python lock."""
    return int(repr(counter)[6:-1])


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
        self._settings = _PlanSettings.of(self._config, self._chain)
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._now_ns = self._clock.now_ns
        self.stats = StatsRegistry(self._config.tracking, self._clock)
        """Per-host live statistics (in-flight, latency window, health penalty)."""
        self.health = HealthModel(
            self._config.health, self._clock, window_s=self._config.tracking.window
        )
        """Turns the statistics into health states and penalties (see :meth:`refresh_health`)."""
        self._refresher: HealthRefresher | None = None
        self._topology = Topology()
        self._topology_lock = threading.RLock()
        self._generation = 0
        self._hosts: dict[int, Any] = {}
        self._live: set[int] = set()
        self._local_dc_seen: Any = None
        self._metadata: Any = None
        self._cluster: Any = None
        self._populated_ns: int | None = None
        self._down_since: dict[int, int] = {}
        self._rack_proximity: dict[Any, float] = {}
        """Proximity factor of each remote rack, from the last health refresh."""
        self._resolver: ReplicaResolver | None = None
        self._tracer_provider = tracer_provider
        self._tracer: DecisionTracer | None = None
        self._trace_ratio = 1.0
        self._configure_tracing(self._config)
        # Plans by where their first host came from; itertools.count increments atomically
        # (one C call, no lock) and is read at scrape time only.
        self._decisions = {position: itertools.count() for position in DECISION_POSITIONS}
        self._untracked_attempts = itertools.count()
        self._unknown_host_events = itertools.count()
        self.config_reloads = {"success": 0, "failure": 0}
        """Reloads through :meth:`reload`, by result."""
        self._error_lock = threading.Lock()
        self.errors = ErrorLog(self._clock, log)
        """Internal errors by stage (plan, tracing, health refresh, snapshot...), each
        logged at most once a minute per stage."""

    # ------------------------------------------------------------------ properties

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
        return _count_value(self._untracked_attempts)

    @property
    def unknown_host_events(self) -> int:
        """``on_up`` / ``on_down`` for hosts this policy does not know (never added, or
        already removed): passed to the child, ignored here."""
        return _count_value(self._unknown_host_events)

    def record_error(self, stage: str, what: str) -> None:
        """Count an exception caught in ``stage`` (see :data:`adaptive_lb.errors.ERROR_STAGES`)
        and log it at most once a minute per stage; call it from the ``except`` block.
        Exporters, the health refresher and the config watcher report through it."""
        self.errors.record(stage, what)

    @property
    def child(self) -> LoadBalancingPolicy:
        """The wrapped policy."""
        return self._child

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config

    @property
    def decisions_by_position(self) -> dict[str, int]:
        """Plans made, by the origin of their first host: ``replica``, ``non_replica`` (a
        replica set existed but a non-replica scored best), ``local`` (no routing key or no
        replicas: least-loaded local host), ``child`` (no local candidate, or a target host:
        the child's plan decided), ``fallback`` (internal error)."""
        return {position: _count_value(c) for position, c in self._decisions.items()}

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
        return self._topology

    @property
    def replica_cache(self):
        """The replica LRU cache (None before :meth:`populate`)."""
        return self._resolver.cache if self._resolver is not None else None

    # ------------------------------------------------------------------ driver contract

    def populate(self, cluster: Any, hosts: Any) -> None:
        """Populate the child, then build the topology snapshot and the replica resolver
        afresh from ``hosts`` (statistics of hosts no longer listed are forgotten).

        One policy serves one ``Cluster``: the driver populates it again when it is also
        used by another execution profile of the same cluster, which is fine; populating it
        for a second cluster while the first is still open raises ``ValueError`` (its plans
        would mix the two clusters' hosts). Once the first cluster is shut down (or
        garbage-collected) the policy may be reused for another one."""
        hosts = list(hosts)
        with self._topology_lock:
            self._check_one_cluster(cluster)
            self._child.populate(cluster, hosts)
            if self._populated_ns is None:
                self._populated_ns = self._clock.now_ns()
            if self._metadata is not cluster.metadata or self._resolver is None:
                self._resolver = ReplicaResolver(
                    cluster.metadata, self._config.policy.replica_cache_size
                )
            self._cluster = cluster
            self._metadata = cluster.metadata
            previous = self._hosts
            self._hosts = {id(host): host for host in hosts}
            self._live = set(self._hosts)
            self._down_since.clear()
            self._rebuild()
            for key, host in previous.items():
                if key not in self._hosts:
                    self.stats.remove(host)
                    self.health.forget(host)

    def _check_one_cluster(self, cluster: Any) -> None:
        previous = self._cluster
        if previous is None or self._metadata is cluster.metadata:
            return
        try:
            open_ = not getattr(previous, "is_shutdown", False)
        except ReferenceError:  # the driver passes a weakref.proxy of its Cluster
            open_ = False
        if open_:
            raise ValueError(
                "this AdaptiveLoadBalancingPolicy already serves another Cluster that is "
                "still open; give each Cluster its own policy object"
            )

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
        if id(host) not in self._hosts:
            next(self._unknown_host_events)
            return
        self._child.on_up(host)
        was_live = id(host) in self._live
        down_since = self._down_since.pop(id(host), None)
        if not self._host_changed(host, live=True, known_only=True) or was_live:
            return
        if down_since is not None:
            # A real outage (not the contact point's bounce while the driver connects).
            if self._clock.now_ns() - down_since >= _BLIP_NS:
                self.health.mark_up(host, self.stats.get(host))
        else:
            self._maybe_warm_up(host)

    def on_down(self, host: Any) -> None:
        """Tell the child, then mark the host not live in the snapshot."""
        self._child.on_down(host)
        if id(host) not in self._hosts or not self._host_changed(host, live=False, known_only=True):
            next(self._unknown_host_events)
            return
        self._down_since.setdefault(id(host), self._clock.now_ns())

    def on_add(self, host: Any) -> None:
        """Tell the child, then add the host (live, like the stock policies do); a host
        joining a cluster in service starts WARMING."""
        self._child.on_add(host)
        known = id(host) in self._hosts
        self._host_changed(host, live=True)
        if not known:
            self._maybe_warm_up(host)

    def _maybe_warm_up(self, host: Any) -> None:
        # While the driver connects it adds every host: nothing is being stampeded yet, so
        # no slow start for hosts that appear then.
        populated = self._populated_ns
        if populated is not None and self._clock.now_ns() - populated >= _STARTUP_GRACE_NS:
            self.health.mark_up(host, self.stats.get(host))

    def on_remove(self, host: Any) -> None:
        """Tell the child, then forget the host and free its statistics."""
        self._child.on_remove(host)
        with self._topology_lock:
            self._down_since.pop(id(host), None)
            self._hosts.pop(id(host), None)
            self._live.discard(id(host))
            self._generation += 1
            self._topology = self._topology.without_host(host, self._generation)
            # Under the lock: an on_add of the same host right after must find it gone.
            self.stats.remove(host)
        self.health.forget(host)

    # ------------------------------------------------------------------ topology

    def refresh_topology(self) -> None:
        """Rebuild the snapshot from scratch: call it after changing something the child's
        distances depend on outside of topology events (e.g. a HostFilterPolicy predicate)."""
        with self._topology_lock:
            self._rebuild()

    def _view(self, host: Any, live: bool) -> HostView:
        settings = self._settings
        distance = self._child.distance(host)
        rack = host.rack
        local_rack = settings.local_rack
        rack_penalty = 1.0
        if local_rack is not None and rack != local_rack:
            rack_penalty = settings.non_local_rack_penalty
        stats = self.stats.get(host)
        stats.rack_penalty = self._rack_factor(rack_penalty, rack)
        return HostView(
            host=host,
            stats=stats,
            datacenter=host.datacenter,
            rack=rack,
            is_local=distance in LOCAL_DISTANCES,
            live=live,
            rack_penalty=rack_penalty,
        )

    def _rebuild(self) -> None:
        # Caller holds _topology_lock.
        self._local_dc_seen = getattr(self._chain.base, "local_dc", None)
        self._generation += 1
        live = self._live
        views = [self._view(host, key in live) for key, host in self._hosts.items()]
        self._topology = Topology.build(views, self._generation)

    def _host_changed(self, host: Any, live: bool, known_only: bool = False) -> bool:
        """Publish ``host``'s new liveness; with ``known_only``, only if it is still known
        (an on_remove may have run since the caller looked). True if published."""
        with self._topology_lock:
            key = id(host)
            if known_only and key not in self._hosts:
                return False
            self._hosts[key] = host
            if live:
                self._live.add(key)
            else:
                self._live.discard(key)
            if getattr(self._chain.base, "local_dc", None) != self._local_dc_seen:
                # DCAwareRoundRobinPolicy inferred its local DC from this host: every
                # distance may have changed.
                self._rebuild()
                return True
            self._generation += 1
            self._topology = self._topology.with_view(self._view(host, live), self._generation)
            return True

    # ------------------------------------------------------------------ health

    def refresh_health(self) -> list[Any]:
        """Recompute every known host's health from its statistics window now, and return
        the transitions. Percentiles are computed here, never per request."""
        stats, groups = self._health_inputs()
        transitions = self.health.refresh(stats, groups, self._knows)
        self._refresh_rack_proximity()
        return transitions

    def maybe_refresh_health(self) -> list[Any] | None:
        """:meth:`refresh_health` if ``health.refresh_interval`` has passed since the last
        refresh and no other thread is refreshing; None otherwise."""
        stats, groups = self._health_inputs()
        transitions = self.health.maybe_refresh(stats, groups, self._knows)
        if transitions is not None:
            self._refresh_rack_proximity()
        return transitions

    def _refresh_rack_proximity(self) -> None:
        """Re-weigh the remote racks of the local datacenter by their measured distance
        (:mod:`adaptive_lb.proximity`) from the windows the health refresh just computed,
        and publish each remote host's ``rack_penalty``."""
        min_samples = self.health.config.min_samples
        remote = [v for v in self._topology.by_id.values() if v.is_local and v.rack_penalty > 1.0]
        latencies: dict[Any, list[float]] = {}
        for view in remote:
            window = self.health.window_stats(view.host)
            if window is None or window.samples < min_samples:
                continue
            latency = window.latency.get(50.0)
            if latency is not None:
                latencies.setdefault(view.rack, []).append(latency)
        self._rack_proximity = rack_proximity(
            latencies, self._rack_proximity, self._config.policy.rack_proximity_cap
        )
        for view in remote:
            view.stats.rack_penalty = self._rack_factor(view.rack_penalty, view.rack)

    def _rack_factor(self, rack_penalty: float, rack: Any) -> float:
        """The live rack factor of a host: its static rack penalty, times its rack's
        proximity when that is a remote rack."""
        if rack_penalty <= 1.0:
            return rack_penalty
        return rack_penalty * self._rack_proximity.get(rack, 1.0)

    def _knows(self, host: Any) -> bool:
        """``host`` is in the topology in force (not removed since a refresh began)."""
        return id(host) in self._topology.by_id

    def _health_inputs(self) -> tuple[dict[Any, Any], dict[Any, Any]]:
        # A host's peers are the other hosts of its datacenter.
        views = self._topology.by_id.values()
        return (
            {view.host: view.stats for view in views},
            {view.host: view.datacenter for view in views},
        )

    def start_health_refresh(self) -> None:
        """Refresh health every ``health.refresh_interval`` on a daemon thread (real clock).
        :func:`adaptive_lb.instrument` calls this; the simulator drives
        :meth:`refresh_health` on its virtual clock instead. Idempotent."""
        with self._topology_lock:
            if self._refresher is None or not self._refresher.is_alive():
                self._refresher = HealthRefresher(self)
                self._refresher.start()

    def stop_health_refresh(self) -> None:
        """Stop the refresh thread (if running) and wait for it."""
        refresher = self._refresher
        self._refresher = None
        if refresher is not None:
            refresher.stop()

    # ------------------------------------------------------------------ snapshot

    def snapshot(self) -> PolicySnapshot:
        """Every known host's numbers as of now (in-flight) and of the last health refresh
        (window counts, percentiles, health), plus cache and error counters."""
        hosts = []
        for view in self._topology.by_id.values():
            host = view.host
            stats = view.stats
            window = self.health.window_stats(host)
            health = self.health.health(host)
            latency = window.latency if window is not None else {}
            hosts.append(
                HostSnapshot(
                    address=str(host.address),
                    port=getattr(host.endpoint, "port", None),
                    datacenter=view.datacenter,
                    rack=view.rack,
                    is_local=view.is_local,
                    live=view.live,
                    in_flight=stats.in_flight,
                    requests=window.requests if window is not None else 0,
                    errors=window.errors if window is not None else 0,
                    timeouts=window.timeouts if window is not None else 0,
                    latency_p50=latency.get(50.0),
                    latency_p95=latency.get(95.0),
                    latency_p99=latency.get(99.0),
                    health_state=stats.health_state.value,
                    health_penalty=stats.health_penalty,
                    rack_penalty=stats.rack_penalty,
                    health_since_ns=health.since_ns if health is not None else 0,
                    health_reason=health.reason if health is not None else "",
                    requests_total=stats.requests_total,
                    errors_total=stats.errors_total,
                    timeouts_total=stats.timeouts_total,
                )
            )
        hosts.sort(key=lambda h: (h.datacenter or "", h.rack or "", h.address))
        cache = self.replica_cache
        return PolicySnapshot(
            taken_ns=self._clock.now_ns(),
            config_hash=self._config_hash,
            hosts=tuple(hosts),
            replica_cache_size=len(cache) if cache is not None else 0,
            replica_cache_hits=cache.hits if cache is not None else 0,
            replica_cache_misses=cache.misses if cache is not None else 0,
            replica_cache_evictions=cache.evictions if cache is not None else 0,
            replica_cache_invalidations=cache.invalidations if cache is not None else 0,
            internal_errors=self.internal_errors,
            plan_fallbacks=self.errors.counts()["plan"],
        )

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
                with self._error_lock:
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
        with self._error_lock:
            self.config_reloads["success"] += 1
        with self._topology_lock:
            old = self._config
            self._config = config
            self._config_hash = config.hash
            self._settings = _PlanSettings.of(config, self._chain)
            if old.health != config.health or old.tracking != config.tracking:
                self.health.reconfigure(config.health, window_s=config.tracking.window)
            if old.tracking != config.tracking:
                self.stats.reconfigure(config.tracking)
            if old.tracing != config.tracing or old.privacy != config.privacy:
                self._configure_tracing(config)
            if self._resolver is not None and (
                old.policy.replica_cache_size != config.policy.replica_cache_size
            ):
                self._resolver.cache.resize(config.policy.replica_cache_size)
            if (
                old.policy.non_local_rack_penalty != config.policy.non_local_rack_penalty
                or old.policy.local_rack != config.policy.local_rack
            ):
                self._rebuild()
        return config

    # ------------------------------------------------------------------ the hot path

    def make_query_plan(
        self, working_keyspace: str | None = None, query: Any = None
    ) -> Iterator[Any]:
        """Yield hosts: the best-scored candidates first, then the rest of the child's plan.

        See the module docstring for the guarantees. When a span is recording in the
        current context, the decision is recorded on it (see :mod:`adaptive_lb.tracing`).
        """
        if self._tracer is not None:
            span = current_recording_span()
            if span is not None and (self._trace_ratio >= 1.0 or random() < self._trace_ratio):
                return self._traced_plan(span, working_keyspace, query)
        return self._plan(working_keyspace, query, None)

    def _configure_tracing(self, config: Config) -> None:
        if config.tracing.enabled:
            self._tracer = DecisionTracer(config.tracing, config.privacy, self._tracer_provider)
            self._trace_ratio = config.tracing.ratio
        else:
            self._tracer = None

    def _traced_plan(self, span: Any, working_keyspace: str | None, query: Any) -> Iterator[Any]:
        info: dict[str, Any] = {}
        hosts = list(self._plan(working_keyspace, query, info))
        try:
            decision, events = self._decision(info, hosts, working_keyspace, query)
            self._tracer.record(span, decision, events)
        except Exception:
            self.errors.record("tracing", "the decision is not recorded on the span")
        return iter(hosts)

    def _decision(
        self, info: dict[str, Any], hosts: list[Any], working_keyspace: str | None, query: Any
    ) -> tuple[Decision, list[tuple[str, dict[str, Any]]]]:
        settings = self._settings
        replicas = info.get("replicas", ())
        replica_ids = {id(view.host) for view in replicas}
        candidates = []
        events = []
        for view in info.get("candidates", ()):
            is_replica = id(view.host) in replica_ids
            stats = view.stats
            penalty = stats.rack_penalty * stats.health_penalty
            if not is_replica and replicas:
                penalty *= settings.non_replica_penalty
            candidates.append(
                Candidate(
                    address=str(view.host.address),
                    port=getattr(view.host.endpoint, "port", None),
                    in_flight=stats.in_flight,
                    health_state=stats.health_state.value,
                    penalty=penalty,
                    score=(stats.in_flight + 1) * penalty,
                    is_replica=is_replica,
                )
            )
            transition = self.health.pop_unreported(view.host)
            if transition is not None:
                events.append(
                    (
                        "adaptive_lb.health_transition",
                        {
                            "server.address": str(view.host.address),
                            "adaptive_lb.health.from": transition.old.state.value,
                            "adaptive_lb.health.to": transition.new.state.value,
                            "adaptive_lb.health.penalty": transition.new.penalty,
                            "adaptive_lb.health.reason": transition.new.reason,
                        },
                    )
                )
        chosen = hosts[0] if hosts else None
        # Recorded by _plan where it counts decisions_by_position: the same vocabulary.
        position = "fallback" if info.get("fallback") else info.get("position", "child")
        cache = self.replica_cache
        keyspace = info.get("keyspace", working_keyspace)
        routing_key = getattr(query, "routing_key", None) if query is not None else None
        decision = Decision(
            keyspace=keyspace,
            lwt=bool(info.get("lwt", False)),
            replica_count=len(replicas),
            candidates=tuple(candidates),
            chosen_address=str(chosen.address) if chosen is not None else None,
            chosen_port=getattr(chosen.endpoint, "port", None) if chosen is not None else None,
            position=position,
            cache_hit=info.get("cache_hit"),
            cache_hit_ratio=cache.hit_ratio if cache is not None else 0.0,
            fallback=bool(info.get("fallback", False)),
            config_hash=self._config_hash,
            plan_length=len(hosts),
            routing_key=routing_key if self._config.privacy.routing_keys else None,
        )
        return decision, events

    def _plan(
        self, working_keyspace: str | None, query: Any, info: dict[str, Any] | None
    ) -> Iterator[Any]:
        """The algorithm. ``info`` (tracing only) receives what the decision was made of,
        and disables the first-host shortcut so that every candidate gets a score."""
        topology = self._topology
        settings = self._settings
        chain = self._chain
        yielded: set[int] | None = None
        rest: Iterator[Any] | None = None
        keyspace = working_keyspace
        in_child = False  # an exception raised by the child is the child's, not ours
        try:
            if query is not None:
                keyspace = query.keyspace or working_keyspace
                if chain.target_host_aware and getattr(query, "target_host", None):
                    in_child = True
                    rest = iter(self._child.make_query_plan(working_keyspace, query))
                    in_child = False
                    local: tuple[HostView, ...] = ()
                else:
                    local = topology.local
            else:
                local = topology.local

            if local and self._resolver is not None:
                allowed: set[int] | None = None
                if not chain.membership_known:
                    # A policy we cannot predict: materialise its plan once and choose
                    # candidates only among the hosts it actually yields.
                    in_child = True
                    plan = list(self._rest_plan(keyspace, query))
                    in_child = False
                    rest = iter(plan)
                    allowed = {id(host) for host in plan}

                replicas: tuple[HostView, ...] | list[HostView] = ()
                if settings.token_aware and keyspace is not None and query is not None:
                    routing_key = query.routing_key
                    if routing_key is not None:
                        replicas, cache_hit = self._resolver.replicas(
                            keyspace, routing_key, query, topology
                        )
                        if replicas and (chain.predicates or allowed is not None):
                            # A TokenAwarePolicy yields every live local replica, whatever
                            # its own child's plan holds: only host filters still apply.
                            replicas = self._eligible(
                                replicas, allowed if chain.token_aware is None else None
                            )
                        if info is not None:
                            info["cache_hit"] = cache_hit
                if info is not None:
                    info["keyspace"] = keyspace
                    info["replicas"] = replicas

                lwt = False
                if replicas and settings.lwt_deterministic:
                    is_lwt = getattr(query, "is_lwt", None)
                    lwt = (is_lwt is not None and is_lwt()) or query.consistency_level in _SERIAL
                if lwt:
                    yielded = set()
                    ordered = order_lwt(replicas)
                    if info is not None:
                        info["lwt"] = True
                        info["position"] = "replica"
                        info["candidates"] = ordered
                    next(self._decisions["replica"])
                    yielded.update(map(id, map(_HOST, ordered)))
                    for view in ordered:
                        yield view.host
                elif replicas:
                    # First host without building the full candidate list when no
                    # non-replica could beat the best replica (the common case).
                    best = replicas[0]
                    best_score = _INFINITY
                    for view in replicas:
                        stats = view.stats
                        score = (
                            (stats.in_flight + 1)
                            * stats.rack_penalty
                            * stats.health_penalty
                            * (1.0 + TIE_JITTER * random())
                        )
                        if score < best_score:
                            best_score = score
                            best = view
                    if (
                        info is None
                        and best_score < settings.non_replica_penalty * topology.min_rack_penalty
                    ):
                        yielded = {id(best.host)}
                        next(self._decisions["replica"])
                        yield best.host
                        others = list(replicas)
                        others.remove(best)  # C-level, by identity first
                    else:
                        yielded = set()
                        others = replicas
                    ordered = rank(
                        others,
                        self._fill_pool(local, allowed),
                        settings.sample_size - len(replicas),
                        replicas,
                        settings.non_replica_penalty,
                    )
                    if info is not None:
                        info["candidates"] = ordered
                    if not yielded and ordered:
                        position = "replica" if ordered[0] in replicas else "non_replica"
                        next(self._decisions[position])
                        if info is not None:
                            info["position"] = position
                    # Recorded before they are yielded: one C-level pass instead of a set
                    # insert per host (nothing between the yields below can raise).
                    yielded.update(map(id, map(_HOST, ordered)))
                    for view in ordered:
                        yield view.host
                else:
                    ordered = rank(
                        (),
                        self._fill_pool(local, allowed),
                        settings.sample_size,
                        (),
                        1.0,
                    )
                    if info is not None:
                        info["candidates"] = ordered
                    if ordered:
                        next(self._decisions["local"])
                        if info is not None:
                            info["position"] = "local"
                    yielded = set(map(id, map(_HOST, ordered)))
                    for view in ordered:
                        yield view.host
            if rest is None:
                in_child = True
                rest = iter(self._rest_plan(keyspace, query))
        except Exception:
            if in_child:
                raise  # as the child alone would have: not ours to count or retry
            self._internal_error()
            if info is not None:
                info["fallback"] = True
            if rest is None:
                rest = iter(self._child.make_query_plan(working_keyspace, query))
            if not yielded:
                next(self._decisions["fallback"])
                if info is not None:
                    info["position"] = "fallback"
        else:
            if not yielded:
                # No local candidate (or a target host): the child's plan decides.
                next(self._decisions["child"])
                if info is not None:
                    info["position"] = "child"

        # The rest of the child's plan, each host once (a child may repeat a host).
        if yielded is None:
            yielded = set()
        for host in rest:
            key = id(host)
            if key not in yielded:
                yielded.add(key)
                yield host

    def _rest_plan(self, keyspace: str | None, query: Any) -> Iterator[Any]:
        chain = self._chain
        if chain.token_aware is None and not chain.predicates and not chain.target_host_aware:
            return self._child.make_query_plan(keyspace, query)
        plan = chain.base.make_query_plan(keyspace, query)
        if not chain.predicates:
            return plan
        predicates = chain.predicates
        return (host for host in plan if all(p(host) for p in predicates))

    def _eligible(
        self, views: tuple[HostView, ...] | list[HostView], allowed: set[int] | None
    ) -> list[HostView]:
        predicates = self._chain.predicates
        return [
            view
            for view in views
            if (allowed is None or id(view.host) in allowed)
            and all(p(view.host) for p in predicates)
        ]

    def _fill_pool(
        self, local: tuple[HostView, ...], allowed: set[int] | None
    ) -> tuple[HostView, ...] | list[HostView]:
        # The hosts the fill may come from: the local candidates the child would yield.
        if allowed is None and not self._chain.predicates:
            return local
        return self._eligible(local, allowed)

    def _internal_error(self) -> None:
        self.errors.record("plan", "the child's plan is used instead")
