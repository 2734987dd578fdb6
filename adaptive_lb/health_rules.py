"""Health rules: the verdict on a host from its statistics window, as pure functions.

:func:`assess` maps the previous verdict, the window and the peers' median to the next
verdict (a :class:`HostHealth`); :func:`peer_medians` finds each host's peers' median;
:func:`warming_penalty` is the penalty of a host coming back. No state, no threads, no
clock, no driver: :class:`adaptive_lb.health.HealthModel` keeps the verdicts and applies
these rules at each refresh.

States (:class:`HealthState`):

* HEALTHY -- penalty ``penalties.healthy`` (1).
* SLOW -- its latency at ``percentile`` is above ``outlier_factor`` x the median of the
  same percentile among its peers (the *other* hosts of its group, e.g. its datacenter,
  that have ``min_samples``) *and* above ``slow_floor``, over at least ``min_samples``
  samples. Penalty ``penalties.slow``. A host without peers that have data cannot be
  judged SLOW: there is nothing to be an outlier against.
* ERRORING -- (errors + timeouts) / requests above ``error_rate`` over at least
  ``min_samples`` requests; or *stalled*: requests in flight on it and not one answer (a
  timeout is not an answer) for ``stall_timeout``. Wins over SLOW. Penalty
  ``penalties.erroring``. Fast errors never enter the latency histogram (see
  :mod:`adaptive_lb.stats`), so a node failing fast is caught here and never looks fast. A
  stall needs no sample count: a node paused by a long GC answers nothing, and the few
  requests caught on it time out far too slowly to reach ``min_samples``.
* WARMING -- the host came back (up again:
  :meth:`~adaptive_lb.health.HealthModel.mark_up`, or recovered from SLOW / ERRORING). Its
  penalty decays from ``penalties.warming`` to ``penalties.healthy`` (1) over
  ``slow_start`` seconds so that the share of traffic it gets, about 1 / penalty, ramps up
  *linearly* (:func:`warming_penalty`); then HEALTHY. ``slow_start`` 0 skips it.

Quick to protect, slow to forgive:

* Getting worse is immediate: HEALTHY or WARMING -> SLOW / ERRORING, and SLOW -> ERRORING,
  at the first refresh that shows it.
* Getting better needs ``min_state_duration`` in the state (no state other than HEALTHY is
  left sooner) *and* numbers clearly back to normal: SLOW is left when the latency is below
  ``recovery_factor`` x the entry threshold (``outlier_factor`` x peer median, or the floor
  if higher), ERRORING when the error rate is below ``recovery_factor`` x ``error_rate``.
  Leaving either goes to WARMING (or to the other bad state if the host is in it).
  HEALTHY is only reached from WARMING, after ``max(slow_start, min_state_duration)``, so
  a host cannot flap between penalised and not penalised faster than that.
* No evidence is not evidence of recovery: with fewer than ``min_samples`` (samples for
  SLOW, requests for ERRORING) a bad state holds -- but a penalised host gets little
  traffic, so once a whole window has passed in the state without enough fresh evidence,
  it moves to WARMING ("probing"): traffic ramps back, evidence comes in, and if it is
  still bad it goes straight back. A SLOW host whose peers have no data any more also
  moves to WARMING (it is no longer an outlier of anything).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from attrs import define

from adaptive_lb.config import HealthConfig
from adaptive_lb.health_state import HealthState
from adaptive_lb.stats import WindowStats

__all__ = ["HostHealth", "assess", "peer_median", "peer_medians", "warming_penalty"]

_NS = 1_000_000_000
_K = TypeVar("_K", bound=Hashable)


@define(frozen=True, slots=True)
class HostHealth:
    """A host's health verdict and the numbers behind it."""

    state: HealthState
    since_ns: int
    """When the host entered ``state`` (clock nanoseconds)."""
    penalty: float
    """Score multiplier the policy applies to the host."""
    reason: str = ""
    """Why the host is in ``state``, with the numbers, for logs, traces and snapshots."""
    latency: float | None = None
    """Seconds at the configured percentile over the window (None: no sample)."""
    peer_median: float | None = None
    """Median of the peers' latency at the same percentile, seconds (None: no peer data)."""
    error_rate: float = 0.0
    """(errors + timeouts) / requests over the window."""
    samples: int = 0
    """Latency samples in the window."""
    requests: int = 0
    """Requests with an outcome in the window."""

    @classmethod
    def initial(cls, now_ns: int, config: HealthConfig) -> HostHealth:
        """The verdict for a host nothing is known about yet: HEALTHY."""
        return cls(HealthState.HEALTHY, now_ns, config.penalties.healthy, "no evidence yet")

    @classmethod
    def warming(cls, now_ns: int, config: HealthConfig, reason: str) -> HostHealth:
        """A host that has just come back: WARMING from ``now_ns`` (HEALTHY if
        ``slow_start`` is 0)."""
        if config.slow_start <= 0:
            return cls(HealthState.HEALTHY, now_ns, config.penalties.healthy, reason)
        return cls(HealthState.WARMING, now_ns, config.penalties.warming, reason)


def warming_penalty(start: float, elapsed_s: float, slow_start: float, end: float = 1.0) -> float:
    """Penalty of a WARMING host ``elapsed_s`` after it came back: its traffic weight
    1 / penalty grows linearly from 1 / ``start`` to 1 / ``end`` over ``slow_start``
    seconds. Monotone non-increasing in ``elapsed_s``, exactly ``end`` from ``slow_start``
    on (and at once when ``start <= end``)."""
    if slow_start <= 0 or elapsed_s >= slow_start or start <= end:
        return end
    progress = max(0.0, elapsed_s) / slow_start
    weight = 1.0 / start + (1.0 / end - 1.0 / start) * progress
    return min(start, max(end, 1.0 / weight))  # 1 / (1 / start) may round above start


def peer_median(values: Iterable[float | None]) -> float | None:
    """Median of the peers' latencies (None values ignored), or None if there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _median_without(ordered: Sequence[float], value: float) -> float | None:
    """``peer_median`` of ``ordered`` (sorted) minus one occurrence of ``value`` (which it
    holds), in O(log n): a refresh of a large datacenter stays linear."""
    remaining = len(ordered) - 1
    if remaining <= 0:
        return None
    removed = bisect.bisect_left(ordered, value)

    def at(position: int) -> float:
        return ordered[position if position < removed else position + 1]

    middle = remaining // 2
    if remaining % 2:
        return at(middle)
    return (at(middle - 1) + at(middle)) / 2


def peer_medians(
    windows: Mapping[_K, WindowStats],
    groups: Mapping[_K, Hashable],
    config: HealthConfig,
) -> dict[_K, float | None]:
    """Each host's peer median: the :func:`peer_median` of the latency at
    ``config.percentile`` of the *other* hosts of its group (``groups``; hosts missing from
    it form one group) that have ``min_samples`` samples. O(n log n) for n hosts."""
    percentile = float(config.percentile)
    own: dict[_K, float] = {}
    by_group: dict[Hashable, list[float]] = {}
    for key, window in windows.items():
        latency = window.latency.get(percentile)
        if latency is not None and window.samples >= config.min_samples:
            own[key] = latency
            by_group.setdefault(groups.get(key), []).append(latency)
    for values in by_group.values():
        values.sort()
    medians: dict[_K, float | None] = {}
    for key in windows:
        group = by_group.get(groups.get(key), [])
        latency = own.get(key)
        medians[key] = peer_median(group) if latency is None else _median_without(group, latency)
    return medians


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f}ms"


def assess(
    previous: HostHealth,
    window: WindowStats,
    peer_median: float | None,
    config: HealthConfig,
    now_ns: int,
    window_s: float = 10.0,
    stalled_s: float = 0.0,
) -> HostHealth:
    """The next verdict for a host; a pure function (see the module docstring for the
    rules).

    ``window`` must hold the latency at ``config.percentile``. ``peer_median`` is the median
    of the peers' latency at that percentile (None when no peer has ``min_samples``: then
    the host cannot be SLOW). ``window_s`` is the statistics window's length: after that
    long in SLOW / ERRORING without ``min_samples`` of fresh evidence a host starts WARMING.
    ``stalled_s`` is how long the host has had requests in flight without answering any
    (0 when it has none in flight, or answered since the last refresh).
    """
    penalties = config.penalties
    latency = window.latency.get(float(config.percentile))
    error_rate = window.error_rate
    enough_requests = window.requests >= config.min_samples
    enough_samples = window.samples >= config.min_samples and latency is not None
    threshold = (
        None if peer_median is None else max(config.outlier_factor * peer_median, config.slow_floor)
    )
    stalled = 0 < config.stall_timeout <= stalled_s
    erroring = enough_requests and error_rate > config.error_rate
    slow = enough_samples and threshold is not None and latency is not None and latency > threshold
    state = previous.state
    in_state_s = (now_ns - previous.since_ns) / _NS
    settled = in_state_s >= config.min_state_duration
    pct = f"p{config.percentile:g}"

    def verdict(new_state: HealthState, penalty: float, reason: str, since_ns: int) -> HostHealth:
        return HostHealth(
            new_state,
            since_ns,
            penalty,
            reason,
            latency=latency,
            peer_median=peer_median,
            error_rate=error_rate,
            samples=window.samples,
            requests=window.requests,
        )

    def hold(penalty: float) -> HostHealth:
        return verdict(state, penalty, previous.reason, previous.since_ns)

    def warming(reason: str) -> HostHealth:
        start = HostHealth.warming(now_ns, config, reason)
        return verdict(start.state, start.penalty, reason, now_ns)

    def slow_reason() -> str:
        return (
            f"{pct} {_ms(latency)} > {config.outlier_factor:.1f} x peer median "
            f"{_ms(peer_median)} (floor {_ms(config.slow_floor)}), {window.samples} samples"
        )

    # Getting worse: at once.
    if stalled and state is not HealthState.ERRORING:
        return verdict(
            HealthState.ERRORING,
            penalties.erroring,
            f"stalled: no answer for {stalled_s:.1f}s with {window.in_flight} requests in flight",
            now_ns,
        )
    if erroring and state is not HealthState.ERRORING:
        return verdict(
            HealthState.ERRORING,
            penalties.erroring,
            f"error+timeout rate {error_rate:.1%} > {config.error_rate:.1%} "
            f"over {window.requests} requests",
            now_ns,
        )
    if slow and state in (HealthState.HEALTHY, HealthState.WARMING):
        return verdict(HealthState.SLOW, penalties.slow, slow_reason(), now_ns)

    if state is HealthState.ERRORING:
        if not settled or stalled:
            return hold(penalties.erroring)
        if enough_requests and error_rate < config.recovery_factor * config.error_rate:
            if slow:
                return verdict(HealthState.SLOW, penalties.slow, slow_reason(), now_ns)
            return warming(
                f"recovered: error+timeout rate {error_rate:.1%} < "
                f"{config.recovery_factor:g} x {config.error_rate:.1%} "
                f"over {window.requests} requests"
            )
        if not enough_requests and in_state_s >= window_s:
            return warming(
                f"probing: only {window.requests} requests in the {window_s:g}s "
                f"since it turned erroring (min {config.min_samples})"
            )
        return hold(penalties.erroring)

    if state is HealthState.SLOW:
        if not settled:
            return hold(penalties.slow)
        if enough_samples and latency is not None:
            if threshold is None:
                return warming(f"no peer latency to compare {pct} {_ms(latency)} with")
            if latency < config.recovery_factor * threshold:
                return warming(
                    f"recovered: {pct} {_ms(latency)} < {config.recovery_factor:g} x "
                    f"{_ms(threshold)} (peer median {_ms(peer_median)}), "
                    f"{window.samples} samples"
                )
        elif in_state_s >= window_s:
            return warming(
                f"probing: only {window.samples} samples in the {window_s:g}s "
                f"since it turned slow (min {config.min_samples})"
            )
        return hold(penalties.slow)

    if state is HealthState.WARMING:
        if in_state_s >= config.slow_start and settled:
            return verdict(
                HealthState.HEALTHY,
                penalties.healthy,
                f"warm-up complete after {in_state_s:.1f}s: {pct} {_ms(latency)}, "
                f"error+timeout rate {error_rate:.1%}",
                now_ns,
            )
        penalty = warming_penalty(
            penalties.warming, in_state_s, config.slow_start, end=penalties.healthy
        )
        return hold(penalty)

    return verdict(
        HealthState.HEALTHY,
        penalties.healthy,
        f"{pct} {_ms(latency)} (peer median {_ms(peer_median)}), {window.samples} samples; "
        f"error+timeout rate {error_rate:.1%} over {window.requests} requests",
        previous.since_ns,
    )
