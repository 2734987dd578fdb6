"""The server's own view of its load (issue 24 item 3): thread-pool rows -> pressure, the
damping (smoothing, relative to peers, randomized partial response, cap, expiry), which
hosts are read, the sender with a stand-in session, and a policy's plans following the
factor (real HostStats, real policy over real driver objects, manual clock)."""

from __future__ import annotations

import random
from collections import Counter, namedtuple
from typing import Any

import attrs
import pytest
from cassandra import InvalidRequest, OperationTimedOut, Unauthorized

from adaptive_lb.config import HealthConfig, ServerLoadConfig, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.runtime.prober import Prober
from adaptive_lb.stats.host import HostStats
from adaptive_lb.stats.server_load import (
    STALE_INTERVALS,
    THREAD_POOLS_QUERY,
    PoolReading,
    ServerLoadRecord,
    due,
    load_factor,
    parse_pools,
    pressure_of,
    publish,
    smooth,
    supports_thread_pools,
)
from adaptive_lb.telemetry.tracing import CANDIDATES_ATTRIBUTE
from tests.unit.prober_standins import StandInPolicy, StandInSession
from tests.unit.test_tracing import candidates_of

MS = 1_000_000
S = 1_000_000_000
CONFIG = ServerLoadConfig()
Row = namedtuple("Row", "name active_tasks active_tasks_limit pending_tasks blocked_tasks")


def pools(read: tuple[int, int, int, int] = (0, 8, 0, 0)) -> list[PoolReading]:
    """A node's answer: ReadStage (active, limit, pending, blocked) as given, idle others."""
    return [
        PoolReading("Native-Transport-Requests", 1, 128, 0, 0),
        PoolReading("ReadStage", *read),
        PoolReading("MutationStage", 0, 8, 0, 0),
        PoolReading("CompactionExecutor", 2, 2, 500, 0),  # not watched: not a user's queue
    ]


def test_pressure_is_the_busiest_watched_pool_in_pool_fulls():
    assert pressure_of(pools()) == (pytest.approx(1 / 128), "Native-Transport-Requests")
    assert pressure_of(pools((8, 8, 16, 0))) == (3.0, "ReadStage")
    assert pressure_of(pools((8, 8, 0, 8))) == (2.0, "ReadStage")  # blocked tasks wait too
    assert pressure_of([PoolReading("ReadStage", 0, 0, 3, 0)]) == (3.0, "ReadStage")
    assert pressure_of([PoolReading("CompactionExecutor", 2, 2, 500, 0)]) is None
    assert pressure_of([]) is None


def test_rows_of_every_stock_row_factory_parse_alike():
    expected = [PoolReading("ReadStage", 8, 8, 40, 0)]
    assert parse_pools([Row("ReadStage", 8, 8, 40, 0)]) == expected
    assert parse_pools([("ReadStage", 8, 8, 40, 0)]) == expected
    assert (
        parse_pools([dict(zip(Row._fields, ("ReadStage", 8, 8, 40, 0), strict=True))]) == expected
    )
    assert parse_pools([("ReadStage", 8, None, None, 0)]) == [PoolReading("ReadStage", 8, 0, 0, 0)]
    with pytest.raises(ValueError, match="unknown shape"):
        parse_pools([object()])
    with pytest.raises(ValueError, match="unexpected types"):
        parse_pools([("ReadStage", "8", 8, 0, 0)])


def test_smoothing_moves_halfway_in_one_half_life():
    assert smooth(None, 6.0, 2.0, 4.0) == 6.0
    assert smooth(0.0, 6.0, 4.0, 4.0) == pytest.approx(3.0)
    assert smooth(0.0, 6.0, 8.0, 4.0) == pytest.approx(4.5)
    assert smooth(2.0, 6.0, 1.0, 0.0) == 6.0  # no smoothing
    # Readings every 2 s with a 4 s half-life: a step to 6 is at 3.0 after 4 s.
    value = 0.0
    for _ in range(2):
        value = smooth(value, 6.0, 2.0, 4.0)
    assert value == pytest.approx(3.0)


def test_the_factor_is_the_excess_over_the_drawn_threshold_capped():
    assert load_factor(0.0, 0.5, 0.0, 4.0) == 1.0
    assert load_factor(-3.0, 0.5, 0.0, 4.0) == 1.0  # less loaded than its peers: no bonus
    assert load_factor(1.0, 0.5, 0.0, 4.0) == 2.0
    assert load_factor(1.0, 0.5, 0.5, 4.0) == 1.5  # threshold drawn at 0.5
    assert load_factor(1.0, 0.5, 0.999, 4.0) == pytest.approx(1.001)
    assert load_factor(50.0, 0.5, 0.3, 4.0) == 4.0
    assert load_factor(50.0, 0.5, 0.3, 1.0) == 1.0  # cap 1: read and shown, never weighed


@pytest.mark.parametrize("excess", [0.25, 0.5, 0.75])
def test_a_fleet_responds_in_proportion_to_the_excess(excess: float):
    """Randomized partial response: of many clients seeing the same excess, the share
    that penalises the node is excess / (2 x threshold), not all or none."""
    rng = random.Random(7)
    clients = [ServerLoadRecord(draw=rng.random()) for _ in range(4000)]
    reacting = sum(load_factor(excess, 0.5, c.draw, 4.0) > 1.0 for c in clients) / len(clients)
    assert reacting == pytest.approx(excess / 1.0, abs=0.03)


def host(clock: ManualClock, draw: float = 0.0) -> HostStats:
    stats = HostStats(TrackingConfig(), clock)
    stats.load = ServerLoadRecord(draw=draw)
    return stats


def read(
    stats: HostStats, clock: ManualClock, answer: list[PoolReading], half_life: float = 4.0
) -> None:
    assert stats.load.begin(clock.now_ns() + 2 * S)
    stats.load.answer(answer, clock.now_ns(), 0.001, half_life)


def test_a_node_queueing_more_than_its_peers_gets_a_factor_and_they_do_not():
    clock = ManualClock(10 * S)
    hosts = {name: host(clock) for name in "abc"}
    for name, stats in hosts.items():
        read(stats, clock, pools((8, 8, 16, 0) if name == "b" else (2, 8, 0, 0)))
    publish(hosts.items(), clock.now_ns(), CONFIG)
    assert hosts["b"].load.excess == pytest.approx(3.0 - 0.25)
    assert hosts["b"].server_load == 3.75  # draw 0: threshold 0
    assert hosts["a"].server_load == hosts["c"].server_load == 1.0
    # Everyone as busy: nothing moves.
    clock.advance_s(2.0)
    for stats in hosts.values():
        read(stats, clock, pools((8, 8, 16, 0)), half_life=0.0)
    publish(hosts.items(), clock.now_ns(), CONFIG)
    assert {stats.server_load for stats in hosts.values()} == {1.0}


def test_without_a_peer_or_a_fresh_reading_or_when_off_the_factor_is_one():
    clock = ManualClock(10 * S)
    a, b = host(clock), host(clock)
    read(a, clock, pools((8, 8, 40, 0)))
    publish([("a", a), ("b", b)], clock.now_ns(), CONFIG)
    assert a.server_load == 1.0  # b has no reading: nothing to compare with
    read(b, clock, pools())
    publish([("a", a), ("b", b)], clock.now_ns(), CONFIG)
    assert a.server_load == 4.0
    publish([("a", a), ("b", b)], clock.now_ns(), attrs.evolve(CONFIG, enabled=False))
    assert a.server_load == 1.0
    publish([("a", a), ("b", b)], clock.now_ns(), CONFIG)
    assert a.server_load == 4.0
    clock.advance_s(STALE_INTERVALS * CONFIG.interval + 0.1)  # readings expire
    publish([("a", a), ("b", b)], clock.now_ns(), CONFIG)
    assert a.server_load == 1.0 and a.load.excess == 0.0


def test_a_queue_is_taken_in_and_forgiven_gradually():
    """Readings every 2 s, half-life 4 s: a node's step to 4 pool-fulls queued moves its
    factor a share 1 - 2 ** -0.5 (29 %) of the way per reading, up to the cap, and back."""
    clock = ManualClock(10 * S)
    hosts = {name: host(clock) for name in "abc"}
    for stats in hosts.values():
        read(stats, clock, pools())
    factors = []
    for step in range(8):
        clock.advance_s(2.0)
        for name, stats in hosts.items():
            queued = name == "a" and step < 4
            read(stats, clock, pools((8, 8, 24, 0) if queued else (0, 8, 0, 0)))
        publish(hosts.items(), clock.now_ns(), CONFIG)
        factors.append(hosts["a"].server_load)
    kept = 2**-0.5
    # (idle nodes report 1/128: one of the 128 request threads busy)
    for step, factor in enumerate(factors[:4]):
        assert factor == pytest.approx(1 + 4 * (1 - kept ** (step + 1)), abs=0.01)
    assert factors[4:] == sorted(factors[4:], reverse=True)
    assert 1.0 < factors[-1] < factors[3]


def test_reads_go_to_live_hosts_with_the_table_one_at_a_time_at_the_interval():
    clock = ManualClock(10 * S)
    rng = random.Random(1)
    a, b, c, d = (host(clock) for _ in range(4))
    d.load.mark_unsupported("release_version 3.0.8")
    listed = [("a", a, True), ("b", b, False), ("c", c, True), ("d", d, True)]
    orders = due(listed, clock.now_ns(), CONFIG, rng)
    assert [o.key for o in orders] == ["a", "c"]
    for order in orders:
        gap = (order.next_ns - clock.now_ns()) / S
        assert 1.5 <= gap <= 2.5
        assert order.stats.load.begin(order.next_ns)
    assert due(listed, clock.now_ns(), CONFIG, rng) == []  # outstanding
    a.load.answer(pools(), clock.now_ns(), 0.001, 4.0)
    assert due(listed, clock.now_ns(), CONFIG, rng) == []  # not yet: the interval
    clock.advance_s(2.6)
    assert [o.key for o in due(listed, clock.now_ns(), CONFIG, rng)] == ["a"]
    assert due(listed, clock.now_ns(), attrs.evolve(CONFIG, enabled=False), rng) == []


def test_an_empty_answer_or_a_refusal_means_no_table_remembered():
    record = ServerLoadRecord()
    assert record.begin(0)
    record.answer([], 0, 0.001, 4.0)  # Simulacron, unprimed
    assert record.supported is False and not record.begin(0)
    record = ServerLoadRecord()
    assert record.begin(0)
    record.fail()  # a timeout: tried again
    assert record.failed == 1 and record.supported is None and record.begin(0)
    record.fail(absent="InvalidRequest: unconfigured table thread_pools")
    assert record.supported is False and "unconfigured" in record.unsupported_reason
    # A host that comes back up (a restart: perhaps an upgrade) is asked again.
    from adaptive_lb.health.model import HealthModel

    stats = HostStats(TrackingConfig(), ManualClock(0))
    stats.load = record
    HealthModel(HealthConfig(), ManualClock(S)).mark_up("h", stats)
    assert record.supported is None and record.begin(0)
    assert supports_thread_pools("3.0.8") is False  # ScyllaDB, Cassandra 3.x
    assert supports_thread_pools("4.0.0") is True and supports_thread_pools("5.0.6") is True
    assert supports_thread_pools(None) is None and supports_thread_pools("dev") is None


class _Host:
    def __init__(self, release_version: str | None) -> None:
        self.release_version = release_version


@pytest.mark.parametrize(
    ("exc", "absent"),
    [
        (InvalidRequest("unconfigured table thread_pools"), True),
        (Unauthorized("no SELECT permission"), True),
        (OperationTimedOut("timed out"), False),
    ],
)
def test_the_sender_reads_one_host_and_counts_what_came_back(exc: Exception, absent: bool):
    from adaptive_lb.stats.server_load import LoadOrder

    session, policy = StandInSession(), StandInPolicy()
    prober = Prober(session, [policy]).start()
    old, new = _Host("3.0.8"), _Host("5.0.6")
    stats_old, stats_new = (
        HostStats(TrackingConfig(), policy.clock),
        HostStats(TrackingConfig(), policy.clock),
    )
    policy.read_load(LoadOrder(old, stats_old, S))
    assert session.calls == [] and stats_old.load.supported is False  # never asked
    policy.read_load(LoadOrder(new, stats_new, S))
    policy.read_load(LoadOrder(new, stats_new, S))  # one outstanding at a time
    assert len(session.calls) == 1
    statement, timeout, target = session.calls[0]
    assert statement is prober.load_statement and statement.query_string == THREAD_POOLS_QUERY
    assert (timeout, target) == (0.5, new)
    callback, errback, args, eargs = session.future.callbacks
    policy.clock.advance(3 * MS)
    callback([Row("ReadStage", 8, 8, 8, 0)], *args)
    assert stats_new.load.raw == 2.0 and stats_new.load.pool == "ReadStage"
    assert stats_new.load.last_latency_s == pytest.approx(0.003)
    policy.read_load(LoadOrder(new, stats_new, 2 * S))
    _, errback, _, eargs = session.future.callbacks
    errback(exc, *eargs)
    assert (stats_new.load.supported is False) is absent
    assert stats_new.load.failed == (0 if absent else 1)
    assert stats_new.requests_total == 0 and stats_new.in_flight == 0  # not user traffic
    prober.close()
    assert policy.read_load is None and policy.errors == []


def test_request_tracking_leaves_the_load_read_alone():
    from adaptive_lb.runtime.tracking import RequestTracker

    class Session:
        cluster = None

        def add_request_init_listener(self, fn):
            pass

        def remove_request_init_listener(self, fn):
            pass

    class Future:
        def __init__(self, query: Any) -> None:
            self.query = query

    tracker = RequestTracker(Session())
    tracker._on_request(Future(tracker.prober.load_statement))
    assert tracker.untracked_requests == 0
    tracker.close()


def test_plans_follow_the_factor_and_the_snapshot_metrics_and_trace_show_it():
    from cassandra.query import SimpleStatement
    from prometheus_client import CollectorRegistry

    from adaptive_lb.exporters.prometheus import AdaptiveLbCollector
    from adaptive_lb.telemetry.tracing import build_decision
    from tests.unit.test_snapshot import example_policy

    with example_policy() as (policy, clock):
        local = sorted(policy.topology.local, key=lambda v: v.host.address)
        fast, slow = local
        slow.stats.publish_health(fast.stats.health_state, 1.0)  # two equal hosts
        for view in local:
            view.stats.load = ServerLoadRecord(draw=0.0)
            read(view.stats, clock, pools((8, 8, 40, 0) if view is fast else (0, 8, 0, 0)))
        policy.refresh_health()
        assert fast.stats.server_load == 4.0 and slow.stats.server_load == 1.0
        firsts = Counter(
            next(iter(policy.make_query_plan("ks", SimpleStatement("q")))).address
            for _ in range(200)
        )
        # fast has one request of this client in flight (score 2 x 4 = 8 against 1).
        assert firsts == {slow.host.address: 200}
        host = next(h for h in policy.snapshot().hosts if h.address == fast.host.address)
        assert (host.server_load, host.server_pressure, host.server_pressure_pool) == (
            4.0,
            6.0,
            "ReadStage",
        )
        assert host.server_load_source == "thread_pools" and host.server_load_reads_total == 1
        assert host.requests_total == policy.stats.get(fast.host).requests_total
        registry = CollectorRegistry()
        registry.register(AdaptiveLbCollector(policy))
        labels = {"policy": "0", "address": host.address, "dc": "dc1", "rack": host.rack or ""}
        sample = registry.get_sample_value
        assert sample("adaptive_lb_host_server_load", labels) == 4.0
        assert sample("adaptive_lb_host_server_pressure_ratio", labels) == 6.0
        assert sample("adaptive_lb_host_server_load_reads_total", labels) == 1.0
        decision, _ = build_decision(
            _Record(local),
            [slow.host, fast.host],
            "ks",
            SimpleStatement("q"),
            non_replica_penalty=12.0,
            config_hash="x",
            routing_keys=False,
            pop_transition=lambda _host: None,
        )
        by_address = {
            c["address"]: c for c in candidates_of({CANDIDATES_ATTRIBUTE: decision.candidates})
        }
        assert float(by_address[fast.host.address]["server_load"]) == 4.0
        assert float(by_address[fast.host.address]["penalty"]) == pytest.approx(
            4.0 * fast.stats.health_penalty
        )


@attrs.define
class _Record:
    """The parts of a PlanRecord that build_decision reads: every candidate scored as a
    replica (no replica set)."""

    candidates: list[Any]
    replicas: tuple[Any, ...] = ()
    position: str = "local"
    keyspace: str | None = "ks"
    lwt: bool = False
    cache_hit: bool | None = None
    fallback: bool = False
    local_rack: str | None = None
    local_rack_source: str = "unknown"
    enabled: bool = True
