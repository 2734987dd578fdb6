"""The simulated servers acting together: replica placement and a coordinator's work.

:class:`SimulatedServers` is the server side of a simulated cluster -- the nodes, the
network between them and where each partition lives -- and does what a coordinator does
with one attempt of a client's request, answering :data:`OK` or :data:`ERROR`:

* ``ONE`` / ``LOCAL_ONE``: a coordinator that is a replica reads locally, otherwise it
  forwards the read to the closest live replica (same zone first, then by network latency:
  a static snitch).
* ``LOCAL_QUORUM``: it reads from the closest ``RF // 2 + 1`` live local replicas (itself
  first) and answers when all of them did.
* A replica that goes down mid-read is replaced by the next live one (its connection resets
  at once); a read to a paused replica simply waits, and the client's timeout decides.

Not to be confused with :class:`~adaptive_lb.tools.sim.driver_topology.DriverTopology`, the
client side's view of the same cluster (the driver's ``Metadata``, ``Host`` objects and
``TokenMap``), which it asks where a partition's replicas are.

Not modelled (stated so the numbers can be judged): Cassandra's dynamic snitch and rapid
read protection (speculative retry at the coordinator), digest reads, read repair.

Imports the simulator's engine, network, nodes, scenario and driver topology only.
"""

from __future__ import annotations

from typing import Any

from adaptive_lb.tools.sim.driver_topology import DriverTopology
from adaptive_lb.tools.sim.engine import Engine
from adaptive_lb.tools.sim.network import Network
from adaptive_lb.tools.sim.node import DROPPED, FAILED_FAST, Node
from adaptive_lb.tools.sim.scenario import Scenario

__all__ = ["ERROR", "OK", "SimulatedServers"]

OK = 0
"""The attempt succeeded."""
ERROR = 1
"""A fast error (Overloaded, Unavailable, ReadFailure, connection reset): the driver's retry
policy moves on to the next host of the plan."""


class SimulatedServers:
    """The nodes, the network, replica placement and the coordinator's behaviour."""

    def __init__(
        self,
        scenario: Scenario,
        engine: Engine,
        topology: DriverTopology,
        nodes: list[Node],
        network: Network,
        statements: list[Any],
    ) -> None:
        consistency = scenario.workload.consistency
        self.local = consistency != "ONE"
        """A ``LOCAL_*`` level: replicas are those of the clients' datacenter."""
        self.quorum = consistency == "LOCAL_QUORUM"
        """Reads wait for ``RF // 2 + 1`` replicas (else for one)."""
        self.engine = engine
        self.network = network
        self.nodes = nodes
        self._by_host = {id(node.host): node for node in nodes}
        # Where each partition lives: asked of the driver's token map once per key.
        self.topology = topology
        """The driver's view of the cluster: replicas come from its token map."""
        self._statements = statements
        self._dc_filter = scenario.client_datacenter if self.local else None
        self._replicas: dict[int, list[Node]] = {}
        self._ordered: dict[tuple[int, str], list[Node]] = {}

    def node_of(self, host: Any) -> Node:
        """The node behind a driver ``Host``."""
        return self._by_host[id(host)]

    def replicas(self, key: int) -> list[Node]:
        """Replicas of key ``key`` (ring order), in the clients' DC for LOCAL_* levels."""
        found = self._replicas.get(key)
        if found is None:
            statement = self._statements[key]
            hosts = self.topology.metadata.get_replicas(statement.keyspace, statement.routing_key)
            found = [self._by_host[id(h)] for h in hosts]
            if self._dc_filter is not None:
                found = [n for n in found if n.datacenter == self._dc_filter]
            self._replicas[key] = found
        return found

    def ordered_replicas(self, key: int, coordinator: Node) -> list[Node]:
        """Replicas by proximity to ``coordinator``: itself, then by network latency."""
        cache_key = (key, coordinator.zone)
        ordered = self._ordered.get(cache_key)
        if ordered is None:
            base = self.network.base_ns
            ordered = sorted(self.replicas(key), key=lambda n: base(coordinator.zone, n.zone))
            self._ordered[cache_key] = ordered
        if coordinator in ordered and ordered[0] is not coordinator:
            ordered = [coordinator] + [n for n in ordered if n is not coordinator]
        return ordered

    # ------------------------------------------------------------------ coordinator

    def arrive(self, attempt: Any) -> None:
        """An attempt reaches its coordinator."""
        node: Node = attempt.node
        engine = self.engine
        now = engine.now
        request = attempt.request
        if node.fault_active(now):
            request.touched = True
        if node.down:
            self._reply(attempt, ERROR, now)
            return
        fault = node.injected_fault(now)
        if fault == FAILED_FAST:
            self._reply(attempt, ERROR, node.resume_time(now) + node.coord_ns)
            return
        if fault == DROPPED:
            return  # never answered: the client's timeout fires
        node.coordinating[id(attempt)] = attempt
        if self.quorum:
            accepted = node.submit(True, False, self._dispatch_quorum, attempt)
        elif node in self.replicas(request.key):
            attempt.needed = 1
            if request.measured:
                node.reads += 1
            accepted = node.submit(True, True, self._answered, attempt)
        else:
            accepted = node.submit(True, False, self._forward, attempt)
        if not accepted:
            self._reply(attempt, ERROR, now)  # Overloaded: shed at the door

    def _forward(self, attempt: Any) -> None:
        attempt.needed = 1
        self._send_reads(attempt, 1)

    def _dispatch_quorum(self, attempt: Any) -> None:
        rf = len(self.replicas(attempt.request.key))
        attempt.needed = rf // 2 + 1
        self._send_reads(attempt, attempt.needed)

    def _send_reads(self, attempt: Any, count: int) -> None:
        node: Node = attempt.node
        now = self.engine.now
        live = [
            n
            for n in self.ordered_replicas(attempt.request.key, node)
            if not n.down and n not in attempt.tried
        ]
        if len(live) + attempt.got < attempt.needed:
            self._reply(attempt, ERROR, now)  # Unavailable
            return
        for replica in live[:count]:
            attempt.tried.append(replica)
            if replica is node:
                if attempt.request.measured:
                    node.reads += 1
                if not node.submit(False, True, self._self_read_done, attempt):
                    self._reply(attempt, ERROR, now)
                    return
            else:
                delay = self.network.delay(node.zone, replica.zone)
                self.engine.at(now + delay, self._read_arrive, (attempt, replica))

    def _read_arrive(self, token: tuple[Any, Node]) -> None:
        attempt, replica = token
        now = self.engine.now
        request = attempt.request
        if replica.fault_active(now):
            request.touched = True
        if replica.down:
            self._read_lost(token)
            return
        fault = replica.injected_fault(now)
        if fault == FAILED_FAST:
            self._respond(token, ERROR, replica.resume_time(now))
            return
        if fault == DROPPED:
            return
        if request.measured:
            replica.reads += 1
        if not replica.submit(False, True, self._read_done, token, self._read_lost):
            self._respond(token, ERROR, now)

    def _read_done(self, token: tuple[Any, Node]) -> None:
        self._respond(token, OK, self.engine.now)

    def _respond(self, token: tuple[Any, Node], outcome: int, at: int) -> None:
        attempt, replica = token
        delay = self.network.delay(replica.zone, attempt.node.zone)
        self.engine.at(at + delay, self._read_response, (attempt, outcome))

    def _read_lost(self, token: tuple[Any, Node]) -> None:
        attempt, replica = token
        # The coordinator sees the connection reset and asks the next live replica.
        delay = self.network.delay(replica.zone, attempt.node.zone)
        self.engine.at(self.engine.now + delay, self._retry_read, attempt)

    def _retry_read(self, attempt: Any) -> None:
        if attempt.dead or attempt.node.down:
            return
        self._send_reads(attempt, 1)

    def _read_response(self, token: tuple[Any, int]) -> None:
        attempt, outcome = token
        node: Node = attempt.node
        if attempt.dead or node.down:
            return
        now = self.engine.now
        if node.pauses:
            resume = node.resume_time(now)
            if resume > now:
                self.engine.at(resume, self._read_response, token)
                return
        if outcome != OK:
            self._reply(attempt, ERROR, now)  # ReadFailure
            return
        self._answered(attempt)

    def _self_read_done(self, attempt: Any) -> None:
        if not attempt.dead:
            self._answered(attempt)

    def _answered(self, attempt: Any) -> None:
        attempt.got += 1
        if attempt.got >= attempt.needed:
            self._reply(attempt, OK, self.engine.now)

    def _reply(self, attempt: Any, outcome: int, at: int) -> None:
        node: Node = attempt.node
        node.coordinating.pop(id(attempt), None)
        attempt.dead = True
        client = attempt.request.client
        # A connection refused / reset: the client knows at once.
        down = outcome == ERROR and node.down
        delay = 0 if down else self.network.delay(node.zone, client.zone)
        self.engine.at(at + delay, client.on_reply, (attempt, outcome))

    # ------------------------------------------------------------------ topology events

    def take_down(self, node: Node) -> None:
        """Kill ``node``: clients whose attempts it coordinates get a connection error,
        reads it was serving are lost (their coordinators ask another replica)."""
        lost = node.go_down()
        for task in lost:
            if task[4] is not None:
                task[4](task[3])
        coordinating = list(node.coordinating.values())
        node.coordinating.clear()
        for attempt in coordinating:
            self._reply(attempt, ERROR, self.engine.now)
