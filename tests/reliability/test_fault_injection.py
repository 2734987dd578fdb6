"""Fault injection: each internal stage made to raise in turn. Requests still get the
child's plan, each failure is counted in its stage, and logged at most once per interval."""

from __future__ import annotations

import time

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import adaptive_lb.plan.planner
from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import ConfigWatcher, HealthConfig, TracingConfig
from adaptive_lb.exporters import AdaptiveLbCollector, register_otel_metrics
from adaptive_lb.plan.replicas import ReplicaResolver
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys
from tests.reliability.conftest import statement

PLANS = 300


class Boom(RuntimeError):
    """The injected failure."""


def _raise(*args, **kwargs):
    raise Boom("injected")


@pytest.fixture
def setup():
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [2, 2, 2]}, seed=13, real_cluster=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(tracing=TracingConfig(enabled=True)),
        tracer_provider=provider,
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return model, policy, provider


def _plans_match_the_child(policy, keys, tracer=None) -> None:
    for key in keys:
        query = statement(key)
        if tracer is not None:
            with tracer.start_as_current_span("app request"):
                ours = list(policy.make_query_plan("ks", query))
        else:
            ours = list(policy.make_query_plan("ks", query))
        theirs = list(policy.child.make_query_plan("ks", query))
        assert len(ours) == len(set(ours))
        assert set(ours) == set(theirs)


def _logged_once(captured_logs, stage: str) -> None:
    logged = captured_logs.matching(f"internal error in {stage}")
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].exc_info is not None and logged[0].exc_info[0] is Boom


@pytest.mark.parametrize("stage", ["replica lookup", "scoring"])
def test_plan_stages_fall_back_to_the_childs_plan(setup, captured_logs, monkeypatch, stage):
    _model, policy, _ = setup
    if stage == "replica lookup":
        monkeypatch.setattr(ReplicaResolver, "replicas", _raise)
    else:
        monkeypatch.setattr(adaptive_lb.plan.planner, "order", _raise)
    keys = murmur3_routing_keys(PLANS, seed=3)
    _plans_match_the_child(policy, keys)
    assert policy.internal_errors_by_stage["plan"] == PLANS
    # Every plan counted once: as a fallback, or (scoring failed after the best replica
    # was yielded) by that first host.
    assert sum(policy.decisions_by_position.values()) == PLANS
    if stage == "replica lookup":
        assert policy.decisions_by_position["fallback"] == PLANS
    _logged_once(captured_logs, "plan")


def test_tracing_failure_keeps_the_plan(setup, captured_logs, monkeypatch):
    _model, policy, provider = setup
    monkeypatch.setattr(policy.decisions.tracer, "record", _raise)
    _plans_match_the_child(policy, murmur3_routing_keys(PLANS, seed=4), provider.get_tracer("t"))
    assert policy.internal_errors_by_stage["tracing"] == PLANS
    assert policy.internal_errors_by_stage["plan"] == 0
    _logged_once(captured_logs, "tracing")


def test_health_refresh_failure_keeps_the_last_verdicts(setup, captured_logs, monkeypatch):
    model, policy, _ = setup
    policy.reload(Config(health=HealthConfig(refresh_interval=0.01)))
    policy.refresh_health()
    before = {h: policy.health.health(h) for h in model.hosts}
    monkeypatch.setattr(policy.health, "maybe_refresh", _raise)
    policy.start_health_refresh()
    try:
        deadline = time.monotonic() + 10
        while policy.internal_errors_by_stage["health_refresh"] < 5:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        policy.stop_health_refresh()
    assert {h: policy.health.health(h) for h in model.hosts} == before
    _plans_match_the_child(policy, murmur3_routing_keys(50, seed=5))
    _logged_once(captured_logs, "health_refresh")


def test_snapshot_failure_neither_fails_a_scrape_nor_floods_the_log(
    setup, captured_logs, monkeypatch
):
    model, policy, _ = setup
    healthy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    healthy.populate(model.cluster, model.metadata.all_hosts())
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector([policy, healthy], ["broken", "fine"]))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    register_otel_metrics([policy, healthy], meter_provider, ["broken", "fine"])
    monkeypatch.setattr(policy, "snapshot", _raise)
    for _ in range(10):
        text = generate_latest(registry).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        in_flight = families["adaptive_lb_host_in_flight"]
        assert {s.labels["policy"] for s in in_flight.samples} == {"fine"}
        data = reader.get_metrics_data()
        assert data is not None
    # 10 scrapes + 10 collections, each with several snapshot-based instruments.
    assert policy.internal_errors_by_stage["snapshot"] >= 20
    errors = families["adaptive_lb_internal_errors"]
    counted = {
        s.labels["stage"]: s.value
        for s in errors.samples
        if s.labels["policy"] == "broken" and s.name.endswith("_total")
    }
    assert counted["snapshot"] >= 10
    _plans_match_the_child(policy, murmur3_routing_keys(50, seed=6))
    _logged_once(captured_logs, "snapshot")
    meter_provider.shutdown()


def test_config_watcher_failure_is_counted_and_keeps_the_config(
    setup, captured_logs, monkeypatch, tmp_path
):
    _model, policy, _ = setup
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("policy:\n  sample_size: 5\n")
    policy.reload(path)
    hash_before = policy.config_hash

    watcher = ConfigWatcher(path, _raise, interval=0.01, report_error=policy.record_error)
    with watcher:
        for size in range(2, 12):
            path.write_text(f"policy:\n  sample_size: {size}\n")
            deadline = time.monotonic() + 5
            while watcher.config is None or watcher.config.policy.sample_size != size:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while policy.internal_errors_by_stage["config_watch"] < 10:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert policy.config_hash == hash_before
    assert watcher.config is not None
    _logged_once(captured_logs, "config_watch")
