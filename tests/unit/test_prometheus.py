"""A real scrape of the Prometheus endpoint, checked against policy.snapshot()."""

from __future__ import annotations

import urllib.request

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.exporters import start_prometheus_server
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

MS = 1_000_000


def test_scrape_matches_the_snapshot():
    model = build_cluster({"dc1": [2, 2, 2], "dc2": [3]}, real_cluster=False, seed=2)
    clock = ManualClock(10**9)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=clock
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    for i, host in enumerate(model.hosts_by_dc["dc1"]):
        stats = policy.stats.get(host)
        for _ in range(60):
            stats.on_send()
            stats.on_success((10 + i) * MS)  # 10..15 ms: healthy alike (2x is SLOW)
        stats.on_send()
        stats.on_error(MS)
        stats.on_send()  # one still in flight
    slow = model.hosts_by_dc["dc1"][5]
    for _ in range(200):
        policy.stats.get(slow).on_send()
        policy.stats.get(slow).on_success(80 * MS)
    policy.refresh_health()
    keys = murmur3_routing_keys(20)
    for key in keys:
        list(policy.make_query_plan("ks", SimpleStatement("q", routing_key=key, keyspace="ks")))

    registry = CollectorRegistry()
    server, _thread = start_prometheus_server(0, policies=[policy], registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    # Privacy: no routing key (raw or hex) and no statement text in any metric or label.
    for key in keys:
        assert key.hex() not in text and repr(key) not in text
    assert '"q"' not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    snapshot = policy.snapshot()
    by_address = {h.address: h for h in snapshot.hosts}

    in_flight = {
        s.labels["address"]: s.value for s in families["adaptive_lb_host_in_flight"].samples
    }
    assert in_flight == {a: h.in_flight for a, h in by_address.items()}
    requests = {
        s.labels["address"]: s.value
        for s in families["adaptive_lb_host_requests"].samples
        if s.name.endswith("_total")
    }
    assert requests[slow.address] == 61 + 200
    assert requests == {a: h.requests_total for a, h in by_address.items()}
    errors = {
        s.labels["address"]: s.value
        for s in families["adaptive_lb_host_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors[model.hosts_by_dc["dc1"][0].address] == 1
    p99 = {
        s.labels["address"]: s.value
        for s in families["adaptive_lb_host_latency_seconds"].samples
        if s.labels.get("quantile") == "0.99"
    }
    assert p99[slow.address] == by_address[slow.address].window_latency_p99_seconds
    assert 0.075 < p99[slow.address] < 0.085
    health = {
        s.labels["address"]
        for s in families["adaptive_lb_host_health"].samples
        if s.labels["state"] == "slow" and s.value == 1
    }
    assert health == {slow.address}
    sample = families["adaptive_lb_host_in_flight"].samples[0]
    assert set(sample.labels) == {"policy", "address", "dc", "rack"}
    decisions = {
        s.labels["position"]: s.value
        for s in families["adaptive_lb_decisions"].samples
        if s.name.endswith("_total")
    }
    assert sum(decisions.values()) == 20
    hits = families["adaptive_lb_replica_cache_misses"].samples[0].value
    assert hits == snapshot.replica_cache_misses == 20
    info = families["adaptive_lb_config_info"].samples[0]
    assert info.labels["hash"] == policy.config_hash
    window = {
        s.labels["address"]: s.value for s in families["adaptive_lb_host_window_requests"].samples
    }
    assert window == {a: h.window_requests for a, h in by_address.items()}
    assert window[slow.address] == 261
    # No tracking attached: every plan above was untracked, and the gauge says so.
    (attached,) = families["adaptive_lb_request_tracking_attached"].samples
    assert (attached.labels, attached.value) == ({"policy": "0"}, 0.0)
    (untracked,) = [
        s for s in families["adaptive_lb_untracked_plans"].samples if s.name.endswith("_total")
    ]
    assert untracked.value == snapshot.untracked_plans == 20


def test_request_tracking_gauge_follows_attachment():
    from adaptive_lb.exporters import AdaptiveLbCollector

    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(policy, names=["main"]))
    labels = {"policy": "main"}
    assert registry.get_sample_value("adaptive_lb_request_tracking_attached", labels) == 0
    list(policy.make_query_plan("ks", SimpleStatement("q")))
    policy.tracking_attached()
    list(policy.make_query_plan("ks", SimpleStatement("q")))
    assert registry.get_sample_value("adaptive_lb_request_tracking_attached", labels) == 1
    assert registry.get_sample_value("adaptive_lb_untracked_plans_total", labels) == 1
    snapshot = policy.snapshot()
    assert snapshot.request_tracking is True and snapshot.untracked_plans == 1


def test_otel_observable_instruments_match_the_snapshot():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from adaptive_lb.exporters import register_otel_metrics

    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=2)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    for i, host in enumerate(model.hosts):
        stats = policy.stats.get(host)
        for _ in range(i + 1):
            stats.on_send()
            stats.on_success(MS)
        stats.on_send()
    policy.refresh_health()
    reader = InMemoryMetricReader()
    register_otel_metrics(policy, MeterProvider(metric_readers=[reader]))
    data = reader.get_metrics_data()
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    in_flight = {
        p.attributes["server.address"]: p.value
        for p in metrics["adaptive_lb.host.in_flight"].data.data_points
    }
    assert in_flight == {h.address: 1 for h in model.hosts}
    requests = {
        p.attributes["server.address"]: p.value
        for p in metrics["adaptive_lb.host.requests"].data.data_points
    }
    assert requests == {h.address: i + 1 for i, h in enumerate(model.hosts)}
    latency = [
        p
        for p in metrics["adaptive_lb.host.latency"].data.data_points
        if p.attributes["quantile"] == "0.99"
    ]
    assert len(latency) == len(model.hosts)
    (attached,) = metrics["adaptive_lb.request_tracking.attached"].data.data_points
    assert (dict(attached.attributes), attached.value) == ({"policy": "0"}, 0)
    (untracked,) = metrics["adaptive_lb.untracked_plans"].data.data_points
    assert untracked.value == policy.untracked_plans == 0


def scrape(registry: CollectorRegistry) -> dict:
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_several_policies_are_told_apart_by_the_policy_label():
    from adaptive_lb import Config
    from adaptive_lb.config import TracingConfig
    from adaptive_lb.exporters import AdaptiveLbCollector

    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=5)
    oltp = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    batch = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    for policy in (oltp, batch):
        policy.populate(model.cluster, model.metadata.all_hosts())
    host = model.hosts[0]
    for _ in range(3):
        oltp.stats.get(host).on_send()
    batch.stats.get(host).on_send()
    batch.reload(Config(tracing=TracingConfig(ratio=0.5)))
    for _ in range(4):
        list(oltp.make_query_plan("ks", SimpleStatement("q")))
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector([oltp, batch], names=["oltp", "batch"]))
    families = scrape(registry)
    in_flight = {
        (s.labels["policy"], s.labels["address"]): s.value
        for s in families["adaptive_lb_host_in_flight"].samples
    }
    assert in_flight[("oltp", host.address)] == 3
    assert in_flight[("batch", host.address)] == 1
    assert len(in_flight) == 2 * len(model.hosts)
    decisions = {
        s.labels["policy"]: s.value
        for s in families["adaptive_lb_decisions"].samples
        if s.name.endswith("_total") and s.labels["position"] == "local"
    }
    assert decisions == {"oltp": 4, "batch": 0}
    reloads = {
        (s.labels["policy"], s.labels["result"]): s.value
        for s in families["adaptive_lb_config_reloads"].samples
        if s.name.endswith("_total")
    }
    assert reloads[("batch", "success")] == 1 and reloads[("oltp", "success")] == 0
    hashes = {
        s.labels["policy"]: s.labels["hash"] for s in families["adaptive_lb_config_info"].samples
    }
    assert hashes == {"oltp": oltp.config_hash, "batch": batch.config_hash}
    assert hashes["oltp"] != hashes["batch"]


def test_collector_reads_missing_counters_with_defaults():
    """Any object with snapshot() will do; counts it does not keep are simply absent."""
    from adaptive_lb.exporters import AdaptiveLbCollector

    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())

    class SnapshotOnly:
        def snapshot(self):
            return policy.snapshot()

    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(SnapshotOnly()))
    families = scrape(registry)
    assert families["adaptive_lb_decisions"].samples == []
    assert families["adaptive_lb_config_reloads"].samples == []
    assert len(families["adaptive_lb_host_in_flight"].samples) == 2
    # No latency sample yet: the summary has no quantile, and never a _count or _sum (a
    # window's count goes down; the window's requests are a gauge of their own).
    assert families["adaptive_lb_host_latency_seconds"].samples == []
    assert {s.value for s in families["adaptive_lb_host_window_requests"].samples} == {0}


def test_health_is_one_hot():
    from adaptive_lb.exporters import AdaptiveLbCollector
    from adaptive_lb.stats.health_state import HealthState

    model = build_cluster({"dc1": [1, 1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    warming = model.hosts[1]
    policy.health.mark_up(warming, policy.stats.get(warming))
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(policy))
    samples = scrape(registry)["adaptive_lb_host_health"].samples
    for host in model.hosts:
        mine = [s for s in samples if s.labels["address"] == host.address]
        states = {s.labels["state"]: s.value for s in mine}
        assert set(states) == {state.value for state in HealthState}
        assert sum(states.values()) == 1
        expected = "warming" if host is warming else "healthy"
        assert states[expected] == 1
    penalty = registry.get_sample_value(
        "adaptive_lb_host_penalty",
        {"policy": "0", "address": warming.address, "dc": "dc1", "rack": warming.rack},
    )
    assert penalty == policy.snapshot().host(warming.address).health_penalty > 1


def test_otel_instruments_cover_every_prometheus_family():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from adaptive_lb.exporters import register_otel_metrics

    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=2)
    policies = [AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1")) for _ in range(2)]
    for policy in policies:
        policy.populate(model.cluster, model.metadata.all_hosts())
    warming = model.hosts[2]
    policies[0].health.mark_up(warming, policies[0].stats.get(warming))
    for _ in range(3):
        list(policies[1].make_query_plan("ks", SimpleStatement("q")))
    reader = InMemoryMetricReader()
    register_otel_metrics(policies, MeterProvider(metric_readers=[reader]), names=["a", "b"])
    data = reader.get_metrics_data()
    metrics = {
        m.name: m.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    health = {
        (p.attributes["policy"], p.attributes["server.address"])
        for p in metrics["adaptive_lb.host.health"]
        if p.attributes["state"] == "warming" and p.value == 1
    }
    assert health == {("a", warming.address)}
    decisions = {
        (p.attributes["policy"], p.attributes["position"]): p.value
        for p in metrics["adaptive_lb.decisions"]
    }
    assert decisions[("b", "local")] == 3 and decisions[("a", "local")] == 0
    info = {
        p.attributes["policy"]: p.attributes["hash"] for p in metrics["adaptive_lb.config.info"]
    }
    assert info == {"a": policies[0].config_hash, "b": policies[1].config_hash}
    fleet = {p.attributes["policy"]: p.value for p in metrics["adaptive_lb.fleet.size"]}
    assert fleet == {"a": 1, "b": 1}  # default_size: nothing counted here
    assert len(metrics["adaptive_lb.host.in_flight"]) == 2 * len(model.hosts)
    for name in (
        "adaptive_lb.host.window_requests",
        "adaptive_lb.host.errors",
        "adaptive_lb.host.timeouts",
        "adaptive_lb.host.penalty",
        "adaptive_lb.replica_cache.hits",
        "adaptive_lb.replica_cache.misses",
        "adaptive_lb.replica_cache.evictions",
        "adaptive_lb.replica_cache.invalidations",
        "adaptive_lb.replica_cache.size",
        "adaptive_lb.plan_fallbacks",
        "adaptive_lb.config.reloads",
        "adaptive_lb.request_tracking.attached",
        "adaptive_lb.untracked_plans",
    ):
        assert metrics[name], name
    fallbacks = {p.attributes["policy"]: p.value for p in metrics["adaptive_lb.plan_fallbacks"]}
    assert fallbacks == {"a": 0, "b": 0}
    untracked = {p.attributes["policy"]: p.value for p in metrics["adaptive_lb.untracked_plans"]}
    assert untracked == {"a": 0, "b": 3}


def test_dashboard_and_scrape_config_name_what_the_collector_serves():
    """Every metric the Grafana dashboard queries is served (a typo would be an empty panel;
    tests/integration/test_prometheus_server.py runs the queries on a real Prometheus)."""
    import json
    import re
    from pathlib import Path

    from adaptive_lb.config import OtlpConfig, TracingConfig
    from adaptive_lb.exporters import AdaptiveLbCollector, setup_tracing

    root = Path(__file__).resolve().parents[2]
    dashboard = json.loads((root / "exporters/grafana/adaptive-lb.json").read_text())
    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    policy.stats.get(model.hosts[0]).on_send()
    policy.stats.get(model.hosts[0]).on_success(MS)
    policy.refresh_health()
    # The span families appear once a setup_tracing processor exists in the process.
    setup_tracing(TracingConfig(otlp=OtlpConfig(endpoint="http://127.0.0.1:9"))).shutdown()
    registry = CollectorRegistry()
    registry.register(AdaptiveLbCollector(policy))
    served = {sample.name for family in scrape(registry).values() for sample in family.samples}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            for name in re.findall(r"adaptive_lb_[a-z_]+", target["expr"]):
                assert name in served, (panel["title"], name)
    scrape_config = (root / "exporters/prometheus/prometheus.yml").read_text()
    assert "127.0.0.1:9464" in scrape_config


def test_start_exporters_starts_what_the_config_enables():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from adaptive_lb import Config
    from adaptive_lb.config import MetricsConfig, OtlpConfig, TracingConfig
    from adaptive_lb.exporters import start_exporters

    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    nothing = start_exporters(Config(), policy)
    assert nothing.prometheus_server is None and nothing.tracer_provider is None
    assert nothing.otel_instruments == []
    config = Config(
        tracing=TracingConfig(otlp=OtlpConfig(endpoint="http://127.0.0.1:9", protocol="http")),
        metrics=MetricsConfig(prometheus_enabled=True, port=0, otel_enabled=True),
    )
    reader = InMemoryMetricReader()
    exporters = start_exporters(
        config,
        [policy],
        names=["main"],
        registry=CollectorRegistry(),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    try:
        assert exporters.tracer_provider.adaptive_lb_processor is not None
        assert exporters.prometheus_server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{exporters.prometheus_server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        assert 'adaptive_lb_host_in_flight{address="127.1.' in text
        assert 'policy="main"' in text
        data = reader.get_metrics_data()
        names = {
            m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }
        assert "adaptive_lb.host.in_flight" in names
    finally:
        exporters.close()
    assert exporters.prometheus_server is None


def test_local_rack_info_says_where_the_rack_comes_from():
    from adaptive_lb.config import PolicyConfig
    from adaptive_lb.exporters import AdaptiveLbCollector

    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    registry = CollectorRegistry()
    configured = AdaptiveLoadBalancingPolicy(
        DCAwareRoundRobinPolicy("dc1"), Config(policy=PolicyConfig(local_rack="r2"))
    )
    unknown = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    for policy in (configured, unknown):
        policy.populate(model.cluster, model.metadata.all_hosts())
    registry.register(AdaptiveLbCollector([configured, unknown], names=["a", "b"]))
    info = {"policy": "a", "rack": "r2", "source": "configured"}
    assert registry.get_sample_value("adaptive_lb_local_rack_info", info) == 1
    info = {"policy": "b", "rack": "", "source": "unknown"}
    assert registry.get_sample_value("adaptive_lb_local_rack_info", info) == 1
    assert unknown.snapshot().local_rack_source == "unknown"


def test_start_prometheus_server_may_be_called_again_in_one_registry():
    """The global registry (which checks for duplicate series): calls add their policies to
    one collector, a name already another policy's is refused, and shutting a server down
    removes its policies' series."""
    import pytest
    from prometheus_client import REGISTRY

    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policies = [AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1")) for _ in range(3)]
    for policy in policies:
        policy.populate(model.cluster, model.metadata.all_hosts())

    def served() -> set[str]:
        info = scrape(REGISTRY).get("adaptive_lb_config_info")
        return {s.labels["policy"] for s in info.samples} if info else set()

    first, _ = start_prometheus_server(0, policies=policies[0], names=["main"])
    try:
        second, _ = start_prometheus_server(0, policies=policies[1])
        try:
            assert served() == {"main", "0"}
            with pytest.raises(ValueError, match="'main' is already another policy's"):
                start_prometheus_server(0, policies=policies[2], names=["main"])
            assert served() == {"main", "0"}
        finally:
            second.shutdown()
            second.server_close()
        assert served() == {"main"}
    finally:
        first.shutdown()
        first.server_close()
    assert served() == set()
