"""Bad input everywhere: each case is a defined behaviour, asserted.

The policy under test is ``AdaptiveLoadBalancingPolicy(TokenAwarePolicy(
DCAwareRoundRobinPolicy("dc1")))`` populated over a real built cluster (a real, never
connected ``Cluster`` whose ``Metadata`` holds real ``Host`` objects and a real Murmur3
``TokenMap``). Where the driver has a say, the reference is the stock child
``TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))`` populated on the same cluster:

* if the stock plan yields for an input, ours must not raise, and must yield a permutation
  of the stock plan's hosts (compared by identity), each once;
* if the stock plan raises, ours may raise too (the same exception type: the child's own
  error, re-raised from the fallback) or yield hosts, each once.

A user's own child policy is its own reference (its plan, each host once). Every counter
stays >= 0 whatever is thrown at tracking, and a Prometheus scrape of the abused policy
parses and has no negative sample.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from cassandra import OperationTimedOut
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    HostDistance,
    LoadBalancingPolicy,
    TokenAwarePolicy,
)
from cassandra.protocol import OverloadedErrorMessage, ResultMessage
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.exporters import AdaptiveLbCollector
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.stats.host import HostStats
from adaptive_lb.tools.sim.driver_topology import ClusterModel, build_cluster, murmur3_routing_keys
from tests.reliability.conftest import statement

LAYOUT = {"dc1": [2, 2, 2], "dc2": [2]}
"""6 local hosts in 3 racks, 2 remote ones: more than enough for every case."""
KEY = murmur3_routing_keys(1, seed=21)[0]
MS = 1_000_000


# ---------------------------------------------------------------- helpers


class UnhashableKey(bytes):
    """A routing key the driver hashes happily (a bytes subclass) but that cannot be a cache
    key: the stock plan yields, ours fails inside and must fall back to the child's plan."""

    __hash__ = None  # type: ignore[assignment]


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    """The real OTel SDK with an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def make_ours(
    model: ClusterModel | None, provider: Any = None, clock: Any = None
) -> AdaptiveLoadBalancingPolicy:
    """Our policy around the stock token-aware child, populated on ``model`` (if given)."""
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), tracer_provider=provider, clock=clock
    )
    if model is not None:
        policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def make_stock(model: ClusterModel | None) -> TokenAwarePolicy:
    """The stock child alone, populated on ``model`` (if given): the reference."""
    policy = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
    if model is not None:
        policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def outcome(policy: LoadBalancingPolicy, keyspace: Any, query: Any) -> list[Any] | Exception:
    """The plan as a list, or the exception that making or iterating it raised."""
    try:
        return list(policy.make_query_plan(keyspace, query))
    except Exception as exc:
        return exc


def identities(plan: list[Any]) -> list[int]:
    """The plan's hosts by identity, sorted (Host compares equal by endpoint only)."""
    return sorted(map(id, plan))


def assert_like_stock(
    ours: AdaptiveLoadBalancingPolicy, stock: LoadBalancingPolicy, keyspace: Any, query: Any
) -> list[Any] | Exception:
    """Check the contract for one input (see the module docstring); return our outcome."""
    expected = outcome(stock, keyspace, query)
    got = outcome(ours, keyspace, query)
    if isinstance(expected, Exception):
        if isinstance(got, Exception):
            assert type(got) is type(expected), (got, expected)
        else:
            assert len(set(map(id, got))) == len(got)
    else:
        assert not isinstance(got, Exception), f"stock yields {len(expected)}, ours raised {got!r}"
        assert len(set(map(id, got))) == len(got), "a host yielded twice"
        assert identities(got) == identities(expected)
    return got


def traced(provider: TracerProvider, fn: Callable[[], Any]) -> Any:
    """``fn()`` under a recording parent span (so the policy records its decision)."""
    with provider.get_tracer("test").start_as_current_span("request"):
        return fn()


def rewind(clock: ManualClock, ns: int) -> None:
    """Move ``clock`` back by ``ns`` ns. ``ManualClock.set`` refuses to; a broken or
    virtualised clock source does not, so the internals are poked."""
    clock._now_ns = max(0, clock.now_ns() - ns)


STATS_COUNTERS = (
    "in_flight",
    "requests_total",
    "errors_total",
    "timeouts_total",
    "abandons_total",
    "unsent_total",
    "underflows",
)


def assert_stats_sane(stats: HostStats) -> None:
    """Every counter of ``stats`` >= 0; penalties finite and >= 0; the window's
    counts and percentiles >= 0."""
    for name in STATS_COUNTERS:
        assert getattr(stats, name) >= 0, name
    for value in (stats.health_penalty, stats.rack_penalty):
        assert math.isfinite(value) and value >= 0
    window = stats.window_stats((0.0, 50.0, 100.0))
    for field in attrs.fields(type(window)):
        value = getattr(window, field.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert math.isfinite(value) and value >= 0, field.name
    for value in window.latency.values():
        assert value is None or value >= 0


def numbers_of(obj: Any) -> Iterator[tuple[str, float]]:
    """Every int/float field of an attrs object (bools and None left out)."""
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield field.name, value


def scrape(policy: AdaptiveLoadBalancingPolicy) -> dict[str, Any]:
    """A Prometheus scrape of a registry holding ``AdaptiveLbCollector(policy)``, parsed by
    prometheus_client's own parser: ``{family name: family}``."""
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(policy))
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def assert_no_negative_numbers(policy: AdaptiveLoadBalancingPolicy) -> None:
    """Every HostStats counter, every snapshot number, every policy counter and every
    sample of a Prometheus scrape is finite and >= 0, and the scrape carries the policy."""
    for _key, stats in policy.stats.items():
        assert_stats_sane(stats)
    snapshot = policy.snapshot()
    for name, value in numbers_of(snapshot):
        assert value >= 0, name
    for host in snapshot.hosts:
        for name, value in numbers_of(host):
            assert math.isfinite(value) and value >= 0, (host.address, name)
    counters = {
        **policy.internal_errors_by_stage,
        **policy.decisions_by_position,
        **policy.config_reloads,
        "untracked": policy.untracked_attempts,
        "unknown_events": policy.unknown_host_events,
    }
    assert all(value >= 0 for value in counters.values()), counters
    families = scrape(policy)
    for family in families.values():
        for sample in family.samples:
            assert math.isfinite(sample.value) and sample.value >= 0, sample
    in_flight = families["adaptive_lb_host_in_flight"].samples
    assert len(in_flight) == len(snapshot.hosts)
    assert policy.internal_errors_by_stage["snapshot"] == 0


@pytest.fixture
def model() -> Iterator[ClusterModel]:
    """A real never-connected Cluster over LAYOUT (shut down after the test)."""
    built = build_cluster(LAYOUT, seed=11)
    yield built
    built.shutdown()


# ---------------------------------------------------------------- statements


# name -> (working keyspace, statement factory, whether ours falls back to the child)
STATEMENTS: dict[str, tuple[str | None, Callable[[], Any], bool]] = {
    "no routing key": ("ks", lambda: statement(None), False),
    "no keyspace anywhere": (None, lambda: statement(KEY, keyspace=None), False),
    "working keyspace only": ("ks", lambda: statement(KEY, keyspace=None), False),
    "unknown keyspace": ("nope", lambda: statement(KEY, keyspace="nope"), False),
    "unknown working keyspace": ("nope", lambda: statement(KEY, keyspace=None), False),
    "routing key of 0 bytes": ("ks", lambda: statement(b""), False),
    "routing key of 64 KiB": ("ks", lambda: statement(b"\xab" * 65536), False),
    "routing key str": ("ks", lambda: statement("a-text-key"), False),
    "unhashable bytes routing key": ("ks", lambda: statement(UnhashableKey(KEY)), True),
    "query None": ("ks", lambda: None, False),
    "query None, no keyspace": (None, lambda: None, False),
}


@pytest.mark.parametrize("case", list(STATEMENTS))
def test_odd_statements_plan_like_the_stock_child(model, case):
    """Guarantee: for statements without routing key or keyspace, with an unknown keyspace,
    an empty, huge or str routing key, or no statement at all, ours never raises where the
    stock child does not, and yields a permutation of its hosts -- traced or not. Only an
    input that breaks our own code (an unhashable key) counts an internal error, and that
    plan is still the child's."""
    keyspace, make, falls_back = STATEMENTS[case]
    provider, exporter = tracing()
    ours, stock = make_ours(model, provider), make_stock(model)
    for _ in range(3):
        plan = assert_like_stock(ours, stock, keyspace, make())
        assert plan, "the stock child yields the live local hosts"
        traced(provider, lambda: assert_like_stock(ours, stock, keyspace, make()))
    expected = 6 if falls_back else 0
    assert ours.internal_errors == ours.internal_errors_by_stage["plan"] == expected
    assert ours.decisions_by_position["fallback"] == expected
    decisions = [e for s in exporter.get_finished_spans() for e in s.events]
    assert len(decisions) == 3  # one decision per traced plan, none lost to an error
    assert_no_negative_numbers(ours)


@pytest.mark.parametrize(
    "key",
    [12345, bytearray(KEY), memoryview(KEY)],
    ids=["int", "bytearray", "memoryview"],
)
def test_routing_key_of_a_wrong_type_raises_as_the_stock_child_does(model, key):
    """Guarantee: a routing key the driver itself cannot hash (int, bytearray,
    memoryview) makes the stock plan raise TypeError; ours raises the same error, from the
    child's plan it falls back to (the error is the child's, not ours), and counts the
    fallback. Nothing is yielded twice, no counter goes wrong."""
    provider, _exporter = tracing()
    ours, stock = make_ours(model, provider), make_stock(model)
    query = statement(key)
    assert isinstance(outcome(stock, "ks", query), TypeError)
    assert isinstance(assert_like_stock(ours, stock, "ks", query), TypeError)
    assert isinstance(traced(provider, lambda: outcome(ours, "ks", query)), TypeError)
    assert ours.internal_errors_by_stage["plan"] == 2
    assert ours.decisions_by_position["fallback"] == 2
    assert_no_negative_numbers(ours)


def test_token_map_absent(model):
    """Guarantee: with no token map (``metadata.token_map = None``, as before the driver
    built one) ours routes by load alone and never raises, where stock raises or not
    depending on the driver (cassandra-driver yields, scylla-driver raises)."""
    provider, _exporter = tracing()
    ours, stock = make_ours(model, provider), make_stock(model)
    model.metadata.token_map = None
    for keyspace, make, _falls_back in STATEMENTS.values():
        plan = assert_like_stock(ours, stock, keyspace, make())
        assert not isinstance(plan, Exception), plan
        assert {id(h) for h in plan} == {id(h) for h in model.hosts_by_dc["dc1"]}
        traced(provider, lambda k=keyspace, m=make: assert_like_stock(ours, stock, k, m()))
    assert ours.internal_errors == 0
    assert_no_negative_numbers(ours)


def test_plans_before_populate_yield_nothing():
    """Guarantee: before ``populate`` the stock child yields nothing for an unrouted plan
    and raises (AttributeError, no metadata yet) for a routed one; ours yields nothing and
    never raises, for every input (even keys of a wrong type), counts nothing as an
    internal error, tracks nothing, and its snapshot and scrape are empty but valid."""
    provider, _exporter = tracing()
    ours, stock = make_ours(None, provider), make_stock(None)
    inputs = [(k, make()) for k, make, _ in STATEMENTS.values()]
    inputs += [("ks", statement(bad)) for bad in (12345, bytearray(KEY), memoryview(KEY))]
    for keyspace, query in inputs:
        assert_like_stock(ours, stock, keyspace, query)
        assert outcome(ours, keyspace, query) == []
        assert traced(provider, lambda k=keyspace, q=query: outcome(ours, k, q)) == []
    assert outcome(stock, "ks", None) == []
    assert isinstance(outcome(stock, "ks", statement(KEY)), AttributeError)
    stranger = build_cluster({"dc1": [1]}, seed=5, real_cluster=False).hosts[0]
    attempts = Attempts.of(ours)
    attempts.sent(stranger)
    attempts.answered(stranger, ResultMessage(2))
    attempts.ended(None)
    assert ours.untracked_attempts == 1 and stranger not in ours.stats
    assert ours.internal_errors == 0
    assert ours.snapshot().hosts == ()
    assert_no_negative_numbers(ours)


# ---------------------------------------------------------------- a user's own child


class UserPolicy(LoadBalancingPolicy):
    """A user's own LoadBalancingPolicy (not a stock one: ours cannot predict its plan, so
    it materialises it). Every host is LOCAL; ``plan(hosts)`` makes each plan, and
    ``calls`` counts ``make_query_plan`` calls."""

    def __init__(self, plan: Callable[[list[Any]], Any]) -> None:
        super().__init__()
        self.plan = plan
        self.hosts: list[Any] = []
        self.calls = 0

    def populate(self, cluster, hosts):
        self.hosts = list(hosts)

    def distance(self, host):
        return HostDistance.LOCAL

    def make_query_plan(self, working_keyspace=None, query=None):
        self.calls += 1
        return self.plan(self.hosts)

    def on_up(self, host):
        pass

    def on_down(self, host):
        pass

    def on_add(self, host):
        pass

    def on_remove(self, host):
        pass


def foreign_hosts(count: int) -> list[Any]:
    """Real Hosts of another model, on endpoints no host of LAYOUT has."""
    other = build_cluster({"dc1": [1]}, seed=17, real_cluster=False)
    rng = random.Random(3)
    return [other.new_host("dc1", "r1", f"10.99.0.{i + 1}", 1, rng) for i in range(count)]


def distinct(plan: list[Any]) -> list[Any]:
    """``plan`` with each host (by identity) kept at its first occurrence."""
    seen: set[int] = set()
    return [h for h in plan if not (id(h) in seen or seen.add(id(h)))]


STRANGERS = foreign_hosts(2)

# name -> the user's plan from the hosts it was populated with
USER_PLANS: dict[str, Callable[[list[Any]], Any]] = {
    "yields nothing": lambda hosts: iter(()),
    "yields duplicates": lambda hosts: iter(hosts + hosts[::-1] + hosts[:1]),
    "yields unknown hosts": lambda hosts: iter([STRANGERS[0], *hosts[:3], STRANGERS[1]]),
    "yields only unknown hosts": lambda hosts: iter(STRANGERS),
}


@pytest.mark.parametrize("case", list(USER_PLANS))
def test_user_child_plans_are_followed(model, case):
    """Guarantee: whatever a user's child yields -- nothing, the same host several times,
    hosts never given to ``populate`` -- ours yields exactly the distinct hosts of the
    child's plan, each once, never raises, calls the child once per plan, counts no
    internal error, and creates no statistics for hosts it was never told about (an
    attempt on one is counted as untracked)."""
    child = UserPolicy(USER_PLANS[case])
    provider, _exporter = tracing()
    ours = AdaptiveLoadBalancingPolicy(child, tracer_provider=provider)
    ours.populate(model.cluster, model.metadata.all_hosts())
    expected = distinct(list(child.make_query_plan()))
    queries = [None, statement(KEY), statement(None), statement(KEY, keyspace="nope")]
    for query in queries:
        for make_plan in (
            lambda q=query: outcome(ours, "ks", q),
            lambda q=query: traced(provider, lambda: outcome(ours, "ks", q)),
        ):
            calls = child.calls
            plan = make_plan()
            assert not isinstance(plan, Exception), plan
            assert len({id(h) for h in plan}) == len(plan), "a host yielded twice"
            assert identities(plan) == identities(expected)
            assert child.calls == calls + 1
    assert ours.internal_errors == 0
    for stranger in STRANGERS:
        assert stranger not in ours.stats and ours.topology.view_of(stranger) is None
        attempts = Attempts.of(ours)
        attempts.sent(stranger)
        attempts.answered(stranger, ResultMessage(2))
    assert ours.untracked_attempts == len(STRANGERS)
    assert_no_negative_numbers(ours)


@pytest.mark.parametrize(
    "case",
    [pytest.param(case) for case in USER_PLANS],
)
def test_token_aware_user_child_plans_are_the_childs_host_set(model, case):
    """Guarantee (module docstring): "The hosts yielded are exactly the child's plan, each
    once". The child here is ``TokenAwarePolicy(user's policy)``: its plan is the live
    replicas the user's policy calls LOCAL, then the user's plan. Ours must yield that
    same host set, each once, whatever the user's plan yields."""
    user = UserPolicy(USER_PLANS[case])
    child = TokenAwarePolicy(user)
    ours = AdaptiveLoadBalancingPolicy(child)
    ours.populate(model.cluster, model.metadata.all_hosts())
    for key in murmur3_routing_keys(5, seed=8):
        query = statement(key)
        expected = distinct(list(child.make_query_plan("ks", query)))
        plan = outcome(ours, "ks", query)
        assert not isinstance(plan, Exception), plan
        assert len({id(h) for h in plan}) == len(plan), "a host yielded twice"
        assert identities(plan) == identities(expected)
    assert ours.internal_errors == 0


def eager_raise(hosts: list[Any]) -> Any:
    """A user's plan that raises as soon as it is asked for."""
    raise RuntimeError("the user's policy is broken")


def lazy_raise(hosts: list[Any]) -> Iterator[Any]:
    """A user's plan that yields one host, then raises."""
    yield hosts[0]
    raise RuntimeError("the user's policy broke halfway")


@pytest.mark.parametrize("make_plan", [eager_raise, lazy_raise], ids=["eager", "lazy"])
def test_user_child_raising_propagates_its_own_error(model, make_plan):
    """Guarantee (observed and pinned): a child whose ``make_query_plan`` raises is the
    child's own error, not ours: the plan raises the child's exception unchanged, as the
    child alone would (before that, a lazy child's first host at most), and nothing is
    left counted in flight. Counters stay valid."""
    child = UserPolicy(make_plan)
    ours = AdaptiveLoadBalancingPolicy(child)
    ours.populate(model.cluster, model.metadata.all_hosts())
    for query in (None, statement(KEY)):
        yielded: list[Any] = []
        with pytest.raises(RuntimeError, match="the user's policy"):
            yielded.extend(ours.make_query_plan("ks", query))
        # The lazy child's first host may come first (ours may also materialise the
        # plan before yielding, and so yield nothing): never another host, never twice.
        first = model.metadata.all_hosts()[0] if make_plan is lazy_raise else None
        assert [id(h) for h in yielded] in ([], [id(first)])
    assert all(ours.stats.get(h).in_flight == 0 for h in model.hosts)
    assert_no_negative_numbers(ours)


@pytest.mark.parametrize("make_plan", [eager_raise, lazy_raise], ids=["eager", "lazy"])
def test_user_child_raising_is_called_once_and_not_counted_as_ours(model, make_plan):
    """Guarantee (module docstring): "The child's make_query_plan is called at most once
    per plan", and ``internal_errors`` counts exceptions of adaptive-lb, not the child's:
    a raising child is called once per plan and its error is not logged as "internal error
    in plan; the child's plan is used instead" (the child's plan raised)."""
    child = UserPolicy(make_plan)
    ours = AdaptiveLoadBalancingPolicy(child)
    ours.populate(model.cluster, model.metadata.all_hosts())
    for query in (None, statement(KEY)):
        calls = child.calls
        with pytest.raises(RuntimeError, match="the user's policy"):
            list(ours.make_query_plan("ks", query))
        assert child.calls == calls + 1
    assert ours.internal_errors == 0


# ---------------------------------------------------------------- tracking


LATENCIES = (0, -1, -(10**18), 1, 10**18)


def test_host_stats_take_any_latency():
    """Guarantee: latencies of 0, negative, and 10**18 ns through on_success / on_error
    (fast and slow) / on_timeout are clamped into the histogram's range: every counter
    exact, in_flight back to 0, no underflow, percentiles within [latency_min,
    latency_max]."""
    config = TrackingConfig()
    stats = HostStats(config, ManualClock(0))
    for latency in LATENCIES:
        for event in (
            stats.on_success,
            stats.on_timeout,
            lambda n: stats.on_error(n, fast=True),
            lambda n: stats.on_error(n, fast=False),
        ):
            stats.on_send()
            event(latency)
    n = len(LATENCIES)
    assert (stats.in_flight, stats.underflows) == (0, 0)
    assert (stats.requests_total, stats.errors_total, stats.timeouts_total) == (4 * n, 2 * n, n)
    window = stats.window_stats((0.0, 50.0, 100.0))
    assert (window.successes, window.errors, window.timeouts) == (n, 2 * n, n)
    assert window.samples == 3 * n  # fast errors are no latency sample
    for value in window.latency.values():
        assert config.latency_min * 0.9 <= value <= config.latency_max * 1.1
    assert_stats_sane(stats)


def test_releases_without_sends_are_underflows_never_negative():
    """Guarantee: a release finding nothing in flight (on_success, on_error, on_timeout,
    on_abandon, on_unsent with no on_send) is counted in ``underflows``; in_flight never
    goes below 0, and the next real attempt is counted normally."""
    stats = HostStats(TrackingConfig(), ManualClock(0))
    stats.on_success(MS)
    stats.on_error(MS)
    stats.on_error(MS, fast=False)
    stats.on_timeout(MS)
    stats.on_abandon()
    stats.on_unsent()
    assert stats.in_flight == 0 and stats.underflows == 6
    stats.on_send()
    assert stats.in_flight == 1
    stats.on_success(MS)
    assert stats.in_flight == 0 and stats.underflows == 6
    assert_stats_sane(stats)


def test_attempts_with_a_clock_going_backwards_and_jumping_ahead(model):
    """Guarantee: request tracking (``Attempts``) with a clock moved backwards between
    send and answer (a negative latency) or jumped 10**18 ns ahead records clamped
    latencies, releases every attempt exactly once, and leaves every number >= 0 -- also
    through a health refresh, a snapshot and a scrape."""
    clock = ManualClock(10**12)
    ours = make_ours(model, clock=clock)
    hosts = model.hosts_by_dc["dc1"]
    for step, host in enumerate(hosts):
        attempts = Attempts.of(ours)
        attempts.sent(host)
        if step % 3 == 0:
            rewind(clock, 5 * 10**9)
        elif step % 3 == 1:
            clock.advance(10**18)
        attempts.answered(
            host, ResultMessage(2) if step % 2 else OverloadedErrorMessage(1, "", None)
        )
        attempts.sent(host)  # a retry on the same host, then the clock goes back again
        rewind(clock, 10**9)
        attempts.ended(OperationTimedOut({}, host))
        ours.refresh_health()
    for host in hosts:
        stats = ours.stats.get(host)
        assert (stats.in_flight, stats.underflows) == (0, 0)
        assert stats.requests_total == 2 and stats.timeouts_total == 1
    assert ours.internal_errors == 0
    assert_no_negative_numbers(ours)


def test_attempts_released_twice_or_never_sent_change_nothing(model):
    """Guarantee: ``Attempts.answered`` twice for the same host, ``ended`` twice, and
    ``not_sent`` / ``answered`` without ``sent`` release at most once: in_flight never
    negative, no underflow, one outcome per attempt."""
    ours = make_ours(model)
    first, second = model.hosts_by_dc["dc1"][:2]
    attempts = Attempts.of(ours)
    attempts.not_sent(first)  # never sent
    attempts.answered(second, ResultMessage(2))  # never sent
    attempts.ended(None)  # nothing outstanding
    attempts.sent(first)
    attempts.sent(second)
    attempts.answered(first, ResultMessage(2))
    attempts.answered(first, ResultMessage(2))  # twice
    attempts.not_sent(first)  # after its answer
    attempts.ended(None)  # second: abandoned
    attempts.ended(None)  # twice
    attempts.ended(OperationTimedOut({}, second))  # and once more, as a timeout
    attempts.answered(second, ResultMessage(2))  # late answer of the abandoned one
    one, two = ours.stats.get(first), ours.stats.get(second)
    assert (one.in_flight, one.requests_total, one.unsent_total) == (0, 1, 0)
    assert (two.in_flight, two.requests_total, two.timeouts_total) == (0, 0, 0)
    assert two.abandons_total == 1
    assert one.underflows == two.underflows == 0
    assert_no_negative_numbers(ours)


# ---------------------------------------------------------------- topology events


def plans_agree(ours: AdaptiveLoadBalancingPolicy, stock: TokenAwarePolicy) -> None:
    """Ours and stock yield the same host set (by identity) for a routed statement, an
    unrouted one and no statement (several routing keys, to hit every replica set)."""
    queries: list[Any] = [None, statement(None)]
    queries += [statement(key) for key in murmur3_routing_keys(8, seed=4)]
    for query in queries:
        assert_like_stock(ours, stock, "ks", query)


def deliver(
    ours: AdaptiveLoadBalancingPolicy, stock: TokenAwarePolicy, event: str, host: Any
) -> None:
    """Deliver one topology event as the driver does (``Cluster.on_down`` marks the Host
    down before telling the policies, ``on_up`` / ``on_add`` mark it up) to ours and to the
    stock reference. The reference does not get an ``on_up`` for a host ours does not know:
    ours deliberately keeps that from its child (a late up must not bring a removed host
    back into the stock child's plans)."""
    forwarded = not (event == "on_up" and ours.topology.view_of(host) is None)
    if event == "on_down":
        host.set_down()
    elif event in ("on_up", "on_add"):
        host.set_up()
    getattr(ours, event)(host)
    if forwarded:
        getattr(stock, event)(host)


def test_events_for_unknown_hosts_match_the_stock_child(model):
    """Guarantee: on_down / on_up / on_add / on_remove (twice) of a host ours was never
    given (another model's, on an endpoint of its own) never raise; plans stay a
    permutation of the stock child's after each event; on_up / on_down of a host unknown
    are counted in ``unknown_host_events``, create no state, and an unknown host's on_up
    never puts it in a plan; once removed, it leaves nothing behind."""
    ours, stock = make_ours(model), make_stock(model)
    stranger = foreign_hosts(1)[0]
    for event in ("on_down", "on_up", "on_up"):
        deliver(ours, stock, event, stranger)
        plans_agree(ours, stock)
    assert ours.unknown_host_events == 3 and stranger not in ours.stats
    assert all(stranger is not h for h in ours.make_query_plan("ks", None))
    for event in ("on_add", "on_remove", "on_remove", "on_down", "on_up"):
        deliver(ours, stock, event, stranger)
        plans_agree(ours, stock)
    assert ours.unknown_host_events == 5
    assert stranger not in ours.stats and ours.topology.view_of(stranger) is None
    assert all(stranger is not h for h in ours.make_query_plan("ks", None))
    assert ours.internal_errors == 0
    assert_no_negative_numbers(ours)


def test_events_for_known_hosts_repeated_match_the_stock_child(model):
    """Guarantee: on_add of a host already known (twice), on_up of a live host, on_down
    twice, and on_remove twice (after the driver dropped it from its metadata) never raise,
    keep plans a permutation of the stock child's, and free the host's statistics; a late
    on_up after the removal does not bring it back."""
    ours, stock = make_ours(model), make_stock(model)
    host = model.hosts_by_dc["dc1"][0]
    for event in ("on_add", "on_add", "on_up", "on_down", "on_down", "on_up"):
        deliver(ours, stock, event, host)
        plans_agree(ours, stock)
    ours.stats.get(host).on_send()  # an attempt in flight when it goes
    model.remove_host(host)  # the driver updates its metadata, then tells the policies
    model.rebuild_token_map()
    for event in ("on_remove", "on_remove", "on_up", "on_down"):
        deliver(ours, stock, event, host)
        plans_agree(ours, stock)
    assert host not in ours.stats and ours.topology.view_of(host) is None
    assert all(host is not h for h in ours.make_query_plan("ks", None))
    assert ours.internal_errors == 0
    assert_no_negative_numbers(ours)


# ---------------------------------------------------------------- all of it at once


def test_every_number_stays_valid_after_all_of_it(model):
    """Guarantee: after every kind of bad input above on one traced policy -- odd
    statements, wrong-type keys, fallbacks, extreme and backwards latencies, releases
    without sends, duplicate releases, unknown-host events, repeated removals -- every
    HostStats counter and every snapshot number is >= 0, ``internal_errors`` counts
    exactly the plans that fell back, and the Prometheus scrape parses with no negative
    sample and reports the same counts."""
    clock = ManualClock(10**12)
    provider, _exporter = tracing()
    ours, stock = make_ours(model, provider, clock), make_stock(model)
    for keyspace, make, _falls_back in STATEMENTS.values():
        assert_like_stock(ours, stock, keyspace, make())
        traced(provider, lambda k=keyspace, m=make: assert_like_stock(ours, stock, k, m()))
    for bad in (12345, bytearray(KEY), memoryview(KEY)):
        # The stock plan raises TypeError; ours re-raises it from the fallback, or (the
        # memoryview, equal to a cached bytes key) answers from the replica cache.
        assert_like_stock(ours, stock, "ks", statement(bad))
    hosts = model.hosts_by_dc["dc1"]
    for i, host in enumerate(hosts):
        stats = ours.stats.get(host)
        stats.on_success(MS)  # no send: an underflow
        attempts = Attempts.of(ours)
        attempts.sent(host)
        if i % 2:
            rewind(clock, 10**9)
        else:
            clock.advance(10**18)
        attempts.answered(host, ResultMessage(2))
        attempts.answered(host, ResultMessage(2))
        attempts.ended(OperationTimedOut({}, host))
        for latency in LATENCIES:
            stats.on_send()
            stats.on_timeout(latency)
    stranger = foreign_hosts(1)[0]
    for event in ("on_up", "on_down", "on_remove", "on_add", "on_add", "on_remove", "on_remove"):
        deliver(ours, stock, event, stranger)
    ours.refresh_health()
    fallbacks = ours.decisions_by_position["fallback"]
    assert fallbacks >= sum(case[2] for case in STATEMENTS.values()) * 2 + 2
    assert ours.internal_errors == ours.internal_errors_by_stage["plan"] == fallbacks
    assert_no_negative_numbers(ours)
    families = scrape(ours)
    errors = {
        s.labels["stage"]: s.value
        for s in families["adaptive_lb_internal_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors["plan"] == fallbacks and sum(errors.values()) == fallbacks
    requests = {
        s.labels["address"]: s.value
        for s in families["adaptive_lb_host_requests"].samples
        if s.name.endswith("_total")
    }
    assert requests == {
        h.address: ours.stats.get(h).requests_total for h in model.metadata.all_hosts()
    }
    assert all(ours.stats.get(h).underflows == 1 for h in hosts)
