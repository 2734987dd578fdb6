"""The server's own view of its load: each node's thread pools, turned into a damped score
factor (pure logic, no driver import).

On Apache Cassandra 4.0 and later every node answers
``SELECT name, active_tasks, active_tasks_limit, pending_tasks, blocked_tasks FROM
system_views.thread_pools`` from in-memory counters, about itself only. That is the load
*every* client puts on it, which a client's own in-flight count cannot see.
:mod:`adaptive_lb.runtime.prober` sends the read to one host at a time, every
``health.server_load.interval`` (jittered), to the live local hosts only; this module
decides which hosts are due (:func:`due`), keeps each host's readings
(:class:`ServerLoadRecord`) and turns them into the factor that multiplies the host's score
(:func:`publish`, at each health refresh).

**Pressure** of a node: over the watched pools (:data:`WATCHED_POOLS`), the largest
``(active + pending + blocked) / active_tasks_limit`` -- 1 when the pool's threads are all
busy and nothing waits, 3 when two more pool-fulls of tasks wait behind them: how many
rounds of service a new task waits for, at the bottleneck pool.

**Damping**, so that many clients reading the same numbers do not all leave the same node
at once (and then all leave the next one):

* *smoothed*: an exponentially weighted mean over time with ``half_life``
  (:func:`smooth`): a step in a node's queue moves the factor halfway in one half-life;
* *relative*: a node's *excess* is its smoothed pressure minus the median of the other
  local-datacenter hosts' with a fresh reading; a cluster busy everywhere moves nothing;
* *randomized partial response*: each client draws, per host, a threshold uniform in
  ``[0, 2 x threshold)`` (:attr:`ServerLoadRecord.draw`); the factor is
  ``1 + (excess - drawn threshold)`` when positive (:func:`load_factor`). The fraction of
  a fleet that reacts to an excess ``e`` grows linearly, ``e / (2 x threshold)``, instead
  of all clients at once at one threshold;
* *capped* at ``cap``, and *expiring*: a reading older than :data:`STALE_INTERVALS` x
  ``interval`` counts for nothing (factor 1: the client's own view alone).

Where the table is missing (ScyllaDB, Cassandra 3.x: the node says so, answers no row, or
its ``release_version`` is below 4) the host's record remembers it and it is not read
again until it comes back up (a restart, perhaps an upgrade); its factor stays 1, and
the round trip of adaptive-lb's probes and of the user's own requests (the health model)
are the signal there.

Imports attrs and the config only.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from attrs import define

from adaptive_lb.config import ServerLoadConfig

__all__ = [
    "STALE_INTERVALS",
    "THREAD_POOLS_QUERY",
    "WATCHED_POOLS",
    "LoadOrder",
    "PoolReading",
    "ServerLoadRecord",
    "due",
    "load_factor",
    "parse_pools",
    "pressure_of",
    "publish",
    "smooth",
    "supports_thread_pools",
]

THREAD_POOLS_QUERY = (
    "SELECT name, active_tasks, active_tasks_limit, pending_tasks, blocked_tasks "
    "FROM system_views.thread_pools"
)
"""What a load read asks (Cassandra 4.0+): a few dozen rows of in-memory counters of the
node that answers; every role may read it, no keyspace of the user's is needed."""
WATCHED_POOLS = ("Native-Transport-Requests", "ReadStage", "MutationStage")
"""The pools whose queues a user request waits in: the request threads, reads, writes."""
STALE_INTERVALS = 3.0
"""A reading older than this many ``interval`` no longer counts."""
JITTER = 0.25
"""A host's next read comes ``interval`` x (1 +/- this) after the last."""

_NS = 1_000_000_000
_DRAWS = random.Random()
"""Thresholds are drawn from a stream of their own: the simulator's seeded ``random``
stream (ties, shuffles) stays as it was."""


@define(frozen=True, slots=True)
class PoolReading:
    """One row of ``system_views.thread_pools``."""

    name: str
    active: int
    limit: int
    pending: int
    blocked: int

    @property
    def pressure(self) -> float:
        """``(active + pending + blocked) / limit`` (a pool without a limit: per thread)."""
        return (self.active + self.pending + self.blocked) / max(self.limit, 1)


_COLUMNS = ("name", "active_tasks", "active_tasks_limit", "pending_tasks", "blocked_tasks")


def parse_pools(rows: Iterable[Any]) -> list[PoolReading]:
    """The rows of :data:`THREAD_POOLS_QUERY`, as the session's row factory made them:
    mappings (``dict_factory``) or sequences in the query's column order (named tuples,
    plain tuples). A null number counts as 0. Raises ValueError on rows of another shape."""
    pools = []
    for row in rows:
        if isinstance(row, Mapping):
            values = [row.get(column) for column in _COLUMNS]
        elif isinstance(row, Sequence) and not isinstance(row, str) and len(row) >= 5:
            values = list(row[:5])
        else:
            raise ValueError(f"a thread_pools row of an unknown shape: {type(row).__name__}")
        name, numbers = values[0], values[1:]
        if not isinstance(name, str) or not all(
            n is None or (isinstance(n, int) and not isinstance(n, bool)) for n in numbers
        ):
            raise ValueError(f"a thread_pools row of unexpected types: {values!r}")
        active, limit, pending, blocked = (n or 0 for n in numbers)
        pools.append(PoolReading(name, active, limit, pending, blocked))
    return pools


def pressure_of(pools: Iterable[PoolReading]) -> tuple[float, str] | None:
    """The largest pressure among the :data:`WATCHED_POOLS` of ``pools``, and that pool's
    name; None when none of them is there."""
    watched = [pool for pool in pools if pool.name in WATCHED_POOLS]
    if not watched:
        return None
    top = max(watched, key=lambda pool: pool.pressure)
    return top.pressure, top.name


def smooth(previous: float | None, value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` folded into the mean ``previous`` after ``elapsed_s``: the older mean
    weighs ``2 ** (-elapsed / half_life)`` (``value`` alone without a previous one, or with
    a half-life of 0)."""
    if previous is None or half_life_s <= 0:
        return value
    kept = math.pow(2.0, -max(0.0, elapsed_s) / half_life_s)
    return kept * previous + (1.0 - kept) * value


def load_factor(excess: float, threshold: float, draw: float, cap: float) -> float:
    """The score factor of a host whose smoothed pressure exceeds its peers' median by
    ``excess``, for a client whose drawn threshold is ``2 x threshold x draw``
    (``draw`` in [0, 1)): ``1 + (excess - drawn threshold)``, at least 1, at most ``cap``."""
    return min(cap, 1.0 + max(0.0, excess - 2.0 * threshold * draw))


def supports_thread_pools(release_version: str | None) -> bool | None:
    """Whether a node of ``release_version`` has ``system_views.thread_pools``: False below
    4 (ScyllaDB reports 3.0.8), None when unknown or unparsable (ask it)."""
    if not release_version:
        return None
    head = release_version.split(".", 1)[0]
    if not head.isdigit():
        return None
    return int(head) >= 4


class ServerLoadRecord:
    """One host's load reads: whether it has the table, the smoothed pressure, counters.

    Written under its lock by the read's callbacks (driver threads) and the health refresh;
    read without a lock by the snapshot and the exporters."""

    __slots__ = (
        "_lock",
        "answered",
        "draw",
        "excess",
        "factor",
        "failed",
        "last_latency_s",
        "next_ns",
        "outstanding",
        "pool",
        "pressure",
        "raw",
        "read_ns",
        "sent",
        "supported",
        "unsupported_reason",
    )

    def __init__(self, draw: float | None = None) -> None:
        self._lock = threading.Lock()
        self.supported: bool | None = None
        """Has ``system_views.thread_pools`` (None: not known yet)."""
        self.unsupported_reason = ""
        """Why it is not read (``supported`` False)."""
        self.sent = 0
        """Reads sent."""
        self.answered = 0
        """Reads answered with the watched pools."""
        self.failed = 0
        """Reads that timed out, failed, or could not be sent."""
        self.outstanding = False
        self.next_ns = 0
        """No read before this (clock ns)."""
        self.raw: float | None = None
        """Pressure of the last reading."""
        self.pool = ""
        """The pool under the most pressure at the last reading."""
        self.pressure: float | None = None
        """Smoothed pressure (``half_life``)."""
        self.read_ns: int | None = None
        """When the last reading arrived (clock ns)."""
        self.last_latency_s: float | None = None
        """Round trip of the last answered read, seconds."""
        self.excess = 0.0
        """Smoothed pressure minus the peers' median, at the last refresh (0: no fresh
        reading, or no peer with one)."""
        self.factor = 1.0
        """The score factor published at the last refresh."""
        self.draw = _DRAWS.random() if draw is None else draw
        """This client's response threshold for this host, as a fraction of
        ``2 x threshold`` (randomized partial response, see the module docstring)."""

    def begin(self, next_ns: int) -> bool:
        """Claim the host for one read; False if one is outstanding or it has no table."""
        with self._lock:
            if self.outstanding or self.supported is False:
                return False
            self.outstanding = True
            self.sent += 1
            self.next_ns = next_ns
            return True

    def answer(
        self, pools: Sequence[PoolReading], now_ns: int, latency_s: float, half_life_s: float
    ) -> None:
        """The outstanding read answered ``pools`` at ``now_ns``. No watched pool in the
        answer: the node has no such table (an empty answer, as Simulacron gives for an
        unprimed query), remembered."""
        with self._lock:
            self.outstanding = False
            found = pressure_of(pools)
            if found is None:
                self._unsupported("no thread pools in the answer")
                return
            raw, pool = found
            elapsed_s = (now_ns - self.read_ns) / _NS if self.read_ns is not None else 0.0
            self.supported = True
            self.answered += 1
            self.raw, self.pool = raw, pool
            self.pressure = smooth(self.pressure, raw, elapsed_s, half_life_s)
            self.read_ns = now_ns
            self.last_latency_s = latency_s

    def fail(self, absent: str | None = None) -> None:
        """The outstanding read did not answer; ``absent``: because the node has no such
        table (why), remembered."""
        with self._lock:
            self.outstanding = False
            if absent is not None:
                self._unsupported(absent)
            else:
                self.failed += 1

    def mark_unsupported(self, reason: str) -> None:
        """Never read this host (e.g. its ``release_version`` is below 4)."""
        with self._lock:
            self._unsupported(reason)

    def came_back(self) -> None:
        """The host came back up (a restart, perhaps upgraded): ask it again whether it has
        the table, and start its readings afresh."""
        with self._lock:
            self.supported = None
            self.unsupported_reason = ""
            self.pressure = self.raw = None
            self.read_ns = None

    def _unsupported(self, reason: str) -> None:
        self.supported = False
        self.unsupported_reason = reason
        self.pressure = self.raw = None
        self.read_ns = None

    def fresh_pressure(self, now_ns: int, stale_s: float) -> float | None:
        """The smoothed pressure if the last reading is younger than ``stale_s``."""
        read_ns = self.read_ns
        if read_ns is None or self.supported is not True or now_ns - read_ns > stale_s * _NS:
            return None
        return self.pressure


class LoadedStats(Protocol):
    """What this module reads and writes of a host's statistics
    (:class:`~adaptive_lb.stats.host.HostStats`)."""

    load: ServerLoadRecord
    server_load: float


@define(frozen=True, slots=True)
class LoadOrder:
    """Read ``key``'s thread pools now; no other read of it before ``next_ns``."""

    key: Hashable
    stats: Any
    next_ns: int


def due(
    hosts: Iterable[tuple[Hashable, LoadedStats, bool]],
    now_ns: int,
    config: ServerLoadConfig,
    rng: random.Random,
) -> list[LoadOrder]:
    """The reads to send now, of ``hosts`` as ``(key, stats, live)`` (the local ones): live,
    not known to lack the table, none outstanding, ``interval`` (jittered) since the last.
    None when ``config.enabled`` is false."""
    if not config.enabled:
        return []
    interval_ns = config.interval * _NS
    orders = []
    for key, stats, live in hosts:
        record = stats.load
        if not live or record.outstanding or record.supported is False or now_ns < record.next_ns:
            continue
        jitter = 1.0 + JITTER * (2.0 * rng.random() - 1.0)
        orders.append(LoadOrder(key, stats, now_ns + round(interval_ns * jitter)))
    return orders


def publish(
    hosts: Iterable[tuple[Hashable, LoadedStats]],
    now_ns: int,
    config: ServerLoadConfig,
    interval_s: float | None = None,
) -> None:
    """Set every host's ``server_load`` factor (and its record's ``excess`` and ``factor``)
    from the fresh smoothed pressures of ``hosts`` (one datacenter's: they are each
    other's peers). 1 for a host without a fresh reading, without a peer that has one, or
    with ``config.enabled`` false. ``interval_s``: the reads' spacing in force, when a
    fleet's budget spaces them beyond ``config.interval`` (:mod:`adaptive_lb.stats.fleet`): a
    reading stays fresh for :data:`STALE_INTERVALS` of it."""
    listed = list(hosts)
    stale_s = STALE_INTERVALS * max(config.interval, interval_s or 0.0)
    fresh = {
        key: pressure
        for key, stats in listed
        if config.enabled and (pressure := stats.load.fresh_pressure(now_ns, stale_s)) is not None
    }
    for key, stats in listed:
        record = stats.load
        pressure = fresh.get(key)
        peers = [value for other, value in fresh.items() if other != key]
        if pressure is None or not peers:
            excess, factor = 0.0, 1.0
        else:
            excess = pressure - statistics.median(peers)
            factor = load_factor(excess, config.threshold, record.draw, config.cap)
        record.excess = excess
        record.factor = factor
        stats.server_load = factor
