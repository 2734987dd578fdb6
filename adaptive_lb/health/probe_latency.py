"""The probe's round trip as a load signal, where nothing else measures the host (pure
logic, no driver import, no probe of its own).

A SLOW host, or one the latency factor keeps away, gets no user request, so no evidence: it
would be let back after a window, and the latency factor would decay, on no evidence at all.
The probes it already gets (:mod:`adaptive_lb.health.probes`) are the evidence there is.
:func:`still_slow` says from their round trips whether it is *still clearly slower* than its
peers; while it is, a SLOW host is not let back on its window's lapse (``probe_slow`` of
:func:`adaptive_lb.health.rules.assess`) and its latency factor does not decay (``held``).

The reference is the peers' user requests, never a probe of theirs: what a probe would take
on the peers is ``q = u - o`` (``u`` their median of user medians, ``o`` the offset of a user
request over a probe measured on hosts that have both, :func:`probe_offset`; without one,
the peers' p10), at least :data:`MIN_REFERENCE` x ``u``. The host's probe median ``m`` must
be surely above ``q`` (:func:`adaptive_lb.stats.latency_factor.gap_bounds`), and a user
request on it, ``u + (m - q)``, beyond what the latency factor counts as equal. One-sided: a
fast probe does not prove that user requests are fast. docs/design.md ("Active probes")
gives the formulas and figures.

Imports the config, the statistics, the evidence rules, the peer groups and the latency
factor's gap bounds; pure logic, no state.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from typing import TypeVar

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.evidence import MIN_EVIDENCE
from adaptive_lb.health.peers import peer_medians
from adaptive_lb.stats.host import HostStats, WindowStats
from adaptive_lb.stats.latency_factor import gap_bounds

__all__ = ["MIN_REFERENCE", "probe_offset", "probe_rtts", "still_slow", "still_slow_hosts"]

MIN_REFERENCE = 0.1
"""The least the peers' probe estimate ``u - o`` may be, as a fraction of ``u``: an offset
measured on one host with a slow read never makes the reference vanish."""

_NS = 1_000_000_000
_K = TypeVar("_K", bound=Hashable)


def probe_rtts(
    stats: Mapping[_K, HostStats], now_ns: int, window_s: float
) -> dict[_K, tuple[float, int]]:
    """Each host's answered probes within the last ``window_s``: ``(median round trip s,
    how many)``. Hosts without one are left out."""
    since = now_ns - round(window_s * _NS)
    found = {}
    for key, host in stats.items():
        rtts = host.probes.recent_rtts(since)
        if rtts:
            found[key] = (statistics.median(rtts), len(rtts))
    return found


def probe_offset(
    probes: Mapping[_K, tuple[float, int]],
    windows: Mapping[_K, WindowStats],
    groups: Mapping[_K, Hashable],
    group: Hashable,
    excluding: _K,
) -> float | None:
    """How much longer a user request takes than a probe on the same node, measured on the
    hosts of ``group`` other than ``excluding`` with :data:`MIN_EVIDENCE` answered probes
    and as many user answers in the window: the median of their user p50 minus their probe
    median, at least 0; None without such a host."""
    gaps = []
    for key, (median_s, count) in probes.items():
        window = windows.get(key)
        if key == excluding or groups.get(key) != group or count < MIN_EVIDENCE:
            continue
        if window is None or window.samples < MIN_EVIDENCE:
            continue
        user_s = window.latency.get(50.0)
        if user_s is not None:
            gaps.append(user_s - median_s)
    return max(0.0, statistics.median(gaps)) if gaps else None


def still_slow(
    median_s: float,
    samples: int,
    peer_user_s: float,
    peer_samples: int,
    offset_s: float | None,
    spread: float,
    config: HealthConfig,
    peer_fastest_s: float | None = None,
) -> str | None:
    """Why a host whose probes took ``median_s`` (median of ``samples``) is still clearly
    slow, its peers' user requests taking ``peer_user_s`` (from about ``peer_samples``
    answers a peer) and a user request ``offset_s`` longer than a probe on the same node
    (None: not measured; then the peers' fastest tenth ``peer_fastest_s`` is what a probe
    takes there, if known); None when it is not (see the module docstring: the one
    formula)."""
    if samples < MIN_EVIDENCE or peer_samples <= 0 or min(median_s, peer_user_s) <= 0:
        return None
    if offset_s is not None:
        peer_s = peer_user_s - offset_s
    elif peer_fastest_s is not None:
        peer_s = min(peer_user_s, peer_fastest_s)
    else:
        peer_s = peer_user_s
    peer_s = max(peer_s, MIN_REFERENCE * peer_user_s)
    jitter_s = config.latency_factor.jitter
    _, low, _ = gap_bounds(
        median_s, peer_s, samples, peer_samples, spread, config.certainty, jitter_s
    )
    if low <= 0:
        return None  # not surely slower than its peers at all
    excess_s = median_s - peer_s
    equal_s = max(
        config.latency_factor.dead_band * peer_user_s, config.recovery_factor * config.slow_floor
    )
    if peer_user_s + excess_s <= equal_s:
        return None
    return (
        f"still slow by its probes: {median_s * 1000:.2f} ms (median of {samples}) against "
        f"{peer_s * 1000:.2f} ms for its peers' (their requests {peer_user_s * 1000:.2f} ms), "
        f"so a request would take "
        f"{(peer_user_s + excess_s) * 1000:.2f} ms (> {equal_s * 1000:.2f} ms)"
    )


def still_slow_hosts(
    stats: Mapping[_K, HostStats],
    windows: Mapping[_K, WindowStats],
    groups: Mapping[_K, Hashable],
    racks: Mapping[_K, Hashable] | None,
    distances: Mapping[tuple[Hashable, Hashable], float] | None,
    peer_user: Mapping[_K, float | None],
    peer_samples: Mapping[Hashable, int],
    spread: float,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
) -> dict[_K, str]:
    """The hosts that are still clearly slow by their probes (:func:`still_slow`), with
    why. ``windows``: the hosts' user windows (with p10); ``racks`` and ``distances``: the
    evidence rules' (their peers' fastest tenth is found as their median is);
    ``peer_user``: each host's peers' user-request median (the evidence rules' reference);
    ``peer_samples``: per group, the median answer count behind it."""
    probes = probe_rtts(stats, now_ns, window_s)
    if not probes:
        return {}
    peer_fastest = peer_medians(
        windows, groups, config, racks, distances, 10.0, MIN_EVIDENCE, strict=True
    )
    slow = {}
    for key, (median_s, count) in probes.items():
        user_s = peer_user.get(key)
        group = groups.get(key)
        if user_s is None or count < MIN_EVIDENCE:
            continue
        offset_s = probe_offset(probes, windows, groups, group, key)
        fastest_s, behind = peer_fastest.get(key), peer_samples.get(group, 0)
        why = still_slow(median_s, count, user_s, behind, offset_s, spread, config, fastest_s)
        if why is not None:
            slow[key] = why
    return slow
