"""How much a dead OTLP collector slows traced query plans.

    python benchmarks/dead_collector.py [--seconds 0.5] [--rounds 7] [--timeout 0.5]

For each protocol (``http``, ``grpc``) and failure mode -- ``closed`` (a port nothing
listens on: connection refused) and ``hung`` (a socket that accepts and never answers) --
an application thread makes traced plans (each plan under its own recording "request"
span, the decision recorded on it) as fast as it can, with ``setup_tracing`` pointed at
the dead endpoint (A) and, in the same rounds, with a no-op exporter (B: same processor,
same spans, nothing sent). Rounds are interleaved (A B, B A, ...) so a noisy neighbour
moves both halves, and each half starts with both span queues drained (not timed); the
slowdown is ``1 - median(per-round A/B rate ratio)``, on wall-clock
rates and on plans per CPU second of the whole process (which charges the export thread's
work to the plans, and moves less with a noisy neighbour on a shared machine). Also
printed: how many calls reached the real OTLP exporter during A (each encodes a batch),
and the CPU the other threads (the export thread) used, as a share of the application
thread's CPU over the A halves (and over the B halves: what the processor costs anyway).
On a shared machine the CPU figures are the steadier ones.

``--timeout`` is ``tracing.otlp.timeout``: at 0.5 s the exporters' own retries (first one
after ~1 s) never fit, so before the backoff fix a closed port made the export thread loop
on encode-and-refuse.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import OtlpConfig, TracingConfig
from adaptive_lb.exporters import setup_tracing
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.sim.driver_topology import build_cluster


class NullExporter(SpanExporter):
    """Accepts every batch and sends nothing (the baseline)."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        """Succeed at once."""
        return SpanExportResult.SUCCESS


@contextmanager
def closed_endpoint() -> Iterator[int]:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


@contextmanager
def hung_endpoint() -> Iterator[int]:
    """A loopback port that accepts connections and never answers; closed on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, name="hung-collector", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        for connection in held:
            connection.close()
        listener.close()


ENDPOINTS: dict[str, Callable[[], Any]] = {"closed": closed_endpoint, "hung": hung_endpoint}


def make_policy(provider: Any) -> AdaptiveLoadBalancingPolicy:
    """A policy over a real driver topology (6 hosts, one DC) tracing to ``provider``."""
    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=6)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(tracing=TracingConfig(mode="event")),
        tracer_provider=provider,
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def real_exporter(provider: Any) -> Any:
    """The OTLP exporter behind the provider's processor (under any wrapper)."""
    exporter = provider.adaptive_lb_processor.exporter
    return getattr(exporter, "exporter", exporter)


def count_calls(exporter: Any) -> list[int]:
    """Count the calls reaching ``exporter.export`` (returned one-element list)."""
    calls = [0]
    export = exporter.export

    def counted(spans: Sequence[Any]) -> SpanExportResult:
        calls[0] += 1
        return export(spans)

    exporter.export = counted
    return calls


def traced_plans(policy: Any, tracer: Any, seconds: float) -> tuple[float, float, float]:
    """Make traced plans for ``seconds``: (plans per second, this thread's CPU seconds,
    plans per CPU second of the process)."""
    statement = SimpleStatement("q", routing_key=b"\x00\x01\x02\x03", keyspace="ks")
    plans = 0
    cpu0, proc0 = time.thread_time(), time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            with tracer.start_as_current_span("request"):
                list(policy.make_query_plan("ks", statement))
        plans += 50
        now = time.perf_counter()
        if now >= deadline:
            break
    return (
        plans / (now - start),
        time.thread_time() - cpu0,
        plans / max(time.process_time() - proc0, 1e-9),
    )


def measure(
    protocol: str, failure: str, seconds: float, rounds: int, timeout: float
) -> dict[str, Any]:
    """Interleaved A (dead endpoint) / B (no-op exporter) rounds for one case."""
    with ENDPOINTS[failure]() as port:
        otlp = OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout=timeout)
        dead = setup_tracing(TracingConfig(otlp=otlp))
        baseline = setup_tracing(TracingConfig(otlp=otlp), exporter=NullExporter())
        try:
            calls = count_calls(real_exporter(dead))
            dead_policy, base_policy = make_policy(dead), make_policy(baseline)
            dead_tracer, base_tracer = dead.get_tracer("app"), baseline.get_tracer("app")
            traced_plans(base_policy, base_tracer, 0.2)  # warm-up
            ratios: list[float] = []
            cpu_ratios: list[float] = []
            app_cpu = other_cpu = 0.0
            base_app_cpu = base_other_cpu = 0.0
            started = time.monotonic()
            for index in range(rounds):
                halves = ["dead", "base"] if index % 2 == 0 else ["base", "dead"]
                rates, per_cpu = {}, {}
                for half in halves:
                    # Start each half with both queues empty: what the dead exporter's
                    # thread still had to do must not be charged to the baseline.
                    dead.force_flush(10_000)
                    baseline.force_flush(10_000)
                    if half == "dead":
                        proc0 = time.process_time()
                        rate, mine, cpu_rate = traced_plans(dead_policy, dead_tracer, seconds)
                        app_cpu += mine
                        other_cpu += time.process_time() - proc0 - mine
                    else:
                        proc0 = time.process_time()
                        rate, mine, cpu_rate = traced_plans(base_policy, base_tracer, seconds)
                        base_app_cpu += mine
                        base_other_cpu += time.process_time() - proc0 - mine
                    rates[half] = rate
                    # plans per CPU second of the process (the application thread's and
                    # every other thread's): less sensitive to a noisy neighbour than
                    # wall-clock, and it charges the export thread's work to the plans.
                    per_cpu[half] = cpu_rate
                ratios.append(rates["dead"] / rates["base"])
                cpu_ratios.append(per_cpu["dead"] / per_cpu["base"])
            elapsed = time.monotonic() - started
            ratio = statistics.median(ratios)
            return {
                "protocol": protocol,
                "failure": failure,
                "slowdown_pct": round(100 * (1 - ratio), 1),
                "cpu_slowdown_pct": round(100 * (1 - statistics.median(cpu_ratios)), 1),
                "ratios": [round(r, 3) for r in ratios],
                "export_calls": calls[0],
                "seconds": round(elapsed, 1),
                "export_thread_cpu_pct": round(100 * other_cpu / app_cpu, 1) if app_cpu else 0,
                "baseline_thread_cpu_pct": (
                    round(100 * base_other_cpu / base_app_cpu, 1) if base_app_cpu else 0
                ),
                "dead_policy_internal_errors": dead_policy.internal_errors,
            }
        finally:
            dead.shutdown()
            baseline.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the slowdown per protocol and failure mode."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per half-round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (A B, B A...)")
    parser.add_argument(
        "--timeout", type=float, default=0.5, help="tracing.otlp.timeout, in seconds"
    )
    parser.add_argument(
        "--protocol",
        choices=["http", "grpc"],
        action="append",
        help="OTLP protocol measured, repeatable (default: both)",
    )
    parser.add_argument(
        "--failure",
        choices=sorted(ENDPOINTS),
        action="append",
        help="failure mode measured, repeatable (default: both)",
    )
    options = parser.parse_args(argv)
    import cassandra

    print(
        f"driver {getattr(cassandra, '__version__', '?')}, Python {sys.version.split()[0]}, "
        f"timeout {options.timeout} s, {options.rounds} rounds x 2 x {options.seconds} s"
    )
    print(
        "| protocol | failure | slowdown (wall) | slowdown (per CPU s) | export calls (in s) "
        "| export-thread CPU (no-op exporter) | wall ratios |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for protocol in options.protocol or ["http", "grpc"]:
        for failure in options.failure or ["closed", "hung"]:
            r = measure(protocol, failure, options.seconds, options.rounds, options.timeout)
            print(
                f"| {protocol} | {failure} | {r['slowdown_pct']:.1f} % | "
                f"{r['cpu_slowdown_pct']:.1f} % | "
                f"{r['export_calls']} ({r['seconds']}) | {r['export_thread_cpu_pct']:.1f} % "
                f"({r['baseline_thread_cpu_pct']:.1f} %) | "
                f"{r['ratios']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
