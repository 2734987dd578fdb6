"""What each host is compared with at a health refresh (pure logic, no driver import).

:func:`compare` computes once per refresh, for every host, its
:class:`~adaptive_lb.health.evidence.Baseline`: the medians of its *peers* (:func:`peer_medians`:
hosts at a comparable network distance from this client, its rack when at least
:data:`MIN_RACK_PEERS` other hosts of it have the answers, else its datacenter with each
peer moved by the racks' measured distances, :class:`adaptive_lb.plan.locality.RackDistances`,
:func:`measure_racks`), the cluster's spread and the client's lateness; how many answers the
peers' medians rest on; the answers since a host's suspicion (the second, disjoint sample);
and what a probed host's round trips say (:func:`still_slow`: a SLOW host, or one the latency
factor keeps away, gets no user request; while its probes show it still clearly slower than
its peers' user requests, it is not let back on its window's lapse and its latency factor
does not decay). docs/design.md ("Peers are true peers", "The round trip as a load signal")
gives the formulas and figures.

Imports its own package and the statistics, locality and config below it.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.evidence import (
    MIN_EVIDENCE,
    Baseline,
    bound_percentiles,
    latency_spread,
    upper_bound_windows,
)
from adaptive_lb.health.verdict import HostHealth
from adaptive_lb.plan.locality import RackDistances, RackKey
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.host import HostStats, WindowStats
from adaptive_lb.stats.latency_factor import gap_bounds
from adaptive_lb.stats.lateness import ClientLateness

__all__ = [
    "MIN_RACK_PEERS",
    "compare",
    "measure_racks",
    "peer_median",
    "peer_medians",
    "still_slow",
    "still_slow_hosts",
]

MIN_RACK_PEERS = 2
"""Other hosts of its rack with data from which a host's rack alone is its peer group: with
two, one slow peer does not move the median the host is compared with much (3 x a peer's
value is the default outlier test), and a 3-host rack -- the smallest common size -- counts."""

_NS = 1_000_000_000
_K = TypeVar("_K", bound=Hashable)


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


def _others(ordered: Sequence[float], own: float | None) -> float | None:
    """The median of ``ordered`` without ``own`` (when it is one of them)."""
    return peer_median(ordered) if own is None else _median_without(ordered, own)


def _capped(
    distances: Mapping[tuple[Hashable, Hashable], float], cap: float
) -> Mapping[tuple[Hashable, Hashable], float]:
    """``distances`` with each rack at most ``cap`` farther than its group's nearest rack
    (``health.max_rack_distance``)."""
    nearest: dict[Hashable, float] = {}
    for (group, _rack), distance in distances.items():
        if distance < nearest.get(group, distance + 1.0):
            nearest[group] = distance
    return {
        (group, rack): min(distance, nearest[group] + cap)
        for (group, rack), distance in distances.items()
    }


def peer_medians(
    windows: Mapping[_K, WindowStats],
    groups: Mapping[_K, Hashable],
    config: HealthConfig,
    racks: Mapping[_K, Hashable] | None = None,
    distances: Mapping[tuple[Hashable, Hashable], float] | None = None,
    percentile: float | None = None,
    min_samples: int | None = None,
    *,
    strict: bool = False,
    counts: dict[_K, int] | None = None,
) -> dict[_K, float | None]:
    """Each host's peer median: the median latency at ``percentile`` (default
    ``config.percentile``) of its peers with ``min_samples`` (default
    ``config.min_samples``) samples. ``groups``: host -> datacenter (hosts missing from it
    form one group); without ``racks`` the peers are the other hosts of its group as they
    are; with ``racks`` (host -> rack), see the module docstring (``distances``: ``(group,
    rack)`` -> seconds; a rack without one is not corrected, nor used to judge a rack with
    one). ``strict``: with ``racks``, a host with neither rack peers nor a rack distance
    gets None rather than its group as it is (a far rack would look slow). ``counts``, when
    given, receives each host's peers' median sample count (0 without peers): how many
    answers of each peer its median rests on."""
    percentile = float(config.percentile if percentile is None else percentile)
    min_samples = config.min_samples if min_samples is None else min_samples
    own: dict[_K, tuple[float, float]] = {}
    """Per host with the samples: its latency and its sample count."""
    peers: dict[tuple[str, Hashable], tuple[list[float], list[float]]] = {}
    """Per peer set -- ``g``: a group, ``r``: a rack, ``x``: a group's hosts whose rack has a
    distance (latency - that distance) -- its latencies and its sample counts."""
    known = _capped(distances or {}, config.max_rack_distance)
    for key, window in windows.items():
        latency = window.latency.get(percentile)
        if latency is None or window.samples < min_samples:
            continue
        own[key] = (latency, float(window.samples))
        group = groups.get(key)
        member = [(("g", group), latency)]
        if racks is not None:
            rack = (group, racks.get(key))
            member.append((("r", rack), latency))
            if rack in known:
                member.append((("x", group), latency - known[rack]))
        for name, value in member:
            values, sizes = peers.setdefault(name, ([], []))
            values.append(value)
            sizes.append(float(window.samples))
    for values, sizes in peers.values():
        values.sort()
        sizes.sort()

    medians: dict[_K, float | None] = {}
    for key in windows:
        median, used = _peer_median(key, own.get(key), groups, racks, known, peers, strict)
        medians[key] = median
        if counts is not None:
            sizes = peers[used][1] if used is not None and median is not None else []
            size = _others(sizes, own[key][1] if key in own else None)
            counts[key] = 0 if size is None else round(size)
    return medians


def _peer_median(
    key: _K,
    own: tuple[float, float] | None,
    groups: Mapping[_K, Hashable],
    racks: Mapping[_K, Hashable] | None,
    known: Mapping[tuple[Hashable, Hashable], float],
    peers: Mapping[tuple[str, Hashable], tuple[list[float], list[float]]],
    strict: bool,
) -> tuple[float | None, tuple[str, Hashable] | None]:
    """``key``'s peer median (:func:`peer_medians`) and the peer set it was taken from."""
    group = groups.get(key)
    latency = None if own is None else own[0]
    if racks is not None:
        rack = (group, racks.get(key))
        same_rack = peers.get(("r", rack), ([], []))[0]
        if len(same_rack) - (latency is not None) >= MIN_RACK_PEERS:
            return _others(same_rack, latency), ("r", rack)
        distance = known.get(rack)
        excess = peers.get(("x", group), ([], []))[0]
        if distance is not None and excess:
            own_excess = None if latency is None else latency - distance
            median = _others(excess, own_excess)
            if median is not None:
                return max(0.0, distance + median), ("x", group)
        if strict:
            return None, None
    return _others(peers.get(("g", group), ([], []))[0], latency), ("g", group)


def still_slow(
    median_s: float,
    samples: int,
    peer_user_s: float,
    peer_samples: int,
    spread: float,
    config: HealthConfig,
    peer_fastest_s: float | None = None,
) -> str | None:
    """Why a host whose probes took ``median_s`` (median of ``samples``) is still clearly
    slow, its peers' user requests taking ``peer_user_s`` (from about ``peer_samples``
    answers a peer; their fastest tenth ``peer_fastest_s``, if known, is what a probe takes
    there); None when it is not (docs/design.md, "The round trip as a load signal")."""
    if samples < MIN_EVIDENCE or peer_samples <= 0 or min(median_s, peer_user_s) <= 0:
        return None
    peer_s = peer_user_s
    # Their fastest tenth moved by a rack's distance may read 0 (clamped): unknown then.
    if peer_fastest_s is not None and peer_fastest_s > 0:
        peer_s = min(peer_user_s, peer_fastest_s)
    jitter_s = config.latency_factor.jitter
    _, low, _ = gap_bounds(
        median_s, peer_s, samples, peer_samples, spread, config.certainty, jitter_s
    )
    if low <= 0:
        return None  # not surely slower than its peers at all
    request_s = peer_user_s + median_s - peer_s  # what a user request would take on it
    equal_s = max(
        config.latency_factor.dead_band * peer_user_s, config.recovery_factor * config.slow_floor
    )
    if request_s <= equal_s:
        return None
    return (
        f"still slow by its probes: {median_s * 1000:.2f} ms (median of {samples}) against "
        f"{peer_s * 1000:.2f} ms for its peers' (their requests {peer_user_s * 1000:.2f} ms), "
        f"so a request would take {request_s * 1000:.2f} ms (> {equal_s * 1000:.2f} ms)"
    )


def still_slow_hosts(
    stats: Mapping[_K, HostStats],
    windows: Mapping[_K, WindowStats],
    groups: Mapping[_K, Hashable],
    racks: Mapping[_K, Hashable] | None,
    distances: Mapping[tuple[Hashable, Hashable], float] | None,
    peer_user: Mapping[_K, float | None],
    peer_samples: Mapping[_K, int],
    spread: float,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
) -> dict[_K, str]:
    """The hosts that are still clearly slow by the probes they answered within the last
    ``window_s`` (:func:`still_slow`), with why. ``peer_user``: each host's peers' median
    (the median rule's reference); their fastest tenth is found as it is; ``peer_samples``:
    each host's, the median answer count of the peers behind it."""
    since = now_ns - round(window_s * _NS)
    probed = {key: host.probes.recent_rtts(since) for key, host in stats.items()}
    if not any(probed.values()):
        return {}
    peer_fastest = peer_medians(
        windows, groups, config, racks, distances, 10.0, MIN_EVIDENCE, strict=True
    )
    slow = {}
    for key, rtts in probed.items():
        user_s, behind = peer_user.get(key), peer_samples.get(key, 0)
        if not rtts or user_s is None:
            continue
        median_s, fastest_s = statistics.median(rtts), peer_fastest.get(key)
        why = still_slow(median_s, len(rtts), user_s, behind, spread, config, fastest_s)
        if why is not None:
            slow[key] = why
    return slow


def compare(
    config: HealthConfig,
    stats: Mapping[Hashable, HostStats],
    windows: Mapping[Hashable, WindowStats],
    groups: Mapping[Hashable, Hashable],
    racks: Mapping[Hashable, Hashable] | None,
    now: int,
    *,
    verdicts: Mapping[Hashable, HostHealth],
    lateness: ClientLateness,
    distances: RackDistances,
    window_s: float,
    probing: bool,
) -> dict[Hashable, Baseline]:
    """Each host's :class:`~adaptive_lb.health.evidence.Baseline` at this refresh (see the
    module docstring). ``verdicts``: every host's verdict of the last refresh;
    ``distances``: each rack's distance (updated here when ``racks`` is given);
    ``probing``: active probes are sent (their round trips are judged too)."""
    near = None
    if racks is not None:
        measure_racks(windows, groups, racks, now, verdicts, distances, window_s)
        near = distances.distances
    medians = peer_medians(windows, groups, config, racks, near)
    # The peers' upper confidence bounds of the same percentile: a host's tail must be
    # above what its peers' tails could be, not only above their estimate.
    bounds = peer_medians(upper_bound_windows(windows, config), groups, config, racks, near)
    # For the median rule (adaptive_lb.health.evidence): medians of hosts with a few answers.
    peer_samples: dict[Hashable, int] = {}
    typical = peer_medians(
        windows, groups, config, racks, near, 50.0, MIN_EVIDENCE, strict=True, counts=peer_samples
    )
    spread = latency_spread(windows.values())
    levels = lateness.levels(now)
    args = (groups, racks, near, typical, peer_samples, spread, config, now)
    probe_slow = still_slow_hosts(stats, windows, *args, window_s) if probing else {}
    recent = since_suspected(config, stats, windows, verdicts)
    return {
        key: Baseline(
            medians[key],
            bounds[key],
            typical[key],
            spread,
            peer_samples[key],
            probe_slow.get(key),
            recent.get(key),
            levels,
        )
        for key in windows
    }


def since_suspected(
    config: HealthConfig,
    stats: Mapping[Hashable, HostStats],
    windows: Mapping[Hashable, WindowStats],
    verdicts: Mapping[Hashable, HostHealth],
) -> dict[Hashable, WindowStats]:
    """For each host whose tail is suspected since an earlier interval of its window, the
    answers of the intervals since (a sample disjoint from the one that raised the
    suspicion)."""
    recent = {}
    for key, verdict in list(verdicts.items()):
        since = verdict.slowness.suspect_interval
        window = windows.get(key)
        if since is None or window is None or window.interval <= since or key not in stats:
            continue
        more = lambda n: bound_percentiles(n, config)  # noqa: E731
        recent[key] = stats[key].window_stats((), more, newer_than=since)
    return recent


def measure_racks(
    windows: Mapping[Hashable, WindowStats],
    groups: Mapping[Hashable, Hashable],
    racks: Mapping[Hashable, Hashable],
    now_ns: int,
    verdicts: Mapping[Hashable, HostHealth],
    into: RackDistances,
    window_s: float,
) -> None:
    """Update ``into`` from the p50 of the hosts that were HEALTHY at the last refresh and
    have :data:`~adaptive_lb.health.evidence.MIN_EVIDENCE` answers (before judging them: a
    host that slows down is judged against its rack's distance from before)."""
    measured: dict[RackKey, list[float]] = {}
    for key, window in windows.items():
        p50 = window.latency.get(50.0)
        health = verdicts.get(key)
        if (
            p50 is None
            or window.samples < MIN_EVIDENCE
            or key not in racks
            or (health is not None and health.state is not HealthState.HEALTHY)
        ):
            continue
        measured.setdefault((groups.get(key), racks[key]), []).append(p50)
    into.update(measured, now_ns, window_s)
    into.forget({(groups.get(key), rack) for key, rack in racks.items()})
