"""A real scrape of the Prometheus endpoint, checked against policy.snapshot()."""

from __future__ import annotations

import urllib.request

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.clock import ManualClock
from adaptive_lb.exporters import start_prometheus_server
from adaptive_lb.sim.cluster import build_cluster, murmur3_routing_keys

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
            stats.on_success((i + 1) * MS)
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
    assert p99[slow.address] == by_address[slow.address].latency_p99
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
