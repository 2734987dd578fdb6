"""The targets a demo run is checked against, printed met / missed by ``adaptive-lb demo``.

Issue 6's targets (adaptive-lb against the stock and baseline policies), issue 15's
(locality and health without hand-tuning): a learned rack as good as a configured one, no
host SLOW from distance alone, a paused node back fast, the shipped defaults winning, and no
scenario worse than the figures it had before (its ``reference``); and issue 24's (thin
traffic): a slow node avoided from a few requests a second, no equal node avoided and equal
nodes sharing evenly, a stalled node found by active probes (few user requests caught in
the stall), and a node busy with other clients' load left by the server's own view of its
queues; and issue 32's (precision): a client pausing itself (GC, CPU steal) makes no host
leave HEALTHY; and issue 34's, a fleet's (:mod:`~adaptive_lb.tools.sim.fleet_report`).

Imports attrs, the simulator's fleet report and (for types) its metrics only; never the
report, which imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from attrs import define

from adaptive_lb.tools.sim.fleet_report import check_fleet

if TYPE_CHECKING:
    from adaptive_lb.tools.sim.metrics import PolicyResult, ScenarioReport

__all__ = [
    "BUSY_NODE",
    "BUSY_SETTLE_S",
    "BUSY_SHARE",
    "BUSY_WINDOW_S",
    "EVEN_SHARE",
    "LEARNED_P50_TOLERANCE",
    "NO_FALSE_VERDICTS",
    "REFERENCE_TOLERANCE",
    "RETURN_WITHIN_S",
    "STALL_TIMEOUTS",
    "TargetCheck",
    "busy_windows",
    "check_targets",
]

REFERENCE_TOLERANCE = 0.02
"""How much worse than its ``reference`` figures a scenario may be, at any percentile."""
LEARNED_P50_TOLERANCE = 0.05
"""How much above the configured rack's p50 a learned rack's may be, once settled."""
RETURN_WITHIN_S = 3.0
"""A paused node's traffic is back to half its fair share within this long of the pause."""
STALL_TIMEOUTS = {"thin-stall": 3, "thin-stall-1rps": 2}
"""User requests that may time out in a thin-traffic scenario's 40 s stall: a few, the
ones sent before the stall is seen (then it is probed, not tried with user requests)."""
EVEN_SHARE = 0.15
"""How far from its fair share an equal node's share of a thin client's requests may be (the
latency factor must not make whichever host answered fastest last take them all)."""
BUSY_NODE = ("busy-node", "busy-node-moderate")
"""Scenarios with a node loaded by other clients whose thread pools are read: it gets at
most :data:`BUSY_SHARE` of the share stock routing gives it, and does not come back while
loaded (after :data:`BUSY_SETTLE_S`, no :data:`BUSY_WINDOW_S` window above that bound)."""
BUSY_SHARE = 0.5
BUSY_SETTLE_S = 10.0
BUSY_WINDOW_S = 5.0
NO_FALSE_VERDICTS = ("noisy-client", "noisy-client-thin")
"""Scenarios with no fault on any node, where no host may leave HEALTHY (a false verdict:
see :func:`~adaptive_lb.tools.sim.metrics.false_verdicts`)."""
_PERCENTILES = ("p50_ms", "p95_ms", "p99_ms")
_Add = Callable[[str, bool, str], None]
"""Records one target: ``add(target, met, detail)``."""


@define(frozen=True)
class TargetCheck:
    """One target and whether this run met it."""

    scenario: str
    target: str
    met: bool
    detail: str


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def check_targets(
    report: ScenarioReport, reports: Sequence[ScenarioReport] = ()
) -> list[TargetCheck]:
    """The targets that apply to this scenario (by its name and what it measured);
    ``reports``: every report of the run, for targets that compare scenarios (a fleet's
    with and without a degraded node)."""
    name = report.scenario.name
    checks: list[TargetCheck] = []

    def add(target: str, met: bool, detail: str) -> None:
        checks.append(TargetCheck(name, target, met, detail))

    adaptive = report.by_policy("adaptive")
    if adaptive is not None:
        _issue_6(report, adaptive.summary, add)
        _reference(report, adaptive.summary, add)
    _issue_15(report, add)
    if adaptive is not None:
        _issue_24(report.scenario.name, adaptive.summary, add)
        if name in BUSY_NODE:
            _busy_node(report, add)
    if name in NO_FALSE_VERDICTS:
        _no_false_verdicts(report, add)
    if report.scenario.is_fleet:
        check_fleet(report, reports, add)
    return checks


def _issue_6(report: ScenarioReport, a: dict[str, Any], add: _Add) -> None:
    name = report.scenario.name
    for baseline in ("latency-aware", "slow-replica", "p2c"):
        other = report.by_policy(baseline)
        if other is not None:
            o = other.summary
            add(
                f"p99 <= {other.label}",
                a["p99_ms"] <= o["p99_ms"],
                f"{a['p99_ms']:.3f} vs {o['p99_ms']:.3f} ms",
            )
    stock = report.by_policy("token-aware")
    if stock is None:
        return
    s = stock.summary
    gain = 1.0 - a["p50_ms"] / s["p50_ms"] if s["p50_ms"] else 0.0
    if name == "local-one":
        add("p50 >= 40 % lower than stock", gain >= 0.40, f"{gain:.1%} lower")
    elif name == "slow-coordinator":
        add("<= 1 % touch the slowed node", a["faulted"] <= 0.01, _pct(a["faulted"]))
    elif name == "gc-pause":
        add("<= 0.1 % affected by the pause", a["faulted"] <= 0.001, _pct(a["faulted"]))
    elif name == "local-quorum":
        add("p50 lower than stock", a["p50_ms"] < s["p50_ms"], f"{gain:.1%} lower")
        add("p95 no worse than stock", a["p95_ms"] <= s["p95_ms"], f"{a['p95_ms']:.3f} ms")
        add("max/mean host load <= 1.3", a["max_mean_host"] <= 1.3, f"{a['max_mean_host']:.2f}")
    if name in ("overload", "one-loaded-node", "fast-failing-node", "hot-partition"):
        worse = [p for p in _PERCENTILES if a[p] > s[p]]
        add("no worse than stock at p50/p95/p99", not worse, ", ".join(worse) or "ok")
        if name != "overload":
            add(
                "strictly better than stock at p99",
                a["p99_ms"] < s["p99_ms"],
                f"{a['p99_ms']:.3f} vs {s['p99_ms']:.3f} ms",
            )


def _reference(report: ScenarioReport, a: dict[str, Any], add: _Add) -> None:
    """No worse than the figures the scenario had before, when run as they were."""
    reference = report.scenario.reference
    if reference is None:
        return
    target = f"no worse than before (reference) by > {REFERENCE_TOLERANCE:.0%} at p50/p95/p99"
    if report.seed != reference["seed"] or report.scenario.requests != reference["requests"]:
        add(target, True, "n/a: not the reference's seed and requests")
        return
    worse = [p for p in _PERCENTILES if a[p] > reference[p] * (1.0 + REFERENCE_TOLERANCE)]
    detail = ", ".join(
        f"{p[:3]} {a[p]:.3f} vs {reference[p]:.3f} ({a[p] / reference[p] - 1.0:+.1%})"
        for p in _PERCENTILES
    )
    add(target, not worse, detail)


def _issue_15(report: ScenarioReport, add: _Add) -> None:
    name = report.scenario.name
    adaptive = report.by_policy("adaptive")
    if name == "one-loaded-node" and adaptive is not None:
        a = adaptive.summary
        others = [r for r in report.results if r.policy != "adaptive"]
        best = min(others, key=lambda r: r.summary["p99_ms"], default=None)
        if best is not None:
            add(
                "default settings: p99 <= every other policy's",
                a["p99_ms"] <= best.summary["p99_ms"],
                f"{a['p99_ms']:.3f} ms vs best other {best.summary['p99_ms']:.3f} ({best.label})",
            )
    if adaptive is not None and "pause_return_s" in adaptive.summary:
        returns = [t for times in adaptive.summary["pause_return_s"].values() for t in times]
        back = [t for t in returns if t is not None]
        add(
            f"paused node back to >= 50 % of its fair share within {RETURN_WITHIN_S:g} s "
            "of each pause's end",
            bool(returns) and len(back) == len(returns) and max(back) <= RETURN_WITHIN_S,
            ", ".join("never" if t is None else f"{t:.1f} s" for t in returns) or "no pause",
        )
    learned = report.by_policy("adaptive-unset")
    if name == "local-one-auto" and learned is not None and adaptive is not None:
        _learned_rack(adaptive.summary, learned.summary, add)
    if name == "far-racks":
        for result in (adaptive, learned):
            if result is None or "slow_verdicts" not in result.summary:
                continue
            verdicts = result.summary["slow_verdicts"]
            add(
                f"{result.label}: no host SLOW from distance (no fault active)",
                verdicts["false"] == 0,
                f"{verdicts['false']} SLOW verdicts",
            )
            add(
                f"{result.label}: the slowed node is flagged SLOW",
                verdicts["faulted"] > 0,
                f"{verdicts['faulted']} SLOW verdicts while it was slowed",
            )


def _issue_24(name: str, a: dict[str, Any], add: _Add) -> None:
    """Thin traffic: a slow node seen from a few requests, and no equal node avoided."""
    if name == "thin-slow":
        add("<= 5 % touch the +50 ms node after 10 s", a["faulted"] <= 0.05, _pct(a["faulted"]))
    elif name == "thin-slightly-slow":
        add("<= 10 % touch the +10 ms node after 30 s", a["faulted"] <= 0.10, _pct(a["faulted"]))
    elif name in STALL_TIMEOUTS:
        most = STALL_TIMEOUTS[name]
        timed_out = round(a["timeouts"] * a["requests"])
        add(
            f"<= {most} user requests timed out in the 40 s stall",
            timed_out <= most,
            f"{timed_out} of {a['requests']} ({_pct(a['faulted'])} touched the node)",
        )
    elif name == "thin-equal":
        attempts = a["attempts_by_host"]
        least = min(attempts.values()) / sum(attempts.values())
        most = max(attempts.values()) / sum(attempts.values())
        add("no equal node below 10 % of requests", least >= 0.10, f"least {_pct(least)}")
        fair = 1.0 / len(attempts)
        add(
            f"equal nodes share evenly: each within {EVEN_SHARE:.0%} of its fair share",
            (1.0 - EVEN_SHARE) * fair <= least and most <= (1.0 + EVEN_SHARE) * fair,
            f"{_pct(least)} to {_pct(most)}",
        )


def _span(times: list[float]) -> str:
    low, high = min(times), max(times)
    return f"learned after {low:.1f} s" if low == high else f"learned after {low:.1f}-{high:.1f} s"


def _learned_rack(configured: dict[str, Any], learned: dict[str, Any], add: _Add) -> None:
    c, u = configured.get("settled"), learned.get("settled")
    if c is None or u is None or not u["requests"] or not c["requests"]:
        add("learned rack settled by 10 s", False, "no request after settled_after")
        return
    after = u["after_s"]
    add(
        f"learned rack: p50 within {LEARNED_P50_TOLERANCE:.0%} of the configured rack's "
        f"after {after:g} s",
        u["p50_ms"] <= c["p50_ms"] * (1.0 + LEARNED_P50_TOLERANCE),
        f"{u['p50_ms']:.3f} vs {c['p50_ms']:.3f} ms",
    )
    add(
        f"learned rack: <= 1 % cross-zone after {after:g} s",
        u["cross_zone"] <= 0.01,
        f"{u['cross_zone']:.2%}",
    )
    racks = learned.get("local_racks", {})
    wrong = [client for client, r in racks.items() if r["rack"] != r["zone"]]
    times = [r["learned_at_s"] for r in racks.values() if r["learned_at_s"] is not None]
    add(
        "every client learned its own zone, once",
        bool(racks) and not wrong and all(r["changes"] == 1 for r in racks.values()),
        _span(times)
        if times and not wrong
        else f"wrong or unlearned: {', '.join(wrong) or 'none'}",
    )


def busy_windows(result: PolicyResult, node: str, after_s: float) -> list[float]:
    """``node``'s share of coordinator attempts in each :data:`BUSY_WINDOW_S` window of
    ``result``'s timeline (its buckets, grouped) starting ``after_s`` seconds or more into
    the run; a window without attempts is left out."""
    step = result.timeline_step_s
    if step <= 0 or node not in result.node_names:
        return []
    index = result.node_names.index(node)
    per = max(1, round(BUSY_WINDOW_S / step))
    shares = []
    for k in range(len(result.timeline)):
        if result.timeline_start_s + k * step < after_s or k % per:
            continue
        window = result.timeline[k : k + per]
        total = sum(sum(bucket) for bucket in window)
        if total:
            shares.append(sum(bucket[index] for bucket in window) / total)
    return shares


def _busy_node(report: ScenarioReport, add: _Add) -> None:
    """The loaded node: at most half stock's share, and no return while it is loaded."""
    adaptive, stock = report.by_policy("adaptive"), report.by_policy("token-aware")
    load = next((f for f in report.scenario.faults if f.kind == "load"), None)
    if adaptive is None or stock is None or load is None:
        return
    a, s = adaptive.summary["faulted"], stock.summary["faulted"]
    bound = BUSY_SHARE * s
    add(
        f"<= {BUSY_SHARE:.0%} of stock's share touch the busy node",
        a <= bound,
        f"{_pct(a)} vs stock {_pct(s)}",
    )
    shares = busy_windows(adaptive, load.node, load.start + BUSY_SETTLE_S)
    add(
        f"no return while loaded: after {BUSY_SETTLE_S:g} s, every {BUSY_WINDOW_S:g} s "
        f"window <= {BUSY_SHARE:.0%} of stock's share",
        bool(shares) and max(shares) <= bound,
        f"most {_pct(max(shares))} in {len(shares)} windows" if shares else "no window",
    )


def _no_false_verdicts(report: ScenarioReport, add: _Add) -> None:
    """Issue 32: no host leaves HEALTHY while no fault is on it (a client's own pauses
    are not the hosts')."""
    for policy in ("adaptive", "adaptive-unset"):
        result = report.by_policy(policy)
        if result is None:
            continue
        verdicts = result.summary.get("verdicts") or {
            "false": 0,
            "false_slow": 0,
            "false_erroring": 0,
        }
        add(
            f"{result.label}: no false verdict (no host leaves HEALTHY without a fault)",
            verdicts["false"] == 0,
            f"{verdicts['false']} false verdicts ({verdicts['false_slow']} SLOW, "
            f"{verdicts['false_erroring']} ERRORING)",
        )
