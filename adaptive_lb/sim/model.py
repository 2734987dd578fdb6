"""The simulated cluster: network, nodes (workers + queue), and what a coordinator does.

* :class:`Network` -- one-way latency between zones (a matrix), times a lognormal jitter.
* :class:`Node` -- ``workers`` tasks served at once (a concurrency limit), the rest wait in
  a FIFO queue, so load makes a node slower. Service times are lognormal. Faults attach
  windows to a node: extra service time, pauses (no progress at all: tasks in service and
  messages waiting are resumed when the pause ends), warm-up after a restart, a CPU shared
  with another tenant, a fraction of fast errors or of requests never answered.
* :class:`SimCluster` -- the coordinator's work for one attempt. ``ONE`` / ``LOCAL_ONE``:
  a coordinator that is a replica reads locally, otherwise it forwards the read to the
  closest live replica (same zone first, then by network latency: a static snitch).
  ``LOCAL_QUORUM``: it reads from the closest ``RF // 2 + 1`` live local replicas (itself
  first) and answers when all of them did. A replica that goes down mid-read is replaced
  by the next live one (its connection resets at once); a read to a paused replica simply
  waits, and the client's timeout decides.

Not modelled (stated so the numbers can be judged): Cassandra's dynamic snitch and rapid
read protection (speculative retry at the coordinator), digest reads, read repair.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from adaptive_lb.sim.engine import Engine
from adaptive_lb.sim.scenario import NodesSpec, Scenario

__all__ = ["ERROR", "OK", "Network", "Node", "SimCluster"]

OK = 0
"""The attempt succeeded."""
ERROR = 1
"""A fast error (Overloaded, Unavailable, ReadFailure, connection reset): the driver's retry
policy moves on to the next host of the plan."""

_NS_PER_US = 1000
_NS_PER_S = 1_000_000_000


def _in_windows(windows: list[tuple[int, int]], t: int) -> bool:
    return any(start <= t < end for start, end in windows)


class Network:
    """One-way message latency between zones."""

    __slots__ = ("_base", "_rng", "_sigma")

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        zones = scenario.zones()
        matrix = scenario.network.matrix()
        inter_dc = scenario.network.inter_dc_us
        self._base: dict[tuple[str, str], int] = {}
        for src, src_dc in zones.items():
            for dst, dst_dc in zones.items():
                us = matrix.get(src, {}).get(dst)
                if us is None:
                    us = inter_dc if src_dc != dst_dc else 0.0
                self._base[(src, dst)] = round(us * _NS_PER_US)
        self._sigma = scenario.network.jitter
        self._rng = rng

    def base_ns(self, src: str, dst: str) -> int:
        """The matrix value from ``src`` to ``dst`` (ns)."""
        return self._base[(src, dst)]

    def delay(self, src: str, dst: str) -> int:
        """One message's latency from zone ``src`` to zone ``dst`` (ns)."""
        base = self._base[(src, dst)]
        if self._sigma <= 0.0 or base == 0:
            return base
        return int(base * math.exp(self._sigma * self._rng.gauss(0.0, 1.0)))


# A task: (coordinate?, read?, done callback, argument, lost callback or None).
Task = tuple[bool, bool, Callable[[Any], None], Any, "Callable[[Any], None] | None"]


class Node:
    """One server: a concurrency limit, a FIFO queue, lognormal service times, faults."""

    __slots__ = (
        "_active",
        "_next_task",
        "busy",
        "coord_ns",
        "coordinating",
        "cpu_share",
        "datacenter",
        "down",
        "drops",
        "engine",
        "epoch",
        "errors",
        "fault_windows",
        "host",
        "index",
        "max_queue",
        "mu",
        "name",
        "pauses",
        "queue",
        "reads",
        "rng",
        "sigma",
        "slow",
        "tasks_done",
        "warm",
        "workers",
        "zone",
    )

    def __init__(
        self,
        index: int,
        name: str,
        host: Any,
        zone: str,
        datacenter: str,
        spec: NodesSpec,
        engine: Engine,
        rng: random.Random,
    ) -> None:
        self.index = index
        self.name = name
        """``ZONE/INDEX``."""
        self.host = host
        self.zone = zone
        self.datacenter = datacenter
        self.engine = engine
        self.rng = rng
        self.workers = spec.workers
        self.max_queue = spec.max_queue
        self.mu = math.log(spec.service_median_us * _NS_PER_US)
        self.sigma = spec.service_sigma
        self.coord_ns = round(spec.coordinator_us * _NS_PER_US)
        self.busy = 0
        self.queue: deque[Task] = deque()
        self._active: dict[int, Task] = {}
        self._next_task = 0
        self.down = False
        self.epoch = 0
        self.tasks_done = 0
        self.reads = 0
        """Replica reads served for measured requests."""
        self.coordinating: dict[int, Any] = {}
        """Attempts this node coordinates and has not answered yet (by ``id``)."""
        # Fault windows, [start, end) in ns.
        self.pauses: list[tuple[int, int]] = []
        self.slow: list[tuple[int, int, int]] = []
        self.warm: list[tuple[int, int, float]] = []
        self.cpu_share: list[tuple[int, int, float]] = []
        self.errors: list[tuple[int, int, float]] = []
        self.drops: list[tuple[int, int, float]] = []
        self.fault_windows: list[tuple[int, int]] = []
        """When a fault is active on this node (for the 'touched the faulted node' count)."""

    # ------------------------------------------------------------------ faults

    def fault_active(self, t: int) -> bool:
        """Whether a fault of this node is active at ``t``."""
        return bool(self.fault_windows) and _in_windows(self.fault_windows, t)

    def paused(self, t: int) -> bool:
        """Whether the node is paused at ``t``."""
        return bool(self.pauses) and _in_windows(self.pauses, t)

    def resume_time(self, t: int) -> int:
        """The first instant at or after ``t`` at which the node is not paused."""
        for start, end in self.pauses:
            if t < start:
                return t
            if t < end:
                return end
        return t

    def finish_time(self, start: int, work: int) -> int:
        """When ``work`` ns of service started at ``start`` completes, pauses skipped."""
        t = start
        remaining = work
        for p_start, p_end in self.pauses:
            if p_end <= t:
                continue
            if p_start >= t + remaining:
                break
            if p_start > t:
                remaining -= p_start - t
            t = p_end
        return t + remaining

    def fraction(self, windows: list[tuple[int, int, float]], t: int) -> float:
        """The fault fraction active at ``t`` in ``windows`` (0 when none)."""
        for start, end, value in windows:
            if start <= t < end:
                return value
        return 0.0

    def service_ns(self, coordinate: bool, read: bool, t: int) -> int:
        """Service time of a task starting at ``t``."""
        work = 0.0
        if coordinate:
            work += self.coord_ns
        if read:
            work += math.exp(self.mu + self.sigma * self.rng.gauss(0.0, 1.0))
        for start, end, factor in self.warm:
            if start <= t < end:
                # Cold caches: factor x at the return, back to 1 x linearly at ``end``.
                work *= 1.0 + (factor - 1.0) * (end - t) / (end - start)
        for start, end, share in self.cpu_share:
            if start <= t < end:
                work /= 1.0 - share
        for start, end, extra in self.slow:
            if start <= t < end:
                work += extra
        return round(work)

    # ------------------------------------------------------------------ work

    def submit(
        self,
        coordinate: bool,
        read: bool,
        done: Callable[[Any], None],
        arg: Any,
        lost: Callable[[Any], None] | None = None,
    ) -> bool:
        """Queue a task; False when the node is down or sheds it (queue full)."""
        if self.down:
            return False
        task = (coordinate, read, done, arg, lost)
        if self.busy < self.workers:
            self.busy += 1
            self._start(task)
            return True
        if self.max_queue is not None and len(self.queue) >= self.max_queue:
            return False
        self.queue.append(task)
        return True

    def _start(self, task: Task) -> None:
        engine = self.engine
        start = self.resume_time(engine.now)
        work = self.service_ns(task[0], task[1], start)
        finish = self.finish_time(start, work) if self.pauses else start + work
        self._next_task += 1
        self._active[self._next_task] = task
        engine.at(finish, self._complete, (self.epoch, self._next_task))

    def _complete(self, token: tuple[int, int]) -> None:
        epoch, task_id = token
        if epoch != self.epoch:
            return  # the node went down meanwhile: the task was lost
        task = self._active.pop(task_id)
        self.tasks_done += 1
        queue = self.queue
        if queue:
            self._start(queue.popleft())
        else:
            self.busy -= 1
        task[2](task[3])

    def go_down(self) -> list[Task]:
        """The process dies: every task in service or queued is lost (returned)."""
        self.down = True
        self.epoch += 1
        lost = list(self._active.values()) + list(self.queue)
        self._active.clear()
        self.queue.clear()
        self.busy = 0
        return lost

    def come_up(self) -> None:
        """The process is back (cold: see the warm-up windows)."""
        self.down = False


class SimCluster:
    """Nodes, network, replica placement and the coordinator's behaviour."""

    def __init__(
        self,
        scenario: Scenario,
        engine: Engine,
        model: Any,
        nodes: list[Node],
        network: Network,
        statements: list[Any],
        rng: random.Random,
    ) -> None:
        self.scenario = scenario
        self.engine = engine
        self.model = model
        self.nodes = nodes
        self.network = network
        self._statements = statements
        self._rng = rng
        self._by_host = {id(node.host): node for node in nodes}
        consistency = scenario.workload.consistency
        self.local = consistency != "ONE"
        self.quorum = consistency == "LOCAL_QUORUM"
        self._replicas: dict[int, list[Node]] = {}
        self._ordered: dict[tuple[int, str], list[Node]] = {}
        self._dc_filter = scenario.client_datacenter if self.local else None

    def node_of(self, host: Any) -> Node:
        """The node behind a driver ``Host``."""
        return self._by_host[id(host)]

    def replicas(self, key: int) -> list[Node]:
        """Replicas of key ``key`` (ring order), in the clients' DC for LOCAL_* levels."""
        found = self._replicas.get(key)
        if found is None:
            statement = self._statements[key]
            hosts = self.model.metadata.get_replicas(statement.keyspace, statement.routing_key)
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
        if node.fault_windows and _in_windows(node.fault_windows, now):
            request.touched = True
        if node.down:
            self._reply(attempt, ERROR, now)
            return
        if node.errors or node.drops:
            draw = node.rng.random()
            if draw < node.fraction(node.errors, now):
                self._reply(attempt, ERROR, node.resume_time(now) + node.coord_ns)
                return
            if draw < node.fraction(node.drops, now):
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
        if replica.fault_windows and _in_windows(replica.fault_windows, now):
            request.touched = True
        if replica.down:
            self._read_lost(token)
            return
        if replica.errors or replica.drops:
            draw = replica.rng.random()
            if draw < replica.fraction(replica.errors, now):
                self._respond(token, ERROR, replica.resume_time(now))
                return
            if draw < replica.fraction(replica.drops, now):
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
