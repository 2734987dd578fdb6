"""What a run measures, and its summary.

Per measured request: client-observed latency (first send to final answer, retries
included; a timed-out request counts at the timeout), its status, whether an attempt went
to a coordinator outside the client's zone, whether it touched a node while a fault was
active there. Per host: coordinator attempts (the load the client-side policy decides),
over time for the traffic-share plot, and replica reads served.

Imports attrs, the simulator's workload and (for types) its scenario only.
"""

from __future__ import annotations

import bisect
from array import array
from typing import TYPE_CHECKING, Any

from attrs import define, field

from adaptive_lb.tools.sim.workload import FAILED, SUCCEEDED, TIMED_OUT, Request

if TYPE_CHECKING:
    from adaptive_lb.tools.sim.scenario import Scenario

__all__ = ["PolicyResult", "Recorder", "ScenarioReport", "percentile"]

TIMELINE_BUCKETS = 60
RETURN_WINDOW_S = 0.5
"""Width of the sliding window in which a paused node's traffic share is measured."""
RETURN_SHARE = 0.5
"""A paused node is back once its share of attempts in a window reaches this fraction of
its fair share (1 / nodes of the clients' datacenter)."""
RETURN_HORIZON_S = 10.0
"""How long after a pause's end its node's return is looked for."""


def pause_returns(
    recorder: Recorder, nodes: list[Any], local: list[int]
) -> dict[str, list[float | None]]:
    """Per paused node (of the clients' datacenter), per pause that ended while requests
    were measured: seconds from the pause's end to the end of the first
    :data:`RETURN_WINDOW_S` window in which the node got at least :data:`RETURN_SHARE` of
    its fair share of coordinator attempts (None: not within :data:`RETURN_HORIZON_S`, or
    the run ended first)."""
    times = recorder.attempt_times
    if not local or not len(times):
        return {}
    fair = 1.0 / len(local)
    first, last = times[0], times[-1]
    width = round(RETURN_WINDOW_S * 1e9)
    step = width // 5
    result: dict[str, list[float | None]] = {}
    for i in local:
        pauses = [(a, b) for a, b in nodes[i].pauses if first <= b and b + width <= last]
        if not pauses:
            continue
        mine = array("q", (t for t, n in zip(times, recorder.attempt_nodes, strict=True) if n == i))
        found: list[float | None] = []
        for _, end in pauses:
            back: float | None = None
            t = end + width
            while t <= min(last, end + round(RETURN_HORIZON_S * 1e9)):
                total = bisect.bisect_left(times, t) - bisect.bisect_left(times, t - width)
                own = bisect.bisect_left(mine, t) - bisect.bisect_left(mine, t - width)
                if total and own >= RETURN_SHARE * fair * total:
                    back = round((t - end) / 1e9, 2)
                    break
                t += step
            found.append(back)
        result[nodes[i].name] = found
    return result


def settled(recorder: Recorder, after_s: float) -> dict[str, Any]:
    """p50 and cross-zone share of the measured requests started ``after_s`` seconds or
    more into the run."""
    start = round(after_s * 1e9)
    chosen = [i for i, t in enumerate(recorder.start_ns) if t >= start]
    latencies = sorted(recorder.latency_ns[i] for i in chosen)
    n = len(latencies)
    crossed = sum(recorder.crossed_flags[i] for i in chosen)
    return {
        "after_s": after_s,
        "requests": n,
        "p50_ms": round(percentile(latencies, 50) / 1e6, 3),
        "cross_zone": round(crossed / n, 4) if n else 0.0,
    }


def slow_verdicts(verdicts: list[tuple[Any, ...]], nodes: list[Any]) -> dict[str, int]:
    """Verdicts SLOW given by the clients' policies over the run: ``false`` on a node with
    no fault active then (distance, noise), ``faulted`` on a node whose fault was.
    ``verdicts``: ``(time, node index, new state[, old state])``."""
    counts = {"false": 0, "faulted": 0}
    for t, index, state, *_ in verdicts:
        if state == "slow":
            counts["faulted" if nodes[index].fault_active(t) else "false"] += 1
    return counts


_AGAINST = ("slow", "erroring")
"""The states a verdict against a host puts it in."""


def false_verdicts(verdicts: list[tuple[Any, ...]], nodes: list[Any]) -> dict[str, int]:
    """Verdicts against a host given by the clients' policies over the run -- every
    transition out of HEALTHY and every one into SLOW or ERRORING (from WARMING, or SLOW ->
    ERRORING) -- counted ``false`` when no fault was active on the node then (by the state
    given: ``false_slow``, ``false_erroring``; ``false`` counts every state), else
    ``faulted``. ``verdicts``: ``(time, node index, new state, old state)``."""
    counts = {"false": 0, "false_slow": 0, "false_erroring": 0, "faulted": 0}
    for t, index, state, *rest in verdicts:
        old = rest[0] if rest else None
        if state == "healthy" or (state not in _AGAINST and old != "healthy"):
            continue
        if nodes[index].fault_active(t):
            counts["faulted"] += 1
            continue
        counts["false"] += 1
        if state in _AGAINST:
            counts[f"false_{state}"] += 1
    return counts


def percentile(sorted_values: list[int] | array, pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0 when empty)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = max(1, min(n, int(-(-pct * n // 100))))
    return float(sorted_values[rank - 1])


class Recorder:
    """Collects one run's measurements."""

    def __init__(self, node_count: int) -> None:
        self.latency_ns = array("q")
        self.status = array("b")
        self.start_ns = array("q")
        self.crossed_flags = array("b")
        self.crossed = 0
        self.touched = 0
        self.retried = 0
        self.attempts_by_node = [0] * node_count
        self.attempt_times = array("q")
        self.attempt_nodes = array("h")
        self.first_ns: int | None = None
        self.last_ns = 0
        self.verdicts: list[tuple[int, int, str, str | None]] | None = None
        """Health transitions of the clients' policies (adaptive-lb only): (time, node
        index, new state, old state)."""

    def attempt(self, now: int, node: Any) -> None:
        """A measured request sent an attempt to ``node``."""
        self.attempts_by_node[node.index] += 1
        self.attempt_times.append(now)
        self.attempt_nodes.append(node.index)

    def verdict(self, now: int, node: Any, state: str, old: str | None = None) -> None:
        """A client's policy changed its health verdict on ``node`` to ``state`` (from
        ``old``)."""
        if self.verdicts is None:
            self.verdicts = []
        self.verdicts.append((now, node.index, state, old))

    def finish(self, request: Request, status: int, now: int) -> None:
        """A measured request ended."""
        if self.first_ns is None or request.start_ns < self.first_ns:
            self.first_ns = request.start_ns
        self.last_ns = max(self.last_ns, now)
        self.latency_ns.append(now - request.start_ns)
        self.status.append(status)
        self.start_ns.append(request.start_ns)
        self.crossed_flags.append(request.crossed)
        self.crossed += request.crossed
        self.touched += request.touched
        self.retried += request.attempts > 1


@define
class PolicyResult:
    """One policy's numbers in one scenario (``summary`` is what the table and JSON show;
    the rest feeds the plots)."""

    policy: str
    label: str
    summary: dict[str, Any]
    latencies_us: list[int] = field(repr=False)
    """Every measured request's latency, sorted (for the CDF)."""
    timeline: list[list[int]] = field(repr=False)
    """Coordinator attempts per time bucket, per node (``[bucket][node]``)."""
    timeline_step_s: float = 0.0
    timeline_start_s: float = 0.0
    node_names: list[str] = field(factory=list)
    wall_s: float = 0.0
    """Wall-clock seconds the run took (not in the JSON: it is not deterministic)."""
    fleet_series: dict[str, Any] | None = field(default=None, repr=False)
    """A fleet run's per-second, per-node attempts and capacities (for the plots; see
    :func:`~adaptive_lb.tools.sim.fleet_metrics.fleet_summary`)."""

    @classmethod
    def build(
        cls,
        policy: str,
        label: str,
        recorder: Recorder,
        nodes: list[Any],
        local_dc: str,
        has_faults: bool,
        wall_s: float,
        settled_after: float | None = None,
        local_racks: dict[str, Any] | None = None,
    ) -> PolicyResult:
        """Summarise ``recorder``."""
        latencies = sorted(recorder.latency_ns)
        n = len(latencies)
        status = recorder.status
        local = [i for i, node in enumerate(nodes) if node.datacenter == local_dc]
        per_host = [recorder.attempts_by_node[i] for i in local]
        mean = sum(per_host) / len(per_host) if per_host else 0.0
        start = recorder.first_ns or 0
        duration = max(1, recorder.last_ns - start)
        reads = [nodes[i].reads for i in local]
        mean_reads = sum(reads) / len(reads) if reads else 0.0
        summary: dict[str, Any] = {
            "requests": n,
            "p50_ms": round(percentile(latencies, 50) / 1e6, 3),
            "p95_ms": round(percentile(latencies, 95) / 1e6, 3),
            "p99_ms": round(percentile(latencies, 99) / 1e6, 3),
            "p999_ms": round(percentile(latencies, 99.9) / 1e6, 3),
            "mean_ms": round(sum(latencies) / n / 1e6, 3) if n else 0.0,
            "cross_zone": round(recorder.crossed / n, 4) if n else 0.0,
            "faulted": round(recorder.touched / n, 4) if n and has_faults else None,
            "max_mean_host": round(max(per_host) / mean, 3) if mean else 0.0,
            "max_mean_reads": round(max(reads) / mean_reads, 3) if mean_reads else 0.0,
            "errors": round(sum(1 for s in status if s == FAILED) / n, 4) if n else 0.0,
            "timeouts": round(sum(1 for s in status if s == TIMED_OUT) / n, 4) if n else 0.0,
            "retried": round(recorder.retried / n, 4) if n else 0.0,
            "succeeded": round(sum(1 for s in status if s == SUCCEEDED) / n, 4) if n else 0.0,
            "duration_s": round(duration / 1e9, 3),
            "throughput": round(n / (duration / 1e9), 1),
            "attempts_by_host": {nodes[i].name: recorder.attempts_by_node[i] for i in local},
        }
        returns = pause_returns(recorder, nodes, local)
        if returns:
            summary["pause_return_s"] = returns
        if recorder.verdicts is not None:
            summary["slow_verdicts"] = slow_verdicts(recorder.verdicts, nodes)
            summary["verdicts"] = false_verdicts(recorder.verdicts, nodes)
        if settled_after is not None:
            summary["settled"] = settled(recorder, settled_after)
        if local_racks is not None:
            summary["local_racks"] = local_racks
        step = duration / TIMELINE_BUCKETS
        timeline = [[0] * len(nodes) for _ in range(TIMELINE_BUCKETS)]
        for t, node in zip(recorder.attempt_times, recorder.attempt_nodes, strict=True):
            bucket = min(TIMELINE_BUCKETS - 1, max(0, int((t - start) / step)))
            timeline[bucket][node] += 1
        return cls(
            policy=policy,
            label=label,
            summary=summary,
            latencies_us=[v // 1000 for v in latencies],
            timeline=timeline,
            timeline_step_s=step / 1e9,
            timeline_start_s=start / 1e9,
            node_names=[node.name for node in nodes],
            wall_s=wall_s,
        )


@define
class ScenarioReport:
    """One scenario's results, one per policy, in the scenario's policy order."""

    scenario: Scenario
    seed: int
    results: list[PolicyResult]

    def by_policy(self, name: str) -> PolicyResult | None:
        """The result of policy ``name``, if it ran."""
        for result in self.results:
            if result.policy == name:
                return result
        return None
