"""adaptive-lb's server-load reads, simulated: what :mod:`adaptive_lb.prober` does with a
:class:`~adaptive_lb.server_load.LoadOrder` in production, against the simulated nodes.

A read is sent like a probe (:class:`~adaptive_lb.tools.sim.driver_side.SimProber`): over the
network to its node only, counted on the client's pool while it is out, served as a
coordinator-only task behind whatever the node has queued (pauses, injected faults, down,
Overloaded alike), with ``health.server_load.timeout``. The node answers the rows of
``system_views.thread_pools`` as its state is when the read is served: the simulated node
has one worker pool, which is both Cassandra's request threads and its read stage, so both
rows carry its busy workers (``active_tasks``), its worker count (``active_tasks_limit``)
and its queue (``pending_tasks``). A scenario whose nodes have no such table
(``nodes.thread_pools: false``: ScyllaDB, Cassandra 3.x) answers the read with an
InvalidRequest instead.

The rows then go where the prober's go: :func:`~adaptive_lb.server_load.parse_pools` and
:meth:`~adaptive_lb.server_load.ServerLoadRecord.answer` (or ``fail``), and the policy's own
health refresh turns them into the host's factor (:func:`~adaptive_lb.server_load.publish`):
the production code, nothing of it re-implemented here.

Imports the library's :mod:`adaptive_lb.server_load` and the simulator's engine, nodes and
servers only.
"""

from __future__ import annotations

from typing import Any

from adaptive_lb.server_load import LoadOrder, ServerLoadRecord, parse_pools
from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.node import DROPPED, FAILED_FAST, Node
from adaptive_lb.tools.sim.servers import SimulatedServers

__all__ = ["NO_TABLE", "POOLS", "SimLoadReader", "thread_pools_rows"]

POOLS = ("Native-Transport-Requests", "ReadStage")
"""The rows a simulated node reports: its one worker pool under both names."""
NO_TABLE = "InvalidRequest: table thread_pools does not exist"
"""What a node without the table answers (as the prober records a RequestValidationException)."""


def thread_pools_rows(node: Node) -> list[tuple[str, int, int, int, int]]:
    """``node``'s ``system_views.thread_pools`` rows now, in the query's column order
    (name, active, limit, pending, blocked)."""
    return [(name, node.busy, node.workers, len(node.queue), 0) for name in POOLS]


class _Read:
    """One read on its way."""

    __slots__ = ("ended", "node", "record", "sent_ns")

    def __init__(self, node: Node, record: ServerLoadRecord, sent_ns: int) -> None:
        self.node = node
        self.record = record
        self.sent_ns = sent_ns
        self.ended = False


class SimLoadReader:
    """Sends one client's server-load reads (``policy.use_prober(..., read_load=reader.read)``);
    see the module docstring. ``zone`` is the client's, ``pools`` its
    :class:`~adaptive_lb.tools.sim.driver_side.PoolCounts`; ``thread_pools``: whether the nodes
    have the table."""

    def __init__(
        self, policy: Any, zone: str, servers: SimulatedServers, pools: Any, thread_pools: bool
    ) -> None:
        self.policy = policy
        self.zone = zone
        self.servers = servers
        self.engine: Engine = servers.engine
        self.pools = pools
        self.thread_pools = thread_pools
        self.sent = 0
        """Reads sent by this client."""

    def read(self, order: LoadOrder) -> None:
        """Send the read ``order`` asks for (what the prober does through the driver)."""
        record: ServerLoadRecord = order.stats.load
        if not record.begin(order.next_ns):
            return
        self.sent += 1
        node = self.servers.node_of(order.key)
        engine = self.engine
        read = _Read(node, record, self.policy.now_ns())
        self.pools.sent(node.host)
        timeout_ns = round(self.policy.config.health.server_load.timeout * NS_PER_S)
        engine.at(engine.now + timeout_ns, self._timed_out, read)
        delay = self.servers.network.delay(self.zone, node.zone)
        engine.at(engine.now + delay, self._arrive, read)

    def _arrive(self, read: _Read) -> None:
        node = read.node
        now = self.engine.now
        if node.down:
            self._reply(read, None, now, reset=True)  # connection reset
            return
        fault = node.injected_fault(now)
        if fault == FAILED_FAST:
            self._reply(read, None, node.resume_time(now) + node.coord_ns)
            return
        if fault == DROPPED:
            return  # never answered: its timeout ends it, its stream stays taken
        if not node.submit(True, False, self._served, read, self._lost):
            self._reply(read, None, now)  # Overloaded: shed at the door

    def _served(self, read: _Read) -> None:
        rows = thread_pools_rows(read.node) if self.thread_pools else NO_TABLE
        self._reply(read, rows, self.engine.now)

    def _lost(self, read: _Read) -> None:
        self._reply(read, None, self.engine.now, reset=True)  # the node died with it

    def _reply(self, read: _Read, answer: Any, at: int, reset: bool = False) -> None:
        delay = 0 if reset else self.servers.network.delay(read.node.zone, self.zone)
        self.engine.at(at + delay, self._answer, (read, answer))

    def _answer(self, token: tuple[_Read, Any]) -> None:
        read, answer = token
        self.pools.answered(read.node.host)
        if read.ended:
            return  # timed out before: the driver's errback ran then
        read.ended = True
        record = read.record
        if answer is None:
            record.fail()
        elif isinstance(answer, str):
            record.fail(absent=answer)
        else:
            now = self.policy.now_ns()
            half_life = self.policy.config.health.server_load.half_life
            record.answer(parse_pools(answer), now, (now - read.sent_ns) / 1e9, half_life)

    def _timed_out(self, read: _Read) -> None:
        if read.ended:
            return
        read.ended = True
        read.record.fail()
