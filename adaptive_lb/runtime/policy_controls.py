"""What an :class:`~adaptive_lb.runtime.policy.AdaptiveLoadBalancingPolicy` offers besides the
driver contract: :class:`PolicyControls`, which the policy class inherits.

The driver calls :mod:`adaptive_lb.runtime.policy` (populate, distances, host events, query plans);
everything else calls these: the application and the exporters read the policy's numbers
(the config in force, the counters, the rack in force, whether tracking is attached, the
snapshot) and tell it things (a config reload, a health refresh, a probe sender); request
tracking finds each attempt's statistics and reports its errors; a forked child forgets the
parent's connections. Each is a short delegation to the part that does the work, made
and owned by the policy (:mod:`adaptive_lb.runtime.policy` builds them).

May import: the parts of a policy (health, planner, refresher, replicas, sampling, snapshot,
stats, topology, tracing, tracking_watch, membership, fleet, config, clock, counting,
errors) and attrs; never :mod:`adaptive_lb.runtime.policy`, which imports it.
"""

from __future__ import annotations

import logging
import os
import threading
from itertools import count
from random import Random
from typing import Any

from attrs import evolve

from adaptive_lb.config import Config
from adaptive_lb.core.clock import Clock
from adaptive_lb.core.counting import counter_value
from adaptive_lb.core.errors import ErrorLog
from adaptive_lb.health.model import HealthModel
from adaptive_lb.plan._driver_policies import ChildChain
from adaptive_lb.plan.planner import Planner, PlanSettings
from adaptive_lb.plan.replicas import ReplicaCache, ReplicaResolver
from adaptive_lb.plan.topology import Topology, TopologyBook
from adaptive_lb.runtime.membership import Membership
from adaptive_lb.runtime.refresher import HealthRefresh
from adaptive_lb.runtime.tracking_watch import TrackingWatch
from adaptive_lb.stats.fleet import FleetEstimate
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.registry import StatsRegistry
from adaptive_lb.stats.sampling import Sampler
from adaptive_lb.telemetry.snapshot import PolicySnapshot
from adaptive_lb.telemetry.tracing import DecisionRecorder

__all__ = ["PolicyControls"]

log = logging.getLogger("adaptive_lb.policy")


class PolicyControls:
    """The policy's readings and controls (see the module docstring). Its parts are made by
    :class:`~adaptive_lb.runtime.policy.AdaptiveLoadBalancingPolicy`, which documents them."""

    _config: Config
    _config_hash: str
    _clock: Clock
    _chain: ChildChain
    _book: TopologyBook
    _refresh: HealthRefresh
    _planner: Planner
    _membership: Membership
    _tracking: TrackingWatch
    _untracked_attempts: count[int]
    _reload_lock: threading.Lock
    errors: ErrorLog
    stats: StatsRegistry
    health: HealthModel
    decisions: DecisionRecorder
    sampler: Sampler
    config_reloads: dict[str, int]
    forked_from_pid: int | None

    # ------------------------------------------------------------------ readings

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
    def fleet(self) -> FleetEstimate:
        """How many clients share the cluster, as this client learns it
        (:mod:`adaptive_lb.stats.fleet`; the prober's clients-table reads write to it)."""
        return self._refresh.fleet

    @property
    def fleet_size(self) -> int:
        """How many clients this one takes to share the cluster, for the fleet's budget of
        reads and probes (:mod:`adaptive_lb.stats.fleet`)."""
        return self._refresh.fleet.size(self.config.health.fleet)

    @property
    def fleet_size_source(self) -> str:
        """Where :attr:`fleet_size` comes from: ``configured`` (``health.fleet.size``),
        ``system_views.clients``, ``system.clients`` (counted there) or ``default``."""
        return self._refresh.fleet.source_of(self.config.health.fleet)

    @property
    def learned_rack(self) -> str | None:
        """The rack learned from measured latency (``local_rack: auto``), or None."""
        return self._book.local_rack.learned

    @property
    def decisions_by_position(self) -> dict[str, int]:
        """Plans made, by the origin of their first host (see
        :data:`adaptive_lb.plan.planner.DECISION_POSITIONS`)."""
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
        every host looks idle and unmeasured; see :mod:`adaptive_lb.runtime.tracking_watch`."""
        return self._tracking.attached

    @property
    def untracked_plans(self) -> int:
        """Plans made while no request tracking was attached (one WARNING after a bounded
        number or time: :mod:`adaptive_lb.runtime.tracking_watch`)."""
        return self._tracking.untracked_plans

    # ------------------------------------------------------------------ tracking and forks

    def tracking_attached(self, attached: bool = True) -> None:
        """Declare that something feeds this policy's statistics per attempt (``attached``)
        or stopped doing so: request tracking does, and the simulator's feedback."""
        self._tracking.attach(attached)

    def inherited_across_fork(self, parent_pid: int) -> None:
        """Called in a child forked after this policy was made (:mod:`adaptive_lb.core.forks`):
        the session's connections and threads stayed in ``parent_pid``, so the policy no
        longer claims request tracking, forgets its refresh thread and probe sender and drops
        the in-flight counts of the parent's requests, whose answers will never come here."""
        self.forked_from_pid = parent_pid
        self._tracking.detach_all()
        self._refresh.forget_thread()
        self._refresh.probe_sender = None  # the session it probed through is the parent's
        self._refresh.loop_timer = None  # and so is its event loop
        self._refresh.clients_reader = None
        self._refresh.fleet.after_fork()
        self.health.probing = False
        self.health.lateness.after_fork()
        self.stats.remove_in_flight_source()  # the parent's pools
        for view in self._book.topology.by_id.values():
            view.stats.in_flight = 0

    def record_error(self, stage: str, what: str) -> None:
        """Count an exception caught in ``stage`` (see :data:`adaptive_lb.core.errors.ERROR_STAGES`)
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

    # ------------------------------------------------------------------ health

    def refresh_health(self) -> list[Any]:
        """Recompute every known host's health from its statistics window now, and return
        the transitions. Percentiles are computed here, never per request."""
        return self._refresh.refresh()

    def maybe_refresh_health(self) -> list[Any] | None:
        """:meth:`refresh_health` if ``health.refresh_interval`` has passed since the last
        refresh and no other thread is refreshing; None otherwise."""
        return self._refresh.maybe_refresh()

    def use_loop_timer(self, create: Any | None) -> None:
        """Time the driver's event loop with ``create(delay_s, callback)`` (its
        ``create_timer``; None: stop): a silence while the client itself did not read
        answers is not a host's stall. Request tracking sets it."""
        self._refresh.loop_timer = create
        self.health.lateness.loop_timer_lost()  # a timer set through another loop is moot

    def time_event_loop(self) -> None:
        """Set a timer on the driver's event loop, to learn how late the client reads
        answers (the health refresh thread calls it; nothing without :meth:`use_loop_timer`)."""
        self._refresh.time_event_loop()

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
        read_clients: Any | None = None,
    ) -> None:
        """Send active probes with ``send(order)`` after each health refresh (None: stop),
        server-load reads with ``read_load(order)`` (:mod:`adaptive_lb.stats.server_load`) and
        clients-table reads with ``read_clients(order)`` (:mod:`adaptive_lb.stats.fleet`).
        With ``replacing``, only if that is the sender in place (a closing session must
        not stop another's). ``rng``: draw the probes' jitter and the server-load
        thresholds from it (the simulator seeds one; default: unseeded).
        :class:`adaptive_lb.runtime.prober.Prober` calls it."""
        refresh = self._refresh
        with self._book.lock:
            if replacing is not None and refresh.probe_sender is not replacing:
                return
            if rng is not None:
                refresh.seed(rng)
            refresh.probe_sender = send
            refresh.load_reader = read_load if send is not None else None
            refresh.clients_reader = read_clients if send is not None else None
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
                self.health.reconfigure(
                    config.health, config.tracking.window, config.tracking.intervals
                )
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
