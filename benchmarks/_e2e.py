"""Helpers of ``benchmarks/e2e_overhead.py``: Simulacron, the variants, the closed loop and
the statistics. Not a public module; nothing here changes the library.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import _e2e_traced
from opentelemetry import context, trace

from adaptive_lb.tools.peers.connect import connect_driver, wait_for_pools
from adaptive_lb.tools.peers.simulacron import Simulacron, ensure_simulacron_jar, pick_node_ip

QUERY = "SELECT v FROM ks.t WHERE k = ?"
CLUSTER = "e2e"
DC = "dc1"
NODES = 3
RF = 2


# ------------------------------------------------------------------------------------------
# Simulacron
# ------------------------------------------------------------------------------------------


class Sim(Simulacron):
    """One Simulacron JVM on loopback (stock jar, activity log off), killed by PID on
    :meth:`stop` and by the kernel if this process dies first (``die_with_parent``: a
    benchmark killed with SIGKILL must not leave a JVM behind on a shared machine)."""

    def __init__(self, startup_timeout: float = 60.0) -> None:
        super().__init__(
            ensure_simulacron_jar(),
            node_ip=pick_node_ip(NODES),
            activity_logging=False,
            startup_timeout=startup_timeout,
            jvm_args=("-Xmx256m",),
            die_with_parent=True,
        )

    def setup_cluster(self) -> list[str]:
        """3 nodes in one DC (racks r1..r3), keyspace ``ks`` NTS RF 2, the prepared
        ``QUERY`` answering one row at once. Returns the node addresses."""
        nodes = self.create_cluster(CLUSTER, [["r1", "r2", "r3"]])[DC]
        self.prime_keyspace("ks", {DC: RF})
        self.prime(QUERY, [{"v": 1}], {"v": "int"}, param_types={"k": "int"})
        return nodes


# ------------------------------------------------------------------------------------------
# OpenTelemetry
# ------------------------------------------------------------------------------------------


def otel_provider() -> tuple[Any, Any]:
    """An SDK TracerProvider (sampling everything) whose spans go, through a
    SimpleSpanProcessor, to an exporter that only counts them. Returns (provider, exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from adaptive_lb.telemetry.tracing import EVENT_NAME

    class CountingExporter(SpanExporter):
        """Drops spans; counts them (and, while ``inspect`` is on, their decision events)."""

        def __init__(self) -> None:
            self.spans = 0
            self.inspect = False
            self.inspected = 0
            self.with_decision = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            self.spans += len(spans)
            if self.inspect:
                for span in spans:
                    self.inspected += 1
                    attributes = span.attributes or {}
                    if "adaptive_lb.position" in attributes or any(
                        e.name == EVENT_NAME for e in span.events
                    ):
                        self.with_decision += 1
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


# ------------------------------------------------------------------------------------------
# Variants
# ------------------------------------------------------------------------------------------

VARIANTS = {
    "stock": "TokenAwarePolicy(DCAwareRoundRobinPolicy('dc1')), the reference",
    "adaptive": "the same wrapped by AdaptiveLoadBalancingPolicy, adaptive_lb.instrument(session)",
    "adaptive-attach": "the same with adaptive_lb.attach(session): request spans on, none "
    "recording",
    "adaptive-otel": "adaptive + a recording OTel parent span per request (decision recorded)",
    "adaptive-spans": "adaptive-attach + that parent span: a request span per request, decision "
    "on it",
    "stock-otel": "stock + the same parent span per request (what the span alone costs)",
    "adaptive-untracked": "diagnostic: adaptive without instrument() (its plan alone)",
    "adaptive-few": "diagnostic: adaptive with tracking.samples_per_host 1 (the listener and "
    "the sampler's pick on every request, next to none tracked)",
    "adaptive-pools": "diagnostic: adaptive without instrument(), in-flight read from the "
    "pools, health refreshed: what it costs when no request is tracked nor sampled",
    "adaptive-one-in-11": "diagnostic: adaptive with the sampler pinned at one request in 11 "
    "(3,500 requests/s on 3 nodes; for e2e_instructions, where valgrind's pace tracks all)",
    "adaptive-every": "diagnostic: adaptive with tracking.samples_per_host 0 (every request "
    "tracked, as before sampling)",
    "stock-hooked": "diagnostic: stock, each future hooked as tracking does, attempts ignored "
    "(what the hook alone costs)",
    "stock-listener": "diagnostic: stock with a request-init listener that does nothing",
    "stock-reclassed": "diagnostic: stock, each future given the hook's attribute and switched "
    "to a subclass that overrides nothing (the hook without its method calls)",
    "stock-tracked": "diagnostic: stock routing, each attempt tracked into a side adaptive "
    "policy's statistics (tracking's cost without its routing)",
    **_e2e_traced.TRACED,
    "stock-shuffled": "diagnostic: TokenAwarePolicy(..., shuffle_replicas=True): stock that "
    "spreads each key over its replicas, as adaptive-lb does",
}


class _IgnoredAttempts:
    """What ``stock-hooked`` gives each hooked future: it hears every attempt, does nothing."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def sent(self, host: Any) -> None:
        pass

    def not_sent(self, host: Any) -> None:
        pass

    def answered(self, host: Any, response: Any) -> None:
        pass

    def ended(self, exception: Any) -> None:
        pass


class Variant:
    """One variant: its own Cluster and Session, connected once, and its closed loop."""

    def __init__(self, name: str, contact_points: list[str]) -> None:
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

        from adaptive_lb import AdaptiveLoadBalancingPolicy, attach, instrument

        self.name = name
        self.adaptive = name.startswith("adaptive")
        self.provider = self.exporter = None
        if name.endswith(("-otel", "-spans")):
            self.provider, self.exporter = otel_provider()
        elif name in _e2e_traced.TRACED:
            self.provider, self.exporter = _e2e_traced.batch_provider()
        # Each driver's default for the reference (scylla-driver shuffles, cassandra-driver
        # does not).
        shuffle = {"shuffle_replicas": True} if name == "stock-shuffled" else {}
        child = TokenAwarePolicy(DCAwareRoundRobinPolicy(DC), **shuffle)
        config = None
        if name in ("adaptive-every", "adaptive-few"):
            from adaptive_lb.config import Config, TrackingConfig

            per_host = 0 if name == "adaptive-every" else 1
            config = Config(tracking=TrackingConfig(samples_per_host=per_host))
        elif name in _e2e_traced.CONFIGS:
            config = _e2e_traced.config_of(name)
        self.policy: Any = (
            AdaptiveLoadBalancingPolicy(child, config, tracer_provider=self.provider)
            if self.adaptive
            else child
        )
        self.cluster, self.session = connect_driver(contact_points, self.policy)
        try:
            if name in ("adaptive-attach", "adaptive-spans") or name in _e2e_traced.CONFIGS:
                self.tracker = attach(self.session, tracer_provider=self.provider).tracker
            elif name == "adaptive-untracked":
                self.tracker = None
            elif name == "adaptive-pools":
                from adaptive_lb.runtime._driver import pool_in_flight_reader

                self.tracker = None
                self.policy.stats.add_in_flight_source(pool_in_flight_reader(self.session))
                self.policy.tracking_attached()
                self.policy.start_health_refresh()
            else:
                self.tracker = instrument(self.session) if self.adaptive else None
            if name == "adaptive-one-in-11":
                # k pinned at what 3,500 requests/s on 3 nodes gets (valgrind runs ~50x
                # slower: its measured rate would track every request).
                sampler = self.policy.sampler
                sampler.every = 11
                sampler.now_ns = lambda: sampler._last_ns
            if name == "stock-hooked":
                from adaptive_lb.runtime._driver import hook_future

                ignored = _IgnoredAttempts()
                self.session.add_request_init_listener(lambda f: hook_future(f, ignored))
            elif name == "stock-instr":
                _e2e_traced.instrument_session(self.session, self.provider)
            elif name == "stock-listener":
                self.session.add_request_init_listener(lambda f: None)
            elif name == "stock-reclassed":
                from cassandra.cluster import ResponseFuture

                class Reclassed(ResponseFuture):
                    __slots__ = ()

                def reclass(future: Any) -> None:
                    future._adaptive_lb_attempts = None
                    future.__class__ = Reclassed

                self.session.add_request_init_listener(reclass)
            elif name == "stock-tracked":
                from adaptive_lb.runtime._driver import hook_future
                from adaptive_lb.runtime.attempts import Attempts

                side = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy(DC)))
                side.populate(self.cluster, list(self.cluster.metadata.all_hosts()))
                side.tracking_attached()
                self.side = side

                def track(future: Any) -> None:
                    hook_future(future, Attempts.of(side))

                self.session.add_request_init_listener(track)
            if not wait_for_pools(self.session, DC, timeout=30.0):
                raise RuntimeError(f"{name}: the driver's pools to {DC} did not open in 30 s")
            self.prepared = self.session.prepare(QUERY)
        except BaseException:
            self.shutdown()
            raise
        # The traced variants trace every request themselves: no parent span of the loop's.
        tracer = (
            self.provider.get_tracer("e2e_overhead")
            if self.provider and name not in _e2e_traced.TRACED
            else None
        )
        self.loop = ClosedLoop(self.session, self.prepared, tracer)

    def park(self) -> None:
        """Stop the health-refresh thread while another variant is timed (its cost belongs
        to this variant's rounds only)."""
        if self.adaptive:
            self.policy.stop_health_refresh()

    def unpark(self) -> None:
        if self.adaptive:
            self.policy.start_health_refresh()

    def verify(self, keys: Sequence[int], count: int = 200) -> dict[str, Any]:
        """Synchronous requests checking token-aware routing (the coordinator is a replica
        of the key), tracking, and (``-otel``) that each parent span got a decision."""
        metadata = self.cluster.metadata
        pk = self.prepared.routing_key_indexes
        on_replica = 0
        if self.exporter is not None:
            self.provider.force_flush()  # the warm-up's spans are not inspected
            self.exporter.inspect, self.exporter.inspected = True, 0
            self.exporter.with_decision = 0
        tracer = self.loop.tracer
        for k in keys[:count]:
            bound = self.prepared.bind((k,))
            replicas = metadata.get_replicas("ks", bound.routing_key)
            if tracer is not None:
                with tracer.start_as_current_span("request"):
                    future = self.session.execute_async(bound)
            else:
                future = self.session.execute_async(bound)
            future.result()
            on_replica += future.coordinator_host in replicas
        out: dict[str, Any] = {
            "requests": count,
            "coordinator_is_replica": on_replica,
            "routing_key_indexes": pk,
            "replicas_per_key": len(metadata.get_replicas("ks", bound.routing_key)),
        }
        if self.exporter is not None:
            self.provider.force_flush()
            self.exporter.inspect = False
            out["spans_with_decision"] = self.exporter.with_decision
        if self.tracker is not None:
            out["untracked_requests"] = self.tracker.untracked_requests
            out["internal_errors"] = self.policy.internal_errors
        return out

    def counters(self) -> dict[str, Any]:
        """End-of-run consistency numbers."""
        out: dict[str, Any] = {}
        if self.tracker is not None:
            stats = [self.policy.stats.peek(h) for h in self.cluster.metadata.all_hosts()]
            out["tracked_requests"] = sum(s.requests_total for s in stats if s is not None)
            out["in_flight_now"] = sum(s.in_flight for s in stats if s is not None)
            out["untracked_requests"] = self.tracker.untracked_requests
            out["internal_errors"] = self.policy.internal_errors
        if self.exporter is not None:
            self.provider.force_flush()
            out["spans_exported"] = self.exporter.spans
        return out

    def shutdown(self) -> None:
        self.cluster.shutdown()
        if self.provider is not None:
            self.provider.shutdown()


# ------------------------------------------------------------------------------------------
# The closed loop
# ------------------------------------------------------------------------------------------


class ClosedLoop:
    """``concurrency`` requests always in flight, from one process: each completion (on the
    driver's event-loop thread) sends the next request until the round's time is up; then
    the round waits for the last ones (every request sent in a round completes in it).

    With a ``tracer``, each request gets a parent span, current while ``execute_async``
    builds the query plan (where the policy records its decision) and ended when the
    request completes.
    """

    def __init__(self, session: Any, prepared: Any, tracer: Any | None) -> None:
        self.session = session
        self.prepared = prepared
        self.tracer = tracer
        self.keys: Sequence[int] = (0,)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stop_at = 0.0
        self._next_key = 0
        self.in_flight = 0
        self.completed = 0
        self.errors = 0
        self.error_types: dict[str, int] = {}

    # The issuing and completion paths are kept minimal and identical for every variant
    # except for the span (two separate issue functions, no per-request branch).

    def _issue_plain(self) -> None:
        with self._lock:
            i = self._next_key
            self._next_key = i + 1
            self.in_flight += 1
        keys = self.keys
        try:
            future = self.session.execute_async(self.prepared, (keys[i % len(keys)],))
        except Exception as exc:
            self._failed(exc, None)
            return
        future.add_callbacks(self._ok, self._failed, callback_args=(None,), errback_args=(None,))

    def _issue_traced(self) -> None:
        with self._lock:
            i = self._next_key
            self._next_key = i + 1
            self.in_flight += 1
        keys = self.keys
        span = self.tracer.start_span("request")
        token = context.attach(trace.set_span_in_context(span))
        try:
            future = self.session.execute_async(self.prepared, (keys[i % len(keys)],))
        except Exception as exc:
            context.detach(token)
            self._failed(exc, span)
            return
        context.detach(token)
        future.add_callbacks(self._ok, self._failed, callback_args=(span,), errback_args=(span,))

    def _ok(self, _rows: Any, span: Any) -> None:
        if span is not None:
            span.end()
        with self._lock:
            self.in_flight -= 1
            self.completed += 1
            more = time.perf_counter() < self._stop_at
            idle = self.in_flight == 0
        if more:
            self._issue()
        elif idle:
            self._done.set()

    def _failed(self, exc: BaseException, span: Any) -> None:
        if span is not None:
            span.end()
        name = type(exc).__name__
        with self._lock:
            self.in_flight -= 1
            self.errors += 1
            self.error_types[name] = self.error_types.get(name, 0) + 1
            idle = self.in_flight == 0
        # A failure does not send the next request (a dead cluster must end the round,
        # not spin); errors are reported and any error fails the run's validity.
        if idle:
            self._done.set()

    def run(
        self, seconds: float, concurrency: int, keys: Sequence[int], drain_timeout: float
    ) -> dict[str, float]:
        """One round: requests, seconds, CPU seconds of the whole process, errors."""
        self._issue = self._issue_traced if self.tracer is not None else self._issue_plain
        self.keys = keys
        self.completed = self.errors = 0
        self.error_types = {}
        self._done.clear()
        times0 = os.times()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        self._stop_at = t0 + seconds
        for _ in range(concurrency):
            self._issue()
        if not self._done.wait(seconds + drain_timeout):
            raise RuntimeError(
                f"round did not drain: {self.in_flight} requests still in flight "
                f"{drain_timeout:.0f} s after the end"
            )
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        times1 = os.times()
        return {
            "requests": self.completed,
            "errors": self.errors,
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "sys_seconds": times1.system - times0.system,
            "req_per_s": self.completed / elapsed,
            "cpu_us_per_req": cpu / max(1, self.completed) * 1e6,
        }


# ------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------


def median_ci(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Median with its distribution-free (order-statistic, binomial) confidence interval:
    ``[x_(j), x_(n+1-j)]`` for the highest j whose coverage is still >= ``level``. With too
    few values for ``level`` it is ``[min, max]``, and ``coverage`` says how much that is
    (5 values: 93.8 %; 6: 96.9 %; 30: [x_(10), x_(21)], 95.7 %)."""
    xs = sorted(values)
    n = len(xs)

    def coverage(j: int) -> float:  # of [x_(j), x_(n+1-j)]: 1 - 2 P(B <= j-1), B ~ Bin(n, 1/2)
        return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n

    j = 1
    while 2 * (j + 1) <= n and coverage(j + 1) >= level:
        j += 1
    return {
        "median": statistics.median(xs),
        "lo": xs[j - 1],
        "hi": xs[n - j],
        "coverage": coverage(j),
        "n": n,
    }


def verdict(ci: dict[str, float], neutral: float, unit: str, scale: float = 1.0) -> str:
    """A sentence on the effect (median - neutral) against the interval's width."""
    effect = (ci["median"] - neutral) * scale
    width = (ci["hi"] - ci["lo"]) * scale
    parts = []
    if ci["lo"] <= neutral <= ci["hi"]:
        parts.append("CI includes no change")
    if width > abs(effect):
        parts.append(f"CI width {width:.1f}{unit} > effect {abs(effect):.1f}{unit}")
    return "; ".join(parts) if parts else "resolved"


def key_sequence(count: int, seed: int) -> list[int]:
    """``count`` distinct partition keys in a random order (the same for every variant)."""
    keys = list(range(count))
    random.Random(seed).shuffle(keys)
    return keys


def run_rounds(
    variants: dict[str, Variant],
    rounds: int,
    seconds: float,
    concurrency: int,
    keys: Sequence[int],
    seed: int,
    drain_timeout: float,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    """``rounds`` rounds, each timing every variant once in a shuffled order, the cyclic GC
    disabled while timing (and frozen by the caller beforehand)."""
    import gc

    rng = random.Random(seed)
    names = list(variants)
    out = []
    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        measured: dict[str, Any] = {}
        for name in order:
            for other in variants.values():
                if other.name != name:
                    other.park()
            variants[name].unpark()
            gc.collect()
            gc.disable()
            try:
                measured[name] = variants[name].loop.run(seconds, concurrency, keys, drain_timeout)
            finally:
                gc.enable()
        out.append({"round": r + 1, "order": order, "variants": measured})
        progress(
            f"round {r + 1}/{rounds}: "
            + ", ".join(
                f"{n} {measured[n]['req_per_s']:,.0f}/s {measured[n]['cpu_us_per_req']:.0f}us"
                for n in names
            )
        )
    return out
