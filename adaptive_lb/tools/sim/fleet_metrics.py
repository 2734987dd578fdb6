"""What a fleet run measures beyond the latency table: how evenly the nodes are loaded second
by second, whether the fleet herds, how the degraded node is loaded against what it has
left, and what adaptive-lb's own reads and probes cost each node.

Per node of the clients' datacenter and per 1 s window from the end of the warm-up, the
coordinator attempts of the measured requests, and each node's *fair share* that second:
its capacity over the datacenter's, where a ``busy`` fault leaves ``1 - utilization`` of a
node, a ``load`` fault ``1 - utilization`` too (with ``rate``: that rate over the node's
capacity taken), and a pause or a ``down`` none (0 while it lasts).

* ``cv_1s`` / ``max_mean_1s``: over the nodes with no fault that second, the coefficient
  of variation and the busiest over the mean of their attempts, averaged over the seconds
  (``max_mean_1s_worst``: the worst second);
* ``alternations``: swings, summed over the nodes: a node above its fair share, then below
  it, then above again (or below, above, below) with the first and the last of the three
  within :data:`ALTERNATION_S` -- a node counts as above (below) when its attempts that
  second pass its fair share of the second's attempts by more than :data:`SWING` of it and
  3 Poisson standard deviations (so chance alone rarely makes one);
* ``degraded``: for the first ``busy`` or ``load`` fault, the node's attempts over its fair
  share of them from :data:`SETTLE_S` after the fault's start to the end of the run (1.0:
  loaded exactly as its remaining capacity allows);
* ``own``: adaptive-lb's server-load reads and probes each node received a second (from
  :meth:`~adaptive_lb.tools.sim.node.Node.count_own`): the busiest node's mean per second
  and the most any node received in one second, for reads, probes and both; ``stalled``:
  the most probes the first paused node received in one second from its pause on.

Imports the simulator's background load, engine and faults only.
"""

from __future__ import annotations

import math
from typing import Any

from adaptive_lb.tools.sim.background import capacity
from adaptive_lb.tools.sim.engine import NS_PER_S
from adaptive_lb.tools.sim.faults import fault_windows

__all__ = [
    "ALTERNATION_S",
    "SETTLE_S",
    "SWING",
    "capacity_shares",
    "fleet_figures",
    "fleet_summary",
]

ALTERNATION_S = 10.0
SWING = 0.25
SETTLE_S = 30.0
"""How long after its fault starts the degraded node's load is compared with its capacity."""
MOVED_WINDOW_S = 5
"""The degraded node's traffic has *moved* from the first second on which this many seconds
load it at most :data:`SWING` above its share of capacity."""


def capacity_shares(scenario: Any, names: list[str], seconds: range) -> list[list[float]]:
    """Each node's capacity (1 = nominal) in each second of ``seconds``, at its middle."""
    caps = [[1.0] * len(names) for _ in seconds]
    nominal = capacity(scenario.nodes)
    horizon = float(seconds.stop + 1)
    for fault in scenario.faults:
        if fault.node not in names:
            continue
        i = names.index(fault.node)
        if fault.kind in ("busy", "load"):
            left = 1.0 - fault.utilization
            if fault.kind == "load" and fault.rate is not None:
                left = max(0.0, 1.0 - fault.rate / nominal)
        elif fault.kind in ("pause", "down"):
            left = 0.0
        else:
            continue
        windows = fault_windows(fault, horizon)
        if fault.kind == "down":  # the warm-up is not capacity lost
            windows = [(fault.start, fault.end if fault.end is not None else horizon)]
        for k, second in enumerate(seconds):
            middle = second + 0.5
            if any(a <= middle < b for a, b in windows):
                caps[k][i] = min(caps[k][i], left)
    return caps


def _per_second(recorder: Any, local: list[int], first: int, last: int) -> list[list[int]]:
    position = {node: j for j, node in enumerate(local)}
    counts = [[0] * len(local) for _ in range(first, last)]
    for t, node in zip(recorder.attempt_times, recorder.attempt_nodes, strict=True):
        second = t // NS_PER_S
        j = position.get(node)
        if j is not None and first <= second < last:
            counts[second - first][j] += 1
    return counts


def _spread(counts: list[list[int]], caps: list[list[float]]) -> dict[str, float]:
    cvs, ratios = [], []
    for row, cap in zip(counts, caps, strict=True):
        values = [c for c, k in zip(row, cap, strict=True) if k == 1.0]
        mean = sum(values) / len(values) if values else 0.0
        if mean <= 0:
            continue
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        cvs.append(sd / mean)
        ratios.append(max(values) / mean)
    return {
        "cv_1s": round(sum(cvs) / len(cvs), 3) if cvs else 0.0,
        "max_mean_1s": round(sum(ratios) / len(ratios), 3) if ratios else 0.0,
        "max_mean_1s_worst": round(max(ratios), 3) if ratios else 0.0,
    }


def _states(counts: list[list[int]], caps: list[list[float]], j: int) -> list[tuple[int, int]]:
    """Node ``j``'s (second index, +1 above / -1 below its fair share), the others left out."""
    found = []
    for k, (row, cap) in enumerate(zip(counts, caps, strict=True)):
        total, weight = sum(row), sum(cap)
        if not total or not weight:
            continue
        expected = total * cap[j] / weight
        margin = max(SWING * expected, 3.0 * math.sqrt(expected))
        if row[j] > expected + margin:
            found.append((k, 1))
        elif row[j] < expected - margin:
            found.append((k, -1))
    return found


def alternations(counts: list[list[int]], caps: list[list[float]]) -> int:
    """Swings above, below and back (or the reverse) within :data:`ALTERNATION_S`."""
    swings = 0
    for j in range(len(counts[0]) if counts else 0):
        runs: list[tuple[int, int]] = []  # (first second of the run, sign)
        for k, sign in _states(counts, caps, j):
            if not runs or runs[-1][1] != sign:
                runs.append((k, sign))
        swings += sum(
            1 for a, c in zip(runs, runs[2:], strict=False) if c[0] - a[0] <= ALTERNATION_S
        )
    return swings


def _ratio(rows: list[list[int]], caps: list[list[float]], j: int) -> float | None:
    """Node ``j``'s attempts in ``rows`` over its fair share of them."""
    got = sum(row[j] for row in rows)
    expected = sum(sum(row) * cap[j] / sum(cap) for row, cap in zip(rows, caps, strict=True))
    return got / expected if expected else None


def _degraded(
    scenario: Any, names: list[str], counts: list[list[int]], caps: list[list[float]], first: int
) -> dict[str, Any] | None:
    fault = next((f for f in scenario.faults if f.kind in ("busy", "load")), None)
    if fault is None or fault.node not in names:
        return None
    j = names.index(fault.node)
    start = max(0, math.ceil(fault.start + SETTLE_S) - first)
    ratio = _ratio(counts[start:], caps[start:], j)
    moved = None  # the first second from which 5 s are within SWING of its share
    begin = max(0, math.ceil(fault.start) - first)
    for k in range(begin, len(counts) - MOVED_WINDOW_S + 1):
        window = _ratio(counts[k : k + MOVED_WINDOW_S], caps[k : k + MOVED_WINDOW_S], j)
        if window is not None and window <= 1.0 + SWING:
            moved = k + first - fault.start
            break
    return {
        "node": fault.node,
        "after_s": fault.start + SETTLE_S,
        "load_over_capacity": None if ratio is None else round(ratio, 3),
        "moved_after_s": moved,
    }


def _stalled(scenario: Any, nodes: list[Any]) -> dict[str, Any] | None:
    """The most probes the first paused node got in one second, from its pause on."""
    fault = next((f for f in scenario.faults if f.kind == "pause"), None)
    node = next((n for n in nodes if fault is not None and n.name == fault.node), None)
    if fault is None or node is None:
        return None
    probes = node.own_requests.get("probe", [])[int(fault.start) :]
    return {"node": node.name, "probes_max_s": max(probes, default=0)}


def _own(nodes: list[Any], first: int, last: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    seconds = max(1, last - first)
    totals: dict[str, list[list[int]]] = {"read": [], "probe": []}
    for node in nodes:
        for kind, series in totals.items():
            counts = node.own_requests.get(kind, [])
            series.append([counts[s] if s < len(counts) else 0 for s in range(first, last)])
    reads, probes = totals["read"], totals["probe"]
    both = [[r + p for r, p in zip(a, b, strict=True)] for a, b in zip(reads, probes, strict=True)]
    for kind, series in (*totals.items(), ("reads_probes", both)):
        found[kind] = {
            "per_node_s": round(max(sum(s) for s in series) / seconds, 2) if series else 0.0,
            "max_node_s": max((max(s, default=0) for s in series), default=0),
        }
    return found


def fleet_summary(scenario: Any, recorder: Any, nodes: list[Any], local: list[int]) -> dict:
    """The fleet figures of one run (see the module docstring), and the per-second series
    behind them (``series``: ``{seconds, nodes, attempts, capacity}``) for the plots."""
    times = recorder.attempt_times
    first = math.ceil(scenario.warmup)
    last = int(times[-1] // NS_PER_S) if len(times) else first
    last = max(first + 1, last)
    names = [nodes[i].name for i in local]
    seconds = range(first, last)
    counts = _per_second(recorder, local, first, last)
    caps = capacity_shares(scenario, names, seconds)
    summary: dict[str, Any] = {
        **_spread(counts, caps),
        "alternations": alternations(counts, caps),
        "own": _own([nodes[i] for i in local], first, last),
    }
    degraded = _degraded(scenario, names, counts, caps, first)
    if degraded is not None:
        summary["degraded"] = degraded
    stalled = _stalled(scenario, [nodes[i] for i in local])
    if stalled is not None:
        summary["stalled"] = stalled
    series = {"seconds": list(seconds), "nodes": names, "attempts": counts, "capacity": caps}
    return {"summary": summary, "series": series}


def fleet_figures(
    scenario: Any, recorder: Any, nodes: list[Any], clients: int, offered_rps: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A fleet run's summary (:func:`fleet_summary`'s, with the fleet's size, offered load
    and utilization of the clients' datacenter) and its per-second series."""
    local = [i for i, node in enumerate(nodes) if node.datacenter == scenario.client_datacenter]
    fleet = fleet_summary(scenario, recorder, nodes, local)
    summary = {
        "clients": clients,
        "offered_rps": round(offered_rps, 1),
        "utilization": round(offered_rps / (capacity(scenario.nodes) * len(local)), 3),
        **fleet["summary"],
    }
    return summary, fleet["series"]
