"""A span exporter wrapper that makes an OTLP receiver that is down cost (next to) nothing.

After a failed export, :class:`BackoffSpanExporter` backs off (1 s doubling to 60 s, with
jitter): until then every batch is dropped at once -- never encoded, no network call -- and
counted as ``backoff``. Without it, a receiver that refuses connections made the export
thread encode (in pure Python) and send batch after batch, taking most of the GIL from the
application. The backoff is in the exporter, not in the processor, so it works under any
span processor (the SDK's ``BatchSpanProcessor`` included).

Needs the OpenTelemetry SDK (``pip install "adaptive-lb[otlp]"``); nothing imports this
module before :func:`~adaptive_lb.exporters.setup_tracing` is called.

Imports the OpenTelemetry SDK and :mod:`~adaptive_lb.exporters.span_counts` only.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from adaptive_lb.exporters.span_counts import TOTALS, ExportCounts

__all__ = ["BackoffSpanExporter"]

log = logging.getLogger("adaptive_lb.exporters")


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
    :func:`~adaptive_lb.exporters.span_export_totals` as ``backoff``, and ``FAILURE`` is
    returned. The first call after the delay is passed on (while it runs, concurrent calls
    are dropped too); if it fails again the delay doubles. One success resets it.

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
        TOTALS.register()

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
        counted, per exporter and in :func:`~adaptive_lb.exporters.span_export_totals`."""
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
            TOTALS.add(drop, count)
            return ExportCounts(**{drop: count})
        if not (probing and 0 < self.probe_size < count):
            if self._attempt(spans, probing):
                return ExportCounts(exported=count)
            return ExportCounts(export_failed=count)
        probe, rest = spans[: self.probe_size], spans[self.probe_size :]
        if not self._attempt(probe, probing):
            with self._lock:
                self._count_backoff(len(rest))
            TOTALS.add("backoff", len(rest))
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
        TOTALS.add("exported" if error is None else "export_failed", count)
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
