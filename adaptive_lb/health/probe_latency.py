"""The probe's round trip as a load signal, where nothing else measures the host (pure
logic, no driver import, no probe of its own).

A SLOW host gets no user request, and a host the latency factor keeps away gets none
either: so no user evidence. Without more, the SLOW host is let back (WARMING) once a whole
statistics window has passed, and the latency factor decays until the host is tried again:
on no evidence at all. A node kept busy by other clients' load (which this client cannot
see; there is no ``system_views.thread_pools`` to read on ScyllaDB or Cassandra 3.x) is
then judged slow again from its first answers, each time, at the cost of those requests.
The probes such a host already gets (:mod:`adaptive_lb.health.probes`: about one a second while
it is SLOW without fresh user answers, or while it had requests in the window but no
fresh answer) are the evidence there is. :func:`still_slow` says from their round trips
whether the host is *still clearly slower* than its peers; while it is, a SLOW host is not
let back on its window's lapse (:func:`adaptive_lb.health.rules.assess`, ``probe_slow``)
and its latency factor does not decay
(:meth:`adaptive_lb.stats.latency_factor.LatencyRecord.update`, ``held``).

**Against the peers' user requests, no probe of theirs.** A healthy host answering its
user requests is never probed, not even as a reference: its user round trips are the
reference. A probe reads one row of ``system.local`` from the node's memory and costs it
almost nothing, a user request a real read, so the two differ on the same node by an
*offset* ``o`` (the read's own cost). It is measured, not assumed: on the hosts other than
the probed one that have both in the window (:data:`MIN_EVIDENCE` answered probes and as
many user answers, e.g. a host probed for want of a fresh answer), the median of their
user p50 minus their probe median, at least 0 (:func:`probe_offset`). What a probe would
take on the peers is then ``q = u - o``, ``u`` being the peers' median of user medians
(the evidence rules' reference, :mod:`adaptive_lb.health.evidence`). Without such a host -- the
common case, healthy hosts with traffic being unprobed -- ``q`` is the peers' median of
their fastest tenth of user requests (p10): a probe is no dearer than the cheapest reads,
so ``q`` can only overstate it and understate how slow the host is. ``q`` is at least
:data:`MIN_REFERENCE` x ``u``. The host's probe median ``m`` (``n`` answered probes in
the window) is compared with ``q`` in their log-normal model: surely slower when::

    ln(m / q) > c * 1.2533 * sqrt(s_m ** 2 / n + s_q ** 2 / n_p)

(``c`` = ``health.certainty``, ``n_p`` the median answer count of the group's hosts,
``s_m`` and ``s_q`` the cluster's log-spread ``s`` with the latency factor's floor for the
client's own jitter at ``m`` and ``q``: a probe's round trip is measured by the same busy
client, :func:`adaptive_lb.stats.latency_factor.floored_spread`).

**How much slower, for a user request.** What slows a probe down on a busy node -- the
queue it waits in, the network -- adds to a user request the same way, in seconds, not as
a ratio. So the excess ``m - q`` is added to ``u``, and the host is still clearly slower
when that is beyond what the latency factor counts as equal::

    u + (m - q) > max(dead_band * u, recovery_factor * slow_floor)

One-sided on purpose: a fast probe does not prove that user requests are fast (a slow
disk, a hot partition, a slow table never shows in ``system.local``), so fast probes leave
the host to the ways back it had without them; only slow probes hold it.

Imports the config, the statistics (window type, host statistics), the evidence rules, the
peer groups and the latency factor's gap bounds (the same jitter floor); pure logic, no
state.
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
    _, low, _ = gap_bounds(
        median_s,
        peer_s,
        samples,
        peer_samples,
        spread,
        config.certainty,
        config.latency_factor.jitter,
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
        why = still_slow(
            median_s,
            count,
            user_s,
            peer_samples.get(group, 0),
            offset_s,
            spread,
            config,
            peer_fastest.get(key),
        )
        if why is not None:
            slow[key] = why
    return slow
