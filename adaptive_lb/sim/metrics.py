"""What a run measures, and its summary.

Per measured request: client-observed latency (first send to final answer, retries
included; a timed-out request counts at the timeout), its status, whether an attempt went
to a coordinator outside the client's zone, whether it touched a node while a fault was
active there. Per host: coordinator attempts (the load the client-side policy decides),
over time for the traffic-share plot, and replica reads served.
"""

from __future__ import annotations

from array import array
from typing import Any

from attrs import define, field

from adaptive_lb.sim.workload import FAILED, SUCCEEDED, TIMED_OUT, Request

__all__ = ["PolicyResult", "Recorder", "percentile"]

TIMELINE_BUCKETS = 60


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
        self.crossed = 0
        self.touched = 0
        self.retried = 0
        self.attempts_by_node = [0] * node_count
        self.attempt_times = array("q")
        self.attempt_nodes = array("h")
        self.first_ns: int | None = None
        self.last_ns = 0

    def attempt(self, now: int, node: Any) -> None:
        """A measured request sent an attempt to ``node``."""
        self.attempts_by_node[node.index] += 1
        self.attempt_times.append(now)
        self.attempt_nodes.append(node.index)

    def finish(self, request: Request, status: int, now: int) -> None:
        """A measured request ended."""
        if self.first_ns is None or request.start_ns < self.first_ns:
            self.first_ns = request.start_ns
        self.last_ns = max(self.last_ns, now)
        self.latency_ns.append(now - request.start_ns)
        self.status.append(status)
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
