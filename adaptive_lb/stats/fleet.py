"""A fleet's reads and probes, bounded per node whatever the fleet size, with no control
plane (pure logic, no driver import).

Every client reads each local node's thread pools (:mod:`adaptive_lb.stats.server_load`) and
probes the nodes in trouble (:mod:`adaptive_lb.health.probes`); a fleet of N clients multiplies
both by N. Here each client learns N and spaces what it sends each node so that the
fleet's total stays within ``health.fleet.budget`` per node per second:

* **How many clients** (:class:`FleetEstimate`): ``health.fleet.size`` when configured;
  else counted in the server's own ``clients`` table, one row per connection, read from one
  local node picked at random every ``clients_interval`` (jittered): Cassandra 4.0+
  ``system_views.clients`` (:data:`CASSANDRA_CLIENTS_QUERY`), ScyllaDB ``system.clients``
  (:data:`SCYLLA_CLIENTS_QUERY`, one connection per shard: the busiest shard's count). A
  node that refuses both or lists nobody (Cassandra 3.x, Simulacron unprimed) leaves
  ``default_size``. Only the count is kept: no address, port or user leaves this module.
* **How often** (:class:`FleetPacer`): each client sends each node at most one of its own
  requests (a thread-pool read or a probe) per *slot*, the slots at least
  ``N / (0.9 x budget)`` seconds apart (:func:`own_period_s`), each spacing drawn in
  [1, 1.5) x that, the first at a random phase. So the fleet sends a node at most
  ``0.9 x budget`` a second of them on average, whichever the client sends; the clients-table
  reads, one per client per ``clients_interval`` spread over the local nodes, are spaced to
  the last tenth (:func:`clients_period_s`), and each also takes its node's slot
  (:meth:`FleetPacer.spend`). A slot goes first to a probe, then to a read.
  Where the period is shorter than a request's own interval the pacer does not bind:
  a fleet of up to 0.9 x budget x 1 s clients probes and reads as a lone client does.
  While it binds, a stalled or erroring host's slots are its probes' (the health refresh
  does not read it: the read would wait in the same stall).

Until its first clients-table read has come back (within :data:`FIRST_CLIENTS_READ_S`
and a round trip; one that times out is tried at once on another node) a client reads no
thread pools and sends no routine probe (``no fresh answer``), and its probe of a host
whose requests hang waits as for a slot: a fleet started at once would otherwise read and
probe every node at the unpaced rate for those seconds (500 reads a second per node from
1,000 clients), before any of them knows to space them. Where the budget binds, the
thread-pool reads also wait until :data:`FIRST_CLIENTS_READ_S` after the client's start
(:meth:`FleetEstimate.starting`), when the fleet's first clients-table reads are done,
rather than adding up with them. Probes of a stalled or erroring host are not held.

What this costs the fleet: a node's queue reaches a client's score once per period, not
every ``server_load.interval``. A probe that waits for a slot is not lost evidence: the
health model judges the host by what it would have shown
(:func:`adaptive_lb.health.probes.judge`): a suspected host whose requests hang is
ERRORING after the probe's timeout, and a stalled host is back in use by each client as
soon as the requests the stall had caught on its connections are answered, without a
probe; a client whose stall caught nothing there is back at its next slot.

Imports the config only.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from attrs import define

from adaptive_lb.config import FleetConfig

__all__ = [
    "CASSANDRA_CLIENTS_QUERY",
    "CLIENTS_SHARE",
    "OWN_SHARE",
    "SCYLLA_CLIENTS_QUERY",
    "ClientsOrder",
    "FleetEstimate",
    "FleetPacer",
    "clients_from_rows",
    "clients_period_s",
    "own_period_s",
]

CASSANDRA_CLIENTS_QUERY = "SELECT address, port FROM system_views.clients"
"""Apache Cassandra 4.0+: one row per client connection to the node that answers."""
SCYLLA_CLIENTS_QUERY = "SELECT address, port, shard_id FROM system.clients"
"""ScyllaDB: one row per client connection, with the shard it is bound to."""
OWN_SHARE = 0.9
"""The part of the budget for thread-pool reads and probes."""
CLIENTS_SHARE = 0.1
"""The part of the budget for clients-table reads."""
SPREAD = 0.5
"""A slot comes ``period`` x [1, 1 + this) after the last: never sooner than the period."""
FIRST_CLIENTS_READ_S = 5.0
"""The first clients-table read comes at a random moment within this long (or within
``clients_interval`` when shorter): a fleet started at once does not read it at once."""
FIRST_READ_TRIES = 3
"""A first clients-table read that times out is tried again (another node, within
:data:`FIRST_CLIENTS_READ_S`); the size is taken as unknown-for-good (``default_size``)
only after this many have failed: a node stalled at the fleet's start must not make the
clients that asked it read and probe at a lone client's pace."""

_NS = 1_000_000_000
_QUERIES = (CASSANDRA_CLIENTS_QUERY, SCYLLA_CLIENTS_QUERY)


def own_period_s(size: int, budget: float) -> float:
    """The least spacing of one client's reads and probes of one node, for a fleet of
    ``size`` clients and ``budget`` per node per second (0: no budget)."""
    if budget <= 0:
        return 0.0
    return size / (OWN_SHARE * budget)


def clients_period_s(size: int, budget: float, nodes: int, interval_s: float) -> float:
    """The spacing of one client's clients-table reads: ``interval_s``, or longer so that
    ``size`` clients reading one of ``nodes`` nodes at random send each node at most
    ``CLIENTS_SHARE x budget`` a second."""
    if budget <= 0:
        return interval_s
    return max(interval_s, size / (max(nodes, 1) * CLIENTS_SHARE * budget))


def clients_from_rows(rows: Iterable[Any]) -> int:
    """How many client sessions the rows of a ``clients`` table show: one row per
    connection (a session keeps one per node; scylla-driver one per shard, so with a
    ``shard_id`` the busiest shard's count). Rows are mappings or sequences in the query's
    column order (address, port[, shard_id]). Raises ValueError on rows of another shape.
    Nothing of a row is kept."""
    total = 0
    per_shard: dict[int, int] = {}
    for row in rows:
        if isinstance(row, Mapping):
            shard = row.get("shard_id")
        elif isinstance(row, Sequence) and not isinstance(row, str) and len(row) >= 2:
            shard = row[2] if len(row) >= 3 else None
        else:
            raise ValueError(f"a clients row of an unknown shape: {type(row).__name__}")
        total += 1
        if isinstance(shard, int) and not isinstance(shard, bool):
            per_shard[shard] = per_shard.get(shard, 0) + 1
    return max(per_shard.values()) if per_shard else total


@define(frozen=True, slots=True)
class ClientsOrder:
    """Read ``query`` (a clients table) from ``key`` now."""

    key: Hashable
    query: str


class FleetEstimate:
    """How many clients share the cluster, as this client learns it (see the module
    docstring). Written under its lock by the refresh and the read's callbacks."""

    __slots__ = (
        "_absent",
        "_asked",
        "_avoid",
        "_lock",
        "_next_ns",
        "_outstanding",
        "_rng",
        "_started_ns",
        "failed",
        "learned",
        "learned_ns",
        "reads",
        "source",
    )

    def __init__(self, rng: random.Random | None = None) -> None:
        self._lock = threading.Lock()
        self._rng = rng if rng is not None else random.Random()
        self._absent: set[str] = set()
        self._next_ns: int | None = None
        self._started_ns: int | None = None
        self._asked: Hashable = None
        self._avoid: Hashable = None
        self._outstanding = False
        self.learned: int | None = None
        """The last count read (None: none yet)."""
        self.learned_ns: int | None = None
        """When it was read (clock ns)."""
        self.reads = 0
        """Clients-table reads sent."""
        self.failed = 0
        """Reads that timed out or failed (tried again at the next interval)."""
        self.source = "default"
        """Where :meth:`size` comes from: ``configured``, the table read, or ``default``."""

    def size(self, config: FleetConfig) -> int:
        """The fleet size in force: configured, else learned, else ``default_size``."""
        if config.size > 0:
            return config.size
        learned = self.learned
        return learned if learned is not None else config.default_size

    def source_of(self, config: FleetConfig) -> str:
        """Where :meth:`size` comes from, for the snapshot."""
        return "configured" if config.size > 0 else self.source

    def order(
        self,
        now_ns: int,
        hosts: Sequence[tuple[Hashable, bool | None]],
        config: FleetConfig,
        nodes: int,
    ) -> ClientsOrder | None:
        """The clients-table read to send now, if one is due, to one of ``hosts`` (live
        local, each with whether it has ``system_views``: its release 4 or above, None when
        unknown), picked at random; ``nodes``: the local hosts the fleet's reads spread
        over."""
        if config.size > 0 or config.clients_interval <= 0 or not hosts:
            return None
        with self._lock:
            if self._outstanding:
                return None
            if self._next_ns is None:
                first = min(FIRST_CLIENTS_READ_S, config.clients_interval)
                self._next_ns = now_ns + round(self._rng.random() * first * _NS)
                if self._started_ns is None:
                    self._started_ns = now_ns
            if now_ns < self._next_ns:
                return None
            candidates = [(key, query) for key, has in hosts if (query := self._query(has))]
            if not candidates:
                return None
            others = [(key, query) for key, query in candidates if key != self._avoid]
            key, query = self._rng.choice(others or candidates)
            self._asked = key
            period = clients_period_s(
                self.size(config), config.budget, nodes, config.clients_interval
            )
            jitter = 1.0 + 0.25 * (2.0 * self._rng.random() - 1.0)
            self._next_ns = now_ns + round(period * jitter * _NS)
            self._outstanding = True
            self.reads += 1
            return ClientsOrder(key, query)

    def _query(self, has_views: bool | None) -> str | None:
        # Cassandra 4.0+ (or unknown) first; ScyllaDB (release 3.0.8) and anything that
        # refused system_views: system.clients.
        order = _QUERIES if has_views is not False else _QUERIES[::-1]
        return next((query for query in order if query not in self._absent), None)

    def answer(self, query: str, count: int, now_ns: int) -> None:
        """``query`` answered ``count`` sessions (0: the node lists nobody, as an unprimed
        Simulacron: the table is taken as absent there)."""
        with self._lock:
            self._outstanding = False
            if count <= 0:
                self._absent.add(query)
                self._next_ns = now_ns  # the other table, at once
                return
            self.learned, self.learned_ns = count, now_ns
            self.source = query.rsplit(" ", 1)[-1]

    def settled(self) -> bool:
        """Whether the fleet's size is known, or will not be: a clients-table read
        answered, :data:`FIRST_READ_TRIES` of them failed, or both tables absent."""
        with self._lock:
            return (
                self.learned is not None
                or self.failed >= FIRST_READ_TRIES
                or self._absent >= set(_QUERIES)
            )

    def started_ns(self) -> int | None:
        """When the fleet's first clients-table reads are done, as this client sees it:
        :data:`FIRST_CLIENTS_READ_S` after its first refresh (None: not started)."""
        with self._lock:
            started = self._started_ns
        return None if started is None else started + round(FIRST_CLIENTS_READ_S * _NS)

    def starting(self, now_ns: int) -> bool:
        """Whether the fleet's first clients-table reads may still be on their way: within
        :data:`FIRST_CLIENTS_READ_S` of this client's first refresh. A fleet started at once
        sends each node ``N / (nodes x FIRST_CLIENTS_READ_S)`` of them a second then; where
        the budget binds, the thread-pool reads wait for that window to pass rather than
        adding up with it."""
        with self._lock:
            started = self._started_ns
            return started is None or now_ns - started < FIRST_CLIENTS_READ_S * _NS

    def after_fork(self) -> None:
        """In a forked child: a read in flight was the parent's, its answer never comes
        here; the child reads the table anew (it is one more client)."""
        with self._lock:
            self._outstanding = False
            self._next_ns = None
            self._started_ns = None

    def fail(self, query: str, absent: bool) -> None:
        """``query`` did not answer; ``absent``: because the node has no such table or
        refuses it (remembered: not asked again)."""
        with self._lock:
            self._outstanding = False
            if absent:
                self._absent.add(query)
                self._next_ns = 0  # the other table, at once
            else:
                self.failed += 1
                if self.learned is None:  # another node, at once: not a lone pace for long
                    self._next_ns, self._avoid = 0, self._asked


class FleetPacer:
    """Each host's next slot for this client's own requests (see the module docstring).
    Used by the health refresh only (one thread)."""

    __slots__ = ("_next", "_rng", "_spent", "period_s")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._next: dict[Hashable, int] = {}
        self._spent: dict[Hashable, int] = {}
        """Hosts sent a clients-table read (:meth:`spend`) and when."""
        self.period_s = 0.0
        """The least spacing of the slots of one host (:func:`own_period_s`)."""

    def resize(self, period_s: float, now_ns: int, from_ns: int | None = None) -> None:
        """Set the period. When it grew (the fleet is larger than thought) every host's next
        slot is drawn anew within the new period from ``from_ns`` (now when None or past):
        a fleet that learns its size at once spreads its slots at once. When it shrank, no
        slot stays farther than that."""
        if period_s != self.period_s:
            grew = period_s > self.period_s
            base = now_ns if from_ns is None else max(now_ns, from_ns)
            for key in list(self._next):
                if grew:
                    self._next[key] = self._first(key, base, period_s)
                else:
                    drawn = now_ns + round(self._rng.random() * period_s * _NS)
                    self._next[key] = min(self._next[key], drawn)
        self.period_s = period_s

    def _first(self, key: Hashable, base_ns: int, period_s: float) -> int:
        """A host's first slot in a period: a random phase from ``base_ns``, and a period
        after this client's clients-table read of it, if any."""
        drawn = base_ns + round(self._rng.random() * period_s * _NS)
        spent = self._spent.pop(key, None)
        return drawn if spent is None else max(drawn, spent + round(period_s * _NS))

    def spend(self, key: Hashable, now_ns: int) -> None:
        """This client sent ``key`` a clients-table read now: a request of its own to that
        node like a read or a probe, so the host's next slot comes a period after it
        (also when the fleet's size, and so the period, is learnt from that very read)."""
        self._spent[key] = now_ns
        next_ns = self._next.get(key)
        if next_ns is not None:
            self._next[key] = max(next_ns, now_ns + round(self.period_s * _NS))

    def binding(self, base_s: float) -> bool:
        """Whether the period is longer than ``base_s``, a request's own interval."""
        return self.period_s > base_s

    def take(self, key: Hashable, now_ns: int, base_s: float) -> bool:
        """Whether this client may send ``key`` one of its own requests now, whose own
        interval is ``base_s``; True spends the slot."""
        period_s = self.period_s
        if period_s <= base_s:
            self._next[key] = now_ns + round(period_s * _NS)
            return True
        next_ns = self._next.get(key)
        if next_ns is None:  # first sight: a random phase
            next_ns = self._next[key] = self._first(key, now_ns, period_s)
        if now_ns < next_ns:
            return False
        self._next[key] = now_ns + round(period_s * (1.0 + SPREAD * self._rng.random()) * _NS)
        return True

    def keep(self, keys: Iterable[Hashable]) -> None:
        """Forget the hosts not in ``keys`` (removed from the cluster)."""
        kept = set(keys)
        for key in [key for key in list(self._spent) if key not in kept]:
            self._spent.pop(key, None)
        for key in [key for key in list(self._next) if key not in kept]:
            self._next.pop(key, None)
