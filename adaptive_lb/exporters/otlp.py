"""Sending decision spans to Jaeger (or any OTLP receiver), without ever making a request
wait on the network -- or pay for a receiver that is down.

:func:`setup_tracing` builds an OpenTelemetry SDK ``TracerProvider`` whose spans go through
a :class:`BoundedSpanProcessor` -- a fixed-size queue drained by one background thread --
to an OTLP exporter (gRPC or HTTP/protobuf) aimed at the configured endpoint, wrapped in a
:class:`BackoffSpanExporter`. Ending a span is an append to that queue; when the queue is
full (the receiver is down, slow or hung), the span is dropped and counted, never waited
for.

After a failed export the :class:`BackoffSpanExporter` backs off (1 s doubling to 60 s,
with jitter): until then every batch is dropped at once -- never encoded, no network call
-- and counted as ``backoff``. Without it, a receiver that refuses connections made the
export thread encode (in pure Python) and send batch after batch, taking most of the GIL
from the application. The backoff is in the exporter, not in the processor, so it works
under any span processor (the SDK's ``BatchSpanProcessor`` included).

Why not the SDK's ``BatchSpanProcessor``: it also never blocks, but it drops silently (a log
line, no count). Here every span that never reached the receiver is counted, per processor
and process-wide (:func:`span_export_totals`), and the Prometheus collector and the
OpenTelemetry instruments publish the process-wide numbers as
``adaptive_lb_trace_spans_dropped_total{reason="queue_full"|"export_failed"|"backoff"|"shutdown"}``
and ``adaptive_lb_trace_spans_exported_total``.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from attrs import define
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from adaptive_lb.config import Config, TracingConfig

__all__ = [
    "BackoffSpanExporter",
    "BoundedSpanProcessor",
    "ExportCounts",
    "SpanExportTotals",
    "make_otlp_exporter",
    "setup_tracing",
    "span_export_totals",
]

log = logging.getLogger("adaptive_lb.exporters")


@define(frozen=True, slots=True)
class SpanExportTotals:
    """Spans handled by every :class:`BoundedSpanProcessor` and :class:`BackoffSpanExporter`
    of the process, since start."""

    exported: int
    queue_full: int
    """Dropped on arrival: the queue was full (receiver down, slow or hung)."""
    export_failed: int
    """Dropped after the exporter failed (refused, timed out, raised)."""
    shutdown: int
    """Still queued when the processor shut down, or ended after it did."""
    backoff: int = 0
    """Dropped without an export attempt (never encoded, never sent): the exporter was
    backing off after a failure."""

    @property
    def dropped(self) -> int:
        """Every span that never reached a receiver."""
        return self.queue_full + self.export_failed + self.shutdown + self.backoff


@define(frozen=True, slots=True)
class ExportCounts:
    """What became of the spans of one batch handed to
    :meth:`BackoffSpanExporter.export_counted` (names as in :class:`SpanExportTotals`)."""

    exported: int = 0
    export_failed: int = 0
    backoff: int = 0
    shutdown: int = 0


class _Totals:
    """Process-wide counters (they survive processors, so they never go down)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sources = 0
        """Processors and backoff exporters created so far (0: nothing to report)."""
        self.counts = {
            "exported": 0,
            "queue_full": 0,
            "export_failed": 0,
            "shutdown": 0,
            "backoff": 0,
        }

    def add(self, kind: str, count: int = 1) -> None:
        with self.lock:
            self.counts[kind] += count


_TOTALS = _Totals()


def span_export_totals() -> SpanExportTotals | None:
    """The process-wide span counts, or None while no :class:`BoundedSpanProcessor` or
    :class:`BackoffSpanExporter` was ever created (tracing goes elsewhere, or nowhere: there
    is nothing to report)."""
    with _TOTALS.lock:
        if not _TOTALS.sources:
            return None
        return SpanExportTotals(**_TOTALS.counts)


def _safe_endpoint(endpoint: str) -> str:
    """``endpoint`` fit for a log line: without user info, query or fragment (where a
    credential could hide)."""
    try:
        parts = urlsplit(endpoint)
    except ValueError:
        return "<unparsable endpoint>"
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class BackoffSpanExporter(SpanExporter):
    """Wraps ``exporter`` so that a receiver that is down costs (next to) nothing.

    After a failed export -- the exporter returned ``FAILURE`` or raised -- the next calls
    are not passed on: until the backoff delay has passed, each batch is dropped at once,
    without encoding it or touching the network, counted in ``backoff_drops`` and in
    :func:`span_export_totals` as ``backoff``, and ``FAILURE`` is returned. The first call
    after the delay is passed on (while it runs, concurrent calls are dropped too); if it
    fails again the delay doubles. One success resets it.

    That first call is a probe: only the first ``probe_size`` (16) spans of its batch go to
    the exporter (encoding a 512-span batch of decision spans costs more CPU than making
    them); if they get through, the rest of the batch follows at once, otherwise it is
    dropped unsent (``backoff``). ``probe_size=0``: probe with the whole batch.

    The delay after the n-th consecutive failure is ``min(max_delay, initial_delay *
    multiplier ** (n - 1))``, times a random factor in ``[1 - jitter, 1]`` (so that many
    clients that lost the same receiver do not come back in step, and ``max_delay`` is a
    true cap). Defaults: 1 s, 2, 60 s, 0.2 -- 1, 2, 4, ... 32, 60, 60 ... s, each up to 20 %
    shorter. It counts from the end of the failed call, so a hung receiver (each call lasts
    the exporter's timeout) is tried at most once per timeout + delay.

    Exceptions from ``exporter.export`` are counted as failures and never propagated.
    ``force_flush`` and ``shutdown`` are delegated. Calls after ``shutdown`` are dropped
    (counted as ``shutdown``).

    Logging (logger ``adaptive_lb.exporters``, never the header values: pass them as
    ``secrets`` and they are masked in error messages; the endpoint is logged without user
    info or query): a WARNING on the first failure, then at most one WARNING per
    ``log_interval`` (60 s) while it keeps failing, and a WARNING when an export succeeds
    again (so whoever saw the failure sees its end).

    Counters (read them without a lock: they only go up): ``export_calls`` (calls that
    reached ``exporter``), ``exported_spans``, ``failed_spans`` (in calls that failed),
    ``backoff_drops``, ``shutdown_drops``. State: ``consecutive_failures``,
    :attr:`backing_off`, :attr:`retry_in`.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        endpoint: str | None = None,
        initial_delay: float = 1.0,
        max_delay: float = 60.0,
        multiplier: float = 2.0,
        jitter: float = 0.2,
        log_interval: float = 60.0,
        probe_size: int = 16,
        secrets: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if initial_delay <= 0 or max_delay < initial_delay or multiplier < 1:
            raise ValueError("need 0 < initial_delay <= max_delay and multiplier >= 1")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self.exporter = exporter
        self.endpoint = _safe_endpoint(endpoint) if endpoint else type(exporter).__name__
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.multiplier = multiplier
        self.jitter = jitter
        self.log_interval = log_interval
        self.probe_size = max(0, probe_size)
        self._secrets = tuple(secret for secret in secrets if secret)
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._retry_at = -math.inf
        self._last_log = -math.inf
        self._dropped_since_log = 0
        self._failed_since_log = 0
        self._dropped_while_failing = 0
        self._failing_since = 0.0
        self._stopped = False
        self.consecutive_failures = 0
        self.export_calls = 0
        self.exported_spans = 0
        self.failed_spans = 0
        self.backoff_drops = 0
        self.shutdown_drops = 0
        with _TOTALS.lock:
            _TOTALS.sources += 1

    @property
    def backing_off(self) -> bool:
        """True while batches are dropped without an export attempt."""
        return self._clock() < self._retry_at

    @property
    def retry_in(self) -> float:
        """Seconds until the next batch is passed on (0: now; infinite while a probe is
        in flight)."""
        return max(0.0, self._retry_at - self._clock())

    def delay(self, failures: int) -> float:
        """The backoff after ``failures`` consecutive failures, before jitter."""
        exponent = min(failures - 1, 1024)  # the cap is reached long before; no overflow
        try:
            delay = self.initial_delay * self.multiplier**exponent
        except OverflowError:
            delay = math.inf
        return min(self.max_delay, delay)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Pass ``spans`` on, or drop them while backing off (see the class)."""
        if self.export_counted(spans).exported == len(spans):
            return SpanExportResult.SUCCESS
        return SpanExportResult.FAILURE

    def export_counted(self, spans: Sequence[ReadableSpan]) -> ExportCounts:
        """:meth:`export`, saying what became of the batch's spans; they are already
        counted, per exporter and in :func:`span_export_totals`."""
        count = len(spans)
        probing = False
        with self._lock:
            if self._stopped:
                self.shutdown_drops += count
                drop = "shutdown"
            elif self._clock() < self._retry_at:
                self._count_backoff(count)
                drop = "backoff"
            else:
                drop = ""
                probing = self.consecutive_failures > 0
                if probing:
                    self._retry_at = math.inf  # concurrent callers: drop while it runs
        if drop:
            _TOTALS.add(drop, count)
            return ExportCounts(**{drop: count})
        if not (probing and 0 < self.probe_size < count):
            if self._attempt(spans, probing):
                return ExportCounts(exported=count)
            return ExportCounts(export_failed=count)
        probe, rest = spans[: self.probe_size], spans[self.probe_size :]
        if not self._attempt(probe, probing):
            with self._lock:
                self._count_backoff(len(rest))
            _TOTALS.add("backoff", len(rest))
            return ExportCounts(export_failed=len(probe), backoff=len(rest))
        if self._attempt(rest, False):
            return ExportCounts(exported=count)
        return ExportCounts(exported=len(probe), export_failed=len(rest))

    def _count_backoff(self, count: int) -> None:
        self.backoff_drops += count
        self._dropped_since_log += count
        self._dropped_while_failing += count

    def _attempt(self, spans: Sequence[ReadableSpan], probing: bool) -> bool:
        """One call to the wrapped exporter, counted; True if it succeeded."""
        count = len(spans)
        error: str | None = None
        try:
            result = self.exporter.export(spans)
            if result is not SpanExportResult.SUCCESS:
                name = getattr(result, "name", result)
                error = f"the exporter returned {name}; its own log says why"
        except Exception as exc:
            error = self._describe(exc)
            if log.isEnabledFor(logging.DEBUG):
                trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                log.debug("adaptive-lb: span export raised: %s", self._redact(trace))
        except BaseException:  # KeyboardInterrupt, SystemExit: never leave a probe mark
            if probing:
                with self._lock:
                    self._retry_at = self._clock() + self.delay(self.consecutive_failures)
            raise
        message: tuple[Any, ...] | None = None
        with self._lock:
            self.export_calls += 1
            now = self._clock()
            if error is None:
                self.exported_spans += count
                if self.consecutive_failures:
                    message = (
                        "adaptive-lb: span export to %s recovered after %d failed "
                        "attempt(s) over %.0f s; %d span(s) dropped meanwhile",
                        self.endpoint,
                        self.consecutive_failures,
                        now - self._failing_since,
                        self._dropped_while_failing,
                    )
                self._reset()
            else:
                self.failed_spans += count
                if not self.consecutive_failures:
                    self._failing_since = now
                    self._dropped_while_failing = 0
                self.consecutive_failures += 1
                self._dropped_while_failing += count
                self._failed_since_log += 1
                delay = self.delay(self.consecutive_failures)
                delay *= 1 - self.jitter * self._rng()
                self._retry_at = now + delay
                if self.consecutive_failures == 1:
                    message = (
                        "adaptive-lb: span export to %s failed (%s); dropping spans without "
                        "sending them for %.1f s, then retrying with a doubling delay (up to "
                        "%.0f s) until it succeeds; they are counted as "
                        'adaptive_lb_trace_spans_dropped_total{reason="backoff"}',
                        self.endpoint,
                        error,
                        delay,
                        self.max_delay,
                    )
                elif now - self._last_log >= self.log_interval:
                    message = (
                        "adaptive-lb: span export to %s still failing (%s): %d failed "
                        "attempt(s) and %d span(s) dropped while backing off since the last "
                        "message; next attempt in %.1f s",
                        self.endpoint,
                        error,
                        self._failed_since_log,
                        self._dropped_since_log,
                        delay,
                    )
                if message is not None:
                    self._last_log = now
                    self._failed_since_log = 0
                    self._dropped_since_log = 0
        _TOTALS.add("exported" if error is None else "export_failed", count)
        if message is not None:
            log.warning(*message)
        return error is None

    def _reset(self) -> None:
        self.consecutive_failures = 0
        self._retry_at = -math.inf
        self._last_log = -math.inf
        self._failed_since_log = 0
        self._dropped_since_log = 0
        self._dropped_while_failing = 0

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _describe(self, exc: BaseException) -> str:
        return self._redact(f"{type(exc).__name__}: {exc}")[:300]

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """The wrapped exporter's ``force_flush``."""
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Shut the wrapped exporter down; later batches are dropped (as ``shutdown``)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.exporter.shutdown()


class BoundedSpanProcessor(SpanProcessor):
    """Batches ended spans to ``exporter`` from a background thread.

    ``on_end`` (called on the thread that ended the span, possibly a request's) only appends
    to a bounded queue. Counters: ``exported_spans``, ``queue_full_drops``,
    ``failed_spans`` (the exporter said no or raised), ``backoff_drops`` (a
    :class:`BackoffSpanExporter` dropped the batch unsent: it was backing off),
    ``shutdown_drops`` (still queued after the flush at shutdown), ``dropped_spans`` (their
    sum: everything that never reached the receiver). They are also added to the
    process-wide :func:`span_export_totals` (by the :class:`BackoffSpanExporter` for what it
    exported or dropped, when ``exporter`` is one).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_size: int = 2048,
        max_batch_size: int = 512,
        schedule_delay: float = 1.0,
    ) -> None:
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self.max_batch_size = max_batch_size
        self.schedule_delay = schedule_delay
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self.exported_spans = 0
        self.failed_spans = 0
        self.backoff_drops = 0
        self.queue_full_drops = 0
        self.shutdown_drops = 0
        with _TOTALS.lock:
            _TOTALS.sources += 1
        self._thread = threading.Thread(target=self._run, name="adaptive-lb-otlp", daemon=True)
        self._thread.start()

    @property
    def dropped_spans(self) -> int:
        """Spans that never reached the receiver (queue full, export failed, backing off
        or shut down)."""
        return self.queue_full_drops + self.failed_spans + self.backoff_drops + self.shutdown_drops

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span, or drop and count it when the queue is full."""
        if self._stopped.is_set():
            self.shutdown_drops += 1
            _TOTALS.add("shutdown")
            return
        with self._lock:
            if len(self._queue) >= self.max_queue_size:
                self.queue_full_drops += 1
                _TOTALS.add("queue_full")
                return
            self._queue.append(span)
            full_batch = len(self._queue) >= self.max_batch_size
        if full_batch:
            self._wake.set()

    def _take_batch(self) -> list[ReadableSpan]:
        with self._lock:
            count = min(len(self._queue), self.max_batch_size)
            return [self._queue.popleft() for _ in range(count)]

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        if isinstance(self.exporter, BackoffSpanExporter):
            counts = self.exporter.export_counted(batch)  # counted process-wide there
        else:
            try:
                result = self.exporter.export(batch)
            except Exception:
                log.debug("adaptive-lb: span export raised", exc_info=True)
                result = SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                counts = ExportCounts(exported=len(batch))
            else:
                counts = ExportCounts(export_failed=len(batch))
            _TOTALS.add("exported", counts.exported)
            _TOTALS.add("export_failed", counts.export_failed)
        self.exported_spans += counts.exported
        self.failed_spans += counts.export_failed
        self.backoff_drops += counts.backoff
        self.shutdown_drops += counts.shutdown

    def _run(self) -> None:
        while True:
            self._wake.wait(self.schedule_delay)
            self._wake.clear()
            self._idle.clear()
            while not self._stopped.is_set():
                batch = self._take_batch()
                if not batch:
                    break
                self._export(batch)
            self._idle.set()
            if self._stopped.is_set():
                self._drop_queued()
                return

    def _drop_queued(self) -> None:
        with self._lock:
            count = len(self._queue)
            self._queue.clear()
        if count:
            self.shutdown_drops += count
            _TOTALS.add("shutdown", count)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export what is queued now; True if the queue emptied within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            self._wake.set()
            if not self._queue and self._idle.is_set():
                return True
            time.sleep(0.005)
        return not self._queue and self._idle.is_set()

    def shutdown(self, timeout_millis: int = 2000) -> None:
        """Flush for at most ``timeout_millis``, then stop: what is still queued is dropped
        (and counted); an export in progress gets a few more seconds to end."""
        if self._stopped.is_set():
            return
        self.force_flush(timeout_millis)
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.exporter.shutdown()


def make_otlp_exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP span exporter for ``config.otlp`` (protocol ``grpc`` or ``http``), without
    backoff (:func:`setup_tracing` wraps it in a :class:`BackoffSpanExporter`).

    ``config.otlp.timeout`` bounds one ``export`` call: both exporters retry retryable
    errors themselves (connection refused or reset, HTTP 429/502/503/504, gRPC UNAVAILABLE,
    DEADLINE_EXCEEDED...) with an exponential delay of their own (1, 2, 4 s +-20 %, sleeping
    in the calling thread: no CPU) only while the next attempt still fits in the timeout,
    and each attempt's socket wait gets what is left of it; a receiver that accepts and
    never answers holds one call for the timeout, waiting on the socket."""
    otlp = config.otlp
    if not otlp.endpoint:
        raise ValueError("tracing.otlp.endpoint is not set")
    headers = dict(otlp.headers) or None
    if otlp.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp.endpoint
        if not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=otlp.timeout)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    # http:// is plaintext, https:// is TLS; no scheme: the exporter decides (TLS unless
    # OTEL_EXPORTER_OTLP_INSECURE=true).
    insecure = True if otlp.endpoint.startswith("http://") else None
    return GrpcExporter(
        endpoint=otlp.endpoint, headers=headers, timeout=otlp.timeout, insecure=insecure
    )


def setup_tracing(
    config: Config | TracingConfig,
    exporter: SpanExporter | None = None,
    max_queue_size: int = 2048,
) -> TracerProvider:
    """A TracerProvider exporting to ``config``'s OTLP endpoint (or to ``exporter``) through
    a :class:`BoundedSpanProcessor`, available as ``provider.adaptive_lb_processor``. The
    exporter is always wrapped in a :class:`BackoffSpanExporter` (unless it is one already),
    available as ``provider.adaptive_lb_exporter``. Pass the provider to
    ``AdaptiveLoadBalancingPolicy(..., tracer_provider=provider)`` or make it global with
    ``opentelemetry.trace.set_tracer_provider``."""
    tracing = config.tracing if isinstance(config, Config) else config
    resource = Resource.create({"service.name": tracing.otlp.service_name})
    provider = TracerProvider(resource=resource)
    if exporter is None:
        exporter = BackoffSpanExporter(
            make_otlp_exporter(tracing),
            endpoint=tracing.otlp.endpoint,
            secrets=list(tracing.otlp.headers.values()),
        )
    elif not isinstance(exporter, BackoffSpanExporter):
        exporter = BackoffSpanExporter(exporter)
    processor = BoundedSpanProcessor(exporter, max_queue_size=max_queue_size)
    provider.add_span_processor(processor)
    provider.adaptive_lb_processor = processor  # type: ignore[attr-defined]
    provider.adaptive_lb_exporter = exporter  # type: ignore[attr-defined]
    return provider
