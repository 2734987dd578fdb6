"""With opentelemetry-instrumentation-cassandra, each request's span holds the
`adaptive_lb.decision` event naming the host the driver actually used."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adaptive_lb import AdaptiveLoadBalancingPolicy, instrument
from adaptive_lb.telemetry.tracing import EVENT_NAME
from tests.integration.simulacron import Simulacron, wait_for_pools

instrumentation = pytest.importorskip(
    "opentelemetry.instrumentation.cassandra",
    reason="needs opentelemetry-instrumentation-cassandra (the dev extra installs it)",
)

pytestmark = pytest.mark.integration

CLUSTER = "tracing"
QUERY = "SELECT v FROM ks.t WHERE k = ?"
ROWS = {"rows": [{"v": 1}], "column_types": {"v": "int"}, "param_types": {"k": "int"}}


@pytest.fixture(scope="module")
def nodes(simulacron: Simulacron) -> Iterator[dict[str, list[str]]]:
    created = simulacron.create_cluster(CLUSTER, [["r1", "r2", "r3"]] * 2)
    try:
        simulacron.prime_keyspace("ks", {"dc1": 2, "dc2": 2})
        simulacron.prime(QUERY, **ROWS)
        yield created
    finally:
        simulacron.remove_cluster(CLUSTER)


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = instrumentation.CassandraInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        instrumentor.uninstrument()


def test_decision_lands_in_the_instrumentation_span(driver_factory, nodes, traced):
    provider, exporter = traced
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), tracer_provider=provider
    )
    _, session = driver_factory(policy, contact_points=[nodes["dc1"][0]])
    instrument(session)
    statement = session.prepare(QUERY)
    wait_for_pools(session, "dc1")
    time.sleep(0.5)
    exporter.clear()
    coordinators = []
    for k in range(20):
        result = session.execute(statement, [k])
        coordinators.append(result.response_future.coordinator_host.address)
    futures = [session.execute_async(statement, [k]) for k in range(20, 40)]
    for future in futures:
        future.result()
        coordinators.append(future.coordinator_host.address)
    spans = [s for s in exporter.get_finished_spans() if s.kind.name == "CLIENT"]
    assert len(spans) == 40
    for span, coordinator in zip(spans, coordinators, strict=True):
        decisions = [e for e in span.events if e.name == EVENT_NAME]
        assert len(decisions) == 1, span.name
        assert decisions[0].attributes["server.address"] == coordinator
        assert decisions[0].attributes["adaptive_lb.position"] == "replica"
        # Recorded while the span was current: the instrumentation starts its span before
        # calling Session.execute_async, which builds the ResponseFuture and its query plan.
        assert span.start_time <= decisions[0].timestamp <= span.end_time
    # No enclosing span (a paging fetch, or the instrumentation removed): nothing recorded.
    recorded = policy.decisions.tracer.recorded
    instrumentation.CassandraInstrumentor().uninstrument()
    session.execute(statement, [99])
    assert policy.decisions.tracer.recorded == recorded
