"""adaptive-lb's own requests to one node, simulated: the trip a probe
(:class:`~adaptive_lb.tools.sim.driver_side.SimProber`) and a server-load read
(:class:`~adaptive_lb.tools.sim.load_reads.SimLoadReader`) share.

A trip goes over the network to its node only, counted on the client's pool while it is out
(:class:`~adaptive_lb.tools.sim.driver_side.PoolCounts`: any object with ``sent(host)`` and
``answered(host)``), and is served as a coordinator-only task behind whatever the node has
queued. A node that is down resets the connection; an injected fast failure answers with
an error once the node resumes; a dropped request is never answered (its timeout ends it,
its stream stays taken); a node that sheds it at the door (Overloaded) answers with an
error at once; a node that dies with it queued resets the connection. The answer travels
back over the network and releases the pool's stream, in time or late; the first of the
answer and the timeout ends the trip; while the client is paused, neither is handled before
the pause's end (:mod:`adaptive_lb.tools.sim.client_pauses`). What a served trip answers,
and what its end and its timeout record, is the subclass's (:meth:`OwnRequests.served`,
:meth:`OwnRequests.end`, :meth:`OwnRequests.expire`).

Imports the simulator's engine, nodes and servers only.
"""

from __future__ import annotations

from typing import Any

from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.node import DROPPED, FAILED_FAST, Node
from adaptive_lb.tools.sim.servers import SimulatedServers

__all__ = ["OwnRequests", "Trip"]


class Trip:
    """One of adaptive-lb's own requests on its way: its node, the record its outcome goes
    to, and ``note``, what the sender keeps with it (a probe's failure count at send, a
    read's send time, a clients read's query)."""

    __slots__ = ("ended", "node", "note", "record")

    def __init__(self, node: Node, record: Any, note: Any) -> None:
        self.node = node
        self.record = record
        self.note = note
        self.ended = False


class OwnRequests:
    """Sends one client's own requests of one kind (see the module docstring). ``zone`` is
    the client's, ``pools`` its pool counts; ``failed`` is the answer a failure gives
    :meth:`end`."""

    failed: Any = None
    kind = "own"
    """What the node counts it as (:meth:`~adaptive_lb.tools.sim.node.Node.count_own`)."""

    def __init__(self, policy: Any, zone: str, servers: SimulatedServers, pools: Any) -> None:
        self.policy = policy
        self.zone = zone
        self.servers = servers
        self.engine: Engine = servers.engine
        self.pools = pools
        self.sent = 0
        """Requests of this kind sent by this client."""
        self.pauses: Any = None
        """The client's own pauses (a
        :class:`~adaptive_lb.tools.sim.client_pauses.ClientPauses`): an answer or timeout
        due in one is handled at its end. None: the client never pauses."""

    def _paused(self, callback: Any, arg: Any) -> bool:
        if self.pauses is None or not self.pauses.defer(self.engine, callback, arg):
            return False
        self.pauses.answers_late += 1
        return True

    def served(self, trip: Trip) -> Any:
        """What the node answers when it serves ``trip``."""
        raise NotImplementedError

    def end(self, trip: Trip, answer: Any) -> None:
        """``trip`` ended with ``answer`` (``failed`` for a failure) before its timeout."""
        raise NotImplementedError

    def expire(self, trip: Trip) -> None:
        """``trip`` timed out before any answer."""
        raise NotImplementedError

    def dispatch(self, key: Any, record: Any, note: Any, timeout_s: float) -> None:
        """Send a request to the node of host ``key``, ended after ``timeout_s``."""
        self.sent += 1
        node = self.servers.node_of(key)
        engine = self.engine
        node.count_own(self.kind, engine.now)
        trip = Trip(node, record, note)
        self.pools.sent(node.host)
        engine.at(engine.now + round(timeout_s * NS_PER_S), self._timed_out, trip)
        delay = self.servers.network.delay(self.zone, node.zone)
        engine.at(engine.now + delay, self._arrive, trip)

    def _arrive(self, trip: Trip) -> None:
        node = trip.node
        now = self.engine.now
        if node.down:
            self._reply(trip, self.failed, now, reset=True)  # connection reset
            return
        fault = node.injected_fault(now)
        if fault == FAILED_FAST:
            self._reply(trip, self.failed, node.resume_time(now) + node.coord_ns)
            return
        if fault == DROPPED:
            return  # never answered: its timeout ends it, its stream stays taken
        if not node.submit(True, False, self._served, trip, self._lost):
            self._reply(trip, self.failed, now)  # Overloaded: shed at the door

    def _served(self, trip: Trip) -> None:
        self._reply(trip, self.served(trip), self.engine.now)

    def _lost(self, trip: Trip) -> None:
        self._reply(trip, self.failed, self.engine.now, reset=True)  # the node died with it

    def _reply(self, trip: Trip, answer: Any, at: int, reset: bool = False) -> None:
        delay = 0 if reset else self.servers.network.delay(trip.node.zone, self.zone)
        self.engine.at(at + delay, self._answer, (trip, answer))

    def _answer(self, token: tuple[Trip, Any]) -> None:
        if self._paused(self._answer, token):
            return
        trip, answer = token
        self.pools.answered(trip.node.host)
        if trip.ended:
            return  # timed out before: the driver's errback ran then
        trip.ended = True
        self.end(trip, answer)

    def _timed_out(self, trip: Trip) -> None:
        if trip.ended or self._paused(self._timed_out, trip):
            return
        trip.ended = True
        self.expire(trip)
