"""Per-request cost of request spans and ``db.client.operation.duration``, over tracking.

    python benchmarks/request_telemetry.py

The same path as ``benchmarks/tracking_overhead.py`` (a real ``ResponseFuture`` through
the request-init listener, one send, one ``ResultMessage``, the final result; network
steps replaced by no-ops), in four variants timed in interleaved rounds:

* ``tracked``: ``instrument(session)``, no request telemetry (the reference);
* ``idle``: ``attach`` with request spans on but nothing recording (no current span, no
  tracer provider of adaptive-lb's own): the one check per request;
* ``span``: a recording SDK ``TracerProvider`` (``BatchSpanProcessor`` to an exporter that
  drops everything): one CLIENT span with its attributes and one attempt event;
* ``span+duration``: the same plus the histogram on an SDK ``MeterProvider``.

Each cost is the median over rounds of (variant - tracked) per request, with its
interquartile range; the cyclic GC is off while timing. Needs the ``otlp`` extra (the SDK).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import types
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import QueryMessage, ResultMessage
from cassandra.query import SimpleStatement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import Config, MetricsConfig
from adaptive_lb.runtime.request_spans import RequestTelemetry
from adaptive_lb.runtime.tracking import RequestTracker
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.offline_session import OfflineFuture, unsent_future
from adaptive_lb.tools.sim.driver_topology import build_cluster

VARIANTS = ("tracked", "idle", "span", "span+duration")


class _Dropping(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Listeners:
    """The two Session methods RequestTracker calls, and a session's (empty) pools: the
    listener path, which telemetry on every request takes (no live session without a
    server)."""

    _pools: dict = {}

    def add_request_init_listener(self, fn, *args, **kwargs):
        self.listener = fn

    def remove_request_init_listener(self, fn, *args, **kwargs):
        pass


def _request_future(policy: Any, statement: Any, session: Any, message: Any) -> Any:
    # Network steps that are no-ops, no plan: this measures the listener path only.
    future = unsent_future(OfflineFuture, policy)
    future.query = statement
    future.session = session
    future.message = message
    return future


def run_once(futures: list[Any], host: Any, response: Any, listener: Any) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for future in futures:
            listener(future)
            future._query(host)
            future._set_result(host, None, None, response)
            future._set_final_result(None)
        return (time.perf_counter() - start) / len(futures)
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Measure and print JSON."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/request_telemetry.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds")
    parser.add_argument("--requests", type=int, default=5000, help="requests per variant/round")
    args = parser.parse_args(argv)
    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    registry = _Listeners()
    tracker = RequestTracker(registry)
    listener = registry.listener
    host = model.hosts[0]
    response = ResultMessage(2)
    statement = SimpleStatement("SELECT v FROM ks.t WHERE k = 1", keyspace="ks")
    session = types.SimpleNamespace(keyspace="ks")
    message = QueryMessage(statement.query_string, ConsistencyLevel.LOCAL_ONE)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_Dropping(), max_queue_size=1 << 16))
    with_durations = Config(metrics=MetricsConfig(otel_enabled=True))
    telemetry = {
        "tracked": None,
        "idle": RequestTelemetry(Config()),
        "span": RequestTelemetry(Config(), tracer_provider=tracer_provider, root_spans=True),
        "span+duration": RequestTelemetry(
            with_durations,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(),
            root_spans=True,
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            tracker.telemetry = telemetry[name]
            futures = [
                _request_future(policy, statement, session, message) for _ in range(args.requests)
            ]
            times[name].append(run_once(futures, host, response, listener))
        tracer_provider.force_flush()
    stats = policy.stats.get(host)
    assert stats.in_flight == 0
    result: dict[str, Any] = {"tracked_us": round(statistics.median(times["tracked"]) * 1e6, 3)}
    for name in VARIANTS[1:]:
        cost = [v - t for v, t in zip(times[name], times["tracked"], strict=True)]
        quartiles = statistics.quantiles(cost, n=4)
        result[f"{name}_cost_us"] = round(statistics.median(cost) * 1e6, 3)
        result[f"{name}_cost_iqr_us"] = [round(quartiles[0] * 1e6, 3), round(quartiles[2] * 1e6, 3)]
    print(json.dumps(result))
    tracer_provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
