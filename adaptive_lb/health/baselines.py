"""What each host is compared with at a health refresh (pure logic, no driver import).

:func:`compare` computes once per refresh, for every host, its
:class:`~adaptive_lb.health.slowness.Baseline` (its true peers' tails, tails' upper bounds
and medians, :mod:`adaptive_lb.health.peers`; the cluster's spread; the client's
lateness), how many answers the peers' medians rest on, what a probed host's round trips
say (:mod:`adaptive_lb.health.probe_latency`) and the answers since a host's suspicion (the
second, disjoint sample). Each rack's distance is measured here too, from the hosts that
were HEALTHY at the last refresh, before any host is judged.

Imports its own package and the statistics, locality and config below it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from attrs import define

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.evidence import (
    MIN_EVIDENCE,
    bound_percentiles,
    latency_spread,
    typical_samples,
    upper_bound_windows,
)
from adaptive_lb.health.peers import peer_medians
from adaptive_lb.health.probe_latency import still_slow_hosts
from adaptive_lb.health.slowness import Baseline
from adaptive_lb.health.verdict import HostHealth
from adaptive_lb.plan.locality import RackDistances, RackKey
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.host import HostStats, WindowStats
from adaptive_lb.stats.lateness import ClientLateness

__all__ = ["Comparison", "compare", "measure_racks"]


@define(frozen=True, slots=True)
class Comparison:
    """What one refresh compares every host with."""

    baselines: dict[Hashable, Baseline]
    peer_samples: dict[Hashable, int]
    """About how many answers of each peer its typical latency rests on."""
    probe_slow: dict[Hashable, str]
    """Why a probed host is still clearly slow by its probes."""
    recent: dict[Hashable, WindowStats]
    """The answers since a host's suspicion (the second, disjoint sample)."""
    probing: bool
    """Active probes are being sent: their outcomes judge a host too."""


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
    distances: tuple[RackDistances, RackDistances],
    window_s: float,
    probing: bool,
) -> Comparison:
    """What each host is compared with at this refresh (see the module docstring).
    ``verdicts``: every host's verdict of the last refresh; ``distances``: each rack's
    distance measured from hosts with ``min_samples`` and with a few answers (updated here
    when ``racks`` is given)."""
    near = thin = None
    if racks is not None:
        measure_racks(config, windows, groups, racks, now, verdicts, distances[0], window_s)
        measure_racks(config, windows, groups, racks, now, verdicts, distances[1], window_s, True)
        near, thin = distances[0].distances, distances[1].distances
    medians = peer_medians(windows, groups, config, racks, near)
    # The peers' upper confidence bounds of the same percentile: a host's tail must be
    # above what its peers' tails could be, not only above their estimate.
    bounds = peer_medians(upper_bound_windows(windows, config), groups, config, racks, near)
    # For the median rule (adaptive_lb.health.evidence): medians of hosts with a few answers.
    typical = peer_medians(windows, groups, config, racks, thin, 50.0, MIN_EVIDENCE, strict=True)
    spread = latency_spread(windows.values())
    peer_samples = typical_samples(windows, groups)
    late = (lateness.high(now), lateness.typical(now))  # the largest, and the typical
    baselines = {
        key: Baseline(medians[key], bounds[key], typical[key], spread, *late) for key in windows
    }
    # A probed host's round trips say whether it is still clearly slow (probe_latency).
    args = (groups, racks, thin, typical, peer_samples, spread, config, now)
    probe_slow = still_slow_hosts(stats, windows, *args, window_s) if probing else {}
    return Comparison(
        baselines,
        {key: peer_samples.get(groups.get(key), 0) for key in windows},
        probe_slow,
        since_suspected(config, stats, windows, verdicts),
        probing,
    )


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
        since = verdict.suspect_interval
        window = windows.get(key)
        if since is None or window is None or window.interval <= since or key not in stats:
            continue
        more = lambda n: bound_percentiles(n, config)  # noqa: E731
        recent[key] = stats[key].window_stats((), more, newer_than=since)
    return recent


def measure_racks(
    config: HealthConfig,
    windows: Mapping[Hashable, WindowStats],
    groups: Mapping[Hashable, Hashable],
    racks: Mapping[Hashable, Hashable],
    now_ns: int,
    verdicts: Mapping[Hashable, HostHealth],
    into: RackDistances,
    window_s: float,
    thin: bool = False,
) -> None:
    """Update ``into`` from the p50 of the hosts that were HEALTHY at the last refresh and
    have ``min_samples`` (``thin``: ``MIN_EVIDENCE``) samples (before judging them: a host
    that slows down is judged against its rack's distance from before)."""
    min_samples = MIN_EVIDENCE if thin else config.min_samples
    measured: dict[RackKey, list[float]] = {}
    for key, window in windows.items():
        p50 = window.latency.get(50.0)
        health = verdicts.get(key)
        if (
            p50 is None
            or window.samples < min_samples
            or key not in racks
            or (health is not None and health.state is not HealthState.HEALTHY)
        ):
            continue
        measured.setdefault((groups.get(key), racks[key]), []).append(p50)
    into.update(measured, now_ns, window_s)
    into.forget({(groups.get(key), rack) for key, rack in racks.items()})
