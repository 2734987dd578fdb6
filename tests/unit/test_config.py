"""Configuration: YAML -> validated frozen attrs objects, every error with its key path."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path

import pytest
import yaml
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.cli import main
from adaptive_lb.config import (
    Config,
    ConfigError,
    ConfigWatcher,
    dump_config,
    json_schema,
    load_config,
    parse_config,
    parse_duration,
)
from adaptive_lb.sim.cluster import build_cluster, murmur3_routing_keys

ROOT = Path(__file__).resolve().parents[2]

# (key path, valid values, invalid values, words expected in the error)
BOUNDS = [
    ("policy.sample_size", [1, 64], [0, 65, 2.5, "8", True], "sample_size"),
    ("policy.non_local_rack_penalty", [1, 1.0, 100], [0.99, -1, "x"], ">= 1"),
    ("policy.non_replica_penalty", [1, 12.5], [0.5], ">= 1"),
    ("policy.token_aware", [True, False], [1, "yes", None], "true or false"),
    ("policy.lwt_deterministic", [True], ["true"], "true or false"),
    ("policy.replica_cache_size", [0, 10_000_000], [-1, 10_000_001], "replica_cache_size"),
    ("policy.local_rack", ["r1", None], [3, []], "string or null"),
    ("tracking.window", [0.5, "10s", "1h"], [0, "-1s", "ten", "2h"], "window"),
    ("tracking.intervals", [1, 120], [0, 121], "intervals"),
    ("tracking.latency_min", ["1us", 0.001], [0], "latency_min"),
    ("tracking.latency_max", ["60s", "1h"], ["2h"], "latency_max"),
    ("tracking.significant_digits", [1, 5], [0, 6], "significant_digits"),
    ("tracking.ewma_alpha", [0.01, 1], [0, 1.1], "ewma_alpha"),
    ("health.percentile", [50, 100], [0, 100.1], "percentile"),
    ("health.outlier_factor", [1.01, 10], [1, 0.5], "> 1"),
    ("health.slow_floor", [0, "2ms"], ["-2ms"], "slow_floor"),
    ("health.error_rate", [0.01, 1], [0, 1.5], "error_rate"),
    ("health.min_samples", [1, 1000], [0], "min_samples"),
    ("health.slow_start", [0, "30s"], [-1], "slow_start"),
    ("health.recovery_factor", [0.1, 1], [0, 1.1], "recovery_factor"),
    ("health.min_state_duration", [0, "500ms"], [-0.1], "min_state_duration"),
    ("health.refresh_interval", ["10ms", "60s", 0.25], ["5ms", "61s"], "refresh_interval"),
    ("health.penalties.slow", [1, 1000], [0.5], ">= 1"),
    ("health.penalties.warming", [1], [0], ">= 1"),
    ("tracing.enabled", [False], ["no"], "true or false"),
    ("tracing.mode", ["event", "span"], ["both"], "mode"),
    ("tracing.ratio", [0, 0.5, 1], [-0.1, 1.1], "ratio"),
    ("tracing.otlp.protocol", ["grpc", "http"], ["udp"], "protocol"),
    ("tracing.otlp.timeout", ["2s", 1], [0], "timeout"),
    ("tracing.otlp.headers", [{"a": "b"}], [{"a": 1}, ["a"]], "headers"),
    ("metrics.port", [0, 65535], [-1, 65536], "port"),
    ("metrics.bind_address", ["127.0.0.1"], [127], "string"),
    ("privacy.routing_keys", [True], ["on"], "true or false"),
]


def document(path: str, value) -> str:
    data: dict = {}
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return yaml.safe_dump(data)


@pytest.mark.parametrize(("path", "good", "bad", "words"), BOUNDS)
def test_every_key_at_and_beyond_its_bounds(path, good, bad, words):
    for value in good:
        parse_config(document(path, value))
    for index, value in enumerate(bad):
        with pytest.raises(ConfigError) as info:
            parse_config(document(path, value))
        message = str(info.value)
        assert path in message, message
        if index == 0:  # the others may fail on their type instead
            assert words in message, message


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        parse_config("health:\n  outlier_factr: 2\n")
    assert "health.outlier_factr: unknown key; did you mean 'outlier_factor'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config("polcy: {}\n")
    assert "did you mean 'policy'" in str(info.value)


def test_several_errors_are_reported_together_with_lines():
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n  sample_size: 0\nhealth:\n  error_rate: 2\n  nope: 1\n", "cfg.yaml")
    error = info.value
    assert len(error.errors) == 3
    assert "health.error_rate: must be <= 1.0, got 2.0 (line 4)" in error.errors
    assert str(error).startswith("cfg.yaml: 3 errors")


def test_wrong_shapes():
    for text, words in [
        ("- 1\n- 2\n", "<top level>: must be a mapping"),
        ("policy: 3\n", "policy: must be a mapping"),
        ("policy: [1]\n", "policy: must be a mapping, got a list"),
        ("42\n", "must be a mapping"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert words in str(info.value)


def test_empty_and_null_documents_give_defaults():
    assert parse_config("") == Config()
    assert parse_config("# nothing\n") == Config()
    assert parse_config("policy:\n") == Config()


def test_not_yaml_names_the_line():
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n  sample_size: [1\n", "f.yaml")
    assert "not valid YAML" in str(info.value) and "line" in str(info.value)


def test_python_object_tags_are_refused():
    for text in (
        "policy: !!python/object/apply:os.system ['true']\n",
        "x: !!python/name:os.system\n",
    ):
        with pytest.raises(ConfigError):
            parse_config(text)


def test_huge_file_is_refused_quickly(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (10 * 1024 * 1024))
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config(big)
    assert "not a config file" in str(info.value)
    assert time.monotonic() - start < 5
    with pytest.raises(ConfigError):
        parse_config("a" * (2 * 1024 * 1024))


def test_durations():
    assert parse_duration("250ms") == 0.25
    assert parse_duration("10s") == 10.0
    assert parse_duration("2m") == 120.0
    assert parse_duration("500us") == pytest.approx(0.0005)
    assert parse_duration(3) == 3.0
    for bad in ("-1s", "1 parsec", "", True, None, "1e3s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_env_var_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    monkeypatch.setenv("ADAPTIVE_LB_CONFIG", str(path))
    assert load_config().policy.sample_size == 3
    monkeypatch.delenv("ADAPTIVE_LB_CONFIG")
    assert load_config() == Config()


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.yaml")
    assert "cannot read" in str(info.value)


def test_default_yaml_is_the_defaults_and_shipped_in_the_package():
    shipped = ROOT / "adaptive_lb" / "data" / "default.yaml"
    documented = ROOT / "config" / "default.yaml"
    assert shipped.read_bytes() == documented.read_bytes()
    assert load_config(documented) == Config()
    # Every key is documented: the file mentions every leaf key of the schema.
    text = documented.read_text()

    def leaves(schema, prefix=""):
        for key, sub in schema["properties"].items():
            if "properties" in sub:
                yield from leaves(sub, f"{prefix}{key}.")
            else:
                yield key

    for key in leaves(json_schema()):
        assert f"{key}:" in text, key


def test_examples_are_valid_and_differ_from_defaults():
    examples = sorted((ROOT / "config" / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    hashes = {load_config(path).hash for path in examples}
    assert len(hashes) == len(examples) and Config().hash not in hashes


def test_round_trip_and_hash():
    config = parse_config("policy:\n  sample_size: 5\nhealth:\n  refresh_interval: 250ms\n")
    again = parse_config(dump_config(config))
    assert again == config and again.hash == config.hash
    assert config.hash != Config().hash and len(config.hash) == 12


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["policy", "health", "tracking", "sample_size", "window", "x"])
            | st.text(max_size=8),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(yaml_values)
def test_arbitrary_documents_raise_only_config_errors(data):
    try:
        text = yaml.safe_dump(data)
    except yaml.YAMLError:
        return
    with contextlib.suppress(ConfigError):
        assert isinstance(parse_config(text), Config)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_config_errors(text):
    with contextlib.suppress(ConfigError):
        parse_config(text)


def test_watcher_applies_good_files_and_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    changes, errors = [], []
    with ConfigWatcher(path, changes.append, errors.append, interval=0.02):
        path.write_text("policy:\n  sample_size: 4\n")
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
        deadline = time.monotonic() + 5
        while not changes and time.monotonic() < deadline:
            time.sleep(0.01)
        path.write_text("policy:\n  sample_size: 0\n")
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
        while not errors and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped = time.monotonic()
    assert time.monotonic() - stopped < 1
    assert [c.policy.sample_size for c in changes] == [4]
    assert len(errors) == 1 and "sample_size" in str(errors[0])


def test_cli_validate_show_schema(tmp_path, capsys):
    good = ROOT / "config" / "examples" / "low-latency-local-one.yaml"
    assert main(["config", "validate", str(good)]) == 0
    assert "ok (hash" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  sample_size: 0\n  tokenaware: true\n")
    assert main(["config", "validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "2 error(s)" in out and "did you mean 'token_aware'" in out
    assert main(["config", "show", str(good)]) == 0
    shown = capsys.readouterr().out
    assert parse_config(shown) == load_config(good)
    assert main(["config", "schema"]) == 0
    import json

    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["policy"]["additionalProperties"] is False
    assert schema["properties"]["policy"]["properties"]["sample_size"]["maximum"] == 64


def test_policy_reload_from_files(tmp_path):
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    good = tmp_path / "good.yaml"
    good.write_text("policy:\n  sample_size: 2\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  sample_size: -2\n")
    policy.reload(good)
    assert policy.config.policy.sample_size == 2
    hash_before = policy.config_hash
    with pytest.raises(ConfigError):
        policy.reload(bad)
    assert policy.config_hash == hash_before
    assert policy.config_reloads == {"success": 1, "failure": 1}


def test_reload_under_load_is_atomic(tmp_path):
    model = build_cluster({"dc1": [3, 3, 3]}, real_cluster=False, seed=5)
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    files = {
        "a": "policy:\n  sample_size: 2\n  non_replica_penalty: 2\n",
        "b": "policy:\n  sample_size: 8\n  non_replica_penalty: 30\n",
        "bad": "policy:\n  sample_size: 2\n  non_replica_penalty: 0\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text)
    valid_hashes = {load_config(paths["a"]).hash, load_config(paths["b"]).hash}
    policy.reload(paths["a"])
    keys = murmur3_routing_keys(200, seed=6)
    local = sorted(model.hosts)
    stop = threading.Event()
    problems = []

    def planner():
        rng = random.Random()
        while not stop.is_set():
            seen_hash = policy.config_hash
            plan = list(
                policy.make_query_plan(
                    "ks", SimpleStatement("q", routing_key=rng.choice(keys), keyspace="ks")
                )
            )
            if sorted(plan) != local:
                problems.append(("plan", plan))
            if seen_hash not in valid_hashes:
                problems.append(("hash", seen_hash))

    threads = [threading.Thread(target=planner) for _ in range(8)]
    for t in threads:
        t.start()
    rejected = 0
    for i in range(1000):
        name = ("a", "b", "bad")[i % 3]
        try:
            policy.reload(paths[name])
        except ConfigError:
            rejected += 1
    stop.set()
    for t in threads:
        t.join()
    assert not problems
    assert rejected == 333
    assert policy.internal_errors == 0
    assert policy.config_hash in valid_hashes
