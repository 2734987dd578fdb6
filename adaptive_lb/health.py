"""Health model: turns each host's statistics window into a state and a score penalty.

States (:class:`HealthState`):

* HEALTHY -- penalty ``penalties.healthy`` (1).
* SLOW -- its latency at ``percentile`` is above ``outlier_factor`` x the median of the
  same percentile among its peers (the other hosts of its datacenter) *and* above
  ``slow_floor``, over at least ``min_samples`` samples. Penalty ``penalties.slow``.
* ERRORING -- (errors + timeouts) / requests above ``error_rate`` over at least
  ``min_samples`` requests. Wins over SLOW. Penalty ``penalties.erroring``. Fast errors
  never enter the latency histogram (see :mod:`adaptive_lb.stats`), so a node failing fast
  is caught here and never looks fast.
* WARMING -- the host came back (up again, or recovered from SLOW / ERRORING). Its penalty
  decays from ``penalties.warming`` to 1 over ``slow_start`` seconds so that the share of
  traffic it gets (about 1 / penalty) ramps up *linearly*; then HEALTHY.

Hysteresis: entering SLOW or ERRORING is immediate (from HEALTHY or WARMING); leaving
them needs ``min_state_duration`` in the state and numbers below ``recovery_factor`` x the
entry threshold. A penalised host gets little traffic, so its window may run short of
samples: once a whole window has passed in the state without ``min_samples`` of fresh
evidence, it moves to WARMING, which ramps traffic back and gathers that evidence (if it is
still bad, it goes straight back).

Percentiles are computed only in :meth:`HealthModel.refresh` (every ``refresh_interval``),
never per request.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from attrs import define

from adaptive_lb.clock import Clock
from adaptive_lb.config import HealthConfig
from adaptive_lb.health_state import HealthState
from adaptive_lb.stats import HostStats, WindowStats

__all__ = [
    "HealthModel",
    "HealthState",
    "HealthTransition",
    "HostHealth",
    "assess",
    "peer_median",
    "warming_penalty",
]

log = logging.getLogger("adaptive_lb.health")

_NS = 1_000_000_000
_BAD = (HealthState.SLOW, HealthState.ERRORING)


@define(frozen=True, slots=True)
class HostHealth:
    """A host's health verdict and the numbers behind it."""

    state: HealthState
    since_ns: int
    """When the host entered ``state``."""
    penalty: float
    reason: str = ""
    latency: float | None = None
    """Seconds at the configured percentile over the window."""
    peer_median: float | None = None
    """Median of the peers' latency at the same percentile, seconds."""
    error_rate: float = 0.0
    samples: int = 0
    requests: int = 0

    @classmethod
    def healthy(cls, now_ns: int, config: HealthConfig) -> HostHealth:
        """The verdict for a host nothing is known about."""
        return cls(HealthState.HEALTHY, now_ns, config.penalties.healthy, "no evidence yet")

    @classmethod
    def warming(cls, now_ns: int, config: HealthConfig, reason: str) -> HostHealth:
        """A host that has just come back."""
        if config.slow_start <= 0:
            return cls(HealthState.HEALTHY, now_ns, config.penalties.healthy, reason)
        return cls(HealthState.WARMING, now_ns, config.penalties.warming, reason)


@define(frozen=True, slots=True)
class HealthTransition:
    """A host changed state."""

    key: Any
    old: HostHealth
    new: HostHealth


def warming_penalty(start: float, elapsed_s: float, slow_start: float) -> float:
    """Penalty of a WARMING host ``elapsed_s`` after it came back: the traffic weight
    1 / penalty grows linearly from 1 / ``start`` to 1 over ``slow_start`` seconds.
    Monotone non-increasing, exactly 1.0 from ``slow_start`` on."""
    if slow_start <= 0 or elapsed_s >= slow_start or start <= 1.0:
        return 1.0
    progress = max(0.0, elapsed_s) / slow_start
    weight = 1.0 / start + (1.0 - 1.0 / start) * progress
    return max(1.0, 1.0 / weight)


def peer_median(values: Iterable[float | None]) -> float | None:
    """Median of the known values (None ignored), or None if there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f}ms"


def assess(
    previous: HostHealth,
    window: WindowStats,
    peers: float | None,
    config: HealthConfig,
    now_ns: int,
    window_s: float = 10.0,
) -> HostHealth:
    """The next verdict for a host (pure function; see the module docstring for the rules).

    ``peers`` is the median latency of the host's peers at ``config.percentile`` (None when
    no peer has enough samples: then nobody can be SLOW). ``window_s`` is the statistics
    window's length, after which a penalised host without fresh evidence starts WARMING.
    """
    latency = window.latency.get(float(config.percentile))
    error_rate = window.error_rate
    enough_requests = window.requests >= config.min_samples
    enough_samples = window.samples >= config.min_samples and latency is not None
    numbers = {
        "latency": latency,
        "peer_median": peers,
        "error_rate": error_rate,
        "samples": window.samples,
        "requests": window.requests,
    }
    pct = f"p{config.percentile:g}"

    def verdict(state: HealthState, penalty: float, reason: str, since: int) -> HostHealth:
        return HostHealth(state, since, penalty, reason, **numbers)

    slow_threshold = None
    if peers is not None:
        slow_threshold = max(config.outlier_factor * peers, config.slow_floor)
    erroring = enough_requests and error_rate > config.error_rate
    slow = enough_samples and slow_threshold is not None and latency > slow_threshold
    error_reason = (
        f"error+timeout rate {error_rate:.1%} > {config.error_rate:.1%} "
        f"over {window.requests} requests"
    )
    slow_reason = (
        f"{pct} {_ms(latency)} > {config.outlier_factor:g} x peer median {_ms(peers)} "
        f"(floor {_ms(config.slow_floor)}), {window.samples} samples"
    )
    state = previous.state
    pen = config.penalties

    if state in _BAD:
        in_state_s = (now_ns - previous.since_ns) / _NS
        if state is HealthState.SLOW and erroring:
            return verdict(HealthState.ERRORING, pen.erroring, error_reason, now_ns)
        if in_state_s < config.min_state_duration:
            return verdict(state, previous.penalty, previous.reason, previous.since_ns)
        if state is HealthState.ERRORING:
            recovered = enough_requests and error_rate < config.recovery_factor * config.error_rate
        else:
            recovered = (
                enough_samples
                and slow_threshold is not None
                and latency < config.recovery_factor * slow_threshold
            )
        if recovered:
            if slow and state is HealthState.ERRORING:
                return verdict(HealthState.SLOW, pen.slow, slow_reason, now_ns)
            reason = (
                f"recovered: error+timeout rate {error_rate:.1%}"
                if state is HealthState.ERRORING
                else f"recovered: {pct} {_ms(latency)} vs peer median {_ms(peers)}"
            )
            return verdict(HealthState.WARMING, pen.warming, reason, now_ns)
        if not enough_requests and in_state_s >= window_s:
            return verdict(
                HealthState.WARMING,
                pen.warming,
                f"probing: only {window.requests} requests in the last {window_s:g}s",
                now_ns,
            )
        return verdict(state, previous.penalty, previous.reason, previous.since_ns)

    if erroring:
        return verdict(HealthState.ERRORING, pen.erroring, error_reason, now_ns)
    if slow:
        return verdict(HealthState.SLOW, pen.slow, slow_reason, now_ns)
    if state is HealthState.WARMING:
        elapsed_s = (now_ns - previous.since_ns) / _NS
        if elapsed_s >= config.slow_start:
            return verdict(HealthState.HEALTHY, pen.healthy, "warm-up complete", now_ns)
        penalty = warming_penalty(pen.warming, elapsed_s, config.slow_start)
        return verdict(HealthState.WARMING, penalty, previous.reason, previous.since_ns)
    return verdict(HealthState.HEALTHY, pen.healthy, "", previous.since_ns)


class HealthModel:
    """Keeps each host's :class:`HostHealth` and applies :func:`assess` on refresh,
    publishing the penalty and state on the host's :class:`HostStats`."""

    def __init__(self, config: HealthConfig, clock: Clock, window_s: float = 10.0) -> None:
        self._config = config
        self._clock = clock
        self._window_s = window_s
        self._health: dict[Hashable, HostHealth] = {}
        self._windows: dict[Hashable, WindowStats] = {}
        self._refresh_lock = threading.Lock()
        self._next_refresh_ns = 0
        self._unreported: dict[Hashable, HealthTransition] = {}
        self.refreshes = 0

    @property
    def config(self) -> HealthConfig:
        """The health config in force."""
        return self._config

    def reconfigure(self, config: HealthConfig, window_s: float | None = None) -> None:
        """Use new thresholds and penalties from the next refresh on."""
        self._config = config
        if window_s is not None:
            self._window_s = window_s

    def health(self, key: Hashable) -> HostHealth | None:
        """The last verdict for ``key``."""
        return self._health.get(key)

    def window_stats(self, key: Hashable) -> WindowStats | None:
        """The window statistics computed for ``key`` at the last refresh."""
        return self._windows.get(key)

    def mark_up(self, key: Hashable, stats: HostStats) -> HealthTransition | None:
        """``key`` came back up: it starts WARMING now."""
        now = self._clock.now_ns()
        old = self._health.get(key) or HostHealth.healthy(now, self._config)
        new = HostHealth.warming(now, self._config, "host came back up")
        self._health[key] = new
        stats.health_state = new.state
        stats.health_penalty = new.penalty
        transition = HealthTransition(key, old, new)
        self._unreported[key] = transition
        self._log(transition)
        return transition

    def forget(self, key: Hashable) -> None:
        """Drop everything about ``key`` (host removed)."""
        self._health.pop(key, None)
        self._windows.pop(key, None)
        self._unreported.pop(key, None)

    def pop_unreported(self, key: Hashable) -> HealthTransition | None:
        """The latest transition of ``key`` not yet shown in a trace (then forgotten): the
        next recorded decision that touches the host reports it."""
        if not self._unreported:
            return None
        return self._unreported.pop(key, None)

    def maybe_refresh(
        self, stats: Mapping[Hashable, HostStats], groups: Mapping[Hashable, Hashable]
    ) -> list[HealthTransition] | None:
        """:meth:`refresh` if ``refresh_interval`` has passed since the last one and no other
        thread is refreshing right now; None otherwise (cheap: an int compare)."""
        if self._clock.now_ns() < self._next_refresh_ns:
            return None
        if not self._refresh_lock.acquire(blocking=False):
            return None
        try:
            return self._refresh(stats, groups)
        finally:
            self._refresh_lock.release()

    def refresh(
        self, stats: Mapping[Hashable, HostStats], groups: Mapping[Hashable, Hashable]
    ) -> list[HealthTransition]:
        """Compute every host's window once, the peer medians per group (a host's peers are
        the other hosts of its group, e.g. its datacenter), and the new verdicts."""
        with self._refresh_lock:
            return self._refresh(stats, groups)

    def _refresh(
        self, stats: Mapping[Hashable, HostStats], groups: Mapping[Hashable, Hashable]
    ) -> list[HealthTransition]:
        config = self._config
        now = self._clock.now_ns()
        self._next_refresh_ns = now + round(config.refresh_interval * _NS)
        percentile = float(config.percentile)
        percentiles = sorted({50.0, 95.0, 99.0, percentile})
        windows = {key: host.window_stats(percentiles) for key, host in stats.items()}
        self._windows = windows
        by_group: dict[Hashable, list[tuple[Hashable, float]]] = {}
        for key, window in windows.items():
            latency = window.latency.get(percentile)
            if latency is not None and window.samples >= config.min_samples:
                by_group.setdefault(groups.get(key), []).append((key, latency))
        transitions = []
        for key, window in windows.items():
            peers = peer_median(
                latency for other, latency in by_group.get(groups.get(key), ()) if other != key
            )
            old = self._health.get(key) or HostHealth.healthy(now, config)
            new = assess(old, window, peers, config, now, self._window_s)
            self._health[key] = new
            host = stats[key]
            host.health_penalty = new.penalty
            host.health_state = new.state
            if new.state is not old.state:
                transition = HealthTransition(key, old, new)
                transitions.append(transition)
                self._unreported[key] = transition
                self._log(transition)
        self.refreshes += 1
        return transitions

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
