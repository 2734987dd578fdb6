"""How much of the application's span around ``session.execute`` the request span covers.

    python benchmarks/request_span_coverage.py --delay-ms 0   # ~30 s: Simulacron + 2,000 requests

The real driver against Simulacron (3 nodes, started and stopped here with its 1 ms timer,
the prepared query answering after ``--delay-ms``: 0 ms gives ~1.2 ms requests, 1 ms
~3-4 ms), ``adaptive_lb.attach(session, tracer_provider=...)`` on the real OpenTelemetry
SDK (``BatchSpanProcessor`` into an ``InMemorySpanExporter``), and one
application span around each ``session.execute``, one request at a time. For each request
it reads the two spans' timestamps and reports the distribution (p10, p50, p90) of
request span duration / application span duration, of the application span's duration and
of the time it has outside the request span (which does not grow with the request).

The exporter does not change the ratio: both spans' timestamps are taken in this process
by the SDK, whatever receives them later (Jaeger shows the same ``startTimeUnixNano`` /
``endTimeUnixNano``). ``--instrumentation`` adds ``opentelemetry-instrumentation-cassandra``
(its ``Cassandra`` span between the two). Run it against another checkout
(``PYTHONPATH=OLD python benchmarks/request_span_coverage.py``) to compare releases.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import _e2e
import figures
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import adaptive_lb
from adaptive_lb.tools.cli import HelpFormatter
from adaptive_lb.tools.peers.connect import connect_driver, wait_for_pools
from adaptive_lb.tools.peers.simulacron import Simulacron, ensure_simulacron_jar, pick_node_ip


def _quantiles(values: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(values, n=10)
    return {
        "p10": round(deciles[0], 3),
        "p50": round(statistics.median(values), 3),
        "p90": round(deciles[8], 3),
    }


def measure(contact_points: list[str], requests: int, warmup: int, instrumentation: bool) -> Any:
    """Run the requests; return per request: the ratio, the application span's duration
    (ms) and the part of it the request span does not cover (us)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    instrumentor = None
    if instrumentation:
        from opentelemetry.instrumentation.cassandra import CassandraInstrumentor

        instrumentor = CassandraInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
    policy = adaptive_lb.AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy(_e2e.DC))
    )
    cluster, session = connect_driver(contact_points, policy)
    try:
        adaptive_lb.attach(session, tracer_provider=provider)
        if not wait_for_pools(session, _e2e.DC, timeout=30.0):
            raise RuntimeError("the driver's pools did not open in 30 s")
        prepared = session.prepare(_e2e.QUERY)
        tracer = provider.get_tracer("application")
        for k in range(warmup + requests):
            if k == warmup:
                provider.force_flush()
                exporter.clear()
            with tracer.start_as_current_span("application"):
                session.execute(prepared, [k])
        provider.force_flush()
        spans = exporter.get_finished_spans()
    finally:
        cluster.shutdown()
        if instrumentor is not None:
            instrumentor.uninstrument()
        provider.shutdown()
    applications = {s.context.trace_id: s for s in spans if s.name == "application"}
    ratios, durations, uncovered = [], [], []
    for span in spans:
        if span.instrumentation_scope.name != "adaptive_lb" or span.kind.name != "CLIENT":
            continue
        application = applications[span.context.trace_id]
        whole = application.end_time - application.start_time
        ratios.append((span.end_time - span.start_time) / whole)
        durations.append(whole / 1e6)
        uncovered.append((whole - (span.end_time - span.start_time)) / 1e3)
    if len(ratios) != requests:
        raise RuntimeError(f"{len(ratios)} request spans for {requests} requests")
    return ratios, durations, uncovered


def main(argv: list[str] | None = None) -> int:
    """Measure and print JSON."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/request_span_coverage.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests measured")
    parser.add_argument("--warmup", type=int, default=200, help="requests before measuring")
    parser.add_argument("--delay-ms", type=int, default=1, help="Simulacron's answer delay")
    parser.add_argument(
        "--instrumentation",
        action="store_true",
        help="with opentelemetry-instrumentation-cassandra installed",
    )
    figures.add_record_option(parser)
    args = parser.parse_args(argv)
    with Simulacron(
        ensure_simulacron_jar(),
        node_ip=pick_node_ip(_e2e.NODES),
        activity_logging=False,
        jvm_args=("-Xmx256m",),
        die_with_parent=True,
        fine_timer=True,
    ) as sim:
        nodes = sim.create_cluster(_e2e.CLUSTER, [["r1", "r2", "r3"]])[_e2e.DC]
        sim.prime_keyspace("ks", {_e2e.DC: _e2e.RF})
        sim.prime(
            _e2e.QUERY, [{"v": 1}], {"v": "int"}, param_types={"k": "int"}, delay_ms=args.delay_ms
        )
        ratios, durations, uncovered = measure(
            nodes, args.requests, args.warmup, args.instrumentation
        )
    result = {
        "requests": args.requests,
        "delay_ms": args.delay_ms,
        "fine_timer": sim.fine_timer,
        "instrumentation": args.instrumentation,
        "coverage": _quantiles(ratios),
        "application_span_ms": _quantiles(durations),
        "uncovered_us": _quantiles(uncovered),
    }
    print(json.dumps(result))
    figures.record_run("request_span_coverage", args.record, result, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
