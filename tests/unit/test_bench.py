"""The plan-throughput benchmark runs end to end and reports what the README shows (a
behaviour check on a tiny run; no figure is asserted)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from adaptive_lb.tools import bench

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def _benchmark(name: str) -> ModuleType:
    """A script of benchmarks/, imported as a module (one importing _e2e or figures needs
    BENCHMARKS on sys.path first)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tiny_run_writes_json_and_markdown(tmp_path, capsys):
    argv = ["--plans", "100", "--repeats", "1", "--keys", "100", "--skip-1000"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    [written] = list(tmp_path.glob("*.json"))
    result = json.loads(written.read_text())
    rows = result["throughput"]["45"]
    assert {row["child"] for row in rows} >= {"DCAware", "TokenAware(DCAware)"}
    for row in rows:
        assert "full_ratio" not in row["stock"]
        for label in ("adaptive", "adaptive, cache 131072"):
            measured = row[label]
            assert measured["full_kops"] > 0 and measured["first_kops"] > 0
            assert measured["full_ratio"] > 0 and measured["first_ratio"] > 0
    [events] = result["topology_events"]
    assert events["hosts"] == 45 and events["populate_ms"] > 0
    table = written.with_suffix(".md").read_text()
    assert "| 45 | TokenAware(DCAware) |" in table
    out = capsys.readouterr().out
    assert table in out
    assert out.endswith(f"wrote 2 files:\n  {written}\n  {written.with_suffix('.md')}\n")


def test_paired_rounds_time_every_policy_and_take_ratios_per_round():
    calls = []

    class Policy:
        def __init__(self, name, hosts):
            self.name, self.hosts = name, hosts

        def make_query_plan(self, keyspace, statement):
            calls.append(self.name)
            return iter(self.hosts)

    policies = {"stock": Policy("stock", [1, 2, 3]), "other": Policy("other", [1])}
    result = bench.measure_paired(policies, [object()], count=50, repeats=3)
    assert set(result) == {"stock", "other"}
    assert "full_ratio" not in result["stock"] and result["other"]["full_ratio"] > 0
    # Warm-up (full + first per policy), then per round and mode one run of each policy,
    # back to back.
    assert calls.count("stock") == calls.count("other") == 2 * 50 + 3 * 2 * 50
    timed = calls[4 * 50 :]
    runs = [timed[i] for i in range(0, len(timed), 50)]
    assert runs == ["stock", "other"] * 6


def test_scale_compares_two_sizes_in_the_same_rounds():
    from cassandra.query import SimpleStatement

    from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

    statements = [
        SimpleStatement("SELECT v FROM ks.t WHERE k = ?", routing_key=key, keyspace="ks")
        for key in murmur3_routing_keys(200, seed=3)
    ]
    small = build_cluster({"dc1": [2, 2, 2]}, vnodes=4, seed=1)
    big = build_cluster({"dc1": [6, 6, 6], "dc2": [6, 6, 6]}, vnodes=4, seed=2)
    try:
        scaled = bench.scale(small, big, statements, count=200, repeats=3)
    finally:
        small.shutdown()
        big.shutdown()
    assert set(scaled["kops"]) == {"45", "1000"}
    assert scaled["first_share"] > 0 and scaled["full_share"] > 0
    table = bench.markdown(
        {"driver": "d", "python": "p", "machine": "m", "throughput": {}, "topology_events": []}
        | {"scale": scaled}
    )
    assert f"first host {scaled['first_share']:.0%}" in table


def test_the_floor_yields_the_first_local_replica_of_each_key():
    """benchmarks/plan_floor.py's floor does the work it claims: its host is a local replica
    of the key in the driver's own token map (so it is a fair lower bound, not a no-op)."""
    from cassandra.query import SimpleStatement

    from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

    plan_floor = _benchmark("plan_floor")

    model = build_cluster({"dc1": [2, 2, 2], "dc2": [2, 2, 2]}, vnodes=4, seed=1)
    try:
        model.metadata.get_replicas("ks", b"warm")  # the driver maps a keyspace lazily
        floor = plan_floor.FloorPlan(model.metadata, "ks", "dc1")
        for key in murmur3_routing_keys(300, seed=4):
            statement = SimpleStatement("SELECT 1", routing_key=key, keyspace="ks")
            (host,) = floor.make_query_plan("ks", statement)
            local = [r for r in model.metadata.get_replicas("ks", key) if r.datacenter == "dc1"]
            assert host is local[0]
    finally:
        model.shutdown()


def test_plan_under_load_reports_each_case(capsys, monkeypatch):
    """benchmarks/plan_under_load.py runs and reports each case it documents."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # for its figures
    module = _benchmark("plan_under_load")
    assert module.main(["--rounds", "1", "--in-flight", "20"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"stock_us", "adaptive_idle_us", "adaptive_loaded_us", "in_flight"}
    assert result["in_flight"] == 20
    assert all(result[k] > 0 for k in ("stock_us", "adaptive_idle_us", "adaptive_loaded_us"))


def test_plan_cold_times_each_policy_warm_and_cold():
    """benchmarks/plan_cold.py times stock and adaptive-lb with the caches warm and evicted,
    on plans that route to a replica."""
    module = _benchmark("plan_cold")
    result = module.measure(rounds=1, plans=200, evict_kib=64)
    assert set(result) == {"hot", "cold"}
    for row in result.values():
        assert set(row) == {"stock", "adaptive", "added"}
        assert row["added"] == pytest.approx(row["adaptive"] - row["stock"], abs=0.011)
    made = module.policies()
    assert made["adaptive"].decisions_by_position["replica"] == 20_000
    assert not made["adaptive"].replica_cache.active  # warmed past the cache's verdict


def test_replica_cache_benchmark_times_hit_miss_and_bypass(capsys):
    """benchmarks/replica_cache.py reports the three cases and the break-even they imply."""
    module = _benchmark("replica_cache")
    assert module.main(["--rounds", "1", "--lookups", "2000"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.err.strip().splitlines()[-1])
    assert {"hit", "miss", "bypassed", "break_even_hit_ratio"} <= set(result)
    assert "| hit | miss | bypassed |" in out.out


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_e2e_instructions_reads_a_real_callgrind_profile(tmp_path, monkeypatch):
    """benchmarks/e2e_instructions.py reads callgrind's total and its per-function counts
    (the interpreter's loop among them), which add up to the total."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # for its _e2e
    module = _benchmark("e2e_instructions")
    out = tmp_path / "callgrind.out"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    subprocess.run(
        [*command, "-S", "-c", "sum(range(100000))"], check=True, capture_output=True, timeout=300
    )
    total = module.total_instructions(out)
    costs = module.function_costs(out)
    assert total > 1_000_000
    assert any("_PyEval_EvalFrameDefault" in name for name in costs)
    assert 0.9 * total <= sum(costs.values()) <= total


def test_tracking_overhead_runs_through_the_drivers_execute_async(capsys, monkeypatch):
    """benchmarks/tracking_overhead.py times requests through the driver's own
    Session.execute_async and checks what it tracked (its assertions run here)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = _benchmark("tracking_overhead")
    monkeypatch.setattr(module, "COUNT", 6000)  # 4,000 expected: 5 % is 4 sd
    monkeypatch.setattr(module, "ROUNDS", 2)
    assert module.main(["--one-in", "3"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["one_in"] == 3 and result["tracked_us"] > 0
