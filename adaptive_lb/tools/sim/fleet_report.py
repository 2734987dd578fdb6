"""A fleet run's table, targets and plots (issue 34), beside the latency table every
scenario prints (:mod:`adaptive_lb.tools.sim.report`).

The targets, from issue 34, checked where their scenario ran:

* ``fleet-half-capacity`` and ``fleet-500x30`` (one node loses half its capacity):
  adaptive-lb's p99 at most :data:`PEER_FACTOR` x the best other policy's and at most
  :data:`HEALTHY_FACTOR` x its own in the same fleet with no fault (``fleet-healthy``,
  when it ran too: :data:`HALF_CAPACITY`); the degraded
  node loaded within :data:`DEGRADED_TOLERANCE` of its share of capacity 30 s after the
  fault, and its traffic moved within :data:`MOVED_WITHIN_S` (issue 34: "a node's queue
  still moves the fleet's traffic within 10 s"); no alternation; its per-node 1 s
  coefficient of variation no worse than stock token-aware routing's.
* ``fleet-size-*``: the server-load reads and probes a node receives a second from the whole
  fleet at most :data:`OWN_PER_NODE_S` (the busiest node's mean); in ``fleet-size-1000``,
  the stalled node at most :data:`STALL_PROBES_S` probes in any second.

Imports (for types) the simulator's metrics only; matplotlib is given to the plots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptive_lb.tools.sim.metrics import ScenarioReport

__all__ = [
    "DEGRADED_TOLERANCE",
    "HALF_CAPACITY",
    "HEALTHY_FACTOR",
    "MOVED_WITHIN_S",
    "OWN_PER_NODE_S",
    "PEER_FACTOR",
    "STALL_PROBES_S",
    "check_fleet",
    "format_fleet_table",
    "write_fleet_plots",
]

PEER_FACTOR = 0.9
HEALTHY_FACTOR = 1.3
DEGRADED_TOLERANCE = 0.2
OWN_PER_NODE_S = 20.0
STALL_PROBES_S = 20
MOVED_WITHIN_S = 10.0
HALF_CAPACITY = {"fleet-half-capacity": "fleet-healthy", "fleet-500x30": None}
"""The fleets with a node at half capacity, and the same fleet without (None: not run)."""
_Add = Callable[[str, bool, str], None]


def format_fleet_table(report: ScenarioReport) -> str:
    """One row per policy: tail latency, per-node spread, alternations, the degraded node,
    adaptive-lb's own requests per node."""
    header = (
        f"{'fleet':<28} {'p50 ms':>8} {'p99 ms':>9} {'p999 ms':>9} {'cv 1s':>6} "
        f"{'max/mean':>8} {'alt':>4} {'degr.':>6} {'reads/s':>8} {'probes/s':>8} {'max/s':>6}"
    )
    lines = [header, "-" * len(header)]
    for result in report.results:
        s, f = result.summary, result.summary.get("fleet")
        if f is None:
            continue
        degraded = (f.get("degraded") or {}).get("load_over_capacity")
        own = f["own"]
        lines.append(
            f"{result.label:<28} {s['p50_ms']:>8.3f} {s['p99_ms']:>9.3f} {s['p999_ms']:>9.3f} "
            f"{f['cv_1s']:>6.3f} {f['max_mean_1s']:>8.3f} {f['alternations']:>4} "
            f"{'-' if degraded is None else f'{degraded:.2f}':>6} "
            f"{own['read']['per_node_s']:>8.1f} {own['probe']['per_node_s']:>8.1f} "
            f"{own['reads_probes']['max_node_s']:>6}"
        )
    first = next((r.summary["fleet"] for r in report.results if "fleet" in r.summary), None)
    if first is not None:
        lines.append(
            f"({first['clients']} clients offering {first['offered_rps']:.0f} requests/s, "
            f"{first['utilization']:.0%} of the nodes' capacity; reads/s, probes/s: the busiest "
            "node's mean a second; max/s: the most reads + probes a node got in one second)"
        )
    return "\n".join(lines)


def check_fleet(report: ScenarioReport, reports: Sequence[ScenarioReport], add: _Add) -> None:
    """Issue 34's targets that apply to ``report`` (``reports``: every report of the run,
    for the comparison with ``fleet-healthy``)."""
    name = report.scenario.name
    adaptive = report.by_policy("adaptive")
    if adaptive is None or "fleet" not in adaptive.summary:
        return
    a, fleet = adaptive.summary, adaptive.summary["fleet"]
    if name in HALF_CAPACITY:
        _half_capacity(report, reports, a, add)
    if name.startswith("fleet-size-"):
        own = fleet["own"]["reads_probes"]["per_node_s"]
        add(
            f"reads + probes per node <= {OWN_PER_NODE_S:g} a second",
            own <= OWN_PER_NODE_S,
            f"{own:.1f} a second (busiest node's mean; {fleet['clients']} clients)",
        )
    if name == "fleet-size-1000" and "stalled" in fleet:
        most = fleet["stalled"]["probes_max_s"]
        add(
            f"the stalled node gets <= {STALL_PROBES_S} probes a second",
            most <= STALL_PROBES_S,
            f"{most} in its worst second",
        )


def _half_capacity(
    report: ScenarioReport, reports: Sequence[ScenarioReport], a: dict[str, Any], add: _Add
) -> None:
    others = [r for r in report.results if r.policy != "adaptive"]
    best = min(others, key=lambda r: r.summary["p99_ms"], default=None)
    if best is not None:
        bound = PEER_FACTOR * best.summary["p99_ms"]
        add(
            f"fleet p99 <= {PEER_FACTOR:g} x the best peer's",
            a["p99_ms"] <= bound,
            f"{a['p99_ms']:.3f} vs {best.summary['p99_ms']:.3f} ms ({best.label})",
        )
    same = HALF_CAPACITY[report.scenario.name]
    healthy = next((r for r in reports if r.scenario.name == same), None)
    reference = healthy.by_policy("adaptive") if healthy is not None else None
    if reference is not None:
        p99 = reference.summary["p99_ms"]
        add(
            f"fleet p99 <= {HEALTHY_FACTOR:g} x the same fleet's with no degraded node",
            a["p99_ms"] <= HEALTHY_FACTOR * p99,
            f"{a['p99_ms']:.3f} vs {p99:.3f} ms (fleet-healthy)",
        )
    fleet = a["fleet"]
    ratio = (fleet.get("degraded") or {}).get("load_over_capacity")
    add(
        f"degraded node's load within {DEGRADED_TOLERANCE:.0%} of its share of capacity after 30 s",
        ratio is not None and abs(ratio - 1.0) <= DEGRADED_TOLERANCE,
        "no measure" if ratio is None else f"{ratio:.2f} x its share",
    )
    moved = (fleet.get("degraded") or {}).get("moved_after_s")
    add(
        f"the degraded node's traffic moves within {MOVED_WITHIN_S:g} s",
        moved is not None and moved <= MOVED_WITHIN_S,
        "never" if moved is None else f"after {moved:g} s",
    )
    add("no alternations", fleet["alternations"] == 0, f"{fleet['alternations']}")
    stock = report.by_policy("token-aware")
    if stock is not None and "fleet" in stock.summary:
        cv, stock_cv = fleet["cv_1s"], stock.summary["fleet"]["cv_1s"]
        add(
            "per-node 1 s load CV no worse than stock's",
            cv <= stock_cv,
            f"{cv:.3f} vs {stock_cv:.3f}",
        )


# ---------------------------------------------------------------------------- plots


def write_fleet_plots(report: ScenarioReport, out: Path, plt: Any) -> list[Path]:
    """``<scenario>-fleet-load.png``: each node's coordinator attempts a second over time
    (the faulted nodes in colour, their fair share dotted), one panel per policy."""
    shown = [r for r in report.results if r.fleet_series is not None]
    if not shown:
        return []
    name = report.scenario.name
    path = out / f"{name}-fleet-load.png"
    faulted = {fault.node for fault in report.scenario.faults}
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 2.1 * len(shown) + 0.6), sharex=True)
    axes = [axes] if len(shown) == 1 else list(axes)
    for ax, result in zip(axes, shown, strict=True):
        series: dict[str, Any] = result.fleet_series or {}
        times = [t + 0.5 for t in series["seconds"]]
        rows, caps = series["attempts"], series["capacity"]
        for j, node in enumerate(series["nodes"]):
            values = [row[j] for row in rows]
            if node in faulted:
                (line,) = ax.plot(times, values, linewidth=1.8, label=node)
                fair = [sum(row) * cap[j] / sum(cap) for row, cap in zip(rows, caps, strict=True)]
                ax.plot(times, fair, linestyle=":", color=line.get_color(), linewidth=1.0)
            else:
                ax.plot(times, values, color="grey", linewidth=0.7, alpha=0.6)
        alternations = result.summary["fleet"]["alternations"]
        ax.set_title(f"{result.label} (alternations: {alternations})", fontsize=9)
        ax.set_ylabel("attempts / s", fontsize=8)
        ax.grid(True, alpha=0.3)
        if faulted:
            ax.legend(fontsize=6, loc="upper right", ncol=3)
    axes[-1].set_xlabel("virtual time (s); dotted: a faulted node's share of capacity")
    fig.suptitle(f"{name}: per-node load (seed {report.seed})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def write_sweep_plot(reports: Sequence[ScenarioReport], out: Path, plt: Any) -> list[Path]:
    """``fleet-size-own-requests.png``: reads and probes per node a second against the
    fleet's size, from the ``fleet-size-*`` reports of the run (none: nothing written)."""
    points = []
    for report in reports:
        result = report.by_policy("adaptive")
        if report.scenario.name.startswith("fleet-size-") and result is not None:
            fleet = result.summary["fleet"]
            points.append((fleet["clients"], fleet["own"]))
    if len(points) < 2:
        return []
    points.sort(key=lambda p: p[0])
    path = out / "fleet-size-own-requests.png"
    fig, ax = plt.subplots(figsize=(6, 3.8))
    sizes = [p[0] for p in points]
    for kind, label in (("read", "thread_pools reads"), ("probe", "probes")):
        ax.plot(sizes, [p[1][kind]["per_node_s"] for p in points], marker="o", label=label)
    ax.plot(
        sizes,
        [p[1]["reads_probes"]["per_node_s"] for p in points],
        marker="s",
        label="both",
        linewidth=2,
    )
    ax.axhline(OWN_PER_NODE_S, color="crimson", linestyle="--", label="target (20 / s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("clients in the fleet")
    ax.set_ylabel("per node per second (busiest node)")
    ax.set_title("adaptive-lb's own requests each node receives", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
