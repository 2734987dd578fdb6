"""The cluster simulator: queueing, network, pauses, determinism, scenario validation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import adaptive_lb
from adaptive_lb.config import ConfigError
from adaptive_lb.health.probes import ProbeOrder
from adaptive_lb.stats.sampling import Sampler
from adaptive_lb.tools.sim import runner
from adaptive_lb.tools.sim.cli import DEMO_SCENARIOS, main
from adaptive_lb.tools.sim.driver_side import PoolCounts, attach_driver_side
from adaptive_lb.tools.sim.engine import Engine
from adaptive_lb.tools.sim.metrics import Recorder
from adaptive_lb.tools.sim.node import Node
from adaptive_lb.tools.sim.policies import NoFeedback, build_policy
from adaptive_lb.tools.sim.report import ScenarioReport, to_json
from adaptive_lb.tools.sim.runner import run_policy
from adaptive_lb.tools.sim.scenario import NodesSpec, load_scenario, parse_scenario, scenario_dir
from adaptive_lb.tools.sim.workload import SUCCEEDED, TIMED_OUT, Client

# As installed: the checkout's, or the wheel's (CI).
SCENARIOS = Path(adaptive_lb.__file__).resolve().parent / "tools" / "sim" / "scenarios"
MS = 1_000_000
S = 1_000_000_000


class _ExpNode(Node):
    """A node with exponential service times (for the M/M/1 check)."""

    __slots__ = ("mean_ns",)

    def service_ns(self, coordinate: bool, read: bool, t: int) -> int:
        return int(self.rng.expovariate(1.0) * self.mean_ns)


def test_mm1_mean_response_time() -> None:
    engine = Engine()
    node = _ExpNode(0, "A/0", None, "A", "dc1", NodesSpec(workers=1), engine, random.Random(3))
    node.mean_ns = 1 * MS  # mu = 1000 / s
    rate = 600.0  # lambda
    arrivals = random.Random(4)
    responses: list[int] = []
    count = 60_000

    def done(started: int) -> None:
        responses.append(engine.now - started)

    def arrive(i: int) -> None:
        node.submit(False, True, done, engine.now)
        if i < count:
            engine.after(int(arrivals.expovariate(rate) * 1e9), arrive, i + 1)

    engine.at(0, arrive, 1)
    engine.run()
    warm = responses[2000:]
    mean_s = sum(warm) / len(warm) / 1e9
    expected = 1.0 / (1000.0 - rate)
    assert abs(mean_s - expected) / expected < 0.05, (mean_s, expected)


class _FixedPlan:
    """A policy stub whose plan is one given host."""

    def __init__(self, host: object) -> None:
        self.host = host

    def make_query_plan(self, keyspace: object = None, query: object = None):
        return iter([self.host])


def _exact_scenario(consistency: str = "LOCAL_ONE"):
    return parse_scenario(
        {
            "name": "exact",
            "network": {"jitter": 0.0},
            "nodes": {"service_median_us": 0.001, "service_sigma": 0.0, "coordinator_us": 0},
            "workload": {"consistency": consistency},
        }
    )


@pytest.mark.parametrize("as_replica", [True, False])
def test_pure_latency_path_returns_matrix_values(as_replica: bool) -> None:
    scenario = _exact_scenario()
    # runner.setup, not imported as ``setup``: pytest 8.0 would call a module-level setup()
    # before the tests, as nose did (pytest 8.1 dropped that).
    sim = runner.setup(scenario, seed=5)
    key = 17
    replicas = sim.cluster.replicas(key)
    zone_b = [n for n in sim.nodes if n.zone == "B"]
    if as_replica:
        coordinator = next(n for n in zone_b if n in replicas)
    else:
        coordinator = next(n for n in zone_b if n not in replicas)
    recorder = Recorder(len(sim.nodes))
    client = Client(
        "A-0",
        "A",
        _FixedPlan(coordinator.host),
        NoFeedback(),
        sim.cluster,
        sim.statements,
        recorder,
        scenario.workload,
    )
    client.start(key, measured=True)
    sim.engine.run()
    matrix = scenario.network.matrix()
    expected_us = matrix["A"]["B"] + matrix["B"]["A"]
    if not as_replica:
        # Forwarded to the closest replica: zone B's own (B -> B 220 us).
        replica_zone = min((n.zone for n in replicas), key=lambda z: matrix["B"][z])
        assert replica_zone == "B"
        expected_us += matrix["B"][replica_zone] + matrix[replica_zone]["B"]
    assert list(recorder.latency_ns) == [pytest.approx(expected_us * 1000, abs=5)]


def test_paused_node_makes_no_progress_during_its_pause() -> None:
    engine = Engine()
    spec = NodesSpec(workers=2, service_median_us=2000, service_sigma=0.0, coordinator_us=0)
    node = Node(0, "A/0", None, "A", "dc1", spec, engine, random.Random(1))
    node.pauses = [(1 * MS, 21 * MS)]
    finished: list[tuple[str, int]] = []

    def done(name: str) -> None:
        finished.append((name, engine.now))

    engine.at(0, lambda _: node.submit(False, True, done, "before"))
    engine.at(5 * MS, lambda _: node.submit(False, True, done, "during"))
    engine.run()
    # 1 ms done before the pause, the other 1 ms after it; the second starts at its end.
    assert finished == [("before", 22 * MS), ("during", 23 * MS)]
    assert node.finish_time(0, 2 * MS) == 22 * MS
    assert node.resume_time(10 * MS) == 21 * MS
    assert node.resume_time(30 * MS) == 30 * MS


def _small(seed: int) -> str:
    scenario = load_scenario(SCENARIOS / "fast-failing-node.yaml")
    results = [
        run_policy(scenario, policy, seed=seed, requests=1500)
        for policy in ("adaptive", "slow-replica")
    ]
    return to_json([ScenarioReport(scenario, seed, results)])


def test_same_seed_same_bytes_different_seed_different_numbers() -> None:
    first = _small(11)
    assert first == _small(11)
    other = json.loads(_small(12))["scenarios"][0]["results"]
    mine = json.loads(first)["scenarios"][0]["results"]
    assert [r["p50_ms"] for r in mine] != [r["p50_ms"] for r in other]


def test_fast_errors_reach_adaptive_lb_as_fast_errors() -> None:
    scenario = load_scenario(SCENARIOS / "fast-failing-node.yaml")
    result = run_policy(scenario, "adaptive", requests=3000)
    # Errors are retried on the next host: the client sees none, the node gets few.
    assert result.summary["errors"] == 0.0
    hosts = result.summary["attempts_by_host"]
    assert hosts["A/1"] < sum(hosts.values()) / len(hosts)


def test_every_shipped_scenario_validates() -> None:
    files = sorted(SCENARIOS.glob("*.yaml"))
    assert {f.stem for f in files} >= set(DEMO_SCENARIOS)
    for path in files:
        scenario = load_scenario(path)
        assert scenario.name == path.stem


def test_the_stock_scenarios_are_the_package_data() -> None:
    """One copy of the stock scenarios: the package data, which ``pip install adaptive-lb``
    ships and ``adaptive-lb demo`` / ``simulate NAME`` read, from any directory."""
    from importlib import resources

    shipped = resources.files("adaptive_lb.tools.sim").joinpath("scenarios")
    names = {entry.name for entry in shipped.iterdir() if entry.name.endswith(".yaml")}
    assert names >= {f"{name}.yaml" for name in DEMO_SCENARIOS}
    assert scenario_dir() == SCENARIOS.resolve()
    assert not (SCENARIOS.parents[4] / "config" / "scenarios").exists()


def test_simulate_takes_a_stock_scenario_by_name(tmp_path, capsys) -> None:
    code = main(
        [
            *("simulate", "local-one", "--requests", "300", "--json", "--no-plots", "--quiet"),
            *("--policy", "adaptive", "--out", str(tmp_path)),
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["scenarios"][0]["name"] == "local-one"


def test_bad_scenario_reports_every_error_with_its_key_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(
            {
                "name": "bad",
                "nodes": {"workers": 0, "colour": "red"},
                "workload": {"mode": "bogus", "keys": {"distribution": "normal"}},
                "faults": [{"kind": "slow", "node": "Z/9"}, {"kind": "pause", "pause_s": 60}],
                "adaptive_lb": {"health": {"outlier_factor": 0.5}},
            },
            source="bad.yaml",
        )
    text = "\n".join(info.value.errors)
    for path in (
        "nodes.workers",
        "nodes.colour",
        "workload.mode",
        "workload.keys.distribution",
        "faults[1].node: required",
        "adaptive_lb.health.outlier_factor",
    ):
        assert path in text, (path, text)
    assert str(info.value).startswith("bad.yaml: ")
    with pytest.raises(ConfigError, match=r"faults\[0\]\.node"):
        parse_scenario({"name": "bad", "faults": [{"kind": "slow", "node": "Z/9"}]})


def test_scenario_files_are_read_like_the_config_file(tmp_path: Path) -> None:
    """The config's loader: key paths with lines, suggestions, duplicates, its limits."""
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\n"
        "nodes: {workerz: 8}\n"
        "topology:\n"
        "  datacenters: {dc1: {A: 4, B: 0}}\n"
        "faults:\n"
        "  - {kind: pause, node: A/1, pause_s: 60}\n"
        "  - kind: slow\n"
        "policies: [adaptive, nope]\n"
        "adaptive_lb:\n"
        "  health: {outlier_factor: 0.5}\n"
        "  tracing: {otlp: {headers: {Authorization: [Bearer Zq9xK2mW]}}}\n"
        "name: again\n"
    )
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: 8 errors:")
    assert info.value.errors[0] == "name: duplicate key (line 12, first on line 1)"
    assert info.value.errors[1].startswith(
        "nodes.workerz: unknown key; did you mean 'workers'? (valid keys: coordinator_us, "
    )
    assert info.value.errors[2:] == [
        "topology.datacenters.dc1.B: must be an integer >= 1, got 0 (line 4)",
        "faults[0].pause_s: must be < period_s (50), got 60 (line 6)",
        "faults[1].node: required (line 7)",
        "policies[1]: must be one of token-aware, round-robin, adaptive, latency-aware, "
        "slow-replica, p2c, adaptive-unset, got 'nope' (line 8)",
        "adaptive_lb.health.outlier_factor: must be > 1, got 0.5 (line 10)",
        "adaptive_lb.tracing.otlp.headers: must be a mapping of strings to strings, got "
        "'Authorization': a list (value hidden) (line 11)",
    ]
    assert "Zq9xK2mW" not in str(info.value)
    for text, words in [
        ("name: x\nfaults: !!python/object/apply:os.system ['true']\n", "only plain YAML"),
        ("name: x\nseed: " + "[" * 20 + "]" * 20 + "\n", "nested deeper than 16 levels"),
        ("name: x\nnodes: {workers: 8.5}\n", "must be an integer, got a number with a fraction"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=words):
            load_scenario(path)
    path.write_text("# " + "x" * (2 * 1024 * 1024))
    with pytest.raises(ConfigError, match="more than 1024 KiB: not a config file"):
        load_scenario(path)


def test_checks_across_scenario_keys_name_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(
            {
                "name": "bad",
                "topology": {"datacenters": {"dc1": {"A": 4}, "dc2": {"A": 3}}},
                "network": {"latency_us": {"A": {"A": 100}}},
                "workload": {"datacenter": "dc9"},
                "faults": [{"kind": "slow", "node": "A/9"}, {"kind": "slow", "node": "x"}],
            }
        )
    assert info.value.errors == [
        "topology.datacenters.dc2.A: zone also in dc1",
        "workload.datacenter: unknown datacenter 'dc9'",
        "faults[0].node: zone A has 3 nodes (0-based index), got 9",
        "faults[1].node: 'x' is not ZONE/INDEX of a known zone",
    ]


def test_simulate_command_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "simulate",
            str(SCENARIOS / "local-one.yaml"),
            "--requests",
            "400",
            "--policy",
            "adaptive",
            "--policy",
            "token-aware",
            "--json",
            "--no-plots",
            "--quiet",
            "--jobs",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    results = document["scenarios"][0]["results"]
    assert [r["policy"] for r in results] == ["adaptive", "token-aware"]
    assert (tmp_path / "results.json").read_text() == json.dumps(
        document, indent=2, sort_keys=True
    ) + "\n"


def test_otlp_endpoint_sends_sampled_requests_with_decisions_in_mapped_time(
    tmp_path, capsys
) -> None:
    """``simulate --otlp-endpoint``: N spans per run at a real OTLP/HTTP receiver, the
    adaptive runs' spans carrying the decision event inside the span, all timestamps in
    real time from the start of the command on (virtual time mapped)."""
    import time

    from tests.otlp_receiver import otlp_http_receiver

    began = time.time_ns()
    with otlp_http_receiver() as receiver:
        code = main(
            [
                *("simulate", "local-one", "--requests", "2000", "--no-plots", "--quiet"),
                *("--json", "--policy", "adaptive", "--policy", "token-aware"),
                *("--out", str(tmp_path), "--trace-requests", "25", "--jobs", "1"),
                *("--otlp-endpoint", receiver.endpoint),
            ]
        )
    assert code == 0
    capsys.readouterr()
    spans = receiver.spans
    by_policy: dict[str, list] = {}
    for span in spans:
        attributes = {a.key: a.value for a in span.attributes}
        by_policy.setdefault(attributes["adaptive_lb.sim.policy"].string_value, []).append(span)
        assert attributes["adaptive_lb.sim.outcome"].string_value == "succeeded"
        assert began <= span.start_time_unix_nano <= span.end_time_unix_nano
        # Virtual seconds, not the wall time the simulation took: a few seconds at most.
        assert span.end_time_unix_nano - began < 600 * 10**9
        assert not any("routing_key" in a.key for a in span.attributes)
    assert {k: len(v) for k, v in by_policy.items()} == {"adaptive": 25, "token-aware": 25}
    for span in by_policy["adaptive"]:
        (event,) = [e for e in span.events if e.name == "adaptive_lb.decision"]
        assert span.start_time_unix_nano <= event.time_unix_nano <= span.end_time_unix_nano
        chosen = {a.key: a.value for a in event.attributes}["server.address"].string_value
        coordinator = {a.key: a.value for a in span.attributes}["server.address"].string_value
        assert chosen == coordinator  # the plan's first host answered (no faults here)
    assert not any(
        e.name == "adaptive_lb.decision" for s in by_policy["token-aware"] for e in s.events
    )


# ------------------------------------------------------------------ production's rules


def _one_client(scenario, sim, host, feedback=None) -> tuple[Client, Recorder]:
    recorder = Recorder(len(sim.nodes))
    client = Client(
        "A-0",
        "A",
        _FixedPlan(host),
        feedback or NoFeedback(),
        sim.servers,
        sim.statements,
        recorder,
        scenario.workload,
    )
    return client, recorder


def test_pool_count_holds_a_timed_out_attempt_until_the_node_answers() -> None:
    scenario = _exact_scenario()
    sim = runner.setup(scenario, seed=5)
    node = sim.nodes[0]
    node.pauses = [(0, 10 * S)]  # stalled for 10 s; the client gives up after 2 s
    client, recorder = _one_client(scenario, sim, node.host)
    client.pools = PoolCounts()
    client.start(1, measured=True)
    sim.engine.run(until_ns=3 * S)
    assert list(recorder.status) == [TIMED_OUT]
    assert client.pools(node.host) == 1  # orphaned: still in flight on the driver's pool
    client.start(2, measured=True)
    sim.engine.run(until_ns=4 * S)
    assert client.pools(node.host) == 2  # a stalled node's count keeps rising
    sim.engine.run()
    assert client.pools(node.host) == 0  # the node answered both, late
    node.host.set_down()
    client.pools.sent(node.host)
    assert client.pools(node.host) == 0  # no pool for a host marked down


class _Recording:
    def __init__(self) -> None:
        self.events: list[str] = []

    def sent(self, host: object) -> None:
        self.events.append("sent")

    def success(self, host: object, latency_ns: int) -> None:
        self.events.append("success")

    def error(self, host: object, latency_ns: int) -> None:
        self.events.append("error")

    def timeout(self, host: object, latency_ns: int) -> None:
        self.events.append("timeout")


def test_only_the_requests_the_sampler_picks_feed_the_policy_every_attempt() -> None:
    scenario = _exact_scenario()
    sim = runner.setup(scenario, seed=5)
    down, up = sim.nodes[0], sim.nodes[1]
    down.down = True  # every request's first attempt fails fast, its second succeeds

    class _TwoHosts:
        def make_query_plan(self, keyspace: object = None, query: object = None):
            return iter([down.host, up.host])

    feedback = _Recording()
    client, recorder = _one_client(scenario, sim, None, feedback)
    client.policy = _TwoHosts()
    client.pools = PoolCounts()
    # The real Sampler on the virtual clock: 1 tracked request per host per second, 1 host.
    client.sampler = Sampler(1.0, lambda: 1, sim.clock.now_ns)
    random.seed(5)  # the sampler draws from the module's generator, as the runner seeds it
    for i in range(40):  # 10 requests a second for 4 s
        sim.engine.at(i * S // 10, lambda k: client.start(k, measured=True), i)
    sim.engine.run()
    assert list(recorder.status) == [SUCCEEDED] * 40
    tracked = feedback.events.count("success")
    # Every request until the rate is measured (RESAMPLE_S: 0.25 s, 3 requests), then each
    # with probability 1/10 (k = 10 / 1): ~6.7 of 40, at most 14 with this seed's margin.
    assert 3 <= tracked <= 14, tracked
    assert feedback.events == ["sent", "error", "sent", "success"] * tracked
    assert client.pools(up.host) == 0 and client.pools(down.host) == 0


def test_simulated_probe_outcomes_are_recorded_as_the_prober_does() -> None:
    scenario = _exact_scenario()
    sim = runner.setup(scenario, seed=5)
    config = scenario.adaptive_lb
    kit = build_policy(
        "adaptive", datacenter="dc1", zone="A", config=config, clock=sim.clock, rng=random.Random()
    )
    kit.policy.populate(sim.topology.cluster, list(sim.topology.hosts))
    node = next(n for n in sim.nodes if n.zone == "B")
    pools, prober = attach_driver_side(kit.policy, "A", sim.servers, random.Random(1))
    stats = kit.policy.stats.get(node.host)

    def probe() -> None:
        prober.send(ProbeOrder(node.host, stats, "test", sim.engine.now))
        prober.send(ProbeOrder(node.host, stats, "test", sim.engine.now))  # one at a time

    probe()
    sim.engine.run()
    record = stats.probes
    matrix = scenario.network.matrix()
    assert (record.sent, record.answered, record.outstanding) == (1, 1, False)
    assert record.last_latency_s == pytest.approx((matrix["A"]["B"] + matrix["B"]["A"]) / 1e6)
    node.pauses = [(sim.engine.now, sim.engine.now + 3 * S)]
    probe()
    sim.engine.run(until_ns=sim.engine.now + 1 * S)
    timeout = config.health.probe_timeout
    assert (record.timed_out, record.last_outcome, pools(node.host)) == (1, "timeout", 1)
    assert record.last_failure_ns == pytest.approx(record.last_sent_ns + timeout * S)
    sim.engine.run()
    # The late answer frees the stream, and is no answer to the probe that timed out.
    assert (record.answered, pools(node.host)) == (1, 0)
    node.down = True
    probe()
    sim.engine.run()
    assert (record.failed, record.sent) == (1, 3)
    assert kit.policy.health.probing


def test_thin_stall_is_found_by_probes_with_few_user_requests_caught() -> None:
    scenario = load_scenario(SCENARIOS / "thin-stall.yaml")
    summary = run_policy(scenario, "adaptive").summary
    assert round(summary["timeouts"] * summary["requests"]) <= 3
    back = summary["pause_return_s"]["A/1"]
    assert back and all(t is not None and t <= 3.0 for t in back), back
