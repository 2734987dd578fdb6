"""Several ``adaptive_lb.attach`` in one process, one after the other and at the same time,
with the real prometheus_client (a fresh registry and the global one) and the real
OpenTelemetry SDK: each session's series are exported while it lives and gone once it is
closed; one collector per registry, one server per address and port, one set of
instruments per meter provider. The real driver against Simulacron is in
tests/integration/test_attach_simulacron.py."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import adaptive_lb
from adaptive_lb import AdaptiveLoadBalancingPolicy, ConfigError
from adaptive_lb.config import Config, MetricsConfig
from adaptive_lb.tools.peers.net import free_tcp_port
from adaptive_lb.tools.sim.driver_topology import build_cluster
from tests.unit.test_attach import StandInSession


def prometheus(port: int = 0) -> Config:
    return Config(metrics=MetricsConfig(prometheus_enabled=True, port=port))


@pytest.fixture(params=["fresh", "global"])
def registry(request):
    """A fresh CollectorRegistry, or prometheus_client's global one (which checks for
    duplicate series at registration: where the second attach used to fail)."""
    if request.param == "fresh":
        yield CollectorRegistry()
        return
    yield REGISTRY
    assert not adaptive_series(scrape_registry(REGISTRY)), "a test left series behind"


def scrape_registry(registry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


def scrape_port(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def adaptive_series(text: str) -> list:
    return [
        sample
        for family in text_string_to_metric_families(text)
        if family.name.startswith("adaptive_lb_")
        for sample in family.samples
    ]


def in_flight(text: str) -> dict[str, dict[str, float]]:
    """policy label -> {address: in flight}."""
    found: dict[str, dict[str, float]] = {}
    for sample in adaptive_series(text):
        if sample.name == "adaptive_lb_host_in_flight":
            found.setdefault(sample.labels["policy"], {})[sample.labels["address"]] = sample.value
    return found


def busy_policy(in_flight_each: int):
    """A policy whose every host has ``in_flight_each`` attempts in flight (to tell
    sessions apart in a scrape)."""
    model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    for host in model.hosts:
        for _ in range(in_flight_each):
            policy.stats.get(host).on_send()
    return policy


def values(policies: dict[str, dict[str, float]]) -> dict[str, set[float]]:
    return {name: set(hosts.values()) for name, hosts in policies.items()}


def test_attach_close_attach_again(registry):
    for cycle in range(3):
        session = StandInSession(busy_policy(cycle + 1))
        attachment = adaptive_lb.attach(session, prometheus(), registry=registry)
        port = attachment.prometheus_port
        assert values(in_flight(scrape_port(port))) == {"0": {cycle + 1}}
        session.shutdown()  # as cluster.shutdown() does
        assert attachment.closed
        assert not adaptive_series(scrape_registry(registry))
        with pytest.raises(OSError):
            scrape_port(port)


def test_two_live_attachments_are_told_apart_and_a_closed_one_is_gone(registry):
    first = StandInSession(busy_policy(1))
    second = StandInSession(busy_policy(2))
    one = adaptive_lb.attach(first, prometheus(), registry=registry)
    try:
        two = adaptive_lb.attach(second, prometheus(), registry=registry)
        try:
            both = {"0": {1.0}, "1": {2.0}}
            assert values(in_flight(scrape_registry(registry))) == both
            # Each server serves the registry: both sessions on either port.
            assert values(in_flight(scrape_port(one.prometheus_port))) == both
            assert values(in_flight(scrape_port(two.prometheus_port))) == both
            first.shutdown()
            text = scrape_port(two.prometheus_port)
            assert values(in_flight(text)) == {"1": {2.0}}
            assert {s.labels["policy"] for s in adaptive_series(text) if "policy" in s.labels} == {
                "1"
            }
            # A new session takes the free name, not the live one's.
            third = StandInSession(busy_policy(3))
            three = adaptive_lb.attach(third, prometheus(), registry=registry)
            assert values(in_flight(scrape_registry(registry))) == {"0": {3.0}, "1": {2.0}}
            three.close()
        finally:
            two.close()
    finally:
        one.close()
    assert not adaptive_series(scrape_registry(registry))


def test_attachments_asking_for_one_port_share_its_server(registry):
    port = free_tcp_port()
    first = StandInSession(busy_policy(1))
    second = StandInSession(busy_policy(2))
    one = adaptive_lb.attach(first, prometheus(port), registry=registry)
    try:
        two = adaptive_lb.attach(second, prometheus(port), registry=registry)
        assert one.prometheus_port == two.prometheus_port == port
        assert values(in_flight(scrape_port(port))) == {"0": {1.0}, "1": {2.0}}
        one.close()  # the server stays up for the other session
        assert values(in_flight(scrape_port(port))) == {"1": {2.0}}
        two.close()  # the last one stops it
        with pytest.raises(OSError):
            scrape_port(port)
        # And the port is free for the next attach.
        again = adaptive_lb.attach(
            StandInSession(busy_policy(4)), prometheus(port), registry=registry
        )
        assert values(in_flight(scrape_port(port))) == {"0": {4.0}}
        again.close()
    finally:
        one.close()


def test_a_port_serving_another_registry_is_a_config_error_when_required():
    port = free_tcp_port()
    first = adaptive_lb.attach(
        StandInSession(busy_policy(1)), prometheus(port), registry=CollectorRegistry()
    )
    try:
        session = StandInSession(busy_policy(2))
        required = Config(metrics=MetricsConfig(prometheus_enabled=True, port=port, required=True))
        with pytest.raises(ConfigError, match=rf"metrics\.port: .*:{port} .*another .*registry"):
            adaptive_lb.attach(session, required, registry=CollectorRegistry())
        assert (
            session.listeners == []
            and not session.cluster.profile_manager.profiles[
                "default"
            ].load_balancing_policy.request_tracking
        )
    finally:
        first.close()


def test_two_sessions_of_one_cluster_share_its_policy():
    """cluster.connect() twice: both sessions have the same policies, served once."""
    policy = busy_policy(1)
    registry = CollectorRegistry()
    first, second = StandInSession(policy), StandInSession(policy)
    one = adaptive_lb.attach(first, prometheus(), registry=registry)
    two = adaptive_lb.attach(second, prometheus(), registry=registry)
    assert values(in_flight(scrape_registry(registry))) == {"0": {1.0}}
    one.close()
    assert values(in_flight(scrape_registry(registry))) == {"0": {1.0}}
    two.close()
    assert not adaptive_series(scrape_registry(registry))


def test_attach_and_close_may_race():
    registry = CollectorRegistry(auto_describe=True)
    port = free_tcp_port()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def cycles(shared_port: int) -> None:
        try:
            start.wait()
            for _ in range(5):
                session = StandInSession(busy_policy(1))
                attachment = adaptive_lb.attach(session, prometheus(shared_port), registry=registry)
                scrape_registry(registry)
                session.shutdown()
                assert attachment.closed
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=cycles, args=(p,)) for p in (port, port, 0, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert not adaptive_series(scrape_registry(registry))
    with pytest.raises(OSError):
        scrape_port(port)


def otel_points(reader) -> dict[str, list]:
    data = reader.get_metrics_data()
    if data is None:
        return {}
    found: dict[str, list] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                assert metric.name not in found, f"{metric.name} registered twice"
                found[metric.name] = list(metric.data.data_points)
    return found


def test_otel_instruments_serve_every_live_attachment_once():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    config = Config(metrics=MetricsConfig(otel_enabled=True))
    first = StandInSession(busy_policy(1))
    second = StandInSession(busy_policy(2))

    def in_flight_by_policy() -> dict[str, set[float]]:
        found: dict[str, set[float]] = {}
        for point in otel_points(reader).get("adaptive_lb.host.in_flight", []):
            found.setdefault(point.attributes["policy"], set()).add(point.value)
        return found

    one = adaptive_lb.attach(first, config, meter_provider=provider)
    two = adaptive_lb.attach(second, config, meter_provider=provider)
    try:
        assert in_flight_by_policy() == {"0": {1}, "1": {2}}
        one.close()
        assert in_flight_by_policy() == {"1": {2}}
        again = adaptive_lb.attach(StandInSession(busy_policy(3)), config, meter_provider=provider)
        assert in_flight_by_policy() == {"0": {3}, "1": {2}}
        again.close()
    finally:
        one.close()
        two.close()
    points = otel_points(reader)
    assert in_flight_by_policy() == {}
    assert not points.get("adaptive_lb.config.info")
    assert not points.get("adaptive_lb.trace.spans.exported")
