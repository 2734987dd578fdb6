"""Health model: keeps each host's verdict and refreshes it from the host's statistics.

Every ``refresh_interval`` :class:`HealthModel` computes each host's window once (the only
place percentiles are computed), applies :func:`assess` against what
:func:`~adaptive_lb.health.peers.compare` compares it with, and publishes the result on the
host's :class:`~adaptive_lb.stats.host.HostStats` (penalty, state, latency factor), which
the hot path reads without a lock. The rules' public names are importable from here.

May import: its own package and the packages below it (statistics, locality, config, clock).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from attrs import define

from adaptive_lb.config import HealthConfig
from adaptive_lb.core.clock import Clock
from adaptive_lb.health.evidence import bound_percentiles
from adaptive_lb.health.peers import compare, peer_median, peer_medians
from adaptive_lb.health.probes import SUSPECTED_PENALTY, judge
from adaptive_lb.health.rules import Baseline, assess
from adaptive_lb.health.verdict import HostHealth, warming_penalty
from adaptive_lb.plan.locality import RackDistances
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.host import HostStats, WindowStats
from adaptive_lb.stats.lateness import ClientLateness

__all__ = [
    "Baseline",
    "HealthModel",
    "HealthState",
    "HealthTransition",
    "HostHealth",
    "assess",
    "peer_median",
    "peer_medians",
    "warming_penalty",
]

log = logging.getLogger("adaptive_lb.health")

_NS = 1_000_000_000
_REPORTED_PERCENTILES = (10.0, 50.0, 95.0, 99.0)
"""Percentiles computed at each refresh besides the configured one (snapshots, exporters,
the probes' reference)."""
_PENALISED = (HealthState.SLOW, HealthState.ERRORING)


@define(frozen=True, slots=True)
class HealthTransition:
    """A host changed state."""

    key: Any
    old: HostHealth
    new: HostHealth


class HealthModel:
    """Keeps each host's :class:`HostHealth` and applies :func:`assess` on refresh.
    Thread-safe: one refresh runs at a time; :meth:`mark_up` and :meth:`forget` may be
    called from other threads at any moment (a refresh in progress does not undo them)."""

    def __init__(
        self, config: HealthConfig, clock: Clock, window_s: float = 10.0, intervals: int = 5
    ) -> None:
        self._config = config
        self._clock = clock
        self._window_s = window_s
        self._intervals = intervals
        self.lateness = ClientLateness(window_s, intervals)
        """How late the client's own timer fires (fed by the refresh thread, or the
        simulator): what the client itself may add to an answer."""
        self._health: dict[Hashable, HostHealth] = {}
        self._windows: dict[Hashable, WindowStats] = {}
        self._unreported: dict[Hashable, HealthTransition] = {}
        self._refresh_lock = threading.Lock()
        """One refresh at a time."""
        self._state_lock = threading.Lock()
        """Guards the verdicts while a refresh applies them against mark_up / forget."""
        self._forgotten: set[Hashable] = set()
        """Keys forgotten while a refresh runs (it must not re-add them)."""
        self._refreshing = False
        self._silence: dict[Hashable, tuple[int, int, tuple[int, int | None], int]] = {}
        """Per host at the last refresh, for :meth:`_silence_s`: its answers, since when
        (client time, :meth:`_client_ns`) they have not changed with tracked requests in
        flight; its answers and last probe answer, since when neither has with requests in
        flight by the driver's count."""
        self._next_refresh_ns = 0
        self.rack_distances = RackDistances()
        """Each rack's distance from this client (refreshed with ``racks``)."""
        self.refreshes = 0
        """Refreshes done (for tests and diagnostics)."""
        self.probing = False
        """Active probes are being sent (:mod:`adaptive_lb.runtime.prober` sets it while it
        runs): their outcomes judge a host too (:func:`adaptive_lb.health.probes.judge`);
        without, a stalled or erroring host is tried again with user requests."""
        self.paced = False
        """Probes wait for slots of a fleet's budget (set by the health refresh): a host
        unanswered for a refresh is placed at ``probes.SUSPECTED_PENALTY`` meanwhile."""
        self.stalled: dict[Hashable, float] = {}
        """Per host, at the last refresh: seconds with requests in flight and no answer."""
        self.unanswered: dict[Hashable, float] = {}
        """Per host, at the last refresh: seconds unanswered (:meth:`_silence_s`): what makes
        a host suspected and probed (:mod:`adaptive_lb.health.probes`)."""

    @property
    def config(self) -> HealthConfig:
        """The health config in force."""
        return self._config

    @property
    def clock(self) -> Clock:
        """The clock verdicts are timed with."""
        return self._clock

    def reconfigure(
        self, config: HealthConfig, window_s: float | None = None, intervals: int | None = None
    ) -> None:
        """Use new thresholds and penalties (and statistics window length and intervals) from
        the next refresh on; current verdicts stay."""
        self._config = config
        window = (
            self._window_s if window_s is None else window_s,
            self._intervals if intervals is None else intervals,
        )
        if window != (self._window_s, self._intervals):
            self._window_s, self._intervals = window
            self.lateness.reconfigure(*window)

    def health(self, key: Hashable) -> HostHealth | None:
        """The last verdict for ``key``."""
        return self._health.get(key)

    @property
    def verdicts(self) -> Mapping[Hashable, HostHealth]:
        """Every host's last verdict (read only)."""
        return self._health

    @property
    def windows(self) -> Mapping[Hashable, WindowStats]:
        """Every host's window as of the last refresh (read only: snapshots and exporters
        do not compute percentiles again)."""
        return self._windows

    def mark_up(self, key: Hashable, stats: HostStats) -> HealthTransition:
        """``key`` came back up: it starts WARMING now, whatever its state (HEALTHY at once
        if ``slow_start`` is 0)."""
        with self._state_lock:
            now = self._clock.now_ns()
            old = self._health.get(key) or HostHealth.initial(now, self._config)
            new = HostHealth.warming(now, self._config, "host came back up")
            self._health[key] = new
            self._forgotten.discard(key)
            stats.publish_health(new.state, new.penalty)
            stats.latency.reset()  # restarted: what it answered before says nothing now
            stats.latency_factor = 1.0
            transition = HealthTransition(key, old, new)
            self._unreported[key] = transition
        stats.load.came_back()  # restarted, perhaps upgraded: has it thread pools now?
        self._log(transition)
        return transition

    def forget(self, key: Hashable) -> None:
        """Drop everything about ``key`` (host removed)."""
        with self._state_lock:
            self._health.pop(key, None)
            self._windows.pop(key, None)
            self._silence.pop(key, None)
            self.stalled.pop(key, None)
            self.unanswered.pop(key, None)
            self._unreported.pop(key, None)
            # A refresh may be computing windows from a mapping that still holds the key.
            # (Only then: with no refresh running there is nothing to undo, and keeping
            # the key would hold a removed host for ever.)
            if self._refreshing:
                self._forgotten.add(key)

    def pop_unreported(self, key: Hashable) -> HealthTransition | None:
        """The latest transition of ``key`` not yet shown in a trace (then forgotten): the
        next recorded decision that touches the host reports it."""
        if not self._unreported:
            return None
        return self._unreported.pop(key, None)

    def maybe_refresh(
        self,
        stats: Mapping[Hashable, HostStats],
        groups: Mapping[Hashable, Hashable],
        is_known: Callable[[Hashable], bool] | None = None,
        racks: Mapping[Hashable, Hashable] | None = None,
    ) -> list[HealthTransition] | None:
        """:meth:`refresh` if ``refresh_interval`` has passed since the last one and no other
        thread is refreshing right now; None otherwise (an int compare when it is not
        time; never waits)."""
        if self._clock.now_ns() < self._next_refresh_ns:
            return None
        return self._refresh(stats, groups, is_known, racks, due=True)

    def refresh(
        self,
        stats: Mapping[Hashable, HostStats],
        groups: Mapping[Hashable, Hashable],
        is_known: Callable[[Hashable], bool] | None = None,
        racks: Mapping[Hashable, Hashable] | None = None,
    ) -> list[HealthTransition]:
        """Compute every host's window once and the new verdicts against its peers (the
        other hosts of its group, e.g. its datacenter; hosts missing from ``groups`` form one
        group; with ``racks``, true peers, :mod:`adaptive_lb.health.peers`); publish them on
        the hosts' stats and return the transitions. Waits for a refresh in progress.
        ``is_known(key)``, when given, is asked while the verdicts are applied: a key it
        denies (removed since ``stats`` was taken) gets no verdict. The caller must publish a
        removal before calling :meth:`forget`, so that a removal racing the refresh is seen
        by one or the other."""
        return self._refresh(stats, groups, is_known, racks, due=False) or []

    def _refresh(
        self,
        stats: Mapping[Hashable, HostStats],
        groups: Mapping[Hashable, Hashable],
        is_known: Callable[[Hashable], bool] | None,
        racks: Mapping[Hashable, Hashable] | None,
        due: bool,
    ) -> list[HealthTransition] | None:
        # One refresh at a time; due: only if still due, never waiting for the lock.
        if not self._refresh_lock.acquire(blocking=not due):
            return None
        try:
            # Another thread may have refreshed between the compare and the acquire.
            if due and self._clock.now_ns() < self._next_refresh_ns:
                return None
            with self._state_lock:
                self._refreshing = True
            try:
                return self._assess_all(stats, groups, is_known, racks)
            finally:
                with self._state_lock:
                    self._refreshing = False
                    self._forgotten.clear()
        finally:
            self._refresh_lock.release()

    def _assess_all(
        self,
        stats: Mapping[Hashable, HostStats],
        groups: Mapping[Hashable, Hashable],
        is_known: Callable[[Hashable], bool] | None,
        racks: Mapping[Hashable, Hashable] | None,
    ) -> list[HealthTransition]:
        config = self._config
        self._next_refresh_ns = self._clock.now_ns() + round(config.refresh_interval * _NS)
        percentiles = sorted({*_REPORTED_PERCENTILES, float(config.percentile)})
        # The expensive part (percentiles), with no lock the hot path or mark_up wait for.
        windows = {
            key: host.window_stats(percentiles, lambda n: bound_percentiles(n, config))
            for key, host in stats.items()
        }
        now = self._clock.now_ns()
        probing = self.probing and config.probe_interval > 0
        baselines = compare(
            config,
            stats,
            windows,
            groups,
            racks,
            now,
            verdicts=self._health,
            lateness=self.lateness,
            distances=self.rack_distances,
            window_s=self._window_s,
            probing=probing,
        )
        transitions = []
        stalled: dict[Hashable, float] = {}
        unanswered: dict[Hashable, float] = {}
        with self._state_lock:
            for key, window in windows.items():
                if key in self._forgotten or (is_known is not None and not is_known(key)):
                    self._forgotten.add(key)
                    continue
                host = stats[key]
                stalled[key], unanswered[key] = self._silence_s(key, host, window.in_flight, now)
                suspected = self.paced and unanswered[key] > 0
                transition = self._judge(
                    key, host, window, baselines[key], stalled[key], now, suspected, probing
                )
                if transition is not None:
                    transitions.append(transition)
                    self._unreported[key] = transition
            for key in self._forgotten:
                windows.pop(key, None)
                self._silence.pop(key, None)
                self._health.pop(key, None)
                self._unreported.pop(key, None)
            self._windows = windows
            self.stalled = stalled
            self.unanswered = unanswered
            self.refreshes += 1
        for transition in transitions:
            self._log(transition)
        return transitions

    def _silence_s(
        self, key: Hashable, host: HostStats, in_flight: int, now_ns: int
    ) -> tuple[float, float]:
        """Seconds ``key`` has been *stalled* (``in_flight`` tracked attempts and no tracked
        answer: the stall rule) and *unanswered* (requests in flight by the driver's count,
        untracked ones too, and neither a tracked answer nor a probe answer: what makes it
        suspected and probed, whichever of its requests were sampled). A timeout is not an
        answer. Under the state lock."""
        answers = host.requests_total - host.timeouts_total
        heard = (answers, host.probes.last_answer_ns)
        old = self._silence.get(key)
        now_ns = self._client_ns(now_ns)
        stalled_ns = now_ns if old is None or old[0] != answers or in_flight <= 0 else old[1]
        unheard_ns = now_ns if old is None or old[2] != heard or host.in_flight <= 0 else old[3]
        self._silence[key] = (answers, stalled_ns, heard, unheard_ns)
        stalled = (now_ns - stalled_ns) / _NS
        return stalled, max(stalled, (now_ns - unheard_ns) / _NS)

    def _client_ns(self, now_ns: int) -> int:
        """``now_ns`` less every moment the client itself did not read answers
        (:attr:`ClientLateness.paused_total_s
        <adaptive_lb.stats.lateness.ClientLateness.paused_total_s>`): a silence is counted
        in the client's own running time. A client that held the GIL for 4 s in a long C
        call, was stopped, or whose event loop a user callback kept for 3 s, heard nothing
        meanwhile, and its first refresh after it, before the event loop had read the
        answers waiting, judged every host with a request in flight stalled: a false
        ERRORING at penalty 1024."""
        return now_ns - round(self.lateness.paused_total_s * _NS)

    def _judge(
        self,
        key: Hashable,
        host: HostStats,
        window: WindowStats,
        baseline: Baseline,
        stalled_s: float,
        now: int,
        suspected: bool,
        probing: bool,
    ) -> HealthTransition | None:
        """Assess one host, publish its verdict and latency factor on its statistics; its
        transition, if any. ``suspected``: unanswered while probes wait for slots;
        ``probing``: active probes are sent. Under the state lock."""
        config = self._config
        old = self._health.get(key) or HostHealth.initial(now, config)
        failures = host.errors_total + host.timeouts_total
        answers = host.requests_total - failures
        new = assess(
            old,
            window,
            baseline,
            config,
            now,
            window_s=self._window_s,
            stalled_s=stalled_s,
            answers=answers,
            failures=failures,
        )
        if probing:
            new = judge(
                old,
                new,
                host.probes,
                config,
                now,
                self._window_s,
                answers,
                window.in_flight,
                host.in_flight,
            )
        self._health[key] = new
        latency = host.latency
        if old.state is HealthState.ERRORING and new.state not in _PENALISED:
            # Out of a stall or errors: the answers caught in it were not the host's
            # service time (the window restarts below).
            latency.reset()
        else:
            latency.update(
                now,
                window.latency.get(50.0),
                baseline.typical,
                window.samples,
                baseline.peer_samples,
                baseline.spread,
                config.latency_factor,
                baseline.probe_slow is not None,
                new.slowness.suspect_ratio,
                baseline.typical_lateness_s,
            )
        host.latency_factor = latency.factor
        if new.probe is None:
            penalty = new.penalty
            if suspected and new.state is not HealthState.ERRORING:
                penalty = max(penalty, SUSPECTED_PENALTY)
            host.publish_health(new.state, penalty)
        elif new.probe is not old.probe:
            # Placed as a healthy host until its budget is spent (or it fails).
            host.start_probe(new.probe.requests, config.penalties.healthy, new.penalty)
        if new.state is old.state:
            return None
        if old.state in _PENALISED and new.state not in _PENALISED:
            # Back from SLOW / ERRORING: judged from now on by what it does now, not by a
            # window that still holds the bad period.
            host.reconfigure(host.config)
        return HealthTransition(key, old, new)

    @staticmethod
    def _log(transition: HealthTransition) -> None:
        new = transition.new
        log.info(
            "host %s: %s -> %s (penalty %.1f): %s",
            transition.key,
            transition.old.state.value,
            new.state.value,
            new.penalty,
            new.reason,
        )
