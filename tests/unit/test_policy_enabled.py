"""``policy.enabled: false``: every plan is exactly the child's plan, while tracking, health,
metrics and decision events carry on; flipped by a reload (issue 25, item 4). Real driver
Host / Metadata / TokenMap objects and policies, a real prometheus_client registry and the
OpenTelemetry SDK with in-memory exporters."""

from __future__ import annotations

import logging
import os
import random
import time

import pytest
from cassandra import ConsistencyLevel
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    HostFilterPolicy,
    RoundRobinPolicy,
    TokenAwarePolicy,
)
from cassandra.query import SimpleStatement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import ConfigWatcher, PolicyConfig, parse_config
from adaptive_lb.exporters import AdaptiveLbCollector, register_otel_metrics
from adaptive_lb.telemetry.tracing import EVENT_NAME
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

try:
    from cassandra.policies import RackAwareRoundRobinPolicy
except ImportError:  # cassandra-driver
    RackAwareRoundRobinPolicy = None

OFF = Config(policy=PolicyConfig(enabled=False))
MS = 1_000_000


def children() -> dict[str, object]:
    """Name -> a factory of a fresh child policy (two identical instances are compared)."""
    made = {
        "token_aware_dc": lambda: TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        "token_aware_unshuffled": lambda: TokenAwarePolicy(
            DCAwareRoundRobinPolicy("dc1", used_hosts_per_remote_dc=1), shuffle_replicas=False
        ),
        "dc_aware_remote": lambda: DCAwareRoundRobinPolicy("dc1", used_hosts_per_remote_dc=2),
        "round_robin": RoundRobinPolicy,
        "host_filter": lambda: HostFilterPolicy(
            TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
            lambda host: not host.address.endswith(".2"),
        ),
    }
    if RackAwareRoundRobinPolicy is not None:
        made["token_aware_rack"] = lambda: TokenAwarePolicy(
            RackAwareRoundRobinPolicy("dc1", "r1", used_hosts_per_remote_dc=1)
        )
    return made


@pytest.fixture
def model():
    """3 DCs of 3 racks x 2 nodes, RF 3 per DC, the driver's real objects."""
    built = build_cluster({"dc1": [2, 2, 2], "dc2": [2, 2, 2], "dc3": [2, 2, 2]}, seed=7)
    yield built
    built.shutdown()


def pair(model, make_child, config=OFF):
    """The policy wrapping one child, and an identical child of its own, both populated
    with the same random state (DCAwareRoundRobinPolicy starts at a random position)."""
    hosts = list(model.metadata.all_hosts())
    random.seed(1234)
    policy = AdaptiveLoadBalancingPolicy(make_child(), config)
    policy.populate(model.cluster, hosts)
    random.seed(1234)
    bare = make_child()
    bare.populate(model.cluster, hosts)
    return policy, bare


def statements(count: int = 300) -> list[tuple[str | None, object]]:
    """(working keyspace, statement): routing keys at several consistencies, lightweight
    transactions (SERIAL / LOCAL_SERIAL), statements without a routing key or a keyspace,
    and no statement at all."""
    made: list[tuple[str | None, object]] = []
    keys = murmur3_routing_keys(count, seed=21)
    levels = (
        ConsistencyLevel.LOCAL_ONE,
        ConsistencyLevel.LOCAL_QUORUM,
        ConsistencyLevel.LOCAL_SERIAL,
        ConsistencyLevel.SERIAL,
    )
    for i, key in enumerate(keys):
        made.append(
            (
                "ks",
                SimpleStatement(
                    "SELECT v FROM ks.t WHERE k = %s",
                    routing_key=key,
                    keyspace="ks",
                    consistency_level=levels[i % len(levels)],
                ),
            )
        )
        if i % 10 == 0:
            made.append(("ks", SimpleStatement("SELECT now() FROM system.local")))
            made.append((None, SimpleStatement("q", routing_key=key)))
            made.append((None, None))
    return made


def same_plan(plan, expected) -> bool:
    return [id(host) for host in plan] == [id(host) for host in expected]


def both(model, bare, make, keyspace, query, seed: int) -> tuple[list, list]:
    """``(make(keyspace, query), the bare child's plan)`` for the same call, each from the
    same random state (TokenAwarePolicy shuffles replicas with the global ``random``) and
    the same token map: scylla-driver's TokenAwarePolicy shuffles the token map's own
    replica list in place, so that list is put back between the two calls."""
    shared = None
    ks = (getattr(query, "keyspace", None) or keyspace) if query is not None else None
    if ks is not None and query.routing_key is not None:
        shared = model.metadata.get_replicas(ks, query.routing_key)
    saved = list(shared) if shared is not None else None
    random.seed(seed)
    expected = list(bare.make_query_plan(keyspace, query))
    if saved is not None:
        shared[:] = saved
    random.seed(seed)
    return list(make(keyspace, query)), expected


def load_the_replicas(policy, model) -> None:
    """Distinct loads and one SLOW host: an ordering policy would reorder nearly every plan."""
    rng = random.Random(5)
    hosts = list(model.metadata.all_hosts())
    for host, load in zip(hosts, rng.sample(range(0, 400), len(hosts)), strict=True):
        policy.stats.get(host).in_flight = load
    policy.stats.get(hosts[0]).health_penalty = 64.0


@pytest.mark.parametrize("name", sorted(children()))
def test_disabled_plans_are_the_childs_plans_exactly(model, name):
    """Element by element, each plan the same as the child alone makes for the same call,
    under a load the ordering would act on: every plan, every statement kind."""
    policy, bare = pair(model, children()[name])
    load_the_replicas(policy, model)
    made = statements()
    for i, (keyspace, query) in enumerate(made):
        plan, expected = both(model, bare, policy.make_query_plan, keyspace, query, i)
        assert same_plan(plan, expected), (i, query, plan, expected)
    assert policy.decisions_by_position["child"] == len(made)
    assert sum(policy.decisions_by_position.values()) == len(made)
    assert policy.internal_errors == 0


def test_disabled_returns_the_childs_own_iterator_and_calls_it_once(model):
    calls = []

    class Counting(DCAwareRoundRobinPolicy):
        def make_query_plan(self, working_keyspace=None, query=None):
            plan = super().make_query_plan(working_keyspace, query)
            calls.append(plan)
            return plan

    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(Counting("dc1")), OFF)
    policy.populate(model.cluster, list(model.metadata.all_hosts()))
    plain = AdaptiveLoadBalancingPolicy(Counting("dc1"), OFF)
    plain.populate(model.cluster, list(model.metadata.all_hosts()))
    for key in murmur3_routing_keys(50, seed=3):
        query = SimpleStatement("q", routing_key=key, keyspace="ks")
        list(policy.make_query_plan("ks", query))  # TokenAwarePolicy's: not looked through
        assert plain.make_query_plan("ks", query) is calls[-1]  # the child's iterator itself
    assert len(calls) == 100


def test_reenabling_restores_the_ordering(model):
    policy, bare = pair(model, children()["token_aware_dc"])
    load_the_replicas(policy, model)
    made = [(k, q) for k, q in statements(200) if getattr(q, "routing_key", None) is not None]
    for i, (keyspace, query) in enumerate(made):
        assert same_plan(*both(model, bare, policy.make_query_plan, keyspace, query, i))
    policy.reload(Config())
    differ = 0
    for i, (keyspace, query) in enumerate(made):
        plan, expected = both(model, bare, policy.make_query_plan, keyspace, query, i)
        assert sorted(map(id, plan)) == sorted(map(id, expected))  # the same hosts, reordered
        differ += not same_plan(plan, expected)
    assert differ > len(made) // 2
    ordered = policy.decisions_by_position
    assert ordered["child"] == len(made)  # the disabled plans
    assert sum(ordered.values()) - ordered["child"] == len(made)  # then ordered again
    assert ordered["replica"] + ordered["non_replica"] > len(made) // 2
    assert policy.internal_errors == 0


def test_tracking_and_health_carry_on_while_disabled(model):
    """The off switch changes the order only: attempts are counted, health is judged and
    the snapshot keeps moving, so the operator can compare."""
    policy, _ = pair(model, children()["token_aware_dc"])
    dc1 = sorted(model.hosts_by_dc["dc1"], key=lambda h: h.address)
    slow = dc1[0]
    for host in dc1:
        stats = policy.attempt_stats(host)  # where request tracking counts an attempt
        latency = 60 * MS if host is slow else MS
        for _ in range(100):
            stats.on_send()
            stats.on_success(latency)
    policy.attempt_stats(dc1[1]).on_send()  # one in flight
    policy.refresh_health()
    snapshot = policy.snapshot()
    assert snapshot.enabled is False
    assert snapshot.health_refreshes == 1
    assert snapshot.host(slow.address).health_state == "slow"
    assert snapshot.host(slow.address).requests_total == 100
    assert snapshot.host(dc1[1].address).in_flight == 1
    # ...and the slow host is still first in the child's plans, as often as the child says.
    firsts = [next(iter(policy.make_query_plan("ks", q))) for _, q in statements(200) if q]
    assert firsts.count(slow) > 10


def test_flipped_by_a_real_yaml_file_reload(model, tmp_path, caplog):
    """A ConfigWatcher applying an atomically rewritten file to policy.reload turns the
    ordering off and on again, one INFO line each time, no restart."""
    caplog.set_level(logging.INFO, logger="adaptive_lb")
    policy, bare = pair(model, children()["token_aware_dc"], Config())
    load_the_replicas(policy, model)
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("policy: {sample_size: 6}\n")

    def rewrite(text: str) -> None:
        staged = tmp_path / "staged.yaml"
        staged.write_text(text)
        os.replace(staged, path)

    def wait_for(enabled: bool) -> None:
        deadline = time.monotonic() + 10
        while policy.config.policy.enabled is not enabled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert policy.config.policy.enabled is enabled

    with ConfigWatcher(path, policy.reload, interval=0.01):
        rewrite("policy:\n  sample_size: 6\n  enabled: false\n")
        wait_for(False)
        for i, (keyspace, query) in enumerate(statements(100)):
            assert same_plan(*both(model, bare, policy.make_query_plan, keyspace, query, i))
        rewrite("policy:\n  sample_size: 6\n  enabled: true\n")
        wait_for(True)
    lines = [r for r in caplog.records if "policy.enabled" in r.getMessage()]
    assert [(r.levelno, r.name) for r in lines] == [(logging.INFO, "adaptive_lb.policy")] * 2
    assert "is now false" in lines[0].getMessage() and "is now true" in lines[1].getMessage()
    # A reload that leaves it alone says nothing.
    policy.reload(parse_config("policy: {enabled: true, sample_size: 5}"))
    assert len([r for r in caplog.records if "policy.enabled" in r.getMessage()]) == 2
    assert policy.config_reloads == {"success": 3, "failure": 0}


def test_snapshot_metrics_and_decision_events_show_the_state(model):
    policy, bare = pair(model, children()["token_aware_dc"], Config())
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(policy, names=["main"]))
    reader = InMemoryMetricReader()
    register_otel_metrics(policy, MeterProvider(metric_readers=[reader]))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    policy.decisions.use_tracer_provider(provider)
    tracer = provider.get_tracer("app")

    def otel_enabled() -> int:
        data = reader.get_metrics_data()
        (point,) = [
            p
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "adaptive_lb.policy.enabled"
            for p in m.data.data_points
        ]
        assert dict(point.attributes) == {"policy": "0"}
        return point.value

    def decision(keyspace, query, seed=None) -> tuple[list, dict]:
        exporter.clear()
        with tracer.start_as_current_span("request"):
            if seed is not None:  # the SDK draws span ids from the global random
                random.seed(seed)
            plan = list(policy.make_query_plan(keyspace, query))
        (span,) = exporter.get_finished_spans()
        (event,) = [e for e in span.events if e.name == EVENT_NAME]
        return plan, dict(event.attributes)

    query = SimpleStatement("q", routing_key=murmur3_routing_keys(1, seed=8)[0], keyspace="ks")
    assert policy.snapshot().enabled is True
    assert registry.get_sample_value("adaptive_lb_policy_enabled", {"policy": "main"}) == 1
    assert otel_enabled() == 1
    _, attributes = decision("ks", query)
    assert "adaptive_lb.enabled" not in attributes  # recorded only while off
    assert attributes["adaptive_lb.position"] == "replica"
    list(bare.make_query_plan("ks", query))  # the children's round robins stay in step

    policy.reload(OFF)
    assert policy.snapshot().enabled is False
    assert policy.snapshot().to_dict()["enabled"] is False
    assert registry.get_sample_value("adaptive_lb_policy_enabled", {"policy": "main"}) == 0
    assert otel_enabled() == 0
    recorded: dict = {}

    def traced(keyspace, query):
        plan, recorded["attributes"] = decision(keyspace, query, recorded["seed"])
        return plan

    for i, (keyspace, stmt) in enumerate(statements(40)):
        recorded["seed"] = i
        plan, expected = both(model, bare, traced, keyspace, stmt, i)
        attributes = recorded["attributes"]
        assert same_plan(plan, expected)  # a recorded plan is the child's too
        assert attributes["adaptive_lb.enabled"] is False
        assert attributes["adaptive_lb.position"] == "child"
        assert attributes["adaptive_lb.config_hash"] == OFF.hash
        if expected:
            assert attributes["server.address"] == expected[0].address
        assert "adaptive_lb.candidates" not in attributes
        assert "adaptive_lb.replica_cache.hit" not in attributes  # no lookup was made
        if keyspace is not None:
            assert attributes["db.namespace"] == "ks"

    policy.reload(Config())
    assert registry.get_sample_value("adaptive_lb_policy_enabled", {"policy": "main"}) == 1
    assert otel_enabled() == 1
    assert "adaptive_lb.enabled" not in decision("ks", query)[1]
    assert policy.internal_errors == 0
