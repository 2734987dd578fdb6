"""Load generators for the integration tests, the benchmarks and ``adaptive-lb loadtest``.

:func:`closed_loop`: ``concurrency`` threads each run ``session.execute`` back to back until
``duration`` has passed (the load follows the answers). :func:`open_loop`: requests sent at
a fixed rate whatever the answers do (the same offered load for every policy). Either way
every request's attempted hosts, coordinator and latency are kept, and every failed request
is counted with why (a parameter the driver cannot bind fails the request, not the
thread). :func:`key_maker` makes keys of the statement's key type.

Imports attrs and the library's :mod:`adaptive_lb.runtime._driver` only; the library never imports a
tool.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from attrs import define, field

from adaptive_lb.runtime._driver import is_tracked


@define
class LoadResult:
    """What a load run observed, request by request."""

    latencies: list[float] = field(factory=list)
    """Seconds, successful requests only."""
    coordinators: Counter = field(factory=Counter)
    """Host address -> requests it answered."""
    attempts: Counter = field(factory=Counter)
    """Host address -> attempts sent to it (``ResponseFuture.attempted_hosts``)."""
    tracked_attempts: Counter = field(factory=Counter)
    """Host address -> attempts of the requests request tracking tracked (all of them, or
    its sample once traffic is thick: :mod:`adaptive_lb.stats.sampling`)."""
    errors: Counter = field(factory=Counter)
    """Exception type name -> requests that failed."""
    error_messages: dict[str, str] = field(factory=dict)
    """Exception type name -> the first such failure's message (why requests failed)."""
    offered: int = 0
    """Open loop: the requests the rate asked for over the run (some may not have been sent:
    a client too busy to keep up, or ``max_in_flight`` reached); closed loop: 0."""

    @property
    def requests(self) -> int:
        """Requests completed (successfully or not)."""
        return len(self.latencies) + sum(self.errors.values())

    def share(self, address: str) -> float:
        """Fraction of all attempts that went to ``address``."""
        total = sum(self.attempts.values())
        return self.attempts[address] / total if total else 0.0

    def percentile(self, p: float) -> float:
        """Latency at percentile ``p`` (0..100), seconds."""
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
        return ordered[index]


@contextlib.contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """With ``pause``, the garbage collector collected then off for the block, then on and
    collected again (a loop's measurements without the collector's pauses)."""
    if not pause:
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def closed_loop(
    session: Any,
    make_statement: Callable[[int], tuple[Any, Any]],
    concurrency: int,
    duration: float,
    timeout: float = 2.0,
    disable_gc: bool = True,
    progress: Callable[[float, int], None] | None = None,
    request_context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> LoadResult:
    """Run ``concurrency`` closed-loop clients for ``duration`` seconds.

    ``make_statement(i)`` returns ``(statement, parameters)`` for request number ``i``.
    ``request_context()``, when given, is entered around each request, from
    ``execute_async`` to its result (e.g. an OpenTelemetry span the policy records its
    decision on).
    With ``disable_gc`` the cyclic garbage collector is off during the run (it adds 20-60 ms
    pauses to the Python client's p99, noise that is not the cluster's), and collected after.
    ``progress(elapsed_seconds, completed_requests)`` is called about once a second.
    """
    with _collector_paused(disable_gc):
        return _closed_loop(
            session,
            make_statement,
            concurrency,
            duration,
            timeout,
            progress,
            request_context or contextlib.nullcontext,
        )


def _closed_loop(
    session: Any,
    make_statement: Callable[[int], tuple[Any, Any]],
    concurrency: int,
    duration: float,
    timeout: float,
    progress: Callable[[float, int], None] | None,
    request_context: Callable[[], AbstractContextManager[Any]],
) -> LoadResult:
    result = LoadResult()
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + duration
    counter = iter(range(10**12))
    clients: list[LoadResult] = []

    def client() -> None:
        local = LoadResult()
        clients.append(local)
        while time.monotonic() < deadline:
            statement, parameters = make_statement(next(counter))
            start = time.perf_counter()
            error = None
            future = None
            with request_context():
                try:
                    # Binding happens here: a parameter of the wrong type raises at once.
                    future = session.execute_async(statement, parameters, timeout=timeout)
                    future.result()
                except Exception as exc:
                    error = exc
            if error is not None:
                name = type(error).__name__
                local.errors[name] += 1
                local.error_messages.setdefault(name, str(error) or name)
            elif future is not None:
                local.latencies.append(time.perf_counter() - start)
                if future.coordinator_host is not None:
                    local.coordinators[future.coordinator_host.address] += 1
            tracked = future is not None and is_tracked(future)
            for host in future.attempted_hosts if future is not None else ():
                local.attempts[host.address] += 1
                if tracked:
                    local.tracked_attempts[host.address] += 1
        with lock:
            result.latencies.extend(local.latencies)
            result.coordinators.update(local.coordinators)
            result.attempts.update(local.attempts)
            result.tracked_attempts.update(local.tracked_attempts)
            result.errors.update(local.errors)
            for name, message in local.error_messages.items():
                result.error_messages.setdefault(name, message)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    if progress is not None:
        while True:
            alive = [thread for thread in threads if thread.is_alive()]
            if not alive:
                break
            alive[0].join(1.0)
            progress(time.monotonic() - started, sum(c.requests for c in list(clients)))
    for thread in threads:
        thread.join(duration + timeout + 30)
    return result


def open_loop(
    session: Any,
    make_statement: Callable[[int], tuple[Any, Any]],
    rate: float,
    duration: float,
    timeout: float = 2.0,
    max_in_flight: int = 1024,
    disable_gc: bool = True,
    progress: Callable[[float, int], None] | None = None,
    request_context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> LoadResult:
    """Send ``rate`` requests a second for ``duration`` seconds from this thread, each as
    it falls due whatever the earlier ones do, then wait for their answers (each ends within
    ``timeout``). A client that falls more than a second behind skips the requests it
    missed rather than bursting; at ``max_in_flight`` outstanding it waits. Both show as
    :attr:`LoadResult.requests` below :attr:`LoadResult.offered`. Latency runs from each
    request's ``execute_async`` to its answer. ``request_context()`` is entered around
    ``execute_async`` (the plan is made there); ``make_statement``, ``disable_gc`` and
    ``progress`` as in :func:`closed_loop`."""
    if not rate > 0:
        raise ValueError(f"rate: must be > 0, got {rate!r}")
    with _collector_paused(disable_gc):
        return _open_loop(
            session,
            make_statement,
            rate,
            duration,
            timeout,
            max_in_flight,
            progress,
            request_context or contextlib.nullcontext,
        )


def _open_loop(
    session: Any,
    make_statement: Callable[[int], tuple[Any, Any]],
    rate: float,
    duration: float,
    timeout: float,
    max_in_flight: int,
    progress: Callable[[float, int], None] | None,
    request_context: Callable[[], AbstractContextManager[Any]],
) -> LoadResult:
    result = LoadResult()
    lock = threading.Lock()  # answers arrive on the driver's threads
    slots = threading.BoundedSemaphore(max_in_flight)

    def finished(future: Any, start: float, error: BaseException | None) -> None:
        elapsed = time.perf_counter() - start
        tracked = is_tracked(future)
        with lock:
            if error is not None:
                name = type(error).__name__
                result.errors[name] += 1
                result.error_messages.setdefault(name, str(error) or name)
            else:
                result.latencies.append(elapsed)
                if future.coordinator_host is not None:
                    result.coordinators[future.coordinator_host.address] += 1
            for host in future.attempted_hosts:
                result.attempts[host.address] += 1
                if tracked:
                    result.tracked_attempts[host.address] += 1
        slots.release()

    started = time.monotonic()
    deadline = started + duration
    shown = started
    number = 0
    while True:
        now = time.monotonic()
        if progress is not None and now - shown >= 1.0:
            shown = now
            progress(now - started, result.requests)
        due = started + number / rate
        if due >= deadline or now >= deadline:
            break
        if now < due:
            time.sleep(min(due - now, deadline - now, 0.05))
            continue
        if now - due > 1.0:  # a second behind (a pause): skip, do not burst
            number = int((now - started) * rate)
            continue
        number += 1
        if not slots.acquire(timeout=max(0.0, deadline - now)):
            break
        statement, parameters = make_statement(number)
        start = time.perf_counter()
        with request_context():
            try:
                # Binding happens here: a parameter of the wrong type raises at once.
                future = session.execute_async(statement, parameters, timeout=timeout)
            except Exception as exc:
                with lock:
                    name = type(exc).__name__
                    result.errors[name] += 1
                    result.error_messages.setdefault(name, str(exc) or name)
                slots.release()
                continue
        future.add_callbacks(
            lambda _rows, f=future, s=start: finished(f, s, None),
            lambda exc, f=future, s=start: finished(f, s, exc),
        )
    result.offered = int(duration * rate)
    for _ in range(max_in_flight):  # every request sent ends within its timeout
        if not slots.acquire(timeout=timeout + 5.0):
            break
    if progress is not None:
        progress(min(time.monotonic() - started, duration), result.requests)
    return result


def key_maker(statement: Any) -> Callable[[int], Any]:
    """``n -> key`` of the type of a prepared statement's first bound column: text for
    text columns, a UUID for uuid / timeuuid ones, ``n`` itself for the rest (integers)."""
    columns = getattr(statement, "column_metadata", None) or ()
    kind = getattr(columns[0].type, "typename", "") if columns else ""
    if kind in ("varchar", "text", "ascii"):
        return str
    if kind in ("uuid", "timeuuid"):
        return lambda n: uuid.UUID(int=n, version=1 if kind == "timeuuid" else 4)
    return lambda n: n
