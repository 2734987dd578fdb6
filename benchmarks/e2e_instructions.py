"""What wrapping the policy costs a request, in CPU instructions counted by valgrind: the real
driver against Simulacron, end to end, with figures that do not depend on the machine's load.

    python benchmarks/e2e_instructions.py                          # ~14 min (~3.5 per variant)
    python benchmarks/e2e_instructions.py --variants stock,adaptive --repeats 3 --top 15

Timing on a shared 2-core VM moves by +-25 % (``e2e_overhead.py`` needs 20 interleaved rounds
for a +-2 us interval). Instructions do not: this starts Simulacron as ``e2e_overhead.py``
does, then runs each variant's client (the same closed loop of ``--concurrency`` requests,
the same ``_e2e.Variant``) under ``valgrind --tool=callgrind`` twice, with ``--small`` and
``--large`` requests after the same warm-up, and reports ``(Ir(large) - Ir(small)) /
(large - small)``: instructions per request, with start-up, connection and warm-up
cancelled out. The warm-up (6,000 requests by default) takes the replica cache past the
verdict it reaches on itself after ~5,100 lookups, so the counts are its steady state. The
two runs of a pair go in parallel (valgrind runs ~50x slower; counts do
not care). ``--top N`` lists the functions (C level: the interpreter, the driver's compiled
modules) whose instructions per request differ most from stock's.

Determinism: ``PYTHONHASHSEED=0`` and one BLAS thread. What still moves -- the
interpreter's method cache and allocator state, the driver's event loop reading one
response or several per wake-up -- is ~0.3 % of stock's count between the pairs of a run
(``--repeats`` shows it) and up to ~1.5 % between runs: compare variants within one run. The
health refresh runs every 1,000 requests from the client itself, not on its 200 ms timer
(under valgrind a timer would fire ~50x as often per request). Instructions are not time:
stock's CPU per request over its instructions is ~0.32 ns per instruction here, and
adaptive-lb's instructions cost 1-3x that in place (``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _e2e
import figures

REFRESH_EVERY = 1000


# ------------------------------------------------------------------------------------------
# The client (a child process, under valgrind)
# ------------------------------------------------------------------------------------------


class CountedLoop:
    """``concurrency`` requests in flight until ``total`` have completed."""

    def __init__(self, variant: _e2e.Variant, keys: list[int], refresh: Any) -> None:
        self.variant, self.keys, self.refresh = variant, keys, refresh
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.left = self.in_flight = self.sent = self.errors = 0

    def run(self, total: int, concurrency: int) -> None:
        self.left, self.done = total, threading.Event()
        for _ in range(min(concurrency, total)):
            self.issue()
        if not self.done.wait(3600):
            raise RuntimeError("the loop did not finish in an hour")

    def issue(self) -> None:
        with self.lock:
            i = self.sent
            self.sent += 1
            self.in_flight += 1
        key = self.keys[i % len(self.keys)]
        future = self.variant.session.execute_async(self.variant.prepared, (key,))
        future.add_callbacks(self.ok, self.failed)

    def ok(self, _rows: Any) -> None:
        with self.lock:
            self.in_flight -= 1
            self.left -= 1
            more = self.left > self.in_flight
            idle = self.in_flight == 0
            sent = self.sent
        if self.refresh is not None and sent % REFRESH_EVERY == 0:
            self.refresh()
        if more:
            self.issue()
        elif idle:
            self.done.set()

    def failed(self, exc: BaseException) -> None:
        with self.lock:
            self.in_flight -= 1
            self.errors += 1
            idle = self.in_flight == 0
        if idle:
            self.done.set()


def child(args: argparse.Namespace) -> None:
    import gc

    variant = _e2e.Variant(args.child, args.contact_points.split(","))
    refresh = None
    # Every adaptive variant but the untracked one refreshes its health, adaptive-pools
    # too (no tracker): left on its timer, valgrind's pace fires it ~50x as often per
    # request, which was most of adaptive-pools' excess until 2026-11-28.
    if variant.adaptive and variant.name != "adaptive-untracked":
        variant.policy.stop_health_refresh()
        refresh = variant.policy.refresh_health
    loop = CountedLoop(variant, _e2e.key_sequence(args.keys, 1), refresh)
    loop.run(args.warmup, args.concurrency)
    gc.collect()
    gc.freeze()
    gc.disable()
    loop.errors = 0
    loop.run(args.requests, args.concurrency)
    variant.shutdown()
    if loop.errors:
        sys.exit(f"{loop.errors} requests failed")


# ------------------------------------------------------------------------------------------
# The parent
# ------------------------------------------------------------------------------------------


def counted(args: argparse.Namespace, name: str, requests: int, out: Path) -> None:
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--child",
        name,
        "--contact-points",
        args.contact_points,
        "--requests",
        str(requests),
        "--warmup",
        str(args.warmup),
        "--concurrency",
        str(args.concurrency),
        "--keys",
        str(args.keys),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{name} ({requests} requests): {done.stderr[-2000:]}")


def total_instructions(out: Path) -> int:
    match = re.search(r"^totals:\s+(\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no totals in {out}")
    return int(match.group(1))


def function_costs(out: Path) -> dict[str, int]:
    """Exclusive instructions per function (``callgrind_annotate``)."""
    text = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(\S.*)$", line)
        if match and "PROGRAM TOTALS" not in match.group(2):
            where, _, binary = match.group(2).partition(" [")
            if where.startswith("???"):  # no symbol: name the binary
                name = f"{where} {os.path.basename(binary.rstrip(']'))}"
            else:  # file:function, without the directories
                name = re.sub(r"^\S*/(?=[^/]*:)", "", where)
            costs[name] = costs.get(name, 0) + int(match.group(1).replace(",", ""))
    return costs


def measure(args: argparse.Namespace, name: str, folder: Path) -> dict[str, Any]:
    """One pair of runs, side by side: instructions per request, and per function (only
    with ``--top``: ``callgrind_annotate`` is slow on these profiles)."""
    small, large = folder / f"{name}-small.out", folder / f"{name}-large.out"
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(counted, args, name, n, out)
            for n, out in ((args.small, small), (args.large, large))
        ]
        for run in runs:
            run.result()  # raises what the run raised
    span = args.large - args.small
    per_request = (total_instructions(large) - total_instructions(small)) / span
    functions: dict[str, float] = {}
    if args.top:
        a, b = function_costs(small), function_costs(large)
        functions = {f: (b.get(f, 0) - a.get(f, 0)) / span for f in set(a) | set(b)}
    return {"per_request": per_request, "functions": functions}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", default="stock,adaptive,adaptive-untracked,stock-tracked")
    parser.add_argument("--small", type=int, default=1000, help="requests, short run")
    parser.add_argument("--large", type=int, default=3000, help="requests, long run")
    parser.add_argument(
        "--warmup",
        type=int,
        default=6000,
        help="requests before counting (past the replica cache's verdict, ~5,100 lookups)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="pairs per variant")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct partition keys")
    parser.add_argument(
        "--top", type=int, default=0, help="print the N largest per-function deltas"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON result path")
    figures.add_record_option(parser)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--contact-points", default="", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    from adaptive_lb.tools.bench import driver_name

    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if names[0] != "stock":
        sys.exit("--variants must start with stock (the reference)")
    results: dict[str, list[dict[str, Any]]] = {}
    with _e2e.Sim() as sim, tempfile.TemporaryDirectory(prefix="e2e-instr-") as tmp:
        args.contact_points = ",".join(sim.setup_cluster())
        for repeat in range(args.repeats):
            for name in names:
                result = measure(args, name, Path(tmp))
                results.setdefault(name, []).append(result)
                print(
                    f"repeat {repeat + 1}: {name} "
                    f"{result['per_request']:,.0f} instructions per request",
                    file=sys.stderr,
                    flush=True,
                )
    headline = report(args, names, results, driver_name())
    figures.record_run("e2e_instructions", args.record, headline, argv)


def report(args: argparse.Namespace, names: list[str], results: Any, driver: str) -> dict[str, Any]:
    """Print the table (and write ``--out``); return the headline figures (``--record``):
    per variant the instructions per request, and the added ones and share vs stock."""
    stock_runs = results["stock"]
    stock = statistics.median(r["per_request"] for r in stock_runs)
    print(
        f"{driver}, Python {sys.version.split()[0]}; Simulacron {_e2e.NODES} nodes, RF {_e2e.RF}; "
        f"{args.concurrency} requests in flight; instructions per request = "
        f"(Ir({args.large}) - Ir({args.small})) / {args.large - args.small}, "
        f"median of {args.repeats} pair(s)\n"
    )
    print("| variant | instructions / request | added vs stock | % of stock |")
    print("| --- | --- | --- | --- |")
    summary = []
    tops = []
    headline: dict[str, Any] = {"repeats": args.repeats}
    for name in names:
        runs = results[name]
        values = [r["per_request"] for r in runs]
        value = statistics.median(values)
        spread = f" ({min(values):,.0f}-{max(values):,.0f})" if len(values) > 1 else ""
        added = value - stock
        print(f"| {name} | {value:,.0f}{spread} | {added:+,.0f} | {added / stock:+.1%} |")
        summary.append({"variant": name, "per_request": values})
        headline[f"{name}.per_request"] = round(value)
        if name != "stock":
            headline[f"{name}.added"] = round(added)
            headline[f"{name}.added_share"] = round(added / stock, 4)
        if args.top and name != "stock":
            mine, theirs = runs[0]["functions"], stock_runs[0]["functions"]
            deltas = {f: mine.get(f, 0) - theirs.get(f, 0) for f in set(mine) | set(theirs)}
            top = sorted(deltas.items(), key=lambda kv: -abs(kv[1]))[: args.top]
            summary[-1]["top_functions"] = top
            tops.append(f"\n{name} vs stock, first pair, instructions per request:")
            tops += [f"  {delta:+9,.0f}  {function}" for function, delta in top]
    print("\n".join(tops))
    if args.out is not None:
        args.out.write_text(json.dumps({"driver": driver, "results": summary}, indent=2))
    return headline


if __name__ == "__main__":
    main()
