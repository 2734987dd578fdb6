"""End to end under faults: the real driver, ``AdaptiveLoadBalancingPolicy`` and
``instrument(session)`` against a 3-node Simulacron cluster while, at the same time,

* one node drops connections mid-request (its connections are closed through the REST API,
  and for a while it is primed to close the connection on some keys);
* another node stalls (``pause-reads``) for a few seconds, twice;
* the config is reloaded from YAML files again and again (two valid ones, one invalid);
* the OTLP collector is down (spans go to a closed port) while every request runs inside a
  recording span of that provider, so every decision is traced.

Every request must end (callback or errback, exactly once) within the client timeout plus a
margin (scylla-driver may hold the caller inside ``execute_async`` for its 2 s connection
borrow wait, see ``POOL_BORROW_TIMEOUT``; such requests get that bound instead, and may
get their timeout errback twice: see ``Loop.driver_repeats``);
afterwards nothing is left in flight, no release underflowed, the policy caught no internal
error and the driver logged no callback error or traceback.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cassandra import OperationTimedOut
from cassandra.connection import ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, HostStateListener, TokenAwarePolicy
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor

from adaptive_lb import AdaptiveLoadBalancingPolicy, ConfigError, instrument
from adaptive_lb.config import load_config
from adaptive_lb.exporters import setup_tracing
from adaptive_lb.telemetry.tracing import EVENT_NAME, SPAN_NAME
from tests.integration.simulacron import (
    ERROR_RESULTS,
    Simulacron,
    free_tcp_port,
    wait_for_pools,
)

pytestmark = pytest.mark.integration

CLUSTER = "faults"
REQUEST_SPAN = "faults.request"
QUERY = "SELECT v FROM ks.t WHERE k = ?"
ROWS: dict[str, Any] = {"rows": [{"v": 7}], "column_types": {"v": "int"}}
PARAMS: dict[str, Any] = {"param_types": {"k": "int"}}

KEYS = 1000
#: Keys the dropping node answers by closing the connection (during the close window).
CLOSING_KEYS = range(7, KEYS, 100)
CONCURRENCY = 8
LOAD_SECONDS = 10.0
CLIENT_TIMEOUT = 1.0
#: Slack for the 2 shared cores: the driver's timer and callbacks run on a busy event loop.
MARGIN = 1.0
#: scylla-driver's ``ResponseFuture._query`` borrows a connection with a hard-coded 2 s wait
#: (``pool.borrow_connection(timeout=2.0)``) that ignores the request timeout: when a node's
#: connection has just been closed and the pool still holds it, ``execute_async`` blocks the
#: caller until this wait ends (reproduced with the stock TokenAwarePolicy, without
#: adaptive_lb; cassandra-driver 3.30 fails such a borrow at once).
POOL_BORROW_TIMEOUT = 2.0
SCYLLA_DRIVER = importlib.util.find_spec("cassandra.shard_info") is not None
#: After the load stops, how long every outstanding request may take to call back.
DRAIN_SECONDS = CLIENT_TIMEOUT + MARGIN + 2.0

TRACING = """
tracing:
  enabled: true
  mode: {mode}
  otlp:
    endpoint: http://127.0.0.1:{port}
    protocol: http
    timeout: 500ms
"""
CONFIG_A = """
tracking:
  window: 2s
  intervals: 4
health:
  refresh_interval: 100ms
  min_samples: 20
  slow_start: 1s
  min_state_duration: 500ms
  stall_timeout: 500ms
"""
CONFIG_B = """
tracking:
  window: 5s
  intervals: 5
health:
  percentile: 90
  outlier_factor: 2.5
  refresh_interval: 50ms
  min_samples: 10
  slow_start: 2s
  min_state_duration: 1s
  stall_timeout: 1s
  error_rate: 0.4
"""
# Not a config: an interval count out of range, and a key that does not exist.
CONFIG_BAD = """
tracking:
  intervals: 0
health:
  no_such_key: 1
"""


@pytest.fixture(scope="module")
def nodes(simulacron: Simulacron) -> Iterator[list[str]]:
    created = simulacron.create_cluster(CLUSTER, [["r1", "r2", "r3"]])
    try:
        simulacron.prime_keyspace("ks", {"dc1": 2})
        simulacron.prime(QUERY, **ROWS, **PARAMS)
        yield created["dc1"]
    finally:
        simulacron.remove_cluster(CLUSTER)


@pytest.fixture
def config_files(tmp_path: Path) -> dict[str, Path]:
    port = free_tcp_port()  # nothing listens there: the collector is down
    files = {
        "a": CONFIG_A + TRACING.format(mode="event", port=port),
        "b": CONFIG_B + TRACING.format(mode="span", port=port),
        "bad": CONFIG_BAD,
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text)
    return paths


class Records(logging.Handler):
    """Keeps every record of a logger tree (at DEBUG) while installed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)

    def bad(self) -> list[str]:
        """Callback errors and tracebacks, except the driver's own handling of a broken
        socket (e.g. ``Defuncting connection ... ConnectionResetError`` at DEBUG, which the
        connection drops provoke on purpose)."""
        return [_describe(r) for r in list(self.records) if not _expected(r)]

    def expected_tracebacks(self) -> int:
        return sum(1 for r in list(self.records) if r.exc_info and _expected(r))


def _describe(record: logging.LogRecord) -> str:
    return f"{record.name} {record.levelname}: {record.getMessage()[:300]} exc={record.exc_info!r}"


def _expected(record: logging.LogRecord) -> bool:
    """False for a record that reports a callback error or an unexpected traceback."""
    text = record.getMessage().lower()
    if "errored" in text or "traceback" in text:
        return False
    if not record.exc_info:
        return True
    exc = record.exc_info[1]
    tb = record.exc_info[2]
    while tb is not None:
        if "adaptive_lb" in tb.tb_frame.f_code.co_filename:
            return False  # raised through the library
        tb = tb.tb_next
    if not isinstance(exc, (OSError, ConnectionException)):
        return False
    if record.levelno < logging.WARNING:
        return True
    # The driver re-creating a pool while the test drops that node's connections, so the
    # new connection is closed in its handshake (seen once in CI: a WARNING with the
    # ConnectionShutdown attached). The driver's own handling of the injected fault.
    return text.startswith("failed to create connection pool for new host")


class capture_logs:
    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)
        self.handler = Records()

    def __enter__(self) -> Records:
        self.level = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self.handler)
        return self.handler

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


class Request:
    """One request of the loop: when it was submitted and what became of it."""

    __slots__ = ("done", "error", "future", "i", "span", "start", "submit_s")

    def __init__(self, i: int, span: Any) -> None:
        self.i = i
        self.span = span
        self.done = False
        self.error: BaseException | None = None  # the first outcome's error, if any
        self.future: Any = None
        self.start = time.perf_counter()
        self.submit_s = 0.0  # time spent inside execute_async


class Loop:
    """``CONCURRENCY`` requests in flight with ``execute_async``, each in its own recording
    span, its wall time measured from submit to callback / errback."""

    def __init__(self, session: Any, statement: Any, tracer: Any, bound: float) -> None:
        self.session = session
        self.statement = statement
        self.tracer = tracer
        self.bound = bound
        self.slots = threading.Semaphore(CONCURRENCY)
        self.lock = threading.Lock()
        self.submitted = 0
        self.completed = 0
        self.duplicates = 0
        # Requests the driver held inside execute_async past the client timeout whose
        # OperationTimedOut errback it then ran again: its timer times the request out while
        # the send waits for a connection, and when the wait ends without one, send_request
        # times it out a second time (both drivers' ResponseFuture; the bare future does it
        # too, with no policy and no server). Not ours to prevent: the future is the driver's.
        self.driver_repeats: list[str] = []
        self.not_recording = 0
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.late: list[str] = []  # requests slower than ``bound``, described
        self.blocked: list[str] = []  # requests that blocked the caller in execute_async
        self.pending: dict[int, Request] = {}
        self.idle = threading.Event()
        self.idle.set()

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            if self.slots.acquire(timeout=0.05):
                self.submit(i)
                i += 1

    def submit(self, i: int) -> None:
        span = self.tracer.start_span(REQUEST_SPAN)
        if not span.is_recording():
            self.not_recording += 1
        request = Request(i, span)
        with self.lock:
            self.submitted += 1
            self.idle.clear()
            self.pending[i] = request
        try:
            with trace.use_span(span, end_on_exit=False):
                request.future = self.session.execute_async(self.statement, [i % KEYS])
        except Exception as exc:  # execute_async itself refused: still one outcome
            request.submit_s = time.perf_counter() - request.start
            self.finish(exc, request)
            return
        request.submit_s = time.perf_counter() - request.start
        request.future.add_callbacks(
            self.finish_ok, self.finish, callback_args=(request,), errback_args=(request,)
        )

    def finish_ok(self, _rows: Any, request: Request) -> None:
        self.finish(None, request)

    def finish(self, error: BaseException | None, request: Request) -> None:
        elapsed = time.perf_counter() - request.start
        future = request.future
        hosts = [h.address for h in getattr(future, "attempted_hosts", None) or ()]
        with self.lock:
            if request.done:
                if (
                    request.submit_s > CLIENT_TIMEOUT
                    and isinstance(error, OperationTimedOut)
                    and isinstance(request.error, OperationTimedOut)
                ):
                    self.driver_repeats.append(f"request {request.i}: {error!r:.200}")
                else:
                    self.duplicates += 1
                return
            request.done = True
            request.error = error
            self.completed += 1
            self.pending.pop(request.i, None)
            self.latencies.append(elapsed)
            self.attempts.update(hosts)
            if error is not None:
                self.errors[type(error).__name__] += 1
            described = (
                f"{elapsed:.3f} s (in execute_async {request.submit_s:.3f} s) hosts {hosts} "
                f"error {error!r:.300}"
            )
            bound = self.bound
            if request.submit_s > CLIENT_TIMEOUT:
                # The driver held the caller inside execute_async past the client timeout
                # (scylla-driver: waiting for a stream on a connection that was just closed).
                self.blocked.append(described)
                bound = POOL_BORROW_TIMEOUT + MARGIN
            if elapsed > bound:
                self.late.append(described)
            if not self.pending:
                self.idle.set()
        request.span.end()
        self.slots.release()

    def outstanding(self) -> list[tuple[int, float]]:
        now = time.perf_counter()
        with self.lock:
            return sorted((i, now - r.start) for i, r in self.pending.items())


class Decisions(SpanProcessor):
    """Counts, as spans end, the request spans and the decisions recorded for them."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def on_end(self, span: Any) -> None:
        if span.name == REQUEST_SPAN:
            self.counts["request spans"] += 1
            if any(e.name == EVENT_NAME for e in span.events):
                self.counts["decision events"] += 1
        elif span.name == SPAN_NAME:
            self.counts["decision spans"] += 1

    @property
    def decisions(self) -> int:
        return self.counts["decision events"] + self.counts["decision spans"]


class Downs(HostStateListener):
    """Counts the driver's DOWN events per address."""

    def __init__(self) -> None:
        self.downs: Counter[str] = Counter()

    def on_down(self, host: Any) -> None:
        self.downs[host.address] += 1

    def on_up(self, host: Any) -> None:
        pass

    def on_add(self, host: Any) -> None:
        pass

    def on_remove(self, host: Any) -> None:
        pass


class Chaos(threading.Thread):
    """Runs ``(at_seconds, name, action)`` steps on schedule; remembers what failed."""

    def __init__(self, steps: list[tuple[float, str, Callable[[], None]]]) -> None:
        super().__init__(name="faults-chaos", daemon=True)
        self.steps = sorted(steps, key=lambda s: s[0])
        self.done: list[str] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        for at, name, action in self.steps:
            if self.stop.wait(max(0.0, t0 + at - time.monotonic())):
                return
            try:
                action()
                self.done.append(name)
            except Exception as exc:  # kept, and reported by the test
                self.failures.append(f"{name}: {type(exc).__name__}: {exc}")


def test_every_request_ends_and_accounting_holds_under_faults(
    simulacron: Simulacron, driver_factory: Any, nodes: list[str], config_files: dict[str, Path]
) -> None:
    t_test = time.monotonic()
    contact, dropping, stalling = nodes
    drop_scope = simulacron.scope_of(dropping, CLUSTER)
    stall_dc, stall_node = simulacron.scope_of(stalling, CLUSTER)

    config = load_config(config_files["a"])
    provider = setup_tracing(config)
    processor = provider.adaptive_lb_processor
    decisions = Decisions()
    provider.add_span_processor(decisions)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, tracer_provider=provider
    )
    reloads: Counter[str] = Counter()

    def reload(name: str) -> None:
        try:
            policy.reload(config_files[name])
            reloads[f"{name} ok"] += 1
        except ConfigError:
            reloads[f"{name} refused"] += 1

    def close_window(on: bool) -> None:
        if on:
            for k in CLOSING_KEYS:
                simulacron.prime(
                    QUERY,
                    result="close_connection",
                    params={"k": k},
                    extra=ERROR_RESULTS["close_connection"],
                    scope=drop_scope,
                    cluster=CLUSTER,
                    **PARAMS,
                )
        else:
            simulacron.clear_primes(drop_scope, cluster=CLUSTER)

    def drop() -> None:
        simulacron.drop_connections(*drop_scope, cluster=CLUSTER)

    def pause() -> None:
        simulacron.pause_reads(stall_dc, stall_node, cluster=CLUSTER)

    def resume() -> None:
        simulacron.resume_reads(stall_dc, stall_node, cluster=CLUSTER)

    steps: list[tuple[float, str, Callable[[], None]]] = [
        (1.0, "pause", pause),
        (1.5, "drop", drop),
        (3.0, "drop", drop),
        (4.0, "resume", resume),
        (5.0, "close-on", lambda: close_window(True)),
        (6.5, "drop", drop),
        (7.0, "pause", pause),
        (8.5, "resume", resume),
        (8.5, "close-off", lambda: close_window(False)),
    ]
    cycle = ["b", "bad", "a"]
    steps += [
        (0.3 + 0.6 * n, f"reload {cycle[n % 3]}", lambda name=cycle[n % 3]: reload(name))
        for n in range(15)
    ]

    with capture_logs("cassandra") as driver_logs, capture_logs("adaptive_lb") as lib_logs:
        try:
            cluster, session = driver_factory(
                policy, contact_points=[contact], request_timeout=CLIENT_TIMEOUT
            )
            instrument(session)
            downs = Downs()
            cluster.register_listener(downs)
            statement = session.prepare(QUERY)
            assert wait_for_pools(session, "dc1", timeout=10.0), session.get_pool_state()
            loop = Loop(
                session,
                statement,
                provider.get_tracer("adaptive_lb.tests.faults"),
                CLIENT_TIMEOUT + MARGIN,
            )
            chaos = Chaos(steps)
            t_load = time.monotonic()
            chaos.start()
            try:
                loop.run(LOAD_SECONDS)
            finally:
                chaos.stop.set()
                chaos.join(timeout=15)
                # Whatever happened, the nodes serve normally again.
                resume()
                simulacron.clear_primes(drop_scope, cluster=CLUSTER)
            load_seconds = time.monotonic() - t_load
            # Hard deadline: a lost callback fails the test instead of hanging it.
            drained = loop.idle.wait(DRAIN_SECONDS)
            stuck = loop.outstanding()
            hosts = list(cluster.metadata.all_hosts())
            by_address = {h.address: h for h in hosts}
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                in_flight = {h.address: h.in_flight for h in policy.snapshot().hosts}
                if not any(in_flight.values()):
                    break
                time.sleep(0.05)
        finally:
            t_flush = time.monotonic()
            provider.shutdown()
            flush_seconds = time.monotonic() - t_flush

    latencies = sorted(loop.latencies)
    bound = CLIENT_TIMEOUT + MARGIN
    successes = loop.completed - sum(loop.errors.values())
    print(
        f"\nfaults: {loop.submitted} requests in {load_seconds:.1f} s, {successes} ok, "
        f"failures {dict(loop.errors)}, max latency {latencies[-1] * 1000:.0f} ms, "
        f"p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.0f} ms; over the bound "
        f"({bound:.1f} s, {POOL_BORROW_TIMEOUT + MARGIN:.1f} s when held in execute_async): "
        f"{len(loop.late)}; held in execute_async past the client timeout: {len(loop.blocked)}"
    )
    for line in loop.late[:10]:
        print(f"faults: late: {line}")
    for line in loop.blocked[:10]:
        print(f"faults: blocked in execute_async by the driver: {line}")
    for line in loop.driver_repeats[:10]:
        print(f"faults: timeout errback run twice by the driver, held in execute_async: {line}")
    print(f"faults: chaos steps done {Counter(chaos.done)}; reloads {dict(reloads)}")
    exported = getattr(processor, "exported_spans", 0)
    print(
        f"faults: spans {dict(decisions.counts)}; to the dead collector: exported {exported}, "
        f"dropped {getattr(processor, 'dropped_spans', '?')}; "
        f"provider shutdown {flush_seconds:.2f} s"
    )
    print(f"faults: in flight after load {in_flight}; internal errors {policy.internal_errors}")
    for host in sorted(hosts, key=lambda h: h.address):
        st = policy.stats.peek(host)
        if st is not None:
            print(
                f"faults: {host.address} requests {st.requests_total} errors {st.errors_total} "
                f"timeouts {st.timeouts_total} abandons {st.abandons_total} "
                f"unsent {st.unsent_total} underflows {st.underflows}; "
                f"driver DOWN events {downs.downs[host.address]}"
            )
    print(
        f"faults: driver tracebacks of broken sockets (expected) "
        f"{driver_logs.expected_tracebacks()}; other driver records flagged "
        f"{len(driver_logs.bad())}"
    )
    print(f"faults: test wall time {time.monotonic() - t_test:.1f} s")

    assert not chaos.failures, chaos.failures
    assert not chaos.is_alive()
    # Every request called back exactly once, in time.
    assert drained, f"{len(stuck)} requests never called back: {stuck[:10]}"
    assert loop.completed == loop.submitted
    assert loop.duplicates == 0
    assert len(loop.driver_repeats) <= len(loop.blocked)
    if not SCYLLA_DRIVER:
        assert not loop.blocked, loop.blocked[:5]
    assert not loop.late, f"{len(loop.late)} requests took more than {bound} s: {loop.late[:5]}"
    assert loop.not_recording == 0
    assert successes > 0.5 * loop.submitted
    # The faults were real: timeouts on the stalled node, broken connections on the other,
    # and tracking saw attempts caught by them: sent into a breaking connection (an error)
    # or counted, then not written for want of a connection (unsent). Which of the two
    # depends on what was in flight at each drop: in some scylla-driver runs the node,
    # marked down at the first drop and WARMING after, had nothing in flight at any later
    # one (errors 0, unsent 1).
    assert loop.errors["OperationTimedOut"] > 0
    # The stall seen on its node: a user request timed out there, or the probe sent to it
    # did (when the probe is what caught the stall first, the node was ERRORING before a
    # user request of the sample could time out there).
    stalled = policy.stats.peek(by_address[stalling])
    assert stalled.timeouts_total + stalled.probes.timed_out > 0, stalled.probes.sent
    dropped = policy.stats.peek(by_address[dropping])
    assert dropped.errors_total + dropped.unsent_total > 0
    assert downs.downs[dropping] > 0
    # Reloads: every valid file taken, the invalid one refused every time.
    assert reloads["a ok"] == 5 and reloads["b ok"] == 5 and reloads["bad refused"] == 5
    assert not reloads["bad ok"] and not reloads["a refused"] and not reloads["b refused"]
    # Tracing: every request ran in a recording span holding its decision; nothing exported.
    assert decisions.counts["request spans"] == loop.submitted
    assert decisions.decisions == loop.submitted  # one plan per request, retries included
    assert exported == 0
    # Accounting.
    assert not any(in_flight.values()), in_flight
    for host in hosts:
        stats = policy.stats.peek(host)
        assert stats is not None, host
        assert stats.counted_in_flight == 0, host
        assert stats.underflows == 0, host
    assert policy.internal_errors == 0, policy.internal_errors_by_stage
    assert not driver_logs.bad(), driver_logs.bad()[:10]
    lib_errors = [
        r.getMessage()
        for r in lib_logs.records
        if r.levelno >= logging.ERROR and "config reload" not in r.getMessage()
    ]
    # The library's own errors: only the refused reloads (export failures are warnings).
    assert not lib_errors, lib_errors[:10]
