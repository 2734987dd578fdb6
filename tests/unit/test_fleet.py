"""A fleet's reads and probes within a budget per node (issue 34 item 4): the fleet size
from the server's clients table, the slots' arithmetic, fleets of 10, 100 and 1,000 clients
(each with its own real pacer, load record and estimate) counted at one node on a virtual
clock, the real policy's refresh spacing its reads, and the sender with a stand-in session."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import attrs
import pytest
from cassandra import InvalidRequest, OperationTimedOut

from adaptive_lb.config import FleetConfig, HealthConfig
from adaptive_lb.runtime.prober import OwnStatement, Prober
from adaptive_lb.stats.fleet import (
    CASSANDRA_CLIENTS_QUERY,
    FIRST_CLIENTS_READ_S,
    SCYLLA_CLIENTS_QUERY,
    ClientsOrder,
    FleetEstimate,
    FleetPacer,
    clients_from_rows,
    clients_period_s,
    own_period_s,
)
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.server_load import ServerLoadRecord, due
from tests.unit.prober_standins import StandInPolicy, StandInSession
from tests.unit.test_server_load import pools

S = 1_000_000_000
REFRESH_S = 0.2


def test_the_fleet_is_the_sessions_in_the_clients_table_never_their_addresses():
    cassandra = [{"address": f"10.0.0.{i}", "port": 40000 + i} for i in range(7)]
    assert clients_from_rows(cassandra) == 7
    assert clients_from_rows([("10.0.0.1", 1), ("10.0.0.1", 2)]) == 2  # two workers of a pod
    # ScyllaDB: a session keeps one connection per shard; one more (a control connection).
    scylla = [("10.0.0.1", 40000 + 10 * s + n, s) for s in range(4) for n in range(5)]
    assert clients_from_rows([*scylla, ("10.0.0.9", 1, 0)]) == 6
    assert clients_from_rows([{"address": "a", "port": 1, "shard_id": 0}]) == 1
    assert clients_from_rows([]) == 0
    with pytest.raises(ValueError, match="unknown shape"):
        clients_from_rows(["10.0.0.1"])


def test_the_periods_keep_a_fleet_within_its_budget():
    assert own_period_s(1000, 20.0) == pytest.approx(1000 / 18)
    assert own_period_s(10, 20.0) == pytest.approx(10 / 18)  # under every base interval
    assert own_period_s(1000, 0.0) == 0.0  # no budget
    # 1,000 clients reading one of 3 nodes: each node gets 2 a second (a tenth of 20).
    assert clients_period_s(1000, 20.0, 3, 60.0) == pytest.approx(1000 / 6)
    assert clients_period_s(10, 20.0, 3, 60.0) == 60.0
    assert clients_period_s(1000, 0.0, 3, 60.0) == 60.0


def test_the_estimate_asks_the_table_the_node_has_and_falls_back_to_the_default():
    config = FleetConfig()
    estimate = FleetEstimate(random.Random(1))
    hosts: list[tuple[Any, bool | None]] = [("a", True), ("b", None)]
    assert estimate.size(config) == 1 and estimate.source_of(config) == "default"
    # The first read comes at a random moment within FIRST_CLIENTS_READ_S.
    first = next(
        t for t in range(0, 6 * S, S // 10) if estimate.order(t, hosts, config, 2) is not None
    )
    assert first <= FIRST_CLIENTS_READ_S * S and estimate.reads == 1
    estimate.answer(CASSANDRA_CLIENTS_QUERY, 0, first)  # Simulacron unprimed: nobody listed
    order = estimate.order(first, hosts, config, 2)
    assert order is not None and order.query == SCYLLA_CLIENTS_QUERY  # the other, at once
    estimate.fail(SCYLLA_CLIENTS_QUERY, absent=True)  # Cassandra 3.x: no such table either
    assert estimate.order(first + 3600 * S, hosts, config, 2) is None  # never asked again
    assert estimate.size(config) == 1
    assert estimate.size(attrs.evolve(config, default_size=40)) == 40
    # A ScyllaDB node (release 3.0.8) is asked system.clients first. A timeout before the
    # size is known is retried soon (another node, perhaps); after, at the interval.
    scylla = FleetEstimate(random.Random(2))
    hosts = [("s", False)]

    def next_order(start: int, end: int) -> int:
        return next(t for t in range(start, end, S // 10) if scylla.order(t, hosts, config, 1))

    assert scylla.order(next_order(0, 6 * S) - 1, hosts, config, 1) is None  # outstanding
    scylla.fail(SCYLLA_CLIENTS_QUERY, absent=False)
    retry = next_order(6 * S, 12 * S)
    assert retry <= 6 * S + FIRST_CLIENTS_READ_S * S and scylla.failed == 1
    scylla.answer(SCYLLA_CLIENTS_QUERY, 100, retry)
    again = next_order(retry, retry + 80 * S)
    assert 45 * S <= again - retry <= 75 * S  # 60 s +/- 25 %
    scylla.fail(SCYLLA_CLIENTS_QUERY, absent=False)
    assert next_order(again, again + 80 * S) - again >= 45 * S
    assert (scylla.size(config), scylla.source_of(config)) == (100, "system.clients")
    # A fork while a read is out (the last one found): the child reads anew within 5 s.
    assert scylla.order(again + 200 * S, hosts, config, 1) is None
    scylla.after_fork()
    assert next_order(again + 200 * S, again + 206 * S) <= again + 206 * S
    configured = attrs.evolve(config, size=12)
    assert scylla.size(configured) == 12 and scylla.source_of(configured) == "configured"
    assert scylla.order(3600 * S, [("s", False)], configured, 1) is None  # never read


@attrs.define
class _Stats:
    """What server_load.due reads of a host."""

    load: ServerLoadRecord = attrs.field(factory=lambda: ServerLoadRecord(draw=0.0))
    server_load: float = 1.0


@attrs.define
class _Client:
    """One client of a simulated fleet: its real pacer, load record and estimate."""

    pacer: FleetPacer
    stats: _Stats
    estimate: FleetEstimate
    rng: random.Random
    phase_ns: int
    next_probe_ns: int = 0


def fleet_at_one_node(
    clients: int, budget: float, seconds: float = 120.0, *, stalled: bool = False, seed: int = 1
) -> tuple[Counter[int], list[float]]:
    """What node ``n0`` of 3 receives from ``clients`` clients over ``seconds``, per whole
    second: thread-pool reads and clients-table reads (``stalled`` false) or probes of a
    node that stalls at 0 and returns (``stalled``: every client wants a probe of it every
    ``probe_interval``, as the scheduler orders for a stalled host). Each client refreshes
    every 0.2 s at a phase of its own, with the shipped settings and the real pacer, load
    records (``due``) and estimate; the fleet size is known from the start. Also the time
    each client first sent ``n0`` its own request (seconds)."""
    config = FleetConfig(budget=budget)
    health = HealthConfig(fleet=config)
    period_s = own_period_s(clients, budget)
    rng = random.Random(seed)
    fleet = []
    for _ in range(clients):
        estimate = FleetEstimate(random.Random(rng.random()))
        estimate.learned = clients
        pacer = FleetPacer(random.Random(rng.random()))
        pacer.resize(period_s, 0)
        phase = round(rng.random() * REFRESH_S * S)
        fleet.append(_Client(pacer, _Stats(), estimate, random.Random(rng.random()), phase))
    counts: Counter[int] = Counter()
    first: dict[int, float] = {}
    hosts = [("n0", None), ("n1", None), ("n2", None)]
    for tick in range(round(seconds / REFRESH_S)):
        for index, client in enumerate(fleet):
            now = tick * round(REFRESH_S * S) + client.phase_ns
            sent = False
            if stalled:
                if now >= client.next_probe_ns and client.pacer.take("n0", now, 1.0):
                    jitter = 1.0 + 0.25 * (2.0 * client.rng.random() - 1.0)
                    client.next_probe_ns = now + round(health.probe_interval * jitter * S)
                    sent = True
            else:
                order = client.estimate.order(now, hosts, config, 3)
                if order is not None:
                    client.estimate.answer(order.query, clients, now)
                    counts[now // S] += order.key == "n0"
                for read in due([("n0", client.stats, True)], now, health.server_load, client.rng):
                    if client.pacer.take("n0", now, health.server_load.interval):
                        assert read.stats.load.begin(read.next_ns)
                        read.stats.load.answer(pools(), now, 0.001, 4.0)
                        sent = True
            if sent:
                counts[now // S] += 1
                first.setdefault(index, now / S)
    return counts, sorted(first.values())


def per_second(counts: Counter[int], start: int, end: int) -> tuple[float, int]:
    """Mean and largest count per second over [start, end)."""
    values = [counts.get(second, 0) for second in range(start, end)]
    return sum(values) / len(values), max(values)


@pytest.mark.parametrize("clients", [10, 100, 1000])
def test_what_a_node_receives_stays_within_the_budget_whatever_the_fleet(clients):
    counts, first = fleet_at_one_node(clients, 20.0)
    mean, peak = per_second(counts, 20, 120)
    reach = sum(1 for t in first if t <= 10.0) / clients
    print(
        f"\n{clients} clients, budget 20: reads per second at one node mean {mean:.1f}, "
        f"max {peak}; {reach:.0%} of the clients read it in its first 10 s"
    )
    assert len(first) == clients  # every client reads the node
    if clients == 10:  # not binding: a lone client's pace, 0.5 a second each
        assert mean == pytest.approx(5.0, rel=0.1)
    else:
        assert mean <= 20.0
    # Without a budget the fleet reads every node at 0.5 a second per client.
    assert per_second(fleet_at_one_node(clients, 0.0, 30.0)[0], 10, 30)[0] == pytest.approx(
        clients / 2, rel=0.1
    )


def test_a_returning_stalled_node_gets_a_spread_of_probes_and_every_client_probes_it():
    counts, first = fleet_at_one_node(1000, 20.0, 180.0, stalled=True)
    mean, peak = per_second(counts, 0, 180)
    period = own_period_s(1000, 20.0)
    print(
        f"\n1000 clients probing a stalled node, budget 20: probes per second mean "
        f"{mean:.1f}, max {peak}; last client's first probe at {first[-1]:.0f} s "
        f"(period {period:.0f} s)"
    )
    assert mean <= 20.0
    assert len(first) == 1000 and first[-1] <= period + REFRESH_S  # the first at a random phase
    # Without a budget: every client, every probe_interval (about 1,000 a second).
    unbounded = per_second(fleet_at_one_node(1000, 0.0, 10.0, stalled=True)[0], 2, 10)[0]
    assert unbounded > 800


def test_the_pacer_binds_only_beyond_a_requests_own_interval_and_rephases_when_it_grows():
    pacer = FleetPacer(random.Random(3))
    pacer.resize(own_period_s(10, 20.0), 0)  # 0.56 s: under the intervals
    assert not pacer.binding(1.0)
    assert all(pacer.take("h", t * S // 5, 1.0) for t in range(10))  # never refused
    pacer.resize(own_period_s(100, 20.0), 2 * S)  # 5.6 s: the slot drawn anew in it
    assert pacer.binding(2.0)
    slots = [t for t in range(2 * S, 30 * S, S // 5) if pacer.take("h", t, 2.0)]
    assert slots[0] <= 2 * S + 5.6 * S
    gaps = [(b - a) / S for a, b in itertools.pairwise(slots)]
    assert all(5.5 <= gap <= 8.6 for gap in gaps), gaps  # period x [1, 1.5), to a refresh
    pacer.resize(own_period_s(1000, 20.0), 30 * S)  # 56 s
    pacer.take("h", 30 * S, 2.0)
    pacer.resize(own_period_s(100, 20.0), 31 * S)  # back to 5.6 s: no slot 56 s away
    assert any(pacer.take("h", t, 2.0) for t in range(31 * S, 37 * S, S // 5))
    pacer.keep([])
    assert pacer.take("h", 40 * S, 2.0) is False  # forgotten: a new random phase


def test_the_policy_spaces_its_reads_by_the_fleet_and_learns_it_from_the_clients_table():
    from adaptive_lb.config import Config
    from tests.unit.test_snapshot import example_policy

    sent: list[tuple[str, Any]] = []
    clients_at: list[float] = []

    def read_load(order: Any) -> None:
        if order.stats.load.begin(order.next_ns):
            sent.append(("read", order.key.address))
            order.stats.load.answer(pools(), clock.now_ns(), 0.001, 4.0)

    def read_clients(order: ClientsOrder) -> None:
        sent.append((order.query, order.key.address))
        clients_at.append((clock.now_ns() - start) / S)
        policy.fleet.answer(order.query, 100, clock.now_ns())

    with example_policy() as (policy, clock):
        policy.reload(Config(health=HealthConfig(probe_interval=0.0)))
        policy.use_prober(lambda order: None, read_load=read_load, read_clients=read_clients)
        start = clock.now_ns()
        for _ in range(round(60 / REFRESH_S)):
            clock.advance_s(REFRESH_S)
            policy.refresh_health()
        clients_reads = [s for s in sent if s[0] != "read"]
        reads = Counter(address for kind, address in sent if kind == "read")
        print(f"\nreads in 60 s by a client of a fleet of 100 (learned): {dict(reads)}")
        assert clients_reads[0][0] == CASSANDRA_CLIENTS_QUERY  # its release is unknown
        # Within 5 s, then once a minute +/- 25 %.
        assert clients_at[0] <= FIRST_CLIENTS_READ_S + REFRESH_S and len(clients_at) <= 2
        assert all(45 <= b - a <= 75 for a, b in itertools.pairwise(clients_at)), clients_at
        assert clients_reads[0][1].startswith("127.1.")  # a local node
        assert (policy.fleet_size, policy.fleet_size_source) == (100, "system_views.clients")
        snapshot = policy.snapshot()
        assert (snapshot.fleet_size, snapshot.fleet_size_source) == (100, "system_views.clients")
        # 100 clients, 20 a second: one read per 5.6-8.3 s (not 2 s) once the size is known,
        # so at most 5 s of the lone pace (3) plus 55 s / 5.6 s.
        # 127.1.0.1 has a request in flight that never answers: stalled, ERRORING from
        # 2 s on, its slots are its probes' (none here) and it is not read.
        stalled, healthy = (
            policy.stats.get(v.host)
            for v in sorted(policy.topology.local, key=lambda v: v.host.address)
        )
        assert stalled.health_state is HealthState.ERRORING
        assert healthy.health_state is not HealthState.ERRORING
        assert set(reads) <= {"127.1.0.1", "127.1.0.2"}  # local hosts only
        assert reads["127.1.0.1"] <= 4  # at 2 s +/- 25 % until the size is known (5 s)
        assert 6 <= reads["127.1.0.2"] <= 3 + 10, reads
        assert clock.now_ns() - start == 60 * S


def test_the_sender_reads_the_clients_table_keeping_only_the_count():
    session, policy = StandInSession(), StandInPolicy()
    prober = Prober(session, [policy]).start()
    policy.read_clients(ClientsOrder("h", CASSANDRA_CLIENTS_QUERY))
    statement, timeout, target = session.calls[0]
    assert isinstance(statement, OwnStatement)  # request tracking leaves it alone
    assert statement.query_string == CASSANDRA_CLIENTS_QUERY
    assert (timeout, target) == (0.5, "h")
    callback, _, args, _ = session.future.callbacks
    callback([{"address": "10.1.2.3", "port": 5, "username": "app"}] * 3, *args)
    assert policy.fleet.learned == 3 and policy.fleet.source == "system_views.clients"
    assert "10.1.2.3" not in repr([getattr(policy.fleet, s, None) for s in FleetEstimate.__slots__])
    for exc, absent in ((OperationTimedOut("late"), False), (InvalidRequest("no table"), True)):
        policy.read_clients(ClientsOrder("h", SCYLLA_CLIENTS_QUERY))
        _, errback, _, eargs = session.future.callbacks
        errback(exc, *eargs)
        assert (SCYLLA_CLIENTS_QUERY in policy.fleet._absent) is absent
    assert policy.fleet.failed == 1
    prober.close()
    assert policy.read_clients is None and policy.errors == []


def test_a_thin_client_without_a_slot_still_detects_a_stall_and_takes_the_node_back():
    """Probes never spend a user request, and in a fleet of 1,000 a client may have no probe
    slot for a node when it stalls: its hung request makes the host ERRORING (stalled) after
    ``stall_timeout`` all the same, and the late answer of that request brings it back."""
    from tests.unit.test_probes import Cluster

    pacer = FleetPacer(random.Random(5))
    pacer.resize(own_period_s(1000, 20.0), 0)  # 56 s between slots

    class Paced(Cluster):
        def may_send(self, order: Any) -> bool:
            # As the policy's refresh: a probe goes out only with a slot.
            return pacer.take(order.key, self.clock.now_ns(), self.config.probe_interval)

    cluster = Paced()
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")  # hangs
    cluster.traffic(2.4, ("h1", "h2"))
    health = cluster.model.health("h0")
    assert health is not None and health.state is HealthState.ERRORING
    assert health.cause == "stall" and cluster.probes_to("h0") == 0  # no slot: no probe
    cluster.stalled.discard("h0")
    cluster.stats["h0"].on_success(2600 * 1_000_000)  # the node is back: the late answer
    cluster.traffic(1.2, ("h1", "h2"))
    assert cluster.state("h0") in (HealthState.WARMING, HealthState.HEALTHY)
    assert cluster.probes_to("h0") == 0


def test_a_first_clients_read_that_times_out_is_tried_at_once_on_another_node():
    """A node stalled at the fleet's start must not leave the clients that asked it at a
    lone client's pace: they ask another node at once, and only after FIRST_READ_TRIES
    failed reads is the size taken as unknown for good."""
    from adaptive_lb.stats.fleet import FIRST_READ_TRIES

    config = FleetConfig()
    estimate = FleetEstimate(random.Random(4))
    hosts: list[tuple[Any, bool | None]] = [("a", True), ("b", True), ("c", True)]
    first = next(t for t in range(0, 6 * S, S // 10) if estimate.order(t, hosts, config, 3))
    assert estimate.starting(first) and not estimate.starting(FIRST_CLIENTS_READ_S * S)
    asked = estimate._asked
    for tries in range(1, FIRST_READ_TRIES + 1):
        assert not estimate.settled()
        estimate.fail(CASSANDRA_CLIENTS_QUERY, absent=False)
        order = estimate.order(first + tries * S // 2, hosts, config, 3)  # at once
        assert order is not None and order.key != asked
        asked = order.key
    estimate.fail(CASSANDRA_CLIENTS_QUERY, absent=False)
    assert estimate.settled() and estimate.size(config) == config.default_size


def test_a_client_whose_probe_waits_for_a_slot_judges_by_what_it_would_have_shown():
    """In a fleet of 1,000 a client rarely has a probe slot for a node: a probe it wants
    waits, and the health model judges by what that probe would have shown. Its request
    hangs: after the probe's suspicion and its timeout with no answer, ERRORING (stalled),
    sooner than ``stall_timeout``. The requests the stall caught answered (the driver's
    count of the host's connections drained): back, HEALTHY, without a probe. A host that
    answers meanwhile is not judged stalled."""
    from tests.unit.test_probes import Cluster

    pacer = FleetPacer(random.Random(5))
    pacer.resize(own_period_s(1000, 20.0), 0)  # 56 s between slots
    pool = {"h0": 0, "h1": 0, "h2": 0}

    class Paced(Cluster):
        def refresh(self) -> None:
            self.held: set[str] = set()
            super().refresh()
            for key, stats in self.stats.items():
                if key not in self.held:
                    stats.probes.release()

        def may_send(self, order: Any) -> bool:
            # As the policy's refresh: a probe goes out only with a slot, else it waits.
            if pacer.take(order.key, self.clock.now_ns(), self.config.probe_interval):
                return True
            order.stats.probes.hold(self.clock.now_ns(), order.reason, order.stats.in_flight)
            self.held.add(order.key)
            return False

    cluster = Paced()
    for key, stats in cluster.stats.items():
        stats.read_in_flight_from(lambda key=key: pool[key])  # the driver's count
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")  # hangs
    pool["h0"] += 1
    start = cluster.clock.now_ns()
    while cluster.state("h0") is not HealthState.ERRORING:
        cluster.traffic(0.2, ("h1", "h2"))
    health = cluster.model.health("h0")
    assert health is not None and health.cause == "stall" and "budget" in health.reason
    waited = (cluster.clock.now_ns() - start) / S
    assert waited <= 1.4 < cluster.config.stall_timeout, waited  # 0.5 s suspicion + 0.5 s
    cluster.traffic(1.0, ("h1", "h2"))
    cluster.time_out("h0")  # the client's timeout: the driver still counts it (orphaned)
    cluster.traffic(2.0, ("h1", "h2"))
    assert cluster.state("h0") is HealthState.ERRORING  # still caught in the stall
    cluster.stalled.discard("h0")
    pool["h0"] = 0  # the node is back: the late answer frees the stream
    cluster.traffic(0.2, ("h1", "h2"))
    health = cluster.model.health("h0")
    assert health is not None and health.state is HealthState.HEALTHY, health
    assert "slot" in health.reason and cluster.probes_to("h0") == 0
    # A host that answers while its probe waits is not stalled (busy, at most).
    cluster.stalled.add("h1")
    cluster.request("h1")
    pool["h1"] += 1
    cluster.traffic(0.8, ("h0", "h2"))  # suspected, its probe waiting
    assert cluster.stats["h1"].probes.held_ns is not None
    cluster.stalled.discard("h1")
    cluster.request("h1")  # answers another request
    cluster.traffic(0.6, ("h0", "h2"))
    assert cluster.state("h1") is not HealthState.ERRORING
    assert cluster.sent == []


@pytest.mark.parametrize("paced", [False, True])
def test_where_probes_wait_for_the_budget_a_host_unanswered_for_a_refresh_is_avoided(paced):
    """A thin client in a large fleet has no probe for a host whose request hangs: it
    places the host at SUSPECTED_PENALTY from the next refresh until an answer (no
    verdict), so that it does not send it a second and a third request meanwhile."""
    from adaptive_lb.health.probes import SUSPECTED_PENALTY
    from tests.unit.test_probes import Cluster

    cluster = Cluster()
    cluster.model.paced = paced
    cluster.traffic(1.0)
    cluster.stalled.add("h0")
    cluster.request("h0")  # hangs
    cluster.traffic(0.4, ("h1", "h2"))
    stats = cluster.stats["h0"]
    assert stats.health_state is HealthState.HEALTHY
    assert stats.health_penalty == (SUSPECTED_PENALTY if paced else 1.0)
    assert cluster.stats["h1"].health_penalty == 1.0
    cluster.stalled.discard("h0")
    stats.on_success(400 * 1_000_000)  # it answers
    cluster.traffic(0.2, ("h1", "h2"))
    assert stats.health_penalty == 1.0


def test_slots_drawn_on_learning_the_fleet_come_after_its_first_clients_reads():
    """A client that learns at 1 s that it is one of 1,000 draws its slots from the end of
    the fleet's first clients-table reads (5 s), not on top of them."""
    pacer = FleetPacer(random.Random(6))
    pacer.resize(own_period_s(1, 20.0), 0)
    assert pacer.take("h", 0, 1.0)  # a lone client's pace: not binding
    pacer.resize(own_period_s(1000, 20.0), 1 * S, round(FIRST_CLIENTS_READ_S * S))
    assert not any(pacer.take("h", t, 1.0) for t in range(S, 5 * S, S // 5))
    assert any(pacer.take("h", t, 1.0) for t in range(5 * S, 62 * S, S // 5))
    # Its clients-table read of a node (at 0.5 s, the size then unknown) is its request of
    # the first period to that node: its first slot comes a period after it.
    pacer = FleetPacer(random.Random(7))
    pacer.resize(own_period_s(1, 20.0), 0)
    pacer.spend("g", S // 2)
    pacer.resize(own_period_s(1000, 20.0), 1 * S, round(FIRST_CLIENTS_READ_S * S))
    period = own_period_s(1000, 20.0)
    assert not any(pacer.take("g", t, 1.0) for t in range(S, round((0.5 + period) * S), S // 5))
    pacer.take("h", 200 * S, 1.0)
    pacer.spend("h", 201 * S)  # and in the steady state
    assert not any(pacer.take("h", t, 1.0) for t in range(201 * S, 201 * S + round(period * S), S))
