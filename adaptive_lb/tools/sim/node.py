"""One simulated server: a concurrency limit, a FIFO queue, lognormal service times, faults.

:class:`Node` serves ``workers`` tasks at once; the rest wait in a FIFO queue (at most
``max_queue``, then shed), so load makes a node slower. A task is coordinating a request,
reading from the local replica, or both; its service time is lognormal (from the node's own
random stream) plus the coordinator's fixed cost. Faults attach windows to a node: extra
service time, pauses (no progress at all: tasks in service and messages waiting are resumed
when the pause ends), warm-up after a restart, a CPU shared with another tenant, a fraction
of fast errors or of requests never answered. What a node does with a request it receives
is :mod:`adaptive_lb.tools.sim.servers`' business.

Imports the simulator's engine, network and scenario only.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.network import NS_PER_US
from adaptive_lb.tools.sim.scenario import NodesSpec

__all__ = ["DROPPED", "FAILED_FAST", "Node", "Task"]


def _in_windows(windows: list[tuple[int, int]], t: int) -> bool:
    return any(start <= t < end for start, end in windows)


Task = tuple[bool, bool, Callable[[Any], None], Any, "Callable[[Any], None] | None"]
"""A unit of work: (coordinate?, read?, done callback, its argument, lost callback or None:
called with the argument when the node dies with the task in service or queued)."""

DROPPED = "dropped"
""":meth:`Node.injected_fault`: the request is never answered (a ``timeouts`` fault)."""
FAILED_FAST = "failed-fast"
""":meth:`Node.injected_fault`: the request fails at once (an ``errors`` fault)."""


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
        "own_requests",
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

    index: int
    """Position in the run's node list (indexes the per-node counts of a run)."""
    name: str
    """``ZONE/INDEX``."""
    host: Any
    """The driver ``Host`` that clients address this node by."""
    zone: str
    """The zone (the driver's rack)."""
    datacenter: str
    rng: random.Random
    """The node's own random stream: service times, injected faults."""

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
        # Capacity and service times, from the scenario's ``nodes`` and the node's stream.
        self.workers = spec.workers
        self.max_queue = spec.max_queue
        self.mu = math.log(spec.service_median_us * NS_PER_US)
        self.sigma = spec.service_sigma
        self.rng = rng
        self.coord_ns = round(spec.coordinator_us * NS_PER_US)
        # Who and where it is.
        self.index = index
        self.name = name
        self.host = host
        self.zone = zone
        self.datacenter = datacenter
        # Work in progress, scheduled on the run's event engine.
        self.busy = 0
        self.queue: deque[Task] = deque()
        self._active: dict[int, Task] = {}
        self._next_task = 0
        self.engine = engine
        self.down = False
        self.epoch = 0
        self.tasks_done = 0
        self.reads = 0
        """Replica reads served for measured requests."""
        self.own_requests: dict[str, list[int]] = {}
        """adaptive-lb's own requests (server-load reads, probes) received, by kind: a
        count per second of the run (:meth:`count_own`)."""
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

    def count_own(self, kind: str, now: int) -> None:
        """One of adaptive-lb's own requests of ``kind`` (``read``, ``probe``) was sent to
        this node at ``now``."""
        per_second = self.own_requests.setdefault(kind, [])
        second = now // NS_PER_S
        if second >= len(per_second):
            per_second.extend([0] * (second + 1 - len(per_second)))
        per_second[second] += 1

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

    def injected_fault(self, t: int) -> str | None:
        """Whether an ``errors`` or ``timeouts`` fault picks a request arriving at ``t``:
        :data:`FAILED_FAST`, :data:`DROPPED` or None. Draws once from the node's stream
        when the node has such a fault at all (active or not), never otherwise."""
        if not (self.errors or self.drops):
            return None
        draw = self.rng.random()
        if draw < self.fraction(self.errors, t):
            return FAILED_FAST
        if draw < self.fraction(self.drops, t):
            return DROPPED
        return None

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
