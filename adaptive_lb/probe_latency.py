"""The probe's round trip as a load signal, where nothing else measures the host (pure
logic, no driver import).

A SLOW host gets no user request, and a host the latency factor keeps away gets none
either: so no user evidence. Without more, the SLOW host is let back (WARMING) once a whole
statistics window has passed, and the latency factor decays until the host is tried again:
on no evidence at all. A node kept busy by other clients' load (which this client cannot
see; there is no ``system_views.thread_pools`` to read on ScyllaDB or Cassandra 3.x) is
then judged slow again from its first answers, each time, at the cost of those requests.
Its probes (:mod:`adaptive_lb.probes`: about one a second while it is SLOW, or HEALTHY with
a latency factor and no fresh user answer: *suspected slow*) are the evidence there is.
:func:`still_slow` says from their round trips whether the host is *still clearly slower*
than its peers; while it is, a SLOW host is not let back on its window's lapse
(:func:`adaptive_lb.health_rules.assess`, ``probe_slow``) and its latency factor does not
decay (:meth:`adaptive_lb.latency_factor.LatencyRecord.update`, ``held``).

**Like with like.** A probe reads one row of ``system.local`` from the node's memory: it
costs the node almost nothing, a user request a real read. So a probe's round trip is
compared with the probes of the host's peers -- the same request, at the same moments,
through the same client -- not with their user requests. While a host of a datacenter is
probed as slow or suspected slow, its HEALTHY peers are probed too, as its *reference*,
every :data:`REFERENCE_INTERVALS` x ``health.probe_interval``
(:func:`adaptive_lb.probes.reference_reason`). The host's probe median ``m`` (its answered
probes in the window, ``n`` of them) is compared with its peers' median of probe medians
``p`` (:func:`~adaptive_lb.peer_groups.peer_medians`: the same true peers and rack-distance
correction the evidence rules use) with the evidence rules' log-normal model: the host's
probes are *surely slower* when::

    ln(m / p) > c * 1.2533 * s * sqrt(1 / n + 1 / n_p)

(``c`` = ``health.certainty``, ``s`` the cluster's log-spread, ``n_p`` the median probe
count of the group's probed hosts).

**How much slower, for a user request.** What slows a probe down on a busy node -- the queue
it waits in, the network -- adds to a user request the same way, in seconds, not as a
ratio: a probe 3 x its peers' (1.1 ms against 0.35) is a user request 0.75 ms slower than
its peers' 1.3 ms, 1.6 x. So the probes' excess ``m - p`` is added to the peers' user
median ``u`` (the evidence rules' reference), and the host is still clearly slower when
that is beyond what the latency factor counts as equal::

    u + (m - p) > max(dead_band * u, recovery_factor * slow_floor)

(``health.latency_factor.dead_band``; the floor keeps a sub-millisecond difference from
mattering where SLOW would not). One-sided on purpose: a fast probe does not prove that
user requests are fast (a slow disk, a hot partition, a slow table never shows in
``system.local``), so fast probes leave the host to the ways back it had without them;
only slow probes hold it.

Imports the config, the statistics (window type, host statistics), the peer groups, the
evidence rules and the latency factor's constant; pure logic, no state.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping
from typing import TypeVar

from adaptive_lb.config import HealthConfig
from adaptive_lb.evidence import MIN_EVIDENCE, typical_samples
from adaptive_lb.latency_factor import MEDIAN_SE
from adaptive_lb.peer_groups import peer_medians
from adaptive_lb.stats import HostStats, WindowStats

__all__ = ["REFERENCE_INTERVALS", "probe_windows", "still_slow", "still_slow_hosts"]

REFERENCE_INTERVALS = 2.0
"""A peer of a host probed as SLOW is probed as a reference at most every this many
``health.probe_interval`` (about 5 reference probes a window per peer)."""

_NS = 1_000_000_000
_K = TypeVar("_K", bound=Hashable)


def probe_windows(
    stats: Mapping[_K, HostStats], now_ns: int, window_s: float
) -> dict[_K, WindowStats]:
    """Each host's answered probes within the last ``window_s``, as a window of their
    round trips (``samples``, and their median at 50): what :func:`still_slow_hosts` and
    the peer groups read. Hosts without one are left out."""
    since = now_ns - round(window_s * _NS)
    windows = {}
    for key, host in stats.items():
        rtts = host.probes.recent_rtts(since)
        if rtts:
            n = len(rtts)
            windows[key] = WindowStats(n, n, 0, 0, n, {50.0: statistics.median(rtts)})
    return windows


def still_slow(
    median_s: float,
    samples: int,
    peer_s: float,
    peer_samples: int,
    peer_user_s: float,
    spread: float,
    config: HealthConfig,
) -> str | None:
    """Why a host whose probes took ``median_s`` (median of ``samples``) against its peers'
    ``peer_s`` (from about ``peer_samples`` probes a peer) is still clearly slow, its
    peers' user requests taking ``peer_user_s``; None when it is not (see the module
    docstring: the one formula)."""
    if samples < MIN_EVIDENCE or peer_samples <= 0 or min(median_s, peer_s, peer_user_s) <= 0:
        return None
    margin = config.certainty * MEDIAN_SE * spread * math.sqrt(1 / samples + 1 / peer_samples)
    if math.log(median_s / peer_s) <= margin:
        return None  # not surely slower than its peers at all
    excess_s = median_s - peer_s
    equal_s = max(
        config.latency_factor.dead_band * peer_user_s, config.recovery_factor * config.slow_floor
    )
    if peer_user_s + excess_s <= equal_s:
        return None
    return (
        f"still slow by its probes: {median_s * 1000:.2f} ms (median of {samples}) against "
        f"its peers' {peer_s * 1000:.2f} ms, so a request would take "
        f"{(peer_user_s + excess_s) * 1000:.2f} ms against their "
        f"{peer_user_s * 1000:.2f} ms (> {equal_s * 1000:.2f} ms)"
    )


def still_slow_hosts(
    stats: Mapping[_K, HostStats],
    groups: Mapping[_K, Hashable],
    racks: Mapping[_K, Hashable] | None,
    distances: Mapping[tuple[Hashable, Hashable], float] | None,
    peer_user: Mapping[_K, float | None],
    spread: float,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
) -> dict[_K, str]:
    """The hosts that are still clearly slow by their probes (:func:`still_slow`), with
    why; ``peer_user`` is each host's peers' user-request median (the evidence rules'
    reference), ``distances`` the rack distances those rules use."""
    windows = probe_windows(stats, now_ns, window_s)
    if len(windows) < 2:
        return {}
    peers = peer_medians(windows, groups, config, racks, distances, 50.0, 1, strict=True)
    counts = typical_samples(windows, groups, 1)
    slow = {}
    for key, window in windows.items():
        peer_s, user_s = peers.get(key), peer_user.get(key)
        median_s = window.latency.get(50.0)
        if peer_s is None or user_s is None or median_s is None:
            continue
        why = still_slow(
            median_s,
            window.samples,
            peer_s,
            counts.get(groups.get(key), 0),
            user_s,
            spread,
            config,
        )
        if why is not None:
            slow[key] = why
    return slow
