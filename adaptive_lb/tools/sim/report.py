"""Tables, JSON and PNG plots of simulation results (the target checks are
:mod:`adaptive_lb.tools.sim.targets`).

Plots need matplotlib (optional: ``pip install "adaptive-lb[demo]"``); without it
:func:`write_plots` returns a note and writes nothing.

Imports the simulator's faults, fleet report, metrics and targets; matplotlib on first use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_lb.tools.sim.faults import fault_windows
from adaptive_lb.tools.sim.fleet_report import (
    format_fleet_table,
    write_fleet_plots,
    write_sweep_plot,
)
from adaptive_lb.tools.sim.metrics import ScenarioReport
from adaptive_lb.tools.sim.targets import TargetCheck, check_targets

__all__ = [
    "ScenarioReport",
    "TargetCheck",
    "check_targets",
    "format_table",
    "format_tally",
    "to_json",
    "write_plots",
    "write_sweep",
]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def format_table(report: ScenarioReport) -> str:
    """A plain-text table: one row per policy."""
    scenario = report.scenario
    header = (
        f"{'policy':<28} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>9} {'x-zone':>7} "
        f"{'faulted':>8} {'max/mean':>8} {'failed':>7}"
    )
    lines = [
        f"== {scenario.name} (seed {report.seed}): {scenario.description}",
        header,
        "-" * len(header),
    ]
    for result in report.results:
        s = result.summary
        failed = s["errors"] + s["timeouts"]
        lines.append(
            f"{result.label:<28} {s['p50_ms']:>8.3f} {s['p95_ms']:>8.3f} {s['p99_ms']:>9.3f} "
            f"{s['cross_zone'] * 100:>6.1f}% {_pct(s['faulted']):>8} "
            f"{s['max_mean_host']:>8.2f} {failed * 100:>6.2f}%"
        )
    if scenario.is_fleet:
        lines.append(format_fleet_table(report))
    return "\n".join(lines)


def format_tally(reports: Sequence[ScenarioReport]) -> str:
    """The closing tally of a run: targets met and missed, each miss named (scenario,
    target, figure), so that a miss is not buried in the tables above."""
    checks = [check for report in reports for check in check_targets(report, reports)]
    missed = [check for check in checks if not check.met]
    lines = [f"targets: {len(checks) - len(missed)} met, {len(missed)} missed of {len(checks)}"]
    lines.extend(f"  MISSED {c.scenario}: {c.target}: {c.detail}" for c in missed)
    return "\n".join(lines)


def format_markdown(report: ScenarioReport) -> str:
    """The same table in Markdown (for the README)."""
    lines = [
        "| policy | p50 ms | p95 ms | p99 ms | cross-zone | faulted | max/mean | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in report.results:
        s = result.summary
        failed = s["errors"] + s["timeouts"]
        lines.append(
            f"| {result.label} | {s['p50_ms']:.3f} | {s['p95_ms']:.3f} | {s['p99_ms']:.3f} | "
            f"{s['cross_zone'] * 100:.1f}% | {_pct(s['faulted'])} | "
            f"{s['max_mean_host']:.2f} | {failed * 100:.2f}% |"
        )
    return "\n".join(lines)


def to_json(reports: Sequence[ScenarioReport]) -> str:
    """Deterministic JSON of the results (same seed -> same bytes)."""
    document: dict[str, Any] = {"scenarios": []}
    for report in reports:
        scenario = report.scenario
        document["scenarios"].append(
            {
                "name": scenario.name,
                "description": scenario.description,
                "seed": report.seed,
                "requests": scenario.requests,
                "adaptive_lb_config_hash": scenario.adaptive_lb.hash,
                "results": [
                    {"policy": r.policy, "label": r.label, **r.summary} for r in report.results
                ],
                "targets": [
                    {"target": c.target, "met": c.met, "detail": c.detail}
                    for c in check_targets(report, reports)
                ],
            }
        )
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------- plots


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_sweep(reports: Sequence[ScenarioReport], out: Path) -> list[Path]:
    """The plot of the fleet's own requests per node against its size, when the run had
    ``fleet-size-*`` scenarios (and matplotlib is installed)."""
    plt = _pyplot()
    return [] if plt is None else write_sweep_plot(reports, out, plt)


def write_plots(report: ScenarioReport, out: Path) -> list[Path] | str:
    """Write ``<scenario>-latency-cdf.png`` and ``<scenario>-traffic.png`` to ``out``;
    returns the paths, or a note when matplotlib is not installed."""
    plt = _pyplot()
    if plt is None:
        return 'matplotlib is not installed: no plots (pip install "adaptive-lb[demo]")'
    out.mkdir(parents=True, exist_ok=True)
    name = report.scenario.name
    paths = [out / f"{name}-latency-cdf.png", out / f"{name}-traffic.png"]

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for result in report.results:
        values = result.latencies_us
        n = len(values)
        if not n:
            continue
        step = max(1, n // 2000)
        xs = [values[i] / 1000 for i in range(0, n, step)] + [values[-1] / 1000]
        ys = [i / n for i in range(0, n, step)] + [1.0]
        width = 2.4 if result.policy == "adaptive" else 1.3
        ax.plot(xs, ys, label=result.label, linewidth=width)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{name}: latency CDF (seed {report.seed})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    shown = [r for r in report.results if r.policy in ("token-aware", "adaptive", "adaptive-unset")]
    shown = shown or report.results[:2]
    faulted = {fault.node for fault in report.scenario.faults}
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 2.6 * len(shown)), sharex=True)
    if len(shown) == 1:
        axes = [axes]
    for ax, result in zip(axes, shown, strict=True):
        buckets = len(result.timeline)
        times = [
            result.timeline_start_s + (i + 0.5) * result.timeline_step_s for i in range(buckets)
        ]
        totals = [sum(row) or 1 for row in result.timeline]
        for node_index, node_name in enumerate(result.node_names):
            share = [
                row[node_index] / total for row, total in zip(result.timeline, totals, strict=True)
            ]
            if node_name in faulted:
                ax.plot(
                    times, share, color="crimson", linewidth=2.2, label=f"{node_name} (faulted)"
                )
            else:
                ax.plot(times, share, color="grey", linewidth=0.8, alpha=0.6)
        end = result.timeline_start_s + buckets * result.timeline_step_s
        labelled = False
        for fault in report.scenario.faults:
            for start, stop in fault_windows(fault, end):
                if start < end:
                    ax.axvspan(
                        start,
                        min(stop, end),
                        color="orange",
                        alpha=0.15,
                        label=None if labelled else "fault active",
                    )
                    labelled = True
        ax.axhline(1 / max(1, len(result.node_names)), color="black", linestyle=":", linewidth=0.8)
        ax.set_ylabel("share of attempts")
        ax.set_title(f"{result.label}", fontsize=9)
        ax.grid(True, alpha=0.3)
        if faulted or labelled:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("virtual time (s)")
    fig.suptitle(f"{name}: per-host traffic share over time (seed {report.seed})", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths + write_fleet_plots(report, out, plt)
