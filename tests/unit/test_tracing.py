"""Decision tracing with the real OpenTelemetry SDK and its in-memory exporter."""

from __future__ import annotations

import logging

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import PrivacyConfig, TracingConfig
from adaptive_lb.plan.planner import PlanRecord
from adaptive_lb.telemetry.tracing import (
    CANDIDATES_ATTRIBUTE,
    EVENT_NAME,
    SPAN_NAME,
    DecisionTracer,
    build_decision,
    current_recording_span,
)
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

SENTINEL_KEY = b"\xde\xad\xbe\xef\x5e\x71\x11\x01"
SENTINEL_TEXT = "SELECT secret_column_7731 FROM ks.t WHERE k = 'bound-value-4242'"


@pytest.fixture
def tracing():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def make_policy(provider, **tracing_kwargs):
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [3]}, real_cluster=False, seed=4)
    config = Config(tracing=TracingConfig(**tracing_kwargs))
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, tracer_provider=provider
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return model, policy


def candidates_of(attributes) -> list[dict[str, str]]:
    """``adaptive_lb.candidates`` read back as a reader of the trace would: one dict per
    candidate, ``address`` and ``port`` beside the ``key=value`` fields."""
    parsed = []
    for entry in attributes[CANDIDATES_ATTRIBUTE].split("; "):
        where, *fields = entry.split(" ")
        address, port = where.rsplit(":", 1)
        parsed.append({"address": address, "port": port, **dict(f.split("=") for f in fields)})
    return parsed


def statement(key=None):
    key = key if key is not None else murmur3_routing_keys(1, seed=9)[0]
    return SimpleStatement(SENTINEL_TEXT, routing_key=key, keyspace="ks")


def test_decision_event_on_the_enclosing_span(tracing):
    provider, exporter = tracing
    model, policy = make_policy(provider)
    tracer = provider.get_tracer("app")
    stmt = statement()
    with tracer.start_as_current_span("request"):
        plan = list(policy.make_query_plan("ks", stmt))
        list(policy.make_query_plan("ks", stmt))  # second: a cache hit
    (span,) = exporter.get_finished_spans()
    events = [e for e in span.events if e.name == EVENT_NAME]
    assert len(events) == 2
    first, second = (dict(e.attributes) for e in events)
    replicas = [
        h for h in model.metadata.get_replicas("ks", stmt.routing_key) if h.datacenter == "dc1"
    ]
    assert first["server.address"] == plan[0].address
    assert first["server.port"] == 9042
    assert first["db.namespace"] == "ks"
    assert first["db.system.name"] == "cassandra"
    assert first["adaptive_lb.position"] == "replica"
    assert first["adaptive_lb.replica_count"] == len(replicas) == 3
    assert first["adaptive_lb.replica_cache.hit"] is False
    assert second["adaptive_lb.replica_cache.hit"] is True
    assert "adaptive_lb.plan_length" not in first  # the plan stays lazy: its length unknown
    assert first["adaptive_lb.config_hash"] == policy.config_hash
    candidates = candidates_of(first)
    addresses = [c["address"] for c in candidates]
    assert addresses[0] == plan[0].address and len(addresses) == 6
    assert set(addresses[:3]) == {h.address for h in replicas}
    assert [c["replica"] for c in candidates] == ["True"] * 3 + ["False"] * 3
    assert {c["port"] for c in candidates} == {"9042"}
    scores = [float(c["score"]) for c in candidates]
    assert scores == sorted(scores)
    for candidate in candidates:  # the score and what it is made of
        host = next(h for h in model.hosts if h.address == candidate["address"])
        assert int(candidate["in_flight"]) == policy.stats.get(host).in_flight == 0
        assert candidate["health"] == "healthy"
        penalty = float(candidate["penalty"])
        assert penalty == (1.0 if candidate["replica"] == "True" else 12.0)
        assert float(candidate["score"]) == (int(candidate["in_flight"]) + 1) * penalty


def test_child_span_mode(tracing):
    provider, exporter = tracing
    _, policy = make_policy(provider, mode="span")
    with provider.get_tracer("app").start_as_current_span("request"):
        list(policy.make_query_plan("ks", statement()))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    child = spans[SPAN_NAME]
    assert child.parent.span_id == spans["request"].context.span_id
    assert child.attributes["adaptive_lb.position"] == "replica"


def test_nothing_recorded_without_a_span_or_when_off(tracing):
    provider, exporter = tracing
    _, policy = make_policy(provider)
    assert current_recording_span() is None
    list(policy.make_query_plan("ks", statement()))
    assert exporter.get_finished_spans() == ()
    _, off = make_policy(provider, enabled=False)
    with provider.get_tracer("app").start_as_current_span("request"):
        list(off.make_query_plan("ks", statement()))
    (span,) = exporter.get_finished_spans()
    assert span.events == ()
    assert off.internal_errors == 0


def test_ratio_samples_decisions(tracing):
    provider, exporter = tracing
    _, policy = make_policy(provider, ratio=0.25)
    with provider.get_tracer("app").start_as_current_span("request"):
        for _ in range(4000):
            list(policy.make_query_plan("ks", statement()))
    (_span,) = exporter.get_finished_spans()
    # The SDK keeps at most 128 events per span by default: count what the tracer recorded.
    assert 800 < policy.decisions.tracer.recorded < 1200


def test_health_transition_shows_on_the_next_decision_touching_the_host(tracing):
    provider, exporter = tracing
    model, policy = make_policy(provider)
    stmt = statement()
    replica = next(
        h for h in model.metadata.get_replicas("ks", stmt.routing_key) if h.datacenter == "dc1"
    )
    policy.health.mark_up(replica, policy.stats.get(replica))
    with provider.get_tracer("app").start_as_current_span("request"):
        list(policy.make_query_plan("ks", stmt))
        list(policy.make_query_plan("ks", stmt))
    (span,) = exporter.get_finished_spans()
    transitions = [e for e in span.events if e.name == "adaptive_lb.health_transition"]
    assert len(transitions) == 1  # reported once
    attributes = transitions[0].attributes
    assert attributes["server.address"] == replica.address
    assert attributes["adaptive_lb.health.to"] == "warming"
    decision = next(e for e in span.events if e.name == EVENT_NAME).attributes
    (entry,) = [c for c in candidates_of(decision) if c["address"] == replica.address]
    assert entry["health"] == "warming"


def test_privacy_by_default(tracing, caplog):
    provider, exporter = tracing
    caplog.set_level(logging.DEBUG)
    _, policy = make_policy(provider)
    stmt = statement(SENTINEL_KEY)
    with provider.get_tracer("app").start_as_current_span("request"):
        list(policy.make_query_plan("ks", stmt))
    (span,) = exporter.get_finished_spans()
    dumped = repr([dict(e.attributes) for e in span.events]) + repr(dict(span.attributes or {}))
    dumped += "\n".join(r.getMessage() for r in caplog.records)
    for secret in (
        SENTINEL_KEY.hex(),
        repr(SENTINEL_KEY),
        "secret_column_7731",
        "bound-value-4242",
    ):
        assert secret not in dumped
    # Allowed explicitly, the routing key is recorded (hex).
    _model, allowed = make_policy(provider)
    allowed.reload(Config(privacy=PrivacyConfig(routing_keys=True)))
    with provider.get_tracer("app").start_as_current_span("request2"):
        list(allowed.make_query_plan("ks", stmt))
    span = next(s for s in exporter.get_finished_spans() if s.name == "request2")
    assert span.events[0].attributes["adaptive_lb.routing_key"] == SENTINEL_KEY.hex()


def test_traced_plan_is_the_same_permutation(tracing):
    provider, _ = tracing
    model, policy = make_policy(provider)
    with provider.get_tracer("app").start_as_current_span("request"):
        for key in murmur3_routing_keys(200, seed=12):
            plan = list(policy.make_query_plan("ks", statement(key)))
            assert sorted(plan) == sorted(model.hosts_by_dc["dc1"])
    assert policy.internal_errors == 0


def test_child_span_mode_without_an_enclosing_span_records_nothing(tracing):
    provider, exporter = tracing
    _, policy = make_policy(provider, mode="span")
    plan = list(policy.make_query_plan("ks", statement()))
    assert len(plan) == 6
    assert exporter.get_finished_spans() == ()
    assert policy.internal_errors == 0


def test_child_span_mode_carries_health_transitions_and_keeps_privacy(tracing):
    provider, exporter = tracing
    model, policy = make_policy(provider, mode="span")
    stmt = statement(SENTINEL_KEY)
    replica = next(
        h for h in model.metadata.get_replicas("ks", stmt.routing_key) if h.datacenter == "dc1"
    )
    policy.health.mark_up(replica, policy.stats.get(replica))
    with provider.get_tracer("app").start_as_current_span("request"):
        list(policy.make_query_plan("ks", stmt))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    child = spans[SPAN_NAME]
    assert [e.name for e in child.events] == ["adaptive_lb.health_transition"]
    assert child.events[0].attributes["server.address"] == replica.address
    assert spans["request"].events == ()  # nothing on the parent in span mode
    dumped = repr(dict(child.attributes)) + repr([dict(e.attributes) for e in child.events])
    dumped += repr(dict(spans["request"].attributes or {})) + child.name
    for secret in (SENTINEL_KEY.hex(), repr(SENTINEL_KEY), "secret_column_7731", "bound-value"):
        assert secret not in dumped


def test_attributes_off_records_the_chosen_host_only(tracing):
    provider, exporter = tracing
    _, policy = make_policy(provider, attributes=False)
    with provider.get_tracer("app").start_as_current_span("request"):
        plan = list(policy.make_query_plan("ks", statement()))
    (span,) = exporter.get_finished_spans()
    (event,) = span.events
    assert event.attributes["server.address"] == plan[0].address
    assert not [k for k in event.attributes if k.startswith(CANDIDATES_ATTRIBUTE)]


def test_ratio_zero_records_nothing(tracing):
    provider, exporter = tracing
    _, policy = make_policy(provider, ratio=0.0)
    with provider.get_tracer("app").start_as_current_span("request"):
        for _ in range(200):
            list(policy.make_query_plan("ks", statement()))
    (span,) = exporter.get_finished_spans()
    assert span.events == ()
    assert policy.decisions.tracer.recorded == 0


def test_non_recording_span_records_nothing():
    """A span the sampler dropped is not recording: no decision, no cost beyond the check."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider(sampler=ALWAYS_OFF)
    _, policy = make_policy(provider)
    with provider.get_tracer("app").start_as_current_span("request") as span:
        assert not span.is_recording()
        list(policy.make_query_plan("ks", statement()))
    assert policy.decisions.tracer.recorded == 0


def test_decision_positions_match_the_counters():
    """Every recorded decision's position is one of DECISION_POSITIONS and was counted in
    decisions_by_position: one vocabulary for traces and metrics."""
    from adaptive_lb.runtime.policy import DECISION_POSITIONS

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [2]}, real_cluster=False, seed=4)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), tracer_provider=provider
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    tracer = provider.get_tracer("test")
    keys = murmur3_routing_keys(20, seed=2)
    statements = [SimpleStatement("q", routing_key=k, keyspace="ks") for k in keys]
    statements.append(SimpleStatement("SELECT now() FROM system.local"))  # no routing key
    for statement in statements:
        with tracer.start_as_current_span("request"):
            list(policy.make_query_plan("ks", statement))
    for host in model.hosts:  # nothing local is up: the child's plan decides
        if host.datacenter == "dc1":
            policy.on_down(host)
    with tracer.start_as_current_span("request"):
        list(policy.make_query_plan("ks", statements[0]))
    recorded = [
        dict(event.attributes)["adaptive_lb.position"]
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == "adaptive_lb.decision"
    ]
    assert set(recorded) <= set(DECISION_POSITIONS)
    assert {"replica", "local", "child"} <= set(recorded)
    counted = {p: n for p, n in policy.decisions_by_position.items() if n}
    assert counted == {p: recorded.count(p) for p in set(recorded)}


def decision_attributes(record: PlanRecord) -> dict[str, object]:
    """The span attributes of the decision made of ``record`` alone (no host yielded),
    with the default tracing and privacy settings."""
    decision, _ = build_decision(
        record,
        [],
        "ks",
        None,
        non_replica_penalty=12.0,
        config_hash="h",
        routing_keys=False,
        pop_transition=lambda host: None,
    )
    return DecisionTracer(TracingConfig(), PrivacyConfig()).attributes(decision)


def test_flags_are_recorded_when_raised():
    attributes = decision_attributes
    plain = attributes(PlanRecord(position="replica"))
    assert not {"adaptive_lb.lwt", "adaptive_lb.fallback", "adaptive_lb.enabled"} & set(plain)
    raised = attributes(PlanRecord(lwt=True, fallback=True, enabled=False))
    assert raised["adaptive_lb.lwt"] is True
    assert raised["adaptive_lb.fallback"] is True and raised["adaptive_lb.position"] == "fallback"
    assert raised["adaptive_lb.enabled"] is False
