"""Query-plan throughput: stock driver policies against AdaptiveLoadBalancingPolicy wrapping
each, measured in the same run on the same topology, plus topology-event costs at scale.

    adaptive-lb bench                       # or: python benchmarks/plan_throughput.py
    adaptive-lb bench --skip-1000 --repeats 3 --out /tmp/bench

The table goes to stdout; <driver>.json and <driver>.md are written to a new folder
./adaptive-lb-bench-YYYYmmdd-HHMMSS (or --out DIR), and their paths printed.

Topologies are made of the driver's real objects (``adaptive_lb.tools.sim.driver_topology``):
45 nodes (5 DCs x 3 racks x 3 nodes) and 1,000 nodes (5 DCs x 3 racks x 66-67 nodes), NTS
RF 3 per DC, 16 vnodes, 100,000 distinct routing keys, local DC ``dc1``. Stock and adaptive
are timed in interleaved rounds (5 by default): each figure is the median over the rounds,
each ratio the median of the per-round ratios, so a busy neighbour on a shared machine moves
both sides of a ratio alike. The cyclic GC is off while a run is timed (it adds noise, not signal).

May import the library, the simulator's driver topology and the CLI's formatter (a tool).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    DefaultLoadBalancingPolicy,
    HostFilterPolicy,
    TokenAwarePolicy,
)
from cassandra.query import SimpleStatement

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import PolicyConfig
from adaptive_lb.tools.cli_format import HelpFormatter, doc_description, format_written
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

try:
    from cassandra.policies import RackAwareRoundRobinPolicy
except ImportError:
    RackAwareRoundRobinPolicy = None

OUT_PREFIX = "adaptive-lb-bench-"
"""Without ``--out``, results go to a new folder ``./adaptive-lb-bench-YYYYmmdd-HHMMSS``."""


def driver_name() -> str:
    """Which distribution provides the ``cassandra`` module."""
    for dist in ("scylla-driver", "cassandra-driver"):
        try:
            return f"{dist} {version(dist)}"
        except Exception:
            continue
    return "unknown"


def children() -> dict[str, Callable[[], Any]]:
    """The stock policies compared (each built fresh per measurement)."""
    made: dict[str, Callable[[], Any]] = {
        "DCAware": lambda: DCAwareRoundRobinPolicy("dc1"),
        "TokenAware(DCAware)": lambda: TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        "Default(DCAware)": lambda: DefaultLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1")),
        "HostFilter(DCAware)": lambda: HostFilterPolicy(
            DCAwareRoundRobinPolicy("dc1"), lambda host: True
        ),
    }
    if not TokenAwarePolicy.shuffle_replicas:
        # cassandra-driver's default keeps the ring order, so one replica of each key takes
        # all of its traffic; shuffling is what spreads it, like the adaptive policy does.
        made["TokenAware(DCAware) shuffled"] = lambda: TokenAwarePolicy(
            DCAwareRoundRobinPolicy("dc1"), shuffle_replicas=True
        )
    if RackAwareRoundRobinPolicy is not None:
        made["RackAware"] = lambda: RackAwareRoundRobinPolicy("dc1", "r1")
        made["TokenAware(RackAware)"] = lambda: TokenAwarePolicy(
            RackAwareRoundRobinPolicy("dc1", "r1")
        )
    return made


def routed_statements(count: int) -> list[SimpleStatement]:
    """``count`` statements on keyspace ``ks`` with distinct Murmur3 routing keys (seed 1)."""
    return [
        SimpleStatement("SELECT v FROM ks.t WHERE k = ?", routing_key=key, keyspace="ks")
        for key in murmur3_routing_keys(count, seed=1)
    ]


def cluster_45() -> Any:
    """The 45-node topology: 5 DCs x 3 racks x 3 nodes, 16 vnodes (the driver's objects)."""
    return build_cluster({f"dc{i}": [3, 3, 3] for i in range(1, 6)}, vnodes=16, seed=1)


def timed_kops(run: Callable[[int], None], count: int) -> float:
    """Kops/s of one ``run(count)``, the cyclic GC off while it runs."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run(count)
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    return count / elapsed / 1000.0


def _runners(policy: Any, statements: list[SimpleStatement]) -> dict[str, Callable[[int], None]]:
    """``full`` (consume the whole plan) and ``first`` (first host only) loops for ``policy``."""
    n = len(statements)
    make = policy.make_query_plan

    def full(total: int) -> None:
        for i in range(total):
            for _host in make("ks", statements[i % n]):
                pass

    def first(total: int) -> None:
        for i in range(total):
            next(iter(make("ks", statements[i % n])))

    return {"full": full, "first": first}


def measure_paired(
    policies: dict[str, Any], statements: list[SimpleStatement], count: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Full-plan and first-host throughput of each policy, the first one (``stock``) being
    the reference: ``repeats`` rounds, each timing every policy once, back to back, so that
    a round slowed by a busy neighbour (this is a shared VM) slows all of them alike. Kops/s
    are medians over the rounds; each ratio is the median of the per-round ratios to the
    reference in the same round."""
    runners = {label: _runners(policy, statements) for label, policy in policies.items()}
    for modes in runners.values():  # warm caches and code paths
        for run in modes.values():
            run(min(count, 2000))
    reference = next(iter(policies))
    rates: dict[str, dict[str, list[float]]] = {
        label: {"full": [], "first": []} for label in policies
    }
    ratios: dict[str, dict[str, list[float]]] = {
        label: {"full": [], "first": []} for label in policies
    }
    for _ in range(repeats):
        for mode in ("full", "first"):
            this_round = {label: timed_kops(modes[mode], count) for label, modes in runners.items()}
            for label, kops in this_round.items():
                rates[label][mode].append(kops)
                ratios[label][mode].append(kops / this_round[reference])
    result: dict[str, dict[str, float]] = {}
    for label in policies:
        row = {
            "full_kops": round(statistics.median(rates[label]["full"]), 1),
            "first_kops": round(statistics.median(rates[label]["first"]), 1),
        }
        if label != reference:
            row["full_ratio"] = round(statistics.median(ratios[label]["full"]), 2)
            row["first_ratio"] = round(statistics.median(ratios[label]["first"]), 2)
        result[label] = row
    return result


def compare(model: Any, statements: list, count: int, repeats: int, names: list[str]) -> list:
    """Stock vs adaptive (default cache, and a cache sized for the keys) for each child
    named, measured in interleaved rounds (:func:`measure_paired`)."""
    rows = []
    hosts = model.metadata.all_hosts()
    configs = {
        "adaptive": Config(),
        "adaptive, cache 131072": Config(policy=PolicyConfig(replica_cache_size=131072)),
    }
    factories = children()
    for name in names:
        if name not in factories:
            continue
        stock = factories[name]()
        stock.populate(model.cluster, hosts)
        policies: dict[str, Any] = {"stock": stock}
        for label, config in configs.items():
            adaptive = AdaptiveLoadBalancingPolicy(factories[name](), config)
            adaptive.populate(model.cluster, hosts)
            policies[label] = adaptive
        row: dict[str, Any] = {"child": name}
        row.update(measure_paired(policies, statements, count, repeats))
        for label in configs:
            assert policies[label].internal_errors == 0
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def scale(small: Any, big: Any, statements: list, count: int, repeats: int) -> dict:
    """Adaptive(TokenAware(DCAware)) at 1,000 nodes against itself at 45 nodes, timed in the
    same interleaved rounds (comparing two separate runs would measure this machine's noise):
    the throughput at 1,000 nodes as a share of the 45-node figure."""
    policies = {}
    for label, model in (("45", small), ("1000", big)):
        policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
        policy.populate(model.cluster, model.metadata.all_hosts())
        policies[label] = policy
    measured = measure_paired(policies, statements, count, repeats)
    return {
        "child": "TokenAware(DCAware)",
        "first_share": measured["1000"]["first_ratio"],
        "full_share": measured["1000"]["full_ratio"],
        "kops": measured,
    }


def topology_events(model: Any, repeats: int) -> dict:
    """populate, on_add and on_remove of AdaptiveLoadBalancingPolicy(TokenAware(DCAware))
    at the model's size, in milliseconds (median)."""
    import random

    hosts = model.metadata.all_hosts()
    populate_ms = []
    for _ in range(repeats):
        policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
        start = time.perf_counter()
        policy.populate(model.cluster, hosts)
        populate_ms.append((time.perf_counter() - start) * 1000)
    child_ms = []
    for _ in range(repeats):
        child = TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))
        start = time.perf_counter()
        child.populate(model.cluster, hosts)
        child_ms.append((time.perf_counter() - start) * 1000)
    rng = random.Random(5)
    add_ms, remove_ms = [], []
    for i in range(repeats * 4):
        host = model.new_host("dc1", "r1", f"127.9.{i // 250}.{i % 250 + 1}", 16, rng)
        start = time.perf_counter()
        policy.on_add(host)
        add_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        policy.on_remove(host)
        remove_ms.append((time.perf_counter() - start) * 1000)
        model.remove_host(host)
    return {
        "hosts": len(hosts),
        "populate_ms": round(statistics.median(populate_ms), 2),
        "stock_child_populate_ms": round(statistics.median(child_ms), 2),
        "on_add_ms": round(statistics.median(add_ms), 3),
        "on_remove_ms": round(statistics.median(remove_ms), 3),
    }


def markdown(result: dict) -> str:
    """The README table."""
    lines = [
        f"Driver: {result['driver']}, Python {result['python']}, {result['machine']}",
        "",
        "| nodes | child | stock full | adaptive full (x) | adaptive+big cache full (x) "
        "| stock first | adaptive first (x) | adaptive+big cache first (x) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size, rows in result["throughput"].items():
        for row in rows:
            a, b, s = row["adaptive"], row["adaptive, cache 131072"], row["stock"]
            lines.append(
                f"| {size} | {row['child']} | {s['full_kops']} | {a['full_kops']} "
                f"({a['full_ratio']}x) | {b['full_kops']} ({b['full_ratio']}x) "
                f"| {s['first_kops']} | {a['first_kops']} ({a['first_ratio']}x) "
                f"| {b['first_kops']} ({b['first_ratio']}x) |"
            )
    lines.append("")
    lines.append(
        "Throughput in Kops/s (median over interleaved rounds); ratio = median of the "
        "per-round adaptive / stock ratios."
    )
    scaled = result.get("scale")
    if scaled is not None:
        lines.append("")
        lines.append(
            f"1,000 vs 45 nodes, adaptive {scaled['child']} in the same rounds: first host "
            f"{scaled['first_share']:.0%}, full plan {scaled['full_share']:.0%} of the "
            "45-node throughput."
        )
    lines.append("")
    lines.append(
        "| nodes | populate (ms) | stock child populate (ms) | on_add (ms) | on_remove (ms) |"
    )
    lines.append("| --- | --- | --- | --- | --- |")
    for ev in result["topology_events"]:
        lines.append(
            f"| {ev['hosts']} | {ev['populate_ms']} | {ev['stock_child_populate_ms']} "
            f"| {ev['on_add_ms']} | {ev['on_remove_ms']} |"
        )
    return "\n".join(lines) + "\n"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser(prog: str = "adaptive-lb bench") -> argparse.ArgumentParser:
    """The benchmark's options (``prog``: the command name ``--help`` shows)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc_description(__doc__), formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--plans", type=_positive_int, default=20000, metavar="N", help="plans per timed run"
    )
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=5,
        metavar="N",
        help="interleaved rounds per comparison; figures are medians over them",
    )
    parser.add_argument(
        "--keys", type=_positive_int, default=100_000, metavar="N", help="distinct routing keys"
    )
    parser.add_argument(
        "--skip-1000", action="store_true", help="45 nodes only (skip the 1,000-node topology)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder for <driver>.json and <driver>.md, created if missing, files in it "
        f"overwritten (default: a new folder ./{OUT_PREFIX}YYYYmmdd-HHMMSS)",
    )
    return parser


def new_out_dir(parent: Path | None = None, *, now: float | None = None) -> Path:
    """Create and return a folder that did not exist: ``adaptive-lb-bench-YYYYmmdd-HHMMSS``
    in ``parent`` (default: the current directory, given as a relative path), with ``-2``,
    ``-3``... appended if that name is taken."""
    base = Path(f"{OUT_PREFIX}{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}")
    if parent is not None:
        base = parent / base
    candidate, number = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
        except FileExistsError:
            number += 1
            candidate = base.with_name(f"{base.name}-{number}")
        else:
            return candidate


def main(argv: list[str] | None = None, *, prog: str = "adaptive-lb bench") -> int:
    """Run the benchmark, print the Markdown table, write JSON + Markdown to ``--out`` (or a
    new folder) and list the files written. ``prog``: the command name ``--help`` shows."""
    args = build_parser(prog).parse_args(argv)
    started = time.time()

    statements = routed_statements(args.keys)
    result: dict[str, Any] = {
        "driver": driver_name(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "throughput": {},
        "topology_events": [],
    }
    small = cluster_45()
    result["throughput"]["45"] = compare(
        small, statements, args.plans, args.repeats, list(children())
    )
    result["topology_events"].append(topology_events(small, args.repeats))
    if not args.skip_1000:
        big = build_cluster({f"dc{i}": [67, 67, 66] for i in range(1, 6)}, vnodes=16, seed=2)
        quarter = max(1, args.plans // 4)  # plans per run at 1,000 nodes
        result["throughput"]["1000"] = compare(
            big, statements, quarter, args.repeats, ["DCAware", "TokenAware(DCAware)"]
        )
        result["topology_events"].append(topology_events(big, args.repeats))
        result["scale"] = scale(small, big, statements, quarter, args.repeats)
        big.shutdown()
    small.shutdown()
    if args.out is None:
        out = new_out_dir(now=started)
    else:
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
    tag = result["driver"].split()[0]
    paths = [out / f"{tag}.json", out / f"{tag}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    paths[1].write_text(table)
    print(table)
    print(format_written(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m adaptive_lb.tools.bench"))
