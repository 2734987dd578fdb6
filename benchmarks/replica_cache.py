"""What one replica lookup costs with the cache hitting, missing, and stood aside.

    python benchmarks/replica_cache.py

The real ``ReplicaResolver`` of an ``AdaptiveLoadBalancingPolicy`` over the 45-node
topology of ``plan_throughput.py`` (the driver's own ``Metadata`` and token map, 16 vnodes),
timed at ``ReplicaResolver.replicas`` -- everything a plan spends on finding its replicas:

* ``hit``: 1,000 keys in turn through a cache that holds them all;
* ``miss``: 100,000 keys in turn through a 4,096-entry cache kept on (every lookup misses);
* ``bypassed``: the same keys with the cache stood aside, as it does by itself for such keys.

Rounds are interleaved (each times the three cases once, in turn); figures are medians of
the rounds, in microseconds per lookup, with the loop's own cost taken off. They give the
cache's break-even hit ratio -- (miss - bypassed) / (miss - hit) -- which
``adaptive_lb.plan.replica_cache.BREAK_EVEN_HIT_RATIO`` rounds. The cyclic GC is off while timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import PolicyConfig
from adaptive_lb.plan.replica_cache import BREAK_EVEN_HIT_RATIO
from adaptive_lb.tools.bench import cluster_45, driver_name, timed_kops
from adaptive_lb.tools.cli_format import HelpFormatter
from adaptive_lb.tools.sim.driver_topology import murmur3_routing_keys


def resolver_case(cache_size: int, keys: list[bytes], active: bool) -> Callable[[int], None]:
    """``run(n)``: n lookups of ``keys`` in turn through a fresh policy's resolver, its cache
    forced on or aside (its own verdict is not waited for)."""
    model = cluster_45()
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")),
        Config(policy=PolicyConfig(replica_cache_size=cache_size)),
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    resolver = policy._planner.resolver
    topology = policy._planner.book.topology
    cache = resolver.cache
    count = len(keys)

    def run(n: int) -> None:
        cache.active = active
        cache._misses_to_review = 1 << 62  # no verdict while timing
        cache._trial_at = 1 << 62
        replicas = resolver.replicas
        for i in range(n):
            replicas("ks", keys[i % count], None, topology)

    run(2 * count)  # fill the cache, build the ring memo
    return run


def loop_only(keys: list[bytes]) -> Callable[[int], None]:
    """The timing loop without the lookup."""
    count = len(keys)

    def run(n: int) -> None:
        for i in range(n):
            keys[i % count]

    return run


def timed_us(run: Callable[[int], None], n: int) -> float:
    """Microseconds per iteration of ``run(n)``, the cyclic GC off."""
    return 1000.0 / timed_kops(run, n)


def measure(rounds: int, lookups: int) -> dict[str, float]:
    """Median microseconds per lookup of each case over ``rounds`` interleaved rounds."""
    few = murmur3_routing_keys(1000, seed=1)
    many = murmur3_routing_keys(100_000, seed=2)
    cases = {
        "hit": resolver_case(4096, few, True),
        "miss": resolver_case(4096, many, True),
        "bypassed": resolver_case(4096, many, False),
    }
    loop = loop_only(many)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        base = timed_us(loop, lookups)
        for name, run in cases.items():
            samples[name].append(timed_us(run, lookups) - base)
    return {name: round(statistics.median(values), 3) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--lookups", type=int, default=100_000, help="lookups per case a round")
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.lookups)
    hit, miss, bypassed = result["hit"], result["miss"], result["bypassed"]
    result["break_even_hit_ratio"] = round((miss - bypassed) / (miss - hit), 2)
    result["BREAK_EVEN_HIT_RATIO"] = BREAK_EVEN_HIT_RATIO
    print(f"{driver_name()}, Python {sys.version.split()[0]}; us per replica lookup (median)")
    print("| hit | miss | bypassed | break-even hit ratio | in use |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| {hit:.2f} | {miss:.2f} | {bypassed:.2f} | {result['break_even_hit_ratio']:.2f} "
        f"| {BREAK_EVEN_HIT_RATIO} |"
    )
    print(json.dumps(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
