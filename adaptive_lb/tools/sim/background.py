"""Other clients' load on a node: requests no simulated client sends.

A ``load`` fault (:class:`~adaptive_lb.tools.sim.scenario.FaultSpec`) gives its node a Poisson
stream of requests from outside the run's clients -- other workers of the same service,
other services -- from ``start`` to ``end``, at ``rate`` a second or at ``utilization`` x
the node's nominal capacity (``workers`` / the mean time of a coordinated local read). Each
is a local read the node coordinates (:meth:`~adaptive_lb.tools.sim.node.Node.submit`), so it
takes the node's workers and queue like any request, and the simulated clients see the node
only as the queueing it causes: in their own requests' latency, in what the node reports of
its thread pools (``nodes.thread_pools``, :mod:`adaptive_lb.tools.sim.load_reads`).

The arrivals are drawn from a stream of their own per node (``rng_for(node name)``), so they
are the same for every policy of a scenario and a run stays a function of its seed. Requests
that arrive while the node is down are lost; a paused node queues them.

Imports the simulator's engine, faults, nodes and scenario only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.faults import node_named
from adaptive_lb.tools.sim.node import Node
from adaptive_lb.tools.sim.scenario import FaultSpec, NodesSpec, Scenario

__all__ = ["Background", "capacity", "install_background"]


def capacity(spec: NodesSpec) -> float:
    """Coordinated local reads a second a node of ``spec`` serves with every worker busy:
    ``workers`` / (coordinator work + mean lognormal read)."""
    mean_us = spec.coordinator_us + spec.service_median_us * math.exp(spec.service_sigma**2 / 2)
    return spec.workers / (mean_us / 1e6)


class Background:
    """One ``load`` fault's arrivals on ``node`` (see the module docstring)."""

    __slots__ = ("end_ns", "engine", "mean_gap_ns", "node", "rng", "sent", "shed")

    def __init__(
        self,
        node: Node,
        rate: float,
        start_ns: int,
        end_ns: int,
        engine: Engine,
        rng: random.Random,
    ) -> None:
        self.node = node
        self.engine = engine
        self.rng = rng
        self.mean_gap_ns = NS_PER_S / rate
        self.end_ns = end_ns
        self.sent = 0
        """Requests that reached the node."""
        self.shed = 0
        """Requests the node refused (down, or its queue full)."""
        self._schedule(start_ns)

    def _schedule(self, after_ns: int) -> None:
        at = after_ns + round(self.rng.expovariate(1.0) * self.mean_gap_ns)
        if at < self.end_ns:
            self.engine.at(at, self._arrive, None)

    def _arrive(self, _: object) -> None:
        if self.node.submit(True, True, _served, None):
            self.sent += 1
        else:
            self.shed += 1
        self._schedule(self.engine.now)


def _served(_: object) -> None:
    """Another client's request answered: nothing of ours to record."""


def _rate(fault: FaultSpec, spec: NodesSpec) -> float:
    return fault.rate if fault.rate is not None else fault.utilization * capacity(spec)


def install_background(
    scenario: Scenario,
    engine: Engine,
    nodes: list[Node],
    rng_for: Callable[[str], random.Random],
) -> list[Background]:
    """Start the arrivals of every ``load`` fault of ``scenario`` (its fault windows are
    set by :func:`~adaptive_lb.tools.sim.faults.install_faults`); ``rng_for(name)``: a stream
    for the fault named ``name``."""
    horizon = scenario.max_duration + 3600.0
    started = []
    for i, fault in enumerate(scenario.faults):
        if fault.kind != "load":
            continue
        node = node_named(nodes, fault.node)
        end = fault.end if fault.end is not None else horizon
        started.append(
            Background(
                node,
                _rate(fault, scenario.nodes),
                round(fault.start * NS_PER_S),
                round(end * NS_PER_S),
                engine,
                rng_for(f"{i}:{fault.node}"),
            )
        )
    return started
