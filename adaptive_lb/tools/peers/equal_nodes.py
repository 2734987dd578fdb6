"""Equal nodes, no verdict: real clients against nodes that do not differ, counting every
health transition out of ``healthy`` (each one a false verdict).

What the false-verdict soak runs (``tests/integration/test_false_verdicts_simulacron.py``,
``benchmarks/false_verdicts.py``): sessions of the real driver with ``attach(session)`` and
the shipped defaults, each at a load of its own (:class:`Load`: paced at a rate with at
most so many requests in flight, or a closed loop), beside processes spinning on the
client's cores when asked (:func:`cpu_hog`: how a busy machine and CPU steal look to the
client), or with the client itself not reading answers for a while
(:func:`stop_reading`: the GIL held, the driver's event loop kept). :class:`Departures`
counts the transitions out of ``healthy`` that the health model logs, as an operator reads
them.

Imports the library's public surface, the driver and the peers' connect helper.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from attrs import define, field

from adaptive_lb.tools.peers.connect import connect_driver, wait_for_pools

__all__ = ["Departures", "Load", "SoakResult", "cpu_hog", "run_loads", "stop_reading"]

HEALTH_LOGGER = "adaptive_lb.health"


@define(frozen=True)
class Load:
    """One client session's load: ``rate`` requests a second with at most ``in_flight`` of
    them at once (None: a closed loop of ``in_flight`` requests, as fast as it goes)."""

    name: str
    in_flight: int
    rate: float | None = None


@define
class SoakResult:
    """What one soak saw: per load, requests answered and failed; every false verdict."""

    answered: dict[str, int] = field(factory=dict)
    failed: dict[str, int] = field(factory=dict)
    departures: list[str] = field(factory=list)
    """Each transition out of ``healthy``, as the health model logged it."""


class Departures(logging.Handler):
    """Collects the health model's log lines that leave ``healthy`` (``host X: healthy ->
    slow (penalty 64.0): ...``) while installed (a context manager)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._logger = logging.getLogger(HEALTH_LOGGER)
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the line if it leaves ``healthy``."""
        message = record.getMessage()
        if ": healthy -> " in message:
            self.lines.append(message)

    def __enter__(self) -> Departures:
        self._logger.addHandler(self)
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[list[int]]:
    """``processes`` Python processes spinning on the CPU while the block runs (their PIDs),
    killed by PID when it ends; each dies by itself after 10 minutes at the latest."""
    code = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass\n"
    spinners = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        for _ in range(processes)
    ]
    try:
        yield [spinner.pid for spinner in spinners]
    finally:
        for spinner in spinners:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spinner.pid, signal.SIGKILL)
            spinner.wait(timeout=10)


def stop_reading(how: str, sessions: Sequence[tuple[Any, Any]], seconds: int = 3) -> float:
    """Keep this client from reading answers for ``seconds``, as an application can:
    ``gil``: hold the GIL (libc's ``sleep`` called with it held, as a long C call does);
    ``loop``: keep the driver's event loop in the callback of a request of the first of
    ``sessions`` (``(session, prepared statement)``, as :func:`run_loads` gives them). Returns
    how long it held, in seconds (0 if the request failed)."""
    if how not in ("gil", "loop"):
        raise ValueError(f"stop_reading: how is 'gil' or 'loop', not {how!r}")
    if how == "gil":
        started = time.monotonic()
        ctypes.PyDLL(None).sleep(seconds)
        return time.monotonic() - started
    held: list[float] = []
    done = threading.Event()

    def keep_the_loop(_rows: object) -> None:
        started = time.monotonic()
        time.sleep(seconds)  # on the driver's event loop thread
        held.append(time.monotonic() - started)
        done.set()

    session, statement = sessions[0]
    future = session.execute_async(statement, (1,))
    future.add_callbacks(keep_the_loop, lambda _exc: done.set())
    done.wait(seconds + 10.0)
    return held[0] if held else 0.0


def _paced(session: Any, statement: Any, load: Load, stop: float, result: SoakResult) -> None:
    """Send ``load.rate`` requests a second (at most ``load.in_flight`` at once) until
    ``stop``; count the answers and failures."""
    slots = threading.BoundedSemaphore(load.in_flight)
    lock = threading.Lock()
    counts = {"answered": 0, "failed": 0}

    def done(outcome: str) -> None:
        with lock:
            counts[outcome] += 1
        slots.release()

    interval = 1.0 / load.rate if load.rate else 0.0
    next_at = time.monotonic()
    key = 0
    while True:
        now = time.monotonic()
        if now >= stop:
            break
        if interval and now < next_at:
            time.sleep(min(next_at - now, stop - now))
            continue
        next_at = max(next_at + interval, now - 1.0)  # no burst to catch up after a pause
        if not slots.acquire(timeout=max(0.0, stop - now)):
            break
        key += 1
        try:
            future = session.execute_async(statement, (key,), timeout=2.0)
        except Exception:
            done("failed")
            continue
        future.add_callbacks(lambda _rows: done("answered"), lambda _exc: done("failed"))
    for _ in range(load.in_flight):  # wait for the last answers (a few seconds at most)
        if slots.acquire(timeout=3.0):
            continue
    result.answered[load.name] = counts["answered"]
    result.failed[load.name] = counts["failed"]


def run_loads(
    contact_points: Sequence[str],
    make_policy: Any,
    query: str,
    loads: Sequence[Load],
    seconds: float,
    datacenter: str = "dc1",
    meanwhile: Callable[[list[tuple[Any, Any]]], None] | None = None,
) -> SoakResult:
    """Connect one session per load (a policy from ``make_policy()``, ``attach(session)``
    with its defaults), wait for their pools, run every load at once for ``seconds``, and
    return what they saw with every false verdict logged meanwhile. ``meanwhile``, if
    given, runs on a thread of its own beside the loads, given each load's ``(session,
    prepared statement)``, and is waited for. The sessions are shut down before it
    returns."""
    from adaptive_lb import attach

    result = SoakResult()
    clusters = []
    with Departures() as departures:
        try:
            runs = []
            for load in loads:
                cluster, session = connect_driver(list(contact_points), make_policy())
                clusters.append(cluster)
                attach(session)
                wait_for_pools(session, datacenter)
                runs.append((session, session.prepare(query), load))
            stop = time.monotonic() + seconds
            threads = [
                threading.Thread(target=_paced, args=(session, statement, load, stop, result))
                for session, statement, load in runs
            ]
            if meanwhile is not None:
                sessions = [(session, statement) for session, statement, _ in runs]
                threads.append(threading.Thread(target=meanwhile, args=(sessions,)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(seconds + 30.0)
        finally:
            for cluster in clusters:
                cluster.shutdown()
        result.departures = list(departures.lines)
    return result
