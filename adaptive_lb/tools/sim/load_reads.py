"""adaptive-lb's server-load reads, simulated: what :mod:`adaptive_lb.runtime.prober` does with a
:class:`~adaptive_lb.stats.server_load.LoadOrder` in production, against the simulated nodes.

A read is sent like a probe (:class:`~adaptive_lb.tools.sim.driver_side.SimProber`, both
:class:`~adaptive_lb.tools.sim.own_requests.OwnRequests`): over the network to its node
only, counted on the client's pool while it is out, served as a coordinator-only task
behind whatever the node has queued (pauses, injected faults, down, Overloaded alike),
with ``health.server_load.timeout``. The node answers the rows of
``system_views.thread_pools`` as its state is when the read is served: the simulated node
has one worker pool, which is both Cassandra's request threads and its read stage, so both
rows carry its busy workers (``active_tasks``), its worker count (``active_tasks_limit``)
and its queue (``pending_tasks``). A scenario whose nodes have no such table
(``nodes.thread_pools: false``: ScyllaDB, Cassandra 3.x) answers the read with an
InvalidRequest instead.

:class:`SimClientsReader` answers the clients-table reads of
:mod:`adaptive_lb.stats.fleet` likewise: a node lists one session per client of the
scenario (each client has one connection to each node), and the count goes to the
policy's :class:`~adaptive_lb.stats.fleet.FleetEstimate` as the prober's does.

The rows then go where the prober's go: :func:`~adaptive_lb.stats.server_load.parse_pools` and
:meth:`~adaptive_lb.stats.server_load.ServerLoadRecord.answer` (or ``fail``), and the policy's own
health refresh turns them into the host's factor (:func:`~adaptive_lb.stats.server_load.publish`):
the production code, nothing of it re-implemented here.

Imports the library's :mod:`adaptive_lb.stats.server_load` and :mod:`adaptive_lb.stats.fleet`
and the simulator's own requests, nodes and servers only.
"""

from __future__ import annotations

from typing import Any

from adaptive_lb.stats.fleet import ClientsOrder, FleetEstimate
from adaptive_lb.stats.server_load import LoadOrder, ServerLoadRecord, parse_pools
from adaptive_lb.tools.sim.node import Node
from adaptive_lb.tools.sim.own_requests import OwnRequests, Trip
from adaptive_lb.tools.sim.servers import SimulatedServers

__all__ = ["NO_TABLE", "POOLS", "SimClientsReader", "SimLoadReader", "thread_pools_rows"]

POOLS = ("Native-Transport-Requests", "ReadStage")
"""The rows a simulated node reports: its one worker pool under both names."""
NO_TABLE = "InvalidRequest: table thread_pools does not exist"
"""What a node without the table answers (as the prober records a RequestValidationException)."""


def thread_pools_rows(node: Node) -> list[tuple[str, int, int, int, int]]:
    """``node``'s ``system_views.thread_pools`` rows now, in the query's column order
    (name, active, limit, pending, blocked)."""
    return [(name, node.busy, node.workers, len(node.queue), 0) for name in POOLS]


class SimLoadReader(OwnRequests):
    """Sends one client's server-load reads (``policy.use_prober(..., read_load=reader.read)``);
    see the module docstring. ``zone`` is the client's, ``pools`` its
    :class:`~adaptive_lb.tools.sim.driver_side.PoolCounts`; ``thread_pools``: whether the nodes
    have the table."""

    kind = "read"

    def __init__(
        self, policy: Any, zone: str, servers: SimulatedServers, pools: Any, thread_pools: bool
    ) -> None:
        super().__init__(policy, zone, servers, pools)
        self.thread_pools = thread_pools

    def read(self, order: LoadOrder) -> None:
        """Send the read ``order`` asks for (what the prober does through the driver)."""
        record: ServerLoadRecord = order.stats.load
        if not record.begin(order.next_ns):
            return
        timeout_s = self.policy.config.health.server_load.timeout
        self.dispatch(order.key, record, self.policy.now_ns(), timeout_s)

    def served(self, trip: Trip) -> Any:
        return thread_pools_rows(trip.node) if self.thread_pools else NO_TABLE

    def end(self, trip: Trip, answer: Any) -> None:
        record = trip.record
        if answer is None:
            record.fail()
        elif isinstance(answer, str):
            record.fail(absent=answer)
        else:
            now = self.policy.now_ns()
            half_life = self.policy.config.health.server_load.half_life
            record.answer(parse_pools(answer), now, (now - trip.note) / 1e9, half_life)

    def expire(self, trip: Trip) -> None:
        trip.record.fail()


class SimClientsReader(OwnRequests):
    """Sends one client's clients-table reads (``policy.use_prober(...,
    read_clients=reader.read)``); every node lists ``sessions`` sessions (the scenario's
    clients)."""

    kind = "read"

    def __init__(
        self, policy: Any, zone: str, servers: SimulatedServers, pools: Any, sessions: int
    ) -> None:
        super().__init__(policy, zone, servers, pools)
        self.sessions = sessions

    def read(self, order: ClientsOrder) -> None:
        """Send the read ``order`` asks for (what the prober does through the driver)."""
        estimate: FleetEstimate = self.policy.fleet
        timeout_s = self.policy.config.health.server_load.timeout
        self.dispatch(order.key, estimate, order.query, timeout_s)

    def served(self, trip: Trip) -> Any:
        return self.sessions

    def end(self, trip: Trip, answer: Any) -> None:
        if answer is None:
            trip.record.fail(trip.note, absent=False)
        else:
            trip.record.answer(trip.note, answer, self.policy.now_ns())

    def expire(self, trip: Trip) -> None:
        trip.record.fail(trip.note, absent=False)
