"""What recording one decision costs on a recording span, over the same plan unrecorded.

    python benchmarks/decision_record.py

A policy over 9 local hosts (3 racks of 3, keyspace RF 3, ``sample_size`` 8: 8 candidates,
some in flight), the real OpenTelemetry SDK (``BatchSpanProcessor`` to an exporter that
drops everything) and, per iteration, a request's part: a recording span started, current
while ``make_query_plan`` gives its first host, then ended. Three variants, timed in
interleaved rounds:

* ``plan``: the span not current (another context attached instead): the plan as an
  untraced request makes it, the baseline;
* ``event``: the span current: the plan records its ``adaptive_lb.decision`` event on it
  (``tracing.mode: event``, what ``instrument`` alone does);
* ``request``: what a request span gets with ``attach``: the plan hands its decision
  over, and the span starts with the decision's attributes (``DecisionRecorder.
  request_attributes``, merged into its own as ``adaptive_lb.runtime.request_spans`` does);
* ``brief``: the same with ``tracing.candidates_ratio: 0`` (the chosen host and why, no
  candidate list: the plan an untraced request gets).

Each cost is the median over rounds of (variant - plan) per request, with its
interquartile range, and the ratio of the medians. Times are the timing thread's CPU time
(``time.thread_time``: time spent preempted on a shared machine is not counted, nor the
processor thread's export), the cyclic GC is off while timing. Run it against another
checkout (``PYTHONPATH=OLD python OLD/benchmarks/decision_record.py``) to compare
releases. Needs the OpenTelemetry SDK (the ``otlp`` extra).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import figures
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import Config, TracingConfig
from adaptive_lb.tools.cli import HelpFormatter
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

VARIANTS = ("plan", "event", "request", "brief")


class _Dropping(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _policy(provider: Any, *, handoff: bool, brief: bool = False) -> tuple[Any, Any]:
    model = build_cluster({"dc1": [3, 3, 3]}, real_cluster=False, seed=4)
    config = Config(tracing=TracingConfig(candidates_ratio=0.0)) if brief else Config()
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, tracer_provider=provider
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    for index, host in enumerate(model.hosts):  # some load to score
        for _ in range(index % 3):
            policy.stats.get(host).in_flight += 1
    policy.tracking_attached()  # no warning: this benchmark has no session to track
    policy.decisions.send_to_requests(handoff, without_parent=handoff)
    return model, policy


def _round(run: Callable[[], None], count: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        for _ in range(count):
            run()
        return (time.thread_time() - start) / count
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Measure and print JSON."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/decision_record.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds")
    parser.add_argument("--decisions", type=int, default=2000, help="decisions per round")
    figures.add_record_option(parser)
    args = parser.parse_args(argv)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropping(), max_queue_size=1 << 16))
    tracer = provider.get_tracer("benchmark")
    _, direct = _policy(provider, handoff=False)
    _, handing = _policy(provider, handoff=True)
    _, briefing = _policy(provider, handoff=True, brief=True)
    statement = SimpleStatement(
        "SELECT v FROM ks.t WHERE k = ?",
        routing_key=murmur3_routing_keys(1, seed=9)[0],
        keyspace="ks",
    )
    start_span = tracer.start_span
    in_context = trace.set_span_in_context
    not_recording = in_context(trace.INVALID_SPAN)

    # Each iteration is a request: a recording span started, current while the plan is
    # made, then ended (exported on the processor's thread, whose CPU time is not counted).
    def plan() -> None:
        span = start_span("request")
        token = context.attach(not_recording)  # as costly as attaching the span's own
        next(iter(direct.make_query_plan("ks", statement)))
        context.detach(token)
        span.end()

    def event() -> None:
        span = start_span("request")
        token = context.attach(in_context(span))
        next(iter(direct.make_query_plan("ks", statement)))
        context.detach(token)
        span.end()

    def handed_over(policy: Any) -> Callable[[], None]:
        def run() -> None:
            token = context.attach(not_recording)
            next(iter(policy.make_query_plan("ks", statement)))
            context.detach(token)
            pending = policy.decisions.take(statement)
            span = start_span("request", attributes=policy.decisions.request_attributes(pending))
            span.end()

        return run

    request, brief = handed_over(handing), handed_over(briefing)

    runs = {"plan": plan, "event": event, "request": request, "brief": brief}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            times[name].append(_round(runs[name], args.decisions))
    baseline = statistics.median(times["plan"])
    result: dict[str, Any] = {"baseline_us": round(baseline * 1e6, 2)}
    for name in VARIANTS[1:]:
        cost = [v - p for v, p in zip(times[name], times["plan"], strict=True)]
        quartiles = statistics.quantiles(cost, n=4)
        result[f"{name}_cost_us"] = round(statistics.median(cost) * 1e6, 2)
        result[f"{name}_cost_iqr_us"] = [round(quartiles[0] * 1e6, 2), round(quartiles[2] * 1e6, 2)]
        result[f"{name}_ratio"] = round(statistics.median(times[name]) / baseline, 2)
    print(json.dumps(result))
    provider.shutdown()
    figures.record_run("decision_record", args.record, result, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
