"""Health refresh: the health model and rack proximity applied to a policy's hosts, now and
then, off the request path -- by a background thread in production, by the simulator's
virtual clock in simulation.

Each refresh computes every known host's window once (percentiles are computed here, never
per request), lets :class:`~adaptive_lb.health.model.HealthModel` judge each host against its
true peers (its rack, else its datacenter corrected by distance), and re-weighs the remote
racks of the local datacenter by their measured distance
(:func:`adaptive_lb.plan.locality.rack_proximity`), publishing each host's penalties on its
:class:`~adaptive_lb.stats.host.HostStats` for the hot path to read.

May import: the health package (model, probes), the plan's locality and the packages below
it (topology, scoring, statistics, server load, fleet).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from adaptive_lb.health.model import HealthModel, HealthState, HealthTransition
from adaptive_lb.health.probes import HUNG, ROUTINE, ProbeOrder, ProbeScheduler
from adaptive_lb.plan.locality import rack_proximity
from adaptive_lb.plan.scoring import HostView
from adaptive_lb.plan.topology import TopologyBook
from adaptive_lb.stats.fleet import ClientsOrder, FleetEstimate, FleetPacer, own_period_s
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.server_load import LoadOrder, due, publish, supports_thread_pools

__all__ = ["HealthRefresh", "HealthRefresher"]


class HealthRefresh:
    """Refreshes the health of the hosts in ``book`` with ``health``.

    ``proximity_cap()`` reads ``policy.rack_proximity_cap`` from the config in force.
    """

    def __init__(
        self, health: HealthModel, book: TopologyBook, proximity_cap: Callable[[], float]
    ) -> None:
        self.health = health
        self._book = book
        self._proximity_cap = proximity_cap
        self.rack_proximity: dict[Any, float] = {}
        """Proximity factor of each remote rack, from the last refresh."""
        self._thread: HealthRefresher | None = None
        self._thread_lock = threading.Lock()
        self.scheduler = ProbeScheduler()
        """Which hosts get an active probe after each refresh (:mod:`adaptive_lb.health.probes`)."""
        self.probe_sender: Callable[[ProbeOrder], None] | None = None
        """Sends one probe (:mod:`adaptive_lb.runtime.prober`, while request tracking is
        attached; the simulator's :mod:`adaptive_lb.tools.sim.driver_side`); None: no probes
        (a policy without tracking)."""
        self.load_reader: Callable[[LoadOrder], None] | None = None
        """Sends one server-load read (:mod:`adaptive_lb.stats.server_load`), beside the probe
        sender; None: none (every host's ``server_load`` factor stays 1)."""
        self.clients_reader: Callable[[ClientsOrder], None] | None = None
        """Sends one clients-table read (:mod:`adaptive_lb.stats.fleet`), beside the probe sender;
        None: none (the fleet size is configured or ``default_size``)."""
        self.loop_timer: Callable[[float, Callable[[], None]], Any] | None = None
        """Sets a timer on the driver's event loop (while request tracking is attached):
        how late it fires is how late the client reads answers (:meth:`time_event_loop`);
        None: the health thread's own lateness stands in."""
        self.fleet = FleetEstimate()
        """How many clients share the cluster (:mod:`adaptive_lb.stats.fleet`)."""
        self.pacer = FleetPacer()
        """Spaces this client's reads and probes of each host within the fleet's budget."""
        self._load_rng = random.Random()
        self._thresholds: random.Random | None = None
        """Set by :meth:`seed`: each host's server-load threshold
        (:attr:`~adaptive_lb.stats.server_load.ServerLoadRecord.draw`) is drawn from it before
        the host's first read; None: the record's own draw (unseeded) stands."""

    def seed(self, rng: random.Random) -> None:
        """Draw the probes' jitter, the server-load thresholds and the clients-table reads'
        moments from ``rng`` (before the first refresh)."""
        self.scheduler = ProbeScheduler(rng)
        # Streams of their own, derived without drawing from ``rng``: the probes' jitter
        # stays what it was without server-load reads.
        state = repr(rng.getstate())
        self._load_rng = random.Random(state)
        self.pacer = FleetPacer(random.Random(f"{state}:fleet"))
        self.fleet = FleetEstimate(random.Random(f"{state}:clients"))
        self._thresholds = random.Random(f"{state}:thresholds")

    def time_event_loop(self) -> None:
        """Set a timer due now on the driver's event loop, unless the last one has not
        fired yet (:meth:`ClientLateness.loop_timer_due
        <adaptive_lb.stats.lateness.ClientLateness.loop_timer_due>`); the health thread
        calls it before each refresh."""
        create, lateness = self.loop_timer, self.health.lateness
        clock = self.health.clock
        if create is None or not lateness.loop_timer_due(clock.now_ns()):
            return
        try:
            create(0.0, lambda: lateness.loop_timer_fired(clock.now_ns()))
        except Exception:
            lateness.loop_timer_lost()
            raise

    def refresh(self) -> list[HealthTransition]:
        """Refresh now (waits for a refresh in progress); the health transitions."""
        stats, groups = self.inputs()
        transitions = self.health.refresh(stats, groups, self._book.knows, self.racks())
        self._refresh_locality()
        self._pace()
        self._probe()
        self._server_load()
        return transitions

    def maybe_refresh(self) -> list[HealthTransition] | None:
        """:meth:`refresh` if ``health.refresh_interval`` has passed since the last one and
        no other thread is refreshing; None otherwise."""
        stats, groups = self.inputs()
        transitions = self.health.maybe_refresh(stats, groups, self._book.knows, self.racks())
        if transitions is not None:
            self._refresh_locality()
            self._pace()
            self._probe()
            self._server_load()
        return transitions

    def _pace(self) -> None:
        """Before the probes and reads of a refresh: the slots' period from the fleet size
        in force (:mod:`adaptive_lb.stats.fleet`)."""
        config = self.health.config.fleet
        period_s = own_period_s(self.fleet.size(config), config.budget)
        # Slots drawn after the fleet's first clients-table reads, not on top of them.
        after = self.fleet.started_ns() if self._learning() else None
        self.pacer.resize(period_s, self.health.clock.now_ns(), after)
        self.pacer.keep(self._book.topology.by_id.keys())
        binding = self.pacer.binding(self.health.config.probe_interval)
        self.health.paced = binding or self._size_unknown()

    def _probe(self) -> None:
        """After a health refresh: send the probes that are due and have a slot of the
        fleet's budget (:mod:`adaptive_lb.stats.fleet`), if a sender is set. A due probe
        without one waits, noted on the host's record
        (:meth:`~adaptive_lb.stats.probe_record.ProbeRecord.hold`): the health model judges
        the host by what it would have shown (:func:`adaptive_lb.health.probes.judge`)."""
        send = self.probe_sender
        if send is None:
            return
        health = self.health
        views = self._book.topology.by_id.values()
        orders = self.scheduler.due(
            ((view.host, view.stats, view.live) for view in views),
            health.verdicts,
            health.windows,
            health.unanswered,
            health.clock.now_ns(),
            health.config,
        )
        now = health.clock.now_ns()
        base = health.config.probe_interval
        unknown = self._size_unknown()
        held = set()
        for order in orders:
            if unknown and order.reason == ROUTINE:
                continue  # a fleet started at once would probe every node at once
            # Its size unknown, a client's probe of a host whose requests hang waits as for
            # a slot (a node stalled at the fleet's start would get one from every client).
            waits = unknown and order.reason == HUNG
            if not waits and self.pacer.take(id(order.key), now, base):
                send(order)
                continue
            # No slot: the health model judges the host by what this probe would show.
            order.stats.probes.hold(now, order.reason, order.stats.in_flight)
            held.add(id(order.stats))
        for view in views:
            if id(view.stats) not in held:
                view.stats.probes.release()

    def _learning(self) -> bool:
        """Whether this client learns the fleet's size from the clients tables."""
        fleet = self.health.config.fleet
        return (
            fleet.size <= 0 < min(fleet.clients_interval, fleet.budget)
            and self.clients_reader is not None
        )

    def _size_unknown(self) -> bool:
        """Whether the fleet's size is still to be learned (:meth:`FleetEstimate.settled`)."""
        return self._learning() and not self.fleet.settled()

    def _server_load(self) -> None:
        """After a health refresh: publish each local host's server-load factor (its
        datacenter's hosts are its peers), then send the clients-table read and the load
        reads that are due and have a slot of the fleet's budget."""
        config = self.health.config.server_load
        local = [view for view in self._book.topology.by_id.values() if view.is_local]
        now = self.health.clock.now_ns()
        interval_s = max(config.interval, self.pacer.period_s)
        by_dc: dict[Any, list[tuple[Hashable, HostStats]]] = {}
        for view in local:
            by_dc.setdefault(view.datacenter, []).append((view.host, view.stats))
        for hosts in by_dc.values():
            publish(hosts, now, config, interval_s)
        read = self.load_reader
        if read is None:
            return
        self._read_clients(local, now)
        if self._size_unknown():
            return  # its size unknown: a fleet started at once would read every node at once
        thresholds = self._thresholds
        binding = self.pacer.binding(config.interval)
        if binding and self._learning() and self.fleet.starting(now):
            return  # the fleet's first clients reads: the thread-pool reads come after them
        readable = (
            (v.host, v.stats, v.live)
            for v in local
            # Paced: a stalled or erroring host's slot is its probe's (its read would wait
            # in the same stall, and the factor weighs nothing beside its penalty).
            if not (binding and v.stats.health_state is HealthState.ERRORING)
        )
        for order in due(readable, now, config, self._load_rng):
            if not self.pacer.take(id(order.key), now, config.interval):
                continue
            if thresholds is not None and order.stats.load.sent == 0:
                order.stats.load.draw = thresholds.random()  # seeded, before its first read
            read(order)

    def _read_clients(self, local: list[HostView[HostStats]], now: int) -> None:
        """Send the clients-table read if one is due
        (:class:`~adaptive_lb.stats.fleet.FleetEstimate`)."""
        reader = self.clients_reader
        if reader is None:
            return
        hosts = [
            (view.host, supports_thread_pools(getattr(view.host, "release_version", None)))
            for view in local
            if view.live
        ]
        order = self.fleet.order(now, hosts, self.health.config.fleet, len(local))
        if order is not None:
            self.pacer.spend(id(order.key), now)  # one of its own requests to that node
            reader(order)

    def inputs(self) -> tuple[dict[Hashable, HostStats], dict[Hashable, Any]]:
        """Every known host's statistics, and its peer group: its datacenter."""
        views = self._book.topology.by_id.values()
        return (
            {view.host: view.stats for view in views},
            {view.host: view.datacenter for view in views},
        )

    def racks(self) -> dict[Hashable, Any]:
        """Every known host's rack: health peers are true peers (its rack first, see
        :mod:`adaptive_lb.health.peers`)."""
        return {view.host: view.rack for view in self._book.topology.by_id.values()}

    def rack_factor(self, rack_penalty: float, rack: Any) -> float:
        """The live rack factor of a host: its static rack penalty, times its rack's
        proximity when that is a remote rack."""
        if rack_penalty <= 1.0:
            return rack_penalty
        return rack_penalty * self.rack_proximity.get(rack, 1.0)

    def _refresh_locality(self) -> None:
        """After a health refresh: learn the local rack (``local_rack: auto``), then
        re-weigh the remote racks."""
        if self._book.local_rack.learning:
            self._learn_local_rack()
        self._refresh_rack_proximity()

    def _learn_local_rack(self) -> None:
        """Feed the rack learner the median p50 of each local rack's live HEALTHY hosts
        that have ``min_samples`` (from the windows the health refresh just computed); when
        the learned rack changes, rebuild the snapshot (every host's rack penalty)."""
        local = [v for v in self._book.topology.by_id.values() if v.is_local]
        latencies = self._p50_by_rack(
            v for v in local if v.live and v.stats.health_state is HealthState.HEALTHY
        )
        medians = {rack: statistics.median(values) for rack, values in latencies.items()}
        racks = {view.rack for view in local}
        live = {view.rack for view in local if view.live}
        now = self.health.clock.now_ns()
        with self._book.lock:  # against a reload reconfiguring it
            if self._book.local_rack.observe(medians, racks, now, live):
                self.rack_proximity = {}  # measured against the old local rack
                self._book.rebuild()

    def _refresh_rack_proximity(self) -> None:
        """Re-weigh the remote racks of the local datacenter from the windows the health
        refresh just computed, and publish each remote host's ``rack_penalty``."""
        remote = [
            v for v in self._book.topology.by_id.values() if v.is_local and v.rack_penalty > 1.0
        ]
        latencies = self._p50_by_rack(remote)
        self.rack_proximity = rack_proximity(latencies, self.rack_proximity, self._proximity_cap())
        for view in remote:
            view.stats.rack_penalty = self.rack_factor(view.rack_penalty, view.rack)

    def _p50_by_rack(self, views: Iterable[HostView[HostStats]]) -> dict[Any, list[float]]:
        """Per rack, the p50 of ``views``' last windows that have ``min_samples``."""
        min_samples = self.health.config.min_samples
        latencies: dict[Any, list[float]] = {}
        for view in views:
            window = self.health.windows.get(view.host)
            if window is None or window.samples < min_samples:
                continue
            latency = window.latency.get(50.0)
            if latency is not None:
                latencies.setdefault(view.rack, []).append(latency)
        return latencies

    def start(self, policy: Any) -> None:
        """Refresh ``policy``'s health every ``health.refresh_interval`` on a daemon
        thread (real clock). Idempotent."""
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = HealthRefresher(policy)
                self._thread.start()

    def forget_thread(self) -> None:
        """In a forked child: the thread stayed in the parent (and its lock may be held
        there); :meth:`start` may start a new one."""
        self._thread_lock = threading.Lock()
        self._thread = None

    def stop(self) -> None:
        """Stop the thread (if running) and wait for it."""
        with self._thread_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()


class HealthRefresher(threading.Thread):
    """Daemon thread calling ``policy.maybe_refresh_health()`` every
    ``policy.config.health.refresh_interval`` (read each time: a reload applies) until
    :meth:`stop`, or until the policy is garbage-collected. A refresh that raises is
    reported through ``policy.record_error`` (counted, logged at most once a minute)."""

    def __init__(self, policy: Any) -> None:
        super().__init__(name="adaptive-lb-health", daemon=True)
        # A weak reference: an unused policy must not be kept alive by its own thread.
        self._policy = weakref.ref(policy)
        self._stop_event = threading.Event()

    def run(self) -> None:
        late_s = 0.0
        while True:
            policy = self._policy()
            if policy is None:
                return
            interval = policy.config.health.refresh_interval
            try:
                # How late this thread woke is how late the client handles anything now
                # (adaptive_lb.stats.lateness): its answers too.
                policy.health.lateness.observe(policy.now_ns(), late_s)
                policy.time_event_loop()
                policy.maybe_refresh_health()
            except Exception:
                policy.record_error("health_refresh", "the last health verdicts stay")
            del policy
            started = time.monotonic()
            if self._stop_event.wait(interval):
                return
            late_s = time.monotonic() - started - interval

    def stop(self) -> None:
        """Ask the thread to end and wait for it."""
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=5)
