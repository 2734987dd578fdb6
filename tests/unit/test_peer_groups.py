"""True health peers: a host's rack, else its datacenter corrected by rack distance."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.model import HealthModel, HealthState
from adaptive_lb.health.peers import MIN_RACK_PEERS, peer_median, peer_medians
from adaptive_lb.plan.locality import RackDistances
from adaptive_lb.stats.host import HostStats, WindowStats

MS = 1_000_000
S = 1_000_000_000
HEALTHY, SLOW = HealthState.HEALTHY, HealthState.SLOW


class Cluster:
    """One datacenter; ``layout`` maps a rack to (hosts, extra distance in ms)."""

    def __init__(self, layout: dict[str, tuple[int, float]], config: HealthConfig | None = None):
        self.clock = ManualClock(0)
        self.config = config or HealthConfig()
        self.model = HealthModel(self.config, self.clock, window_s=10.0)
        self.stats: dict[str, HostStats] = {}
        self.racks: dict[str, str] = {}
        self.distance_ms: dict[str, float] = {}
        for rack, (count, distance) in layout.items():
            for i in range(count):
                key = f"{rack}{i}"
                self.stats[key] = HostStats(TrackingConfig(), self.clock)
                self.racks[key] = rack
                self.distance_ms[key] = distance
        self.extra_ms: dict[str, float] = {}
        """Hosts genuinely slower (server side), ms added to every answer."""

    def second(self, use_racks: bool = True) -> None:
        """One second of traffic: every host answers 100 requests (p50 0.8 ms, p99 2 ms, plus
        its distance and extra), then a health refresh."""
        self.clock.advance_s(1.0)
        for key, stats in self.stats.items():
            base = self.distance_ms[key] + self.extra_ms.get(key, 0.0)
            for i in range(100):
                stats.on_send()
                stats.on_success(int((base + (2.0 if i % 50 == 0 else 0.8)) * MS))
        groups = dict.fromkeys(self.stats, "dc1")
        self.model.refresh(self.stats, groups, racks=self.racks if use_racks else None)

    def slow(self) -> list[str]:
        return sorted(k for k, s in self.stats.items() if s.health_state is SLOW)


def test_a_far_racks_hosts_are_not_slow_from_distance_alone():
    layout = {"A": (4, 0.0), "B": (4, 0.2), "C": (4, 6.0)}  # C: 6 ms farther
    old = Cluster(layout)
    old.second(use_racks=False)
    assert old.slow() == ["C0", "C1", "C2", "C3"]  # judged against the datacenter: SLOW
    new = Cluster(layout)
    for _ in range(15):
        new.second()
        assert new.slow() == []


def test_a_genuinely_slow_host_of_a_far_rack_is_still_flagged():
    c = Cluster({"A": (4, 0.0), "C": (4, 6.0)})
    c.second()
    c.extra_ms["C1"] = 20.0
    c.second()  # half its window slow: its body is, not only its tail
    assert c.slow() == ["C1"]


@pytest.mark.parametrize("far_hosts", [1, MIN_RACK_PEERS])
def test_a_small_far_rack_is_judged_against_its_datacenter_moved_to_its_distance(far_hosts):
    """Too few hosts for its rack alone: compared with the datacenter, each peer moved to the
    rack's distance -- not SLOW for being far, SLOW for being slow."""
    # C is 6 ms farther: beyond the default max_rack_distance (5 ms), so allow 10 ms here.
    layout = {"A": (4, 0.0), "B": (4, 0.2), "C": (far_hosts, 6.0)}
    c = Cluster(layout, HealthConfig(max_rack_distance=0.01))
    for _ in range(12):
        c.second()
        assert c.slow() == []
    health = c.model.health("C0")
    assert health is not None and health.peer_median is not None
    # The peers' p99 above their rack's distance (1.2 ms), plus C's distance (6.8 ms).
    assert health.peer_median == pytest.approx(0.0012 + 0.0068, rel=0.05)
    c.extra_ms["C0"] = 20.0  # the single (or one of two) far host slows down
    c.second()
    c.second()  # its median slow (a tail alone would need two windows)
    assert c.slow() == ["C0"]


def test_a_single_host_rack_is_judged_by_the_distance_it_had_before():
    c = Cluster({"A": (4, 0.0), "B": (1, 0.0)})
    for _ in range(5):
        c.second()
    c.extra_ms["B0"] = 6.0  # not far: slow
    c.second()
    c.second()  # its median slow (a tail alone would need two windows)
    assert c.slow() == ["B0"]
    distance = c.model.rack_distances.distances[("dc1", "B")]
    assert distance == pytest.approx(0.0008, rel=0.1)  # its SLOW answers never counted


def test_racks_distances_are_kept_while_a_rack_is_not_measured():
    c = Cluster({"A": (4, 0.0), "C": (1, 6.0)})
    c.second()
    known = c.model.rack_distances.distances[("dc1", "C")]
    c.clock.advance_s(30.0)  # no traffic at all: windows empty
    c.model.refresh(c.stats, dict.fromkeys(c.stats, "dc1"), racks=c.racks)
    assert c.model.rack_distances.distances[("dc1", "C")] == known


# ----------------------------------------------------------------- pure


def window(latency: float | None, samples: int = 100, p50: float | None = None) -> WindowStats:
    return WindowStats(
        requests=samples,
        successes=samples,
        errors=0,
        timeouts=0,
        samples=samples,
        latency={99.0: latency, 50.0: p50 if p50 is not None else latency},
    )


@settings(max_examples=100, deadline=None)
@given(
    hosts=st.lists(
        st.tuples(
            st.sampled_from(["r1", "r2", "r3"]),
            st.one_of(st.none(), st.floats(0.0001, 1.0)),
            st.integers(0, 120),
        ),
        max_size=14,
    )
)
def test_a_host_of_a_rack_with_enough_peers_is_compared_with_its_rack_only(hosts) -> None:
    config = HealthConfig()
    windows = {f"h{i}": window(latency, samples) for i, (_, latency, samples) in enumerate(hosts)}
    racks = {f"h{i}": rack for i, (rack, _, _) in enumerate(hosts)}
    groups = dict.fromkeys(windows, "dc1")
    counts: dict[str, int] = {}
    medians = peer_medians(windows, groups, config, racks, {}, counts=counts)

    def qualified(key: str) -> float | None:
        w = windows[key]
        return w.latency[99.0] if w.samples >= config.min_samples else None

    def samples_of(key: str, peers: list[str]) -> int:
        sizes = [windows[o].samples for o in peers]
        return round(peer_median(sizes) or 0) if medians[key] is not None else 0

    for key in windows:
        rack_peers = [o for o in windows if o != key and racks[o] == racks[key] and qualified(o)]
        if len(rack_peers) >= MIN_RACK_PEERS:
            assert medians[key] == peer_median(qualified(o) for o in rack_peers)
            assert counts[key] == samples_of(key, rack_peers)
        else:  # no distance known: the datacenter as it is
            others = [o for o in windows if o != key and qualified(o)]
            assert medians[key] == peer_median(qualified(o) for o in others)
            assert counts[key] == samples_of(key, others)


def test_a_hosts_peer_count_is_its_peers_not_its_datacenters():
    """The answers a host's peer median rests on are its peers' (here its rack's, 500 each),
    not the datacenter's typical host (most are far racks with a few answers)."""
    config = HealthConfig()
    windows = {f"a{i}": window(0.001, 500) for i in range(4)}
    windows |= {f"{r}{i}": window(0.0015, 5) for r in "bc" for i in range(4)}
    racks = {key: key[0] for key in windows}
    counts: dict[str, int] = {}
    peer_medians(windows, dict.fromkeys(windows, "dc1"), config, racks, {}, 50.0, 3, counts=counts)
    assert counts["a1"] == 500
    assert counts["b1"] == 5


def test_corrected_median_moves_each_peer_to_the_hosts_distance():
    config = HealthConfig()
    windows = {"a0": window(0.002), "a1": window(0.004), "c0": window(0.009)}
    racks = {"a0": "A", "a1": "A", "c0": "C"}
    distances = {("dc1", "A"): 0.001, ("dc1", "C"): 0.006}
    medians = peer_medians(windows, dict.fromkeys(windows, "dc1"), config, racks, distances)
    # c0: peers' excess over their rack (1 and 3 ms), median 2 ms, plus C's 6 ms.
    assert medians["c0"] == pytest.approx(0.008)
    # a0: peers a1 (excess 3 ms) and c0 (excess 3 ms): 3 ms + A's 1 ms.
    assert medians["a0"] == pytest.approx(0.004)


def test_rack_distances_start_at_the_first_measurement_then_follow_over_a_window():
    distances = RackDistances()
    # The lower quartile of the hosts' p50: a slower host does not pull its rack away.
    distances.update({("dc1", "A"): [0.009, 0.003, 0.002]}, now_ns=0, time_constant_s=10.0)
    assert distances.distances == {("dc1", "A"): 0.002}
    distances.update({("dc1", "A"): [0.004], ("dc1", "B"): []}, 10 * S, 10.0)
    expected = 0.002 + 0.002 * (1 - math.exp(-1))
    assert distances.distances[("dc1", "A")] == pytest.approx(expected)
    assert ("dc1", "B") not in distances.distances
    distances.forget({("dc1", "B")})
    assert distances.distances == {}


def test_a_single_host_rack_slow_from_its_start_is_still_judged():
    """Racks of one host each, one of them 20 ms slow from the first second: its rack's
    distance, measured on itself, counts at most ``health.max_rack_distance`` beyond the
    nearest rack's, so the host is still SLOW; with no cap it would be excused as far."""
    for cap, expected in ((HealthConfig().max_rack_distance, ["C0"]), (1.0, [])):
        cluster = Cluster(
            {"A": (1, 0.0), "B": (1, 0.0), "C": (1, 0.0)}, HealthConfig(max_rack_distance=cap)
        )
        cluster.extra_ms["C0"] = 20.0
        for _ in range(5):
            cluster.second()
        assert cluster.slow() == expected, cap
