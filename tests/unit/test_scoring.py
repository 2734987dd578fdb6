"""The weighted least-loaded order, as pure logic: no driver import, plain host keys and
hand-set statistics."""

from __future__ import annotations

import collections

import pytest
from attrs import define

from adaptive_lb.plan.scoring import (
    HostView,
    best_replica,
    fill_hosts,
    lowest_score,
    order,
    order_lwt,
    score_of,
)

NON_REPLICA = 12.0


@define
class Load:
    """The five numbers scoring reads (``HostLoad``)."""

    in_flight: int = 0
    rack_penalty: float = 1.0
    health_penalty: float = 1.0
    server_load: float = 1.0
    latency_factor: float = 1.0


def rank(replicas, local, fill_count, exclude, non_replica_penalty) -> list[HostView]:
    """Replicas and fill hosts in score order, composed as the planner composes them."""
    return order(replicas, fill_hosts(local, fill_count, exclude), non_replica_penalty)


def views(names: str, **load: float) -> list[HostView]:
    return [HostView(host=name, stats=Load(**load), is_local=True) for name in names]


def hosts(ordered: list[HostView]) -> list[str]:
    return [view.host for view in ordered]


def test_score_is_the_wlllb_formula():
    view = HostView(host="a", stats=Load(in_flight=3, rack_penalty=4.0, health_penalty=64.0))
    assert score_of(view, True, NON_REPLICA) == 4 * 4.0 * 64.0
    assert score_of(view, False, NON_REPLICA) == 4 * 4.0 * 64.0 * NON_REPLICA
    view.stats.server_load = 2.5
    assert score_of(view, True, NON_REPLICA) == 4 * 4.0 * 64.0 * 2.5
    view.stats.latency_factor = 1.5
    assert score_of(view, True, NON_REPLICA) == 4 * 4.0 * 64.0 * 2.5 * 1.5


def test_a_host_the_server_reports_loaded_sinks_behind_equal_peers():
    replicas = views("abc")
    replicas[1].stats.server_load = 1.5
    for _ in range(50):
        assert hosts(rank(replicas, replicas, 0, replicas, NON_REPLICA))[-1] == "b"
    # ...but not behind a peer with more of this client's own requests in flight.
    replicas[0].stats.in_flight = 1  # score 2 > 1.5
    for _ in range(50):
        assert hosts(rank(replicas, replicas, 0, replicas, NON_REPLICA))[-1] == "a"


def test_replicas_come_before_fill_under_equal_load():
    replicas = views("abc")
    local = replicas + views("defghi")
    for _ in range(200):
        ordered = rank(replicas, local, 5, replicas, NON_REPLICA)
        assert sorted(hosts(ordered[:3])) == ["a", "b", "c"]
        assert len(ordered) == 8
        assert len(set(hosts(ordered))) == 8


def test_fill_skips_excluded_hosts_and_stops_at_its_count():
    replicas = views("ab")
    local = replicas + views("cdef")
    for count in range(6):
        ordered = rank((), local, count, replicas, NON_REPLICA)
        assert len(ordered) == min(count, 4)
        assert not {"a", "b"} & set(hosts(ordered))


def test_a_loaded_replica_moves_behind_its_peers_and_an_idle_fill_host():
    a, b, c = views("abc")
    a.stats.in_flight = 20  # score 21, an idle fill host scores 12
    (d,) = views("d")
    ordered = rank([a, b, c], [a, b, c, d], 5, [a, b, c], NON_REPLICA)
    assert hosts(ordered) in (["b", "c", "d", "a"], ["c", "b", "d", "a"])


def test_fill_hosts_are_ordered_by_score():
    local = views("abcdef")
    for view, in_flight in zip(local, (5, 0, 3, 1, 4, 2), strict=True):
        view.stats.in_flight = in_flight
    for _ in range(50):
        assert hosts(rank((), local, 6, (), 1.0)) == ["b", "d", "f", "c", "e", "a"]


def test_an_unhealthy_host_sinks():
    replicas = views("abc")
    replicas[0].stats.health_penalty = 64.0
    for _ in range(50):
        assert hosts(rank(replicas, replicas, 0, replicas, NON_REPLICA))[-1] == "a"


@pytest.mark.parametrize("kind", ["replicas", "fill"])
def test_equal_hosts_are_first_equally_often(kind: str):
    equal = views("abcdef")
    plans = 60_000
    if kind == "replicas":  # broken by the jitter
        firsts = collections.Counter(
            rank(equal, (), 0, (), NON_REPLICA)[0].host for _ in range(plans)
        )
    else:  # broken by the random window over the shuffled local list
        firsts = collections.Counter(rank((), equal, 3, (), 1.0)[0].host for _ in range(plans))
    expected = plans / len(equal)
    assert set(firsts) == set("abcdef")
    for count in firsts.values():
        assert abs(count - expected) / expected < 0.05, firsts


def test_lwt_order_is_ring_order_with_unhealthy_hosts_last():
    replicas = views("abc")
    replicas[2].stats.in_flight = 50  # ignored: clients must agree on the coordinator
    assert hosts(order_lwt(replicas)) == ["a", "b", "c"]
    replicas[0].stats.health_penalty = 64.0
    assert hosts(order_lwt(replicas)) == ["b", "c", "a"]


def test_hot_loops_order_by_score_of():
    """best_replica() and rank() inline the formula for speed: their order must be
    score_of's, for any load (distinct scores, so tie-breaking plays no part)."""
    import random

    rng = random.Random(3)
    penalties = (1.0, 1.5, 4.0, 6.0, 64.0)

    def random_views(prefix: str, count: int) -> list[HostView]:
        return [
            HostView(
                host=f"{prefix}{i}",
                stats=Load(
                    rng.randrange(50),
                    rng.choice(penalties),
                    rng.choice(penalties),
                    rng.choice((1.0, 1.25, 2.5, 4.0)),
                ),
                is_local=True,
            )
            for i in range(count)
        ]

    for _ in range(300):
        replicas = random_views("r", rng.randint(1, 4))
        fill = random_views("f", rng.randint(0, 6))
        scores = {v.host: score_of(v, True, NON_REPLICA) for v in replicas}
        scores.update({v.host: score_of(v, False, NON_REPLICA) for v in fill})
        if len(set(scores.values())) < len(scores):
            continue  # a tie: the order among equals is random by design
        best, best_score = best_replica(replicas)
        assert best.host == min((v.host for v in replicas), key=scores.__getitem__)
        assert best_score == pytest.approx(scores[best.host], rel=1e-8)
        ordered = hosts(rank(replicas, fill, len(fill), (), NON_REPLICA))
        assert ordered == sorted(scores, key=scores.__getitem__)
        fill_scores = [scores[v.host] for v in fill]
        assert lowest_score(fill, NON_REPLICA) == (min(fill_scores) if fill else float("inf"))


def test_fill_hosts_is_a_random_window_without_the_excluded():
    local = views("abcdef")
    seen_first = collections.Counter()
    for _ in range(600):
        fill = fill_hosts(local, 3, local[:2])
        names = hosts(fill)
        assert len(names) == 3 and not {"a", "b"} & set(names)
        ring = "cdef" * 2  # a window of local's order, wrapping around
        assert "".join(names) in ring
        seen_first[names[0]] += 1
    assert set(seen_first) == {"c", "d", "e", "f"}
    assert fill_hosts(local, 0, ()) == [] and fill_hosts((), 3, ()) == []
