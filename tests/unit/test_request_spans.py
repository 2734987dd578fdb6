"""Request spans and ``db.client.operation.duration`` with the real OpenTelemetry SDK, on
the attempts objects the driver hooks call (the driver end to end is in
tests/integration/test_attach_simulacron.py)."""

from __future__ import annotations

import random
import time
import types

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import OverloadedErrorMessage, QueryMessage, ResultMessage
from cassandra.query import BatchStatement, SimpleStatement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import Config, MetricsConfig, PrivacyConfig, TracingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.runtime._driver import FUTURE_POLICY_ATTRIBUTE
from adaptive_lb.runtime.request_spans import (
    ATTEMPT_EVENT,
    DURATION_METRIC,
    RequestTelemetry,
    operation_name,
)
from adaptive_lb.telemetry.tracing import EVENT_NAME
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

MS = 1_000_000
TEXT = "SELECT v FROM ks.t WHERE k = 42"


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


# Not named ``setup``: pytest 8.0 (the dev extra's floor) calls a module-level function of
# that name before the module's tests, as nose did (pytest 8.1 dropped that).
def build(provider, config=None, *, root_spans=True, meter_provider=None):
    clock = ManualClock(0)
    model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
    config = config or Config()
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        config,
        clock=clock,
        tracer_provider=provider,
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    telemetry = RequestTelemetry(
        config, tracer_provider=provider, meter_provider=meter_provider, root_spans=root_spans
    )
    policy.decisions.send_to_requests(telemetry.spans, without_parent=telemetry.root_spans)
    return model, policy, telemetry, clock


def future_for(statement, keyspace="ks"):
    return types.SimpleNamespace(
        query=statement,
        session=types.SimpleNamespace(keyspace=keyspace),
        message=QueryMessage(TEXT, ConsistencyLevel.LOCAL_QUORUM, fetch_size=500),
    )


def events_of(span):
    return [dict(e.attributes) for e in span.events if e.name == ATTEMPT_EVENT]


def test_a_retried_request_is_one_span_with_two_attempts(traced):
    provider, exporter = traced
    _model, policy, telemetry, clock = build(provider)
    statement = SimpleStatement(TEXT, keyspace="ks")
    plan = list(policy.make_query_plan("ks", statement))
    attempts = telemetry.observe(future_for(statement), policy)
    first, second = plan[0], plan[1]
    attempts.sent(first)
    clock.advance(2 * MS)
    attempts.answered(first, OverloadedErrorMessage(0x1001, "busy", None))
    attempts.sent(second)
    clock.advance(3 * MS)
    attempts.answered(second, ResultMessage(2))
    assert exporter.get_finished_spans() == ()  # not ended before the final result
    attempts.ended(None)
    (span,) = exporter.get_finished_spans()
    assert span.name == "SELECT ks" and span.kind.name == "CLIENT"
    attributes = span.attributes
    assert attributes["db.system.name"] == "cassandra"
    assert attributes["db.namespace"] == "ks"
    assert attributes["db.operation.name"] == "SELECT"
    assert attributes["cassandra.consistency.level"] == "local_quorum"
    assert attributes["cassandra.page.size"] == 500
    assert attributes["cassandra.query.idempotent"] is False
    assert attributes["server.address"] == str(second.address)
    assert attributes["cassandra.coordinator.dc"] == "dc1"
    assert "cassandra.speculative_execution.count" not in attributes  # none: "not set"
    assert "error.type" not in attributes and "db.query.text" not in attributes
    one, two = events_of(span)
    assert (one["server.address"], one["adaptive_lb.attempt.outcome"]) == (
        str(first.address),
        "error",
    )
    assert one["db.response.status_code"] == "4097"
    assert one["adaptive_lb.attempt.duration"] == pytest.approx(0.002)
    assert (two["adaptive_lb.attempt.kind"], two["adaptive_lb.attempt.outcome"]) == (
        "retry",
        "success",
    )
    # The plan's decision, made before the request existed, is the request span's own:
    # the chosen host and why, every candidate, no separate event.
    # The chosen host leads the candidates (adaptive_lb.chosen would repeat it).
    assert attributes["adaptive_lb.candidates"].startswith(f"{first.address}:")
    assert " health=" in attributes["adaptive_lb.candidates"]
    assert "adaptive_lb.chosen" not in attributes
    assert attributes["adaptive_lb.position"] == "local"
    assert [e.name for e in span.events] == [ATTEMPT_EVENT, ATTEMPT_EVENT]
    assert policy.stats.get(first).in_flight == policy.stats.get(second).in_flight == 0


def test_a_speculative_execution_and_a_client_timeout(traced):
    provider, exporter = traced
    model, policy, telemetry, clock = build(provider)
    statement = SimpleStatement(TEXT, keyspace="ks", is_idempotent=True)
    attempts = telemetry.observe(future_for(statement), policy)
    attempts.sent(model.hosts[0])
    clock.advance(50 * MS)
    attempts.sent(model.hosts[1])  # raced while the first is outstanding
    clock.advance(250 * MS)
    attempts.ended(OperationTimedOut({}, model.hosts[1]))
    (span,) = exporter.get_finished_spans()
    assert span.attributes["cassandra.speculative_execution.count"] == 1
    assert span.attributes["cassandra.query.idempotent"] is True
    assert span.attributes["error.type"] == "cassandra.OperationTimedOut"
    assert span.status.status_code.name == "ERROR"
    outcomes = [
        (e["adaptive_lb.attempt.kind"], e["adaptive_lb.attempt.outcome"]) for e in events_of(span)
    ]
    assert sorted(outcomes) == [("first", "client_timeout"), ("speculative", "client_timeout")]
    assert all(policy.stats.get(h).in_flight == 0 for h in model.hosts[:2])


def test_nothing_recording_means_plain_tracking(traced):
    provider, _exporter = traced
    _model, policy, telemetry, _clock = build(provider, root_spans=False)
    statement = SimpleStatement(TEXT, keyspace="ks")
    assert telemetry.observe(future_for(statement), policy) is None
    list(policy.make_query_plan("ks", statement))
    assert policy.decisions.take(statement) is None  # no span current: no decision made


def test_under_an_application_span_the_request_is_its_child(traced):
    provider, exporter = traced
    model, policy, telemetry, _clock = build(provider, root_spans=False)
    statement = SimpleStatement(TEXT, keyspace="ks")
    with provider.get_tracer("app").start_as_current_span("handler") as parent:
        list(policy.make_query_plan("ks", statement))
        attempts = telemetry.observe(future_for(statement), policy)
    attempts.sent(model.hosts[0])
    attempts.answered(model.hosts[0], ResultMessage(2))
    attempts.ended(None)
    request = next(s for s in exporter.get_finished_spans() if s.name == "SELECT ks")
    assert request.parent.span_id == parent.get_span_context().span_id
    handler = next(s for s in exporter.get_finished_spans() if s.name == "handler")
    assert [e.name for e in handler.events] == []  # the decision went to the request span
    assert "adaptive_lb.position" not in handler.attributes
    assert request.attributes["adaptive_lb.position"] == "local"
    assert request.attributes["server.address"] == str(model.hosts[0].address)


@pytest.mark.parametrize("ratio", [1.0, 0.0])
def test_the_request_span_starts_where_the_plan_started(traced, ratio):
    """The plan is the driver's first step for a request (the request-init listener runs
    after it): the span covers it, and the decision is recorded on it."""
    provider, exporter = traced
    model, policy, telemetry, _clock = build(
        provider, Config(tracing=TracingConfig(ratio=ratio)), root_spans=False
    )
    statement = SimpleStatement(TEXT, keyspace="ks")
    with provider.get_tracer("app").start_as_current_span("handler"):
        before_plan = time.time_ns()
        list(policy.make_query_plan("ks", statement))
        planned = time.time_ns()
        attempts = telemetry.observe(future_for(statement), policy)
    attempts.sent(model.hosts[0])
    attempts.answered(model.hosts[0], ResultMessage(2))
    attempts.ended(None)
    request = next(s for s in exporter.get_finished_spans() if s.name == "SELECT ks")
    assert before_plan <= request.start_time <= planned
    assert [e.name for e in request.events if e.name == EVENT_NAME] == []
    # tracing.ratio 0 leaves the decision out, not the span's start
    assert ("adaptive_lb.position" in request.attributes) is bool(ratio)
    assert ("adaptive_lb.candidates" in request.attributes) is bool(ratio)


def test_a_plan_for_another_statement_does_not_start_the_span(traced):
    provider, exporter = traced
    _model, policy, telemetry, _clock = build(provider)
    other = SimpleStatement(TEXT, keyspace="ks")
    list(policy.make_query_plan("ks", other))
    planned = time.time_ns()
    statement = SimpleStatement(TEXT, keyspace="ks")
    attempts = telemetry.observe(future_for(statement), policy)
    attempts.ended(None)
    (span,) = exporter.get_finished_spans()
    assert span.start_time >= planned
    assert [e.name for e in span.events] == []  # nor does its decision go there


def test_later_pages_do_not_touch_the_ended_span(traced):
    provider, exporter = traced
    model, policy, telemetry, _clock = build(provider)
    statement = SimpleStatement(TEXT, keyspace="ks")
    attempts = telemetry.observe(future_for(statement), policy)
    for _page in range(3):  # the driver reuses the future for each page
        attempts.sent(model.hosts[0])
        attempts.answered(model.hosts[0], ResultMessage(2))
        attempts.ended(None)
    (span,) = exporter.get_finished_spans()
    assert events_of(span) == []  # answered at its first attempt: the span is that attempt
    assert span.attributes["server.address"] == str(model.hosts[0].address)
    assert policy.stats.get(model.hosts[0]).requests_total == 3


def test_privacy_statement_text_only_when_allowed(traced):
    provider, exporter = traced
    for allowed in (False, True):
        exporter.clear()
        config = Config(privacy=PrivacyConfig(statement_text=allowed))
        model, policy, telemetry, _clock = build(provider, config)
        statement = SimpleStatement(TEXT, keyspace="ks")
        attempts = telemetry.observe(future_for(statement), policy)
        attempts.sent(model.hosts[0])
        attempts.answered(model.hosts[0], ResultMessage(2))
        attempts.ended(None)
        (span,) = exporter.get_finished_spans()
        assert ("db.query.text" in span.attributes) is allowed
        assert "42" not in span.name


def test_request_spans_off_by_config(traced):
    provider, _exporter = traced
    config = Config(tracing=TracingConfig(request_spans=False))
    _model, policy, telemetry, _clock = build(provider, config)
    assert telemetry.observe(future_for(SimpleStatement(TEXT)), policy) is None


def test_the_duration_histogram_in_seconds():
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    config = Config(tracing=TracingConfig(enabled=False), metrics=MetricsConfig(otel_enabled=True))
    model, policy, telemetry, clock = build(None, config, meter_provider=meters)
    statement = SimpleStatement(TEXT, keyspace="ks")
    for outcome in (ResultMessage(2), None):
        attempts = telemetry.observe(future_for(statement), policy)
        attempts.sent(model.hosts[0])
        clock.advance(4 * MS)
        if outcome is not None:
            attempts.answered(model.hosts[0], outcome)
            attempts.ended(None)
        else:
            attempts.ended(OperationTimedOut({}, model.hosts[0]))
    (metric,) = [
        m
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == DURATION_METRIC
    ]
    assert metric.unit == "s"
    points = {p.attributes.get("error.type"): p for p in metric.data.data_points}
    assert set(points) == {None, "cassandra.OperationTimedOut"}
    ok = points[None]
    assert ok.count == 1 and ok.sum == pytest.approx(0.004)
    assert ok.attributes["db.system.name"] == "cassandra"
    assert ok.attributes["server.address"] == str(model.hosts[0].address)


def test_operation_names():
    assert operation_name(SimpleStatement("  select * from t")) == "SELECT"
    assert operation_name(SimpleStatement("BEGIN BATCH INSERT ...")) == "BATCH"
    assert operation_name(BatchStatement()) == "BATCH"
    assert operation_name(SimpleStatement("frobnicate the table")) is None
    assert operation_name(SimpleStatement("")) is None


def test_a_failing_span_never_reaches_the_driver_and_is_counted(traced, monkeypatch):
    provider, _exporter = traced
    model, policy, telemetry, _clock = build(provider)
    statement = SimpleStatement(TEXT, keyspace="ks")
    attempts = telemetry.observe(future_for(statement), policy)
    span = attempts.request.span

    def broken(*args, **kwargs):
        raise RuntimeError("exporter bug")

    monkeypatch.setattr(span, "add_event", broken)
    monkeypatch.setattr(span, "set_attributes", broken)
    host, other = model.hosts[0], model.hosts[1]
    attempts.sent(host)  # a retry: two attempt events, and the end's attributes
    attempts.answered(host, OverloadedErrorMessage(0x1001, "busy", None))
    attempts.sent(other)
    attempts.answered(other, ResultMessage(2))
    attempts.ended(None)
    stats = policy.stats.get(host)
    assert stats.in_flight == 0 and stats.requests_total == 1  # tracking unaffected
    assert policy.stats.get(other).requests_total == 1
    assert policy.internal_errors_by_stage["tracing"] == 2  # the events, then the end


def test_a_failing_observe_leaves_the_request_tracked(monkeypatch):
    from adaptive_lb.runtime.attempts import Attempts
    from adaptive_lb.runtime.tracking import RequestTracker
    from tests.unit.test_tracking import ListenerRegistry

    _model, policy, telemetry, _clock = build(None, root_spans=True)
    tracker = RequestTracker(ListenerRegistry())
    tracker.telemetry = telemetry

    def broken(future, policy):
        raise RuntimeError("bug")

    monkeypatch.setattr(telemetry, "observe", broken)
    hooked = []
    monkeypatch.setattr(
        "adaptive_lb.runtime.tracking.hook_future", lambda f, a, every_end=False: hooked.append(a)
    )
    future = future_for(SimpleStatement(TEXT, keyspace="ks"))
    setattr(future, FUTURE_POLICY_ATTRIBUTE, policy)  # where the driver keeps it
    tracker._on_request(future)
    (attempts,) = hooked
    assert type(attempts) is Attempts  # plain tracking
    assert policy.internal_errors_by_stage["tracing"] == 1


def test_candidates_ratio_zero_keeps_the_chosen_host_and_why(traced):
    """``tracing.candidates_ratio: 0``: every span still names its coordinator and the
    chosen host with its in-flight, health, penalty and score; no candidate list."""
    provider, exporter = traced
    _model, policy, telemetry, _clock = build(
        provider, Config(tracing=TracingConfig(candidates_ratio=0.0))
    )
    statement = SimpleStatement(TEXT, keyspace="ks")
    plan = list(policy.make_query_plan("ks", statement))
    attempts = telemetry.observe(future_for(statement), policy)
    attempts.sent(plan[0])
    attempts.answered(plan[0], ResultMessage(2))
    attempts.ended(None)
    (span,) = exporter.get_finished_spans()
    chosen = span.attributes["adaptive_lb.chosen"]
    assert chosen.startswith(f"{plan[0].address}:") and " score=" in chosen
    assert "adaptive_lb.candidates" not in span.attributes
    assert span.attributes["server.address"] == str(plan[0].address)
    assert span.attributes["adaptive_lb.position"] == "local"


def test_candidates_ratio_zero_keeps_the_plans_first_host_shortcut(traced):
    """A brief decision (no candidate list) is made by the plan an untraced request gets:
    the best replica first when nothing can beat it, with its reason; one load for both."""
    provider, exporter = traced
    _model, brief, telemetry, _clock = build(
        provider, Config(tracing=TracingConfig(candidates_ratio=0.0))
    )
    _model, untraced, _telemetry, _clock = build(None, Config(tracing=TracingConfig(enabled=False)))
    keys = murmur3_routing_keys(40, seed=5)
    for index, key in enumerate(keys):
        statement = SimpleStatement(TEXT, keyspace="ks", routing_key=key)
        random.seed(index)
        plan = list(brief.make_query_plan("ks", statement))
        random.seed(index)
        first = next(iter(untraced.make_query_plan("ks", statement)))
        assert plan[0].address == first.address
        attempts = telemetry.observe(future_for(statement), brief)
        attempts.ended(None)
    spans = exporter.get_finished_spans()
    assert len(spans) == len(keys)
    for span in spans:
        assert span.attributes["adaptive_lb.position"] == "replica"
        assert span.attributes["adaptive_lb.replica_count"] == 3
        chosen = span.attributes["adaptive_lb.chosen"]
        assert chosen.startswith(f"{span.attributes['server.address']}:")
        assert " in_flight=0 health=healthy penalty=1 score=1 replica=True" in chosen
        assert "adaptive_lb.candidates" not in span.attributes
    assert brief.decisions_by_position["replica"] == len(keys)


def prepared_statement():
    from cassandra.cqltypes import Int32Type
    from cassandra.protocol import ColumnMetadata
    from cassandra.query import PreparedStatement

    return PreparedStatement(
        column_metadata=[ColumnMetadata("ks", "t", "k", Int32Type)],
        query_id=b"\x01",
        routing_key_indexes=[0],
        query="SELECT v FROM ks.t WHERE k = ?",
        keyspace="ks",
        protocol_version=4,
        result_metadata=[],
        result_metadata_id=None,
    )


def test_a_prepared_statements_attributes_are_built_once(traced):
    """Requests of one prepared statement reuse its name and attributes while what they
    say is the same (consistency, page size, idempotence, keyspace)."""
    provider, exporter = traced
    _model, policy, telemetry, _clock = build(provider)
    prepared = prepared_statement()
    levels = (ConsistencyLevel.LOCAL_ONE, ConsistencyLevel.LOCAL_ONE, ConsistencyLevel.QUORUM)
    for key, level in enumerate(levels):
        bound = prepared.bind([key])
        future = future_for(bound)
        future.message = QueryMessage(TEXT, level, fetch_size=100)
        attempts = telemetry.observe(future, policy)
        attempts.ended(None)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["SELECT t"] * 3
    assert [s.attributes["cassandra.consistency.level"] for s in spans] == [
        "local_one",
        "local_one",
        "quorum",
    ]
    assert all(s.attributes["db.collection.name"] == "t" for s in spans)
    statements = telemetry._statements
    one = statements.describe(prepared.bind([1]), None, QueryMessage(TEXT, levels[0], 100))
    two = statements.describe(prepared.bind([2]), None, QueryMessage(TEXT, levels[0], 100))
    assert one is two  # built once


def test_a_request_left_out_of_the_sample_keeps_its_span(traced):
    """Request tracking's sampler left the request out (``tracked`` false): its span is
    whole (attempts, coordinator), and no host statistic counts it."""
    provider, exporter = traced
    _model, policy, telemetry, _clock = build(provider)
    statement = SimpleStatement(TEXT, keyspace="ks")
    plan = list(policy.make_query_plan("ks", statement))
    attempts = telemetry.observe(future_for(statement), policy)
    attempts.tracked = False
    first, second = plan[0], plan[1]
    attempts.sent(first)
    attempts.answered(first, OverloadedErrorMessage(0x1001, "busy", None))
    attempts.sent(second)
    attempts.answered(second, ResultMessage(2))
    attempts.ended(None)
    (span,) = exporter.get_finished_spans()
    assert [e["adaptive_lb.attempt.outcome"] for e in events_of(span)] == ["error", "success"]
    assert span.attributes["server.address"] == str(second.address)
    for host in (first, second):
        stats = policy.stats.get(host)
        assert stats.requests_total == stats.in_flight == 0
    assert not attempts
