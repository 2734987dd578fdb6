"""Health peers: whom each host is compared with (pure logic, no driver import).

A host is SLOW when its latency is an outlier among its *peers*, hosts at a comparable
network distance from this client (:func:`peer_medians`): its rack, when at least
:data:`MIN_RACK_PEERS` other hosts of it have the answers; else its datacenter, each peer
moved from its rack's distance to the host's (``latency - distance(peer's rack) +
distance(host's rack)``: network distance adds to every answer; a rack's distance is
:class:`adaptive_lb.plan.locality.RackDistances`, counted at most
``health.max_rack_distance`` beyond the nearest rack); else its datacenter as it is.
docs/design.md ("Peers are true peers") tells why. The median of the peers is computed once
per group and per refresh in O(n log n).

Imports the config and the statistics only.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from adaptive_lb.config import HealthConfig
from adaptive_lb.stats.host import WindowStats

__all__ = ["MIN_RACK_PEERS", "peer_median", "peer_medians"]

MIN_RACK_PEERS = 2
"""Other hosts of its rack with data from which a host's rack alone is its peer group: with
two, one slow peer does not move the median the host is compared with much (3 x a peer's
value is the default outlier test), and a 3-host rack -- the smallest common size -- counts."""

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
) -> dict[_K, float | None]:
    """Each host's peer median: the median latency at ``percentile`` (default
    ``config.percentile``) of its peers (see the module docstring), counting only hosts
    with ``min_samples`` (default ``config.min_samples``) samples.

    ``groups`` maps a host to its datacenter (hosts missing from it form one group).
    Without ``racks`` the peers are the *other* hosts of its group, as they are. With
    ``racks`` (host -> rack), its rack first, then its group corrected by ``distances``
    (``(group, rack)`` -> seconds; racks missing from it are not corrected, and hosts of
    such racks are not used to judge hosts of racks that have one). ``strict``: with
    ``racks``, a host that has neither rack peers nor a measured rack distance gets None
    rather than its group as it is (a far rack would look slow)."""
    percentile = float(config.percentile if percentile is None else percentile)
    min_samples = config.min_samples if min_samples is None else min_samples
    own: dict[_K, float] = {}
    by_group: dict[Hashable, list[float]] = {}
    by_rack: dict[tuple[Hashable, Hashable], list[float]] = {}
    excess: dict[Hashable, list[float]] = {}
    """Per group: latency - the host's rack distance, of the hosts whose rack has one."""
    known = _capped(distances or {}, config.max_rack_distance)
    for key, window in windows.items():
        latency = window.latency.get(percentile)
        if latency is None or window.samples < min_samples:
            continue
        own[key] = latency
        group = groups.get(key)
        by_group.setdefault(group, []).append(latency)
        if racks is not None:
            rack = (group, racks.get(key))
            by_rack.setdefault(rack, []).append(latency)
            if rack in known:
                excess.setdefault(group, []).append(latency - known[rack])
    for values in (*by_group.values(), *by_rack.values(), *excess.values()):
        values.sort()

    medians: dict[_K, float | None] = {}
    for key in windows:
        group = groups.get(key)
        latency = own.get(key)
        if racks is not None:
            rack = (group, racks.get(key))
            same_rack = by_rack.get(rack, [])
            if len(same_rack) - (latency is not None) >= MIN_RACK_PEERS:
                medians[key] = _others(same_rack, latency)
                continue
            distance = known.get(rack)
            if distance is not None and excess.get(group):
                own_excess = None if latency is None else latency - distance
                median = _others(excess[group], own_excess)
                if median is not None:
                    medians[key] = max(0.0, distance + median)
                    continue
            if strict:
                medians[key] = None
                continue
        medians[key] = _others(by_group.get(group, []), latency)
    return medians
