"""Faults on a schedule: each :class:`~adaptive_lb.tools.sim.scenario.FaultSpec` becomes time
windows on one node, and ``down`` faults become events that kill and restart the node and
tell every client's policy (``on_down`` / ``on_up``, hosts marked down / up) the way the
driver does when a node's connections drop and when it comes back.

Imports the simulator's engine, nodes, servers and scenario only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.node import Node
from adaptive_lb.tools.sim.scenario import FaultSpec, Scenario
from adaptive_lb.tools.sim.servers import SimulatedServers

__all__ = ["fault_windows", "install_faults", "node_named"]


def node_named(nodes: list[Node], name: str) -> Node:
    """The node called ``ZONE/INDEX``."""
    for node in nodes:
        if node.name == name:
            return node
    raise KeyError(name)


def _ns(seconds: float) -> int:
    return round(seconds * NS_PER_S)


def fault_windows(fault: FaultSpec, end_s: float) -> list[tuple[float, float]]:
    """When ``fault`` is active, in seconds (``end_s`` closes an open-ended fault); for a
    ``down`` fault this includes the warm-up after the return."""
    end = fault.end if fault.end is not None else end_s
    if fault.kind == "pause":
        windows = []
        t = fault.start
        while t < end:
            windows.append((t, min(t + fault.pause_s, end)))
            t += fault.period_s
        return windows
    if fault.kind == "down":
        return [(fault.start, end + fault.warmup_s)]
    return [(fault.start, end)]


def install_faults(
    scenario: Scenario,
    engine: Engine,
    servers: SimulatedServers,
    notify_down: Callable[[Any], None],
    notify_up: Callable[[Any], None],
) -> None:
    """Attach every fault of ``scenario`` to its node and schedule the down/up events."""
    horizon = scenario.max_duration + 3600.0
    for fault in scenario.faults:
        node = node_named(servers.nodes, fault.node)
        windows = fault_windows(fault, horizon)
        node.fault_windows.extend((_ns(a), _ns(b)) for a, b in windows)
        node.fault_windows.sort()
        start = _ns(fault.start)
        end = _ns(fault.end if fault.end is not None else horizon)
        if fault.kind == "pause":
            node.pauses.extend((_ns(a), _ns(b)) for a, b in windows)
            node.pauses.sort()
        elif fault.kind == "slow":
            node.slow.append((start, end, round(fault.extra_ms * 1_000_000)))
        elif fault.kind == "errors":
            node.errors.append((start, end, fault.fraction))
        elif fault.kind == "timeouts":
            node.drops.append((start, end, fault.fraction))
        elif fault.kind == "busy":
            node.cpu_share.append((start, end, fault.utilization))
        elif fault.kind == "down":
            _schedule_down(fault, node, engine, servers, notify_down, notify_up, start, end)


def _schedule_down(
    fault: FaultSpec,
    node: Node,
    engine: Engine,
    servers: SimulatedServers,
    notify_down: Callable[[Any], None],
    notify_up: Callable[[Any], None],
    start: int,
    end: int,
) -> None:
    detection = _ns(fault.detection_s)
    host = node.host

    def kill(_: Any) -> None:
        servers.take_down(node)

    def seen_down(_: Any) -> None:
        host.set_down()
        notify_down(host)

    def revive(_: Any) -> None:
        node.come_up()
        if fault.warmup_s > 0 and fault.warmup_factor > 1.0:
            node.warm.append((engine.now, engine.now + _ns(fault.warmup_s), fault.warmup_factor))

    def seen_up(_: Any) -> None:
        host.set_up()
        notify_up(host)

    engine.at(start, kill)
    engine.at(start + detection, seen_down)
    if fault.end is not None:
        engine.at(end, revive)
        engine.at(end + detection, seen_up)
