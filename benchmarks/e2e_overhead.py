"""What wrapping the policy costs a service: the real driver against Simulacron, end to end.

    python benchmarks/e2e_overhead.py                  # 30 rounds x 2 s per variant, ~9 min
    python benchmarks/e2e_overhead.py --rounds 6 --seconds 1        # ~1 min, a noisy look

Starts Simulacron (a simulated CQL cluster; Java, and Maven the first time) on loopback: 3
nodes in one DC, keyspace ``ks`` NTS RF 2, the prepared ``SELECT v FROM ks.t WHERE k = ?``
primed to answer at once, protocol v4; token-aware routing is checked (every coordinator of
a check request is a replica of its key). The script kills it by PID when done (and the
kernel does if this process dies: ``setpriv --pdeathsig``); a watchdog ends the whole run if
it takes far longer than planned.

The client is CPU-bound by design: one process keeps ``--concurrency`` ``execute_async``
requests in flight (each completion sends the next one, on the driver's event-loop
thread), so what a variant adds per request shows as throughput lost and CPU spent.
Variants, each with its own Cluster and Session created once up front and warmed up:

* ``stock``: ``TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))``, the reference;
* ``adaptive``: the same wrapped by ``AdaptiveLoadBalancingPolicy``, with
  ``adaptive_lb.instrument(session)`` (request tracking + health refresh thread);
* ``adaptive-otel``: ``adaptive`` with a recording OpenTelemetry tracer: an SDK
  TracerProvider whose spans go to an exporter that drops them, a parent span per request,
  so every decision is recorded on it;
* ``stock-otel``: ``stock`` with the same parent span, to tell the cost of the span itself
  from the cost of recording the decision on it.

Every request traced (``--variants stock,adaptive,stock-instr,adaptive-traced,...``, each on
an SDK TracerProvider with a BatchSpanProcessor to an exporter that drops the spans):
``stock-instr`` is ``stock`` with the span opentelemetry-instrumentation-cassandra puts
around ``execute_async`` (its wrapper bound to that variant's session only);
``adaptive-traced`` is ``adaptive_lb.attach(session, tracer_provider=tp)`` with the
defaults (a request span per request, its decision on it), compared with ``stock-instr``;
``adaptive-traced-brief`` the same with ``tracing.candidates_ratio: 0`` (the chosen host's
reason, no candidate list) and ``adaptive-traced-nodecision`` with ``tracing.ratio: 0``.

Diagnostic variants (not run by default; they split ``adaptive``'s cost): ``adaptive-untracked``
(the plan without tracking), ``adaptive-every`` (every request tracked: no sampling),
``stock-tracked`` (stock routing, attempts tracked into a side policy's statistics),
``stock-hooked`` (futures hooked, attempts ignored),
``stock-listener`` (a request-init listener doing nothing), ``stock-reclassed`` (the hook's
attribute and class switch, no overridden method) and ``stock-shuffled``
(``shuffle_replicas=True``).

Timing: ``--rounds`` rounds; in each, every variant runs ``--seconds`` once, in a shuffled
order, so a busy neighbour on a shared machine slows the variants of a round alike. Every
request sent in a round completes in it. The cyclic GC is frozen after warm-up
(``gc.freeze()``) and disabled while a round is timed (collected between runs). Only the
timed variant's health-refresh thread runs. For each variant against the reference, the
figures are medians of the per-round ratios -- throughput (requests/s) and process CPU per
request (``time.process_time()``, all threads) -- and of the per-round difference in CPU
microseconds per request, each with a distribution-free 95 % confidence interval of the
median (order statistics). The table says when an interval includes no change or is wider
than the effect. Markdown goes to stdout, everything (per-round figures too) to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import _e2e
import figures

from adaptive_lb.tools.bench import driver_name

REFERENCE = "stock"
DEFAULT_VARIANTS = "stock,adaptive,adaptive-attach,adaptive-otel,adaptive-spans,stock-otel"
NODES_TEXT = f"{_e2e.NODES} nodes, 1 DC, RF {_e2e.RF}, protocol v4"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------


def compare(rounds: list[dict[str, Any]], name: str, reference: str) -> dict[str, Any]:
    """``name`` against ``reference``, round by round."""
    thr, cpu, added = [], [], []
    for r in rounds:
        a, b = r["variants"][name], r["variants"][reference]
        thr.append(a["req_per_s"] / b["req_per_s"])
        cpu.append(a["cpu_us_per_req"] / b["cpu_us_per_req"])
        added.append(a["cpu_us_per_req"] - b["cpu_us_per_req"])
    out = {
        "variant": name,
        "reference": reference,
        "throughput_ratio": _e2e.median_ci(thr),
        "cpu_per_request_ratio": _e2e.median_ci(cpu),
        "added_cpu_us_per_request": _e2e.median_ci(added),
    }
    out["throughput_note"] = _e2e.verdict(out["throughput_ratio"], 1.0, " pp", 100)
    out["cpu_note"] = _e2e.verdict(out["cpu_per_request_ratio"], 1.0, " pp", 100)
    return out


def summarize(rounds: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    import statistics

    per_variant = {}
    for name in names:
        runs = [r["variants"][name] for r in rounds]
        per_variant[name] = {
            "req_per_s": statistics.median(x["req_per_s"] for x in runs),
            "cpu_us_per_req": statistics.median(x["cpu_us_per_req"] for x in runs),
            "cpu_utilisation": statistics.median(x["cpu_seconds"] / x["seconds"] for x in runs),
            "requests": sum(x["requests"] for x in runs),
            "errors": sum(x["errors"] for x in runs),
        }
    comparisons = [compare(rounds, n, REFERENCE) for n in names if n != REFERENCE]
    if "adaptive-otel" in names and "stock-otel" in names:
        comparisons.append(compare(rounds, "adaptive-otel", "stock-otel"))
    if "adaptive-spans" in names and "stock-otel" in names:
        comparisons.append(compare(rounds, "adaptive-spans", "stock-otel"))
    for name in names:  # every request traced: against the stock instrumentation
        if name.startswith("adaptive-traced") and "stock-instr" in names:
            comparisons.append(compare(rounds, name, "stock-instr"))
    if "adaptive-attach" in names and "adaptive" in names:
        comparisons.append(compare(rounds, "adaptive-attach", "adaptive"))
    return {"per_variant": per_variant, "comparisons": comparisons}


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures ``--record`` keeps (docs/figures.json): per variant its CPU per request
    and throughput; per comparison (``<variant>`` against stock, ``<variant>_vs_<reference>``
    otherwise) the medians and interval bounds; the share of requests tracked."""
    cfg, summary = result["config"], result["summary"]
    out: dict[str, Any] = {"rounds": cfg["rounds"], "seconds": cfg["seconds"]}
    for name, v in summary["per_variant"].items():
        out[f"{name}.cpu_us"] = round(v["cpu_us_per_req"], 1)
        out[f"{name}.req_per_s"] = round(v["req_per_s"])
    for c in summary["comparisons"]:
        key = c["variant"] if c["reference"] == REFERENCE else f"{c['variant']}_vs_{c['reference']}"
        for field, short, digits in (
            ("throughput_ratio", "throughput", 3),
            ("cpu_per_request_ratio", "cpu_ratio", 3),
            ("added_cpu_us_per_request", "added_us", 1),
        ):
            ci = c[field]
            out[f"{key}.{short}"] = round(ci["median"], digits)
            out[f"{key}.{short}_lo"] = round(ci["lo"], digits)
            out[f"{key}.{short}_hi"] = round(ci["hi"], digits)
    for name, c in result["counters"].items():
        if "tracked_requests" in c and c.get("requests_issued"):
            out[f"{name}.tracked_share"] = round(c["tracked_requests"] / c["requests_issued"], 4)
    return out


def _ratio(ci: dict[str, float]) -> str:
    return f"{ci['median']:.3f} ({ci['lo']:.3f}-{ci['hi']:.3f})"


def _diff(ci: dict[str, float]) -> str:
    return f"{ci['median']:+.1f} ({ci['lo']:+.1f} to {ci['hi']:+.1f})"


def markdown(result: dict[str, Any]) -> str:
    cfg, summary = result["config"], result["summary"]
    coverage = _e2e.median_ci([0.0] * cfg["rounds"])["coverage"]
    lines = [
        f"{result['driver']}, Python {result['python']}, {result['machine']}; "
        f"Simulacron {NODES_TEXT}; {cfg['concurrency']} requests in flight, one process; "
        f"{cfg['rounds']} rounds x {cfg['seconds']:g} s per variant, shuffled order; "
        f"GC frozen after warm-up and disabled while timing; load average "
        f"{result['loadavg_before'][0]:.1f} before, {result['loadavg_after'][0]:.1f} after.",
        "",
        "| variant | req/s | CPU us/req | CPU use (cores) | errors |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, v in summary["per_variant"].items():
        lines.append(
            f"| {name} | {v['req_per_s']:,.0f} | {v['cpu_us_per_req']:.1f} "
            f"| {v['cpu_utilisation']:.2f} | {v['errors']} |"
        )
    lines += [
        "",
        f"Medians over rounds. Against the reference, medians of per-round figures with "
        f"their {coverage:.1%} order-statistic confidence interval:",
        "",
        "| variant | vs | throughput ratio (CI) | CPU/request ratio (CI) "
        "| added CPU us/request (CI) | noise |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in summary["comparisons"]:
        notes = []
        for label, note in (("throughput", c["throughput_note"]), ("CPU", c["cpu_note"])):
            if note != "resolved":
                notes.append(f"{label}: {note}")
        lines.append(
            f"| {c['variant']} | {c['reference']} | {_ratio(c['throughput_ratio'])} "
            f"| {_ratio(c['cpu_per_request_ratio'])} | {_diff(c['added_cpu_us_per_request'])} "
            f"| {'; '.join(notes) or 'interval narrower than the effect'} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:  # explained in the help text itself
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per variant a round")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help=f"comma-separated, from {', '.join(_e2e.VARIANTS)}; must include {REFERENCE}",
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds per variant")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct partition keys")
    parser.add_argument("--seed", type=int, default=1, help="round order and key order")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON result path (default: a fresh file e2e_overhead-*.json in the temp dir)",
    )
    figures.add_record_option(parser)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in _e2e.VARIANTS]
    if unknown or REFERENCE not in names or len(set(names)) != len(names):
        parser.error(f"--variants: known are {', '.join(_e2e.VARIANTS)}; include {REFERENCE}")
    if args.rounds < 1 or args.seconds <= 0 or args.concurrency < 1 or args.keys < 1:
        parser.error("--rounds, --seconds, --concurrency and --keys must be positive")
    args.names = [REFERENCE] + [n for n in names if n != REFERENCE]
    return args


def _on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = len(args.names)
    planned = 30 + n * (args.warmup + 5) + args.rounds * n * (args.seconds + 0.5)
    hard_limit = 2 * planned + 120
    log(f"planned ~{planned / 60:.1f} min; the watchdog ends the run after {hard_limit:.0f} s")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    sim = _e2e.Sim()
    variants: dict[str, _e2e.Variant] = {}

    def watchdog() -> None:
        log(f"watchdog: still running after {hard_limit:.0f} s; stopping Simulacron, exiting")
        sim.stop()
        os._exit(3)

    timer = threading.Timer(hard_limit, watchdog)
    timer.daemon = True
    timer.start()
    loadavg_before = os.getloadavg()
    try:
        sim.start()
        log(f"Simulacron pid {sim.pid} ready in {sim.startup_seconds:.1f} s, REST {sim.base_url}")
        nodes = sim.setup_cluster()
        log(f"nodes {', '.join(nodes)}")
        for name in args.names:
            variants[name] = _e2e.Variant(name, nodes[:1])
            variants[name].park()
        keys = _e2e.key_sequence(args.keys, args.seed)
        checks = {}
        for name, variant in variants.items():
            variant.unpark()
            warm = variant.loop.run(args.warmup, args.concurrency, keys, drain_timeout=15)
            checks[name] = {"warmup": warm, **variant.verify(keys)}
            variant.park()
            log(f"warm-up {name}: {warm['req_per_s']:,.0f}/s; checks {checks[name]}")
        problems = _check(checks)
        if problems:
            for problem in problems:
                log(f"CHECK FAILED: {problem}")
            return 1
        gc.collect()
        gc.freeze()
        try:
            rounds = _e2e.run_rounds(
                variants,
                args.rounds,
                args.seconds,
                args.concurrency,
                keys,
                args.seed,
                drain_timeout=15,
                progress=log,
            )
        finally:
            gc.unfreeze()
        counters = {name: v.counters() for name, v in variants.items()}
    finally:
        for variant in variants.values():
            try:
                variant.shutdown()
            except Exception as exc:
                log(f"shutdown of {variant.name}: {exc!r}")
        sim.stop()
        timer.cancel()

    result: dict[str, Any] = {
        "benchmark": "e2e_overhead",
        "driver": driver_name(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "config": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "concurrency": args.concurrency,
            "variants": args.names,
            "variant_descriptions": {k: _e2e.VARIANTS[k] for k in args.names},
            "warmup_seconds": args.warmup,
            "keys": args.keys,
            "seed": args.seed,
            "cluster": NODES_TEXT,
            "gc": "frozen after warm-up, disabled while timing, collected between runs",
        },
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        "checks": checks,
        "counters": counters,
        "summary": summarize(rounds, args.names),
        "rounds": rounds,
    }
    for name, c in counters.items():  # every span exported; every request tracked where due
        issued = checks[name]["warmup"]["requests"] + checks[name]["requests"]
        issued += sum(r["variants"][name]["requests"] for r in rounds)
        c["requests_issued"] = issued
        # The loop's span per request, and adaptive-lb's request span under it.
        per_request = {"spans_exported": 2 if name == "adaptive-spans" else 1}
        if name == "adaptive-every":  # the others track a sample (spans or not)
            per_request["tracked_requests"] = 1
        for key, times in per_request.items():
            if key in c and c[key] != times * issued:
                log(f"WARNING: {name}: {key} {c[key]} != {times} x {issued} requests issued")
    table = markdown(result)
    result["markdown"] = table
    out = args.out
    if out is None:
        fd, name = tempfile.mkstemp(prefix="e2e_overhead-", suffix=".json")
        os.close(fd)
        out = Path(name)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table)
    errors = sum(v["errors"] for v in result["summary"]["per_variant"].values())
    if errors:
        log(f"WARNING: {errors} requests failed during the timed rounds")
    log(f"JSON: {out}")
    if not errors:
        figures.record_run("e2e_overhead", args.record, headline(result), argv)
    return 1 if errors else 0


def _check(checks: dict[str, dict[str, Any]]) -> list[str]:
    """Reasons the setup does not measure what it claims (empty: it does)."""
    problems = []
    for name, c in checks.items():
        if c["warmup"]["errors"]:
            problems.append(f"{name}: {c['warmup']['errors']} errors during warm-up")
        if c["coordinator_is_replica"] != c["requests"]:
            problems.append(
                f"{name}: token-aware routing not working "
                f"({c['coordinator_is_replica']}/{c['requests']} coordinators were replicas)"
            )
        if c.get("untracked_requests"):
            problems.append(f"{name}: {c['untracked_requests']} requests not tracked")
        if c.get("internal_errors"):
            problems.append(f"{name}: {c['internal_errors']} adaptive-lb internal errors")
        if name == "adaptive-otel" and c.get("spans_with_decision") != c["requests"]:
            problems.append(
                f"{name}: {c.get('spans_with_decision')}/{c['requests']} spans got a decision"
            )
        wants = 0 if name == "adaptive-traced-nodecision" else c["requests"]
        if name.startswith("adaptive-traced") and c.get("spans_with_decision") != wants:
            problems.append(
                f"{name}: {c.get('spans_with_decision')}/{c['requests']} spans got a decision"
            )
        if name in ("stock-otel", "stock-instr") and c.get("spans_with_decision"):
            problems.append(f"{name}: decisions recorded without adaptive-lb?")
    return problems


if __name__ == "__main__":
    sys.exit(main())
