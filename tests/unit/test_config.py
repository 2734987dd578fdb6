"""Configuration: YAML -> validated frozen attrs objects, every error with its key path."""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import (
    Config,
    ConfigError,
    ConfigWatcher,
    HealthConfig,
    HealthPenalties,
    OtlpConfig,
    PolicyConfig,
    TracingConfig,
    TrackingConfig,
    config_from_mapping,
    config_to_mapping,
    dump_config,
    json_schema,
    load_config,
    parse_config,
    parse_duration,
    render_default_yaml,
)
from adaptive_lb.config.defaults import COMMAND as DEFAULT_YAML_COMMAND
from adaptive_lb.config.validation import nested_class
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))

# (key path, valid values, invalid values, words expected in the error of the first invalid
# value -- the others may fail on their type instead). Every leaf key is in this table.
BOUNDS = [
    ("policy.enabled", [True, False], ["off", 0, None], "must be true or false, got a string"),
    ("policy.sample_size", [1, 64, 8.0], [0, 65, 2.5, "8", True, None], "must be >= 1, got 0"),
    ("policy.non_local_rack_penalty", [1, 1.0, 100], [0.99, -1, "x"], "must be >= 1, got 0.99"),
    ("policy.rack_proximity_cap", [1, 2.5, 100], [0.5, 100.5, "4"], "must be >= 1, got 0.5"),
    ("policy.non_replica_penalty", [1, 12.5], [0.5, [1]], "must be >= 1, got 0.5"),
    ("policy.token_aware", [True, False], [1, "yes", None], "must be true or false"),
    ("policy.lwt_deterministic", [True, False], ["true", 0], "must be true or false"),
    ("policy.replica_cache_size", [0, 10_000_000], [-1, 10_000_001], "must be >= 0, got -1"),
    ("policy.local_rack", ["r1", None, "", "auto"], [3, [], {}], "must be a string or null"),
    ("policy.rack_learning.margin", [0.05, 0.9], [0, 0.95, "x"], "must be > 0, got 0"),
    ("policy.rack_learning.learn_after", [0, "500ms", "1h"], [-1, "2h"], "non-negative"),
    ("policy.rack_learning.relearn_after", [0, "30s", "24h"], [-1, "25h"], "non-negative"),
    ("tracking.window", [0.5, "10s", "1h", 3600], [0, "-1s", "ten", "2h"], "must be > 0, got 0"),
    ("tracking.intervals", [1, 120], [0, 121, 1.5], "must be >= 1, got 0"),
    ("tracking.latency_min", ["1us", 0.001, 1e-9], [0, -1e-6, "x"], "must be > 0, got 0"),
    ("tracking.latency_max", ["60s", "1h", 0.01], ["2h", 0], "must be <= 3600, got 7200"),
    ("tracking.significant_digits", [1, 5], [0, 6], "must be >= 1, got 0"),
    ("tracking.samples_per_host", [0, 100, 2.5, 1e6], [-1, 1e7], "must be >= 0, got -1"),
    ("health.percentile", [50, 100, 0.1], [0, 100.1], "must be > 0, got 0"),
    ("health.outlier_factor", [1.01, 10], [0.5, 1], "must be > 1, got 0.5"),
    ("health.slow_floor", [0, "2ms", "0s"], ["-2ms", -0.001], "must be a duration"),
    ("health.error_rate", [0.01, 1], [0, 1.5], "must be > 0, got 0"),
    ("health.min_samples", [1, 1000], [0, -5], "must be >= 1, got 0"),
    ("health.certainty", [1, 10], [0.5, 11], "must be >= 1, got 0.5"),
    ("health.slow_start", [0, "30s", "1.5m"], [-1, "30 seconds"], "non-negative duration"),
    ("health.recovery_factor", [0.1, 1], [0, 1.1], "must be > 0, got 0"),
    ("health.min_state_duration", [0, "500ms"], [-0.1], "non-negative duration, got -0.1"),
    ("health.refresh_interval", ["10ms", "60s", 0.25], ["5ms", "61s"], "must be >= 0.01"),
    ("health.stall_timeout", [0, "500ms", "1m"], [-1, "soon"], "non-negative duration"),
    ("health.probe_interval", [0, "250ms", "1m"], [-1, "61s"], "non-negative duration"),
    ("health.probe_timeout", ["10ms", "1s", 60], [0, "61s"], "must be > 0, got 0"),
    ("health.max_rack_distance", [0, "10ms", "1s"], [-0.001, "2s"], "non-negative duration"),
    ("health.penalties.healthy", [1, 2.5], [0.9, "1"], "must be >= 1, got 0.9"),
    ("health.penalties.slow", [1, 1000], [0.5], "must be >= 1, got 0.5"),
    ("health.penalties.erroring", [1, 64], [0], "must be >= 1, got 0"),
    ("health.penalties.stalled", [1, 1024], [0], "must be >= 1, got 0"),
    ("health.penalties.warming", [1], [0, False], "must be >= 1, got 0"),
    ("health.server_load.enabled", [True, False], ["off", 1], "must be true or false"),
    ("health.server_load.interval", ["500ms", 2, "1m"], ["499ms", "61s"], "must be >= 0.5"),
    ("health.server_load.timeout", ["10ms", "1s", 60], [0, "61s"], "must be > 0, got 0"),
    ("health.server_load.half_life", [0, "4s", "10m"], [-1, "11m"], "non-negative duration"),
    ("health.server_load.threshold", [0, 0.5, 100], [-0.1, 100.5, "1"], "must be >= 0"),
    ("health.server_load.cap", [1, 4, 100], [0.9, 101, None], "must be >= 1, got 0.9"),
    ("health.fleet.budget", [0, 20, 0.5, 100000], [-1, 100001, "20"], "must be >= 0"),
    ("health.fleet.size", [0, 1000, 10000000], [-1, 1.5, 10000001], "must be >= 0, got -1"),
    ("health.fleet.default_size", [1, 200], [0, 2.5, None], "must be >= 1, got 0"),
    ("health.fleet.clients_interval", [0, "60s", "1h"], [-1, "25h"], "non-negative duration"),
    ("health.latency_factor.cap", [1, 4, 100], [0.9, 101, None], "must be >= 1, got 0.9"),
    ("health.latency_factor.certainty", [0, 2, 10], [-0.1, 10.5, "2"], "must be >= 0"),
    ("health.latency_factor.dead_band", [1, 1.25, 10], [0.99, 10.5, "x"], "must be >= 1"),
    ("health.latency_factor.jitter", [0, "1ms", "1s"], [-1, "2s"], "non-negative duration"),
    ("health.latency_factor.half_life", [0, "7s", "10m"], [-1, "11m"], "non-negative duration"),
    ("tracing.enabled", [True, False], ["no"], "must be true or false, got a string ('no')"),
    ("tracing.mode", ["event", "span"], ["both", 1], "must be one of event, span, got 'both'"),
    ("tracing.ratio", [0, 0.5, 1], [-0.1, 1.1], "must be >= 0, got -0.1"),
    ("tracing.candidates_ratio", [0, 0.1, 1], [-0.1, 1.5], "must be >= 0, got -0.1"),
    ("tracing.attributes", [False], ["false"], "must be true or false"),
    ("tracing.request_spans", [True, False], ["on", 1], "must be true or false"),
    ("reload.enabled", [True, False], ["yes", None], "must be true or false"),
    ("reload.interval", ["50ms", 1, "1h"], [0, "2h", "soon"], "must be > 0, got 0"),
    ("tracing.otlp.endpoint", ["http://127.0.0.1:4317", None], [4317], "string or null"),
    ("tracing.otlp.protocol", ["grpc", "http"], ["udp", None], "must be one of grpc, http"),
    ("tracing.otlp.headers", [{"a": "b"}, {}, None], [{"a": 1}, ["a"]], "strings to strings"),
    ("tracing.otlp.timeout", ["2s", 1], [0, "2 days"], "must be > 0, got 0"),
    ("tracing.otlp.service_name", ["svc"], [None, 5], "must be a string, got null"),
    ("metrics.prometheus_enabled", [True], ["on"], "must be true or false"),
    ("metrics.bind_address", ["127.0.0.1", "::1"], [127], "must be a string"),
    ("metrics.port", [0, 65535], [-1, 65536], "must be >= 0, got -1"),
    ("metrics.port_count", [1, 1024], [0, 1025], "must be >= 1, got 0"),
    ("metrics.required", [True, False], [1, "yes"], "must be true or false"),
    ("metrics.otel_enabled", [True], [1], "must be true or false, got an integer (1)"),
    ("privacy.routing_keys", [True], ["on"], "must be true or false"),
    ("privacy.statement_text", [True], [None], "must be true or false, got null"),
    ("privacy.bound_values", [True], ["yes"], "must be true or false"),
]


def leaf_paths(cls: type = Config, prefix: str = "") -> list[str]:
    """Every value key of the file, as dotted paths."""
    paths = []
    for attribute in attrs.fields(cls):
        default = attribute.default
        if isinstance(default, attrs.Factory) and attrs.has(default.factory):
            paths += leaf_paths(default.factory, f"{prefix}{attribute.name}.")
        else:
            paths.append(f"{prefix}{attribute.name}")
    return paths


def nest(path: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for ``"a.b"``."""
    data: dict[str, Any] = {}
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return data


def document(path: str, value: Any) -> str:
    return yaml.safe_dump(nest(path, value))


def get(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


def get_mapping(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def test_the_bounds_table_covers_every_key():
    assert sorted(row[0] for row in BOUNDS) == sorted(leaf_paths())


@pytest.mark.parametrize(("path", "good", "bad", "words"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_every_key_at_and_beyond_its_bounds(path, good, bad, words):
    for value in good:
        config = parse_config(document(path, value))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert get(config, path) == value
    for index, value in enumerate(bad):
        with pytest.raises(ConfigError) as info:
            parse_config(document(path, value), "c.yaml")
        error = info.value
        assert len(error.errors) == 1, error.errors
        assert error.errors[0].startswith(f"{path}: "), error.errors
        assert re.search(r"\(line \d+\)$", error.errors[0]), error.errors
        if index == 0:
            assert words in error.errors[0], error.errors


def test_the_message_names_path_value_and_reason():
    with pytest.raises(ConfigError) as info:
        parse_config("health:\n  outlier_factor: 0.5\n", "app.yaml")
    assert info.value.errors == ["health.outlier_factor: must be > 1, got 0.5 (line 2)"]
    assert str(info.value) == "app.yaml: health.outlier_factor: must be > 1, got 0.5 (line 2)"
    assert info.value.source == "app.yaml"


def test_constructing_objects_directly_still_validates():
    for make in (
        lambda: PolicyConfig(sample_size=0),
        lambda: PolicyConfig(sample_size=True),
        lambda: PolicyConfig(sample_size=8.0),
        lambda: PolicyConfig(token_aware=1),
        lambda: HealthConfig(outlier_factor=float("nan")),
        lambda: HealthConfig(outlier_factor=10**400),
        lambda: HealthPenalties(slow="64"),
        lambda: TrackingConfig(latency_min=1.0, latency_max=0.5),
        lambda: TracingConfig(mode="both"),
        lambda: OtlpConfig(headers={"a": 1}),
        lambda: OtlpConfig(endpoint=4317),
    ):
        with pytest.raises((TypeError, ValueError)):
            make()
    with pytest.raises(ValueError, match=r"outlier_factor: must be > 1, got 0\.5"):
        HealthConfig(outlier_factor=0.5)


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        parse_config("health:\n  outlier_factr: 2\n")
    assert "health.outlier_factr: unknown key; did you mean 'outlier_factor'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config("polcy: {}\n")
    assert "polcy: unknown key; did you mean 'policy'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config("tracing:\n  otlp:\n    endpont: x\n")
    assert "tracing.otlp.endpont: unknown key; did you mean 'endpoint'? " in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config("zzzzzz: 1\n")
    assert "did you mean" not in str(info.value)
    assert "valid keys: health, metrics, policy, privacy, reload, tracing, tracking" in str(
        info.value
    )
    with pytest.raises(ConfigError) as info:
        parse_config("null: 1\n1: 2\n")
    assert [e.split(":")[0] for e in info.value.errors] == ["null", "1"]


def test_a_removed_key_is_refused_saying_so_and_what_to_do(tmp_path):
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("tracking:\n  window: 5s\n  ewma_alpha: 0.2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (error,) = info.value.errors
    assert error.startswith("tracking.ewma_alpha: removed in 0.1.0: nothing read")
    assert error.endswith("; delete the key (line 3)")
    assert "unknown key" not in error


def test_removed_keys_are_no_fields_and_default_yaml_lists_them():
    classes, todo = [], [Config]
    while todo:  # every section class
        cls = todo.pop()
        classes.append(cls)
        todo += [nested for f in attrs.fields(cls) if (nested := nested_class(f)) is not None]
    removed = {(cls, name) for cls in classes for name in getattr(cls, "REMOVED", {})}
    assert (TrackingConfig, "ewma_alpha") in removed
    default_yaml = (ROOT / "config" / "default.yaml").read_text(encoding="utf-8")
    for cls, name in removed:
        assert name not in attrs.fields_dict(cls)
        assert f"# `{name}`: {cls.REMOVED[name][:40]}" in default_yaml


def test_several_errors_are_reported_together_with_lines():
    text = "policy:\n  sample_size: 0\nhealth:\n  error_rate: 2\n  nope: 1\nmetrics: [1]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "cfg.yaml")
    error = info.value
    assert len(error.errors) == 4
    assert error.errors[0] == "policy.sample_size: must be >= 1, got 0 (line 2)"
    assert error.errors[1] == "health.error_rate: must be <= 1, got 2 (line 4)"
    assert error.errors[2].startswith("health.nope: unknown key")
    assert error.errors[3] == "metrics: must be a mapping, got a list (line 6)"
    assert str(error).startswith("cfg.yaml: 4 errors:\n  policy.sample_size")


def test_checks_across_keys():
    with pytest.raises(ConfigError) as info:
        parse_config("tracking:\n  latency_min: 2s\n  latency_max: 1s\n")
    assert info.value.errors == ["tracking.latency_max: must be > latency_min (2), got 1 (line 3)"]


def test_wrong_shapes():
    for text, words in [
        ("- 1\n- 2\n", "<top level>: must be a mapping, got a list"),
        ("42\n", "<top level>: must be a mapping, got an integer"),
        ("just words\n", "<top level>: must be a mapping, got a string"),
        ("policy: 3\n", "policy: must be a mapping, got an integer (line 1)"),
        ("policy: [1]\n", "policy: must be a mapping, got a list"),
        ("tracing:\n  otlp: true\n", "tracing.otlp: must be a mapping, got a boolean (line 2)"),
        ("policy:\n  sample_size: '8'\n", "must be an integer, got a string ('8')"),
        ("policy:\n  sample_size: 8.5\n", "must be an integer, got a number with a fraction"),
        ("policy:\n  sample_size: [8]\n", "must be an integer, got a list ([8])"),
        ("policy:\n  token_aware: 'true'\n", "must be true or false, got a string ('true')"),
        ("policy:\n  local_rack: 2024-01-01\n", "must be a string or null, got a date"),
        ("policy:\n  local_rack: !!binary aGk=\n", "got binary data"),
        ("health:\n  percentile: .nan\n", "must be a finite number, got nan"),
        ("health:\n  outlier_factor: .inf\n", "must be a finite number, got inf"),
        ("policy:\n  sample_size: " + "9" * 400 + "\n", "policy.sample_size: must be <= 64"),
        ("health:\n  percentile: " + "9" * 400 + "\n", "must be a finite number"),
        ("tracking:\n  window: " + "9" * 400 + "\n", "must be a finite duration"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert words in str(info.value), (text, str(info.value))


def test_integers_written_as_whole_floats_are_accepted():
    config = parse_config("policy:\n  replica_cache_size: 1.0e+4\n  sample_size: 8.0\n")
    assert config.policy.replica_cache_size == 10_000
    assert type(config.policy.replica_cache_size) is int
    assert type(config.policy.sample_size) is int


def test_duplicate_keys_are_refused():
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n  sample_size: 1\n  sample_size: 2\n")
    assert info.value.errors == ["policy.sample_size: duplicate key (line 3, first on line 2)"]
    with pytest.raises(ConfigError) as info:
        parse_config("policy: {}\npolicy:\n  sample_size: 0\n")
    assert info.value.errors[0] == "policy: duplicate key (line 2, first on line 1)"
    # A merge key is not a duplicate.
    merged = "base: &b {sample_size: 3}\n"
    with pytest.raises(ConfigError, match="base: unknown key"):
        parse_config(merged + "policy:\n  <<: *b\n  token_aware: false\n")


def test_empty_and_null_documents_give_defaults():
    assert parse_config("") == Config()
    assert parse_config("# nothing\n") == Config()
    assert parse_config("---\n...\n") == Config()
    assert parse_config("~\n") == Config()
    assert parse_config("policy:\n") == Config()
    assert parse_config("policy: {}\ntracing:\n  otlp:\n") == Config()
    assert config_from_mapping({}) == Config()
    assert config_from_mapping(None) == Config()


def test_not_yaml_names_the_line():
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n  sample_size: [1\n", "f.yaml")
    assert str(info.value).startswith("f.yaml: not valid YAML: line ")
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n\tsample_size: 1\n", "f.yaml")
    assert "not valid YAML: line 2, column 1" in str(info.value)  # PyYAML's scanner's mark
    with pytest.raises(ConfigError) as info:
        parse_config("a: 1\n---\nb: 2\n")
    assert "line 2" in str(info.value)
    # PyYAML's reader's own problem text ("unacceptable character #x0000: ..."), passed on.
    with pytest.raises(ConfigError, match="not valid YAML: unacceptable character #x0000"):
        parse_config("policy: \x00\n")
    for text in ("{" * 5000, "a: " + "{b: " * 3000 + "1"):
        with pytest.raises(ConfigError, match="nested deeper than 16 levels"):
            parse_config(text)


def test_not_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('{"policy": {"sample_size": 3}\n}}}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: not valid YAML: line 2, column")
    binary = tmp_path / "b.yaml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)


def test_a_utf8_bom_is_fine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes("\ufeffpolicy:\n  local_rack: zoné\n".encode())
    assert load_config(path).policy.local_rack == "zoné"


def test_python_object_tags_are_refused():
    for text in (
        "policy: !!python/object/apply:os.system ['true']\n",
        "x: !!python/name:os.system\n",
        "x: !!python/object:adaptive_lb.config.Config {}\n",
        "!!python/object/new:adaptive_lb.config.Config {}\n",
        "policy:\n  local_rack: !custom x\n",
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(text, "evil.yaml")
        assert "only plain YAML values are accepted" in str(info.value)
        assert "line " in str(info.value)


def test_an_alias_bomb_is_harmless():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("policy: {sample_size: *a9, local_rack: *a9}")
    lines.append("tracing: {otlp: {headers: {k: *a9}}}")
    start = time.thread_time()  # CPU, not wall-clock: a busy machine may preempt the test
    with pytest.raises(ConfigError) as info:
        parse_config("\n".join(lines) + "\n")
    assert time.thread_time() - start < 5
    assert len(str(info.value)) < 5000
    assert "policy.sample_size: must be an integer, got a list" in str(info.value)


def test_implausible_documents_under_1_mib_are_refused_quickly():
    mib = 1024 * 1024
    documents = {
        "nested deeper than 16 levels": "[" * (mib - 1),
        "more than 10000 values": ("- " + "[" * 15 + "]" * 15 + "\n") * (mib // 33 - 1),
    }
    flat = "".join(f"a{i}: {i}\n" for i in range(120_000))
    documents["more than 10000 values: not a config file?"] = flat[: flat.rfind("\n", 0, mib) + 1]
    start = time.thread_time()
    for words, text in documents.items():
        with pytest.raises(ConfigError) as info:
            parse_config(text, "x.yaml")
        assert str(info.value).startswith("x.yaml: line "), str(info.value)
        assert words in str(info.value)
    assert time.thread_time() - start < 10  # about 2 s; without the limits, a minute
    nested = "policy:\n  local_rack: " + "[" * 13 + "x" + "]" * 13 + "\n"
    with pytest.raises(ConfigError, match="must be a string or null, got a list"):
        parse_config(nested)  # "x" is 16 levels deep: allowed, only wrong
    with pytest.raises(ConfigError, match="line 2, column 29: nested deeper than 16 levels"):
        parse_config(nested.replace("x", "[x]"))


def test_a_long_list_of_errors_is_cut():
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n" + "".join(f"  k{i}: 1\n" for i in range(150)))
    error = info.value
    assert error.total == 150 and len(error.errors) == 101
    assert error.errors[-1] == "... and 50 more"
    assert str(error).startswith("<string>: 150 errors:\n  policy.k0: unknown key")


def test_huge_file_is_refused_quickly(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (10 * 1024 * 1024))
    start = time.thread_time()
    with pytest.raises(ConfigError) as info:
        load_config(big)
    assert time.thread_time() - start < 1
    assert str(info.value) == (
        f"{big}: file is {10 * 1024 * 1024 + 2} bytes, more than 1024 KiB: not a config file?"
    )
    start = time.thread_time()
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        parse_config("a" * (10 * 1024 * 1024))
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        parse_config("é" * (600 * 1024))  # 600 Ki characters, 1.2 MiB of UTF-8
    assert time.thread_time() - start < 1
    # Just under the limit is parsed.
    assert parse_config("#" * (1024 * 1024 - 1)) == Config()


def test_durations():
    assert parse_duration("250ms") == 0.25
    assert parse_duration("10s") == 10.0
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("2m") == 120.0
    assert parse_duration("1h") == 3600.0
    assert parse_duration(" 3 s ") == 3.0
    assert parse_duration("500us") == pytest.approx(0.0005)
    assert parse_duration("500µs") == pytest.approx(0.0005)
    assert parse_duration(3) == 3.0 and type(parse_duration(3)) is float
    assert parse_duration(0.25) == 0.25
    assert parse_duration(0) == 0.0
    for bad in ("-1s", "1 parsec", "", "s", "10", "1e3s", ".5s", "1,5s", True, None, [1], -1):
        with pytest.raises(ValueError):
            parse_duration(bad)
    for bad in (float("nan"), float("-inf"), 10**400):
        with pytest.raises(ValueError):
            parse_duration(bad)
    config = parse_config("tracking:\n  window: 2m\nhealth:\n  slow_floor: 500us\n")
    assert config.tracking.window == 120.0
    assert config.health.slow_floor == pytest.approx(0.0005)


def test_env_var_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    monkeypatch.setenv("ADAPTIVE_LB_CONFIG", str(path))
    assert load_config().policy.sample_size == 3
    monkeypatch.setenv("ADAPTIVE_LB_CONFIG", "")
    assert load_config() == Config()
    monkeypatch.delenv("ADAPTIVE_LB_CONFIG")
    assert load_config() == Config()
    monkeypatch.setenv("ADAPTIVE_LB_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read"):
        load_config()


def test_unreadable_paths_are_config_errors(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.yaml")
    assert "cannot read: No such file" in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)
    assert load_config(str(EXAMPLES[0])) == load_config(EXAMPLES[0])


def test_default_yaml_is_the_defaults_and_documents_every_key():
    documented = ROOT / "config" / "default.yaml"
    assert load_config(documented) == Config()
    assert load_config(documented).hash == Config().hash
    # Every key is written out and has a comment line right above it (or above its section).
    lines = documented.read_text().splitlines()
    for path in leaf_paths():
        key = path.rsplit(".", 1)[-1]
        index = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:"))
        above = [line.strip() for line in lines[max(0, index - 6) : index]]
        assert any(line.startswith("#") for line in above), path


def test_default_yaml_is_generated_from_the_model():
    documented = (ROOT / "config" / "default.yaml").read_text(encoding="utf-8")
    assert documented == render_default_yaml(), (
        "config/default.yaml differs from the settings classes: regenerate it with "
        f"`{DEFAULT_YAML_COMMAND}`"
    )
    assert parse_config(render_default_yaml()) == Config()
    # Each field's docstring is its comment; bounds, choices and units come from the model.
    assert "# Most candidates scored per plan: replicas first" in documented
    assert "Integer, 1..64.\n  sample_size: 8\n" in documented
    assert "Duration, 10ms..1m.\n  refresh_interval: 200ms\n" in documented
    assert "One of: event, span.\n  mode: event\n" in documented


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_valid_and_commented(path):
    config = load_config(path)
    assert config != Config()
    assert path.read_text().startswith("#")


def test_the_examples_differ():
    names = {p.name for p in EXAMPLES}
    assert {
        "low-latency-local-one.yaml",
        "multi-dc-remote-failover.yaml",
        "jaeger-prometheus-localhost.yaml",
    } <= names
    assert len({load_config(p).hash for p in EXAMPLES}) == len(EXAMPLES)


def test_round_trip_and_hash():
    config = parse_config("policy:\n  sample_size: 5\nhealth:\n  refresh_interval: 250ms\n")
    again = parse_config(dump_config(config))
    assert again == config and again.hash == config.hash
    assert config.hash != Config().hash and re.fullmatch(r"[0-9a-f]{12}", config.hash)
    assert parse_config(dump_config(Config())) == Config()
    for path in EXAMPLES:
        example = load_config(path)
        assert parse_config(dump_config(example)).hash == example.hash


def test_hash_differs_when_any_value_differs():
    base = Config().hash
    hashes = {base}
    for path, good, _bad, _words in BOUNDS:
        default = get(Config(), path)
        for value in good:
            config = parse_config(document(path, value))
            if get(config, path) != default:
                assert config.hash != base, path
                hashes.add(config.hash)
    assert len(hashes) > len(BOUNDS)


def test_equal_configs_hash_equal_whatever_the_spelling():
    a = parse_config("policy:\n  non_replica_penalty: 4\ntracking:\n  window: 10s\n")
    b = Config(policy=PolicyConfig(non_replica_penalty=4.0), tracking=TrackingConfig(window=10))
    assert a == b and a.hash == b.hash


def test_config_to_mapping_is_plain_data():
    data = config_to_mapping(parse_config("tracing:\n  otlp:\n    headers: {a: b}\n"))
    assert data["tracing"]["otlp"]["headers"] == {"a": "b"}
    assert data["tracking"]["window"] == 10.0

    def check(value: Any) -> None:
        assert type(value) in (dict, str, int, float, bool, type(None)), value
        if isinstance(value, dict):
            for item in value.values():
                check(item)

    check(data)
    assert set(data) == {"policy", "tracking", "health", "tracing", "metrics", "privacy", "reload"}
    assert config_from_mapping(data) == parse_config("tracing:\n  otlp:\n    headers: {a: b}\n")


def test_config_from_mapping_reports_like_the_parser():
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"policy": {"sample_size": 0}, "x": 1}, source="dict")
    assert info.value.errors[0] == "policy.sample_size: must be >= 1, got 0"
    assert info.value.errors[1].startswith("x: unknown key")
    assert info.value.source == "dict"
    with pytest.raises(ConfigError, match="<top level>: must be a mapping"):
        config_from_mapping([1, 2])


# --------------------------------------------------------------------------- secrets

SECRET = "Bearer Zq9xK2mW7pLr"
SECRET_CORE = "Zq9xK2mW"
"""Part of the secret that must never show (a truncated repr would still show it)."""
OTLP = "tracing:\n  otlp:\n"

# A secret in each position an error message could echo it from, and words the message must
# still have (what is wrong, and where).
SECRET_DOCUMENTS = {
    "beside a bad header": (
        f'{OTLP}    headers:\n      Authorization: "{SECRET}"\n      X-Retries: 3\n',
        "tracing.otlp.headers: must be a mapping of strings to strings, got 'X-Retries': an "
        "integer (value hidden) (line 3)",
    ),
    "headers as a list": (
        f'{OTLP}    headers: ["Authorization: {SECRET}"]\n',
        "tracing.otlp.headers: must be a mapping of strings to strings, got a list (value "
        "hidden) (line 3)",
    ),
    "headers as a string": (f'{OTLP}    headers: "Authorization={SECRET}"\n', "got a string"),
    "a header as a list": (f"{OTLP}    headers: {{Authorization: [{SECRET}]}}\n", "a list"),
    "a header as a mapping": (f"{OTLP}    headers: {{A: {{token: {SECRET}}}}}\n", "'A': a mapping"),
    "non-string header name": (
        f'{OTLP}    headers:\n      3: "{SECRET}"\n',
        "got 3 (a name) (value hidden)",
    ),
    "many bad headers": (
        OTLP + "    headers: {" + ", ".join(f"h{i}: [{SECRET}]" for i in range(9)) + "}\n",
        "got 'h0': a list, 'h1': a list, 'h2': a list, 'h3': a list ... (value hidden)",
    ),
    "under a secret-like key": (
        f"policy:\n  local_rack: {{x: 1, api_key: {SECRET}, db_password: {SECRET}}}\n",
        "policy.local_rack: must be a string or null, got a mapping (value hidden) (line 2)",
    ),
    "in a pair under a secret-like key": (
        f"policy:\n  local_rack: !!pairs [token: {SECRET}]\n",
        "got a list (value hidden)",
    ),
    "unknown secret-like key": (f"{OTLP}    api_key: {SECRET}\n", "api_key: unknown key"),
    "misspelt headers": (
        f"{OTLP}    header: {{Authorization: {SECRET}}}\n",
        "tracing.otlp.header: unknown key; did you mean 'headers'?",
    ),
    "duplicate header": (
        f"{OTLP}    headers:\n      Authorization: {SECRET}\n      Authorization: {SECRET}x\n",
        "tracing.otlp.headers.Authorization: duplicate key (line 5, first on line 4)",
    ),
    "duplicate keys under a secret": (
        f"{OTLP}    headers:\n      A: {{{SECRET}: 1, {SECRET}: 2}}\n",
        "'A': a mapping (value hidden)",
    ),
    "unclosed quote": (f'{OTLP}    headers:\n      A: "{SECRET}\n', "not valid YAML: line "),
    "unclosed flow mapping": (f"{OTLP}    headers: {{A: {SECRET}\n", "not valid YAML: line "),
    "bad escape": (f'{OTLP}    headers:\n      A: "{SECRET}\\q"\n', "not valid YAML: line 4"),
    "colon in a plain value": (f"{OTLP}    headers:\n      A: {SECRET}: x\n", "line 4"),
    "tab in the value's line": (f"{OTLP}    headers:\n\tA: {SECRET}\n", "not valid YAML: line 4"),
    "!!int": (f"{OTLP}    headers:\n      A: !!int {SECRET}\n", "line 4, column 10: not a valid"),
    "!!float": (f"{OTLP}    headers:\n      A: !!float {SECRET}\n", "not a valid !!float"),
    "!!bool": (f"{OTLP}    headers:\n      A: !!bool {SECRET}\n", "not a valid !!bool"),
    "!!timestamp": (f"{OTLP}    headers:\n      A: !!timestamp {SECRET}\n", "not a valid"),
    "!!binary": (f"{OTLP}    headers:\n      A: !!binary {SECRET}é\n", "base64"),
    "as an alias": (f"{OTLP}    headers:\n      A: *{SECRET_CORE}\n", "found undefined alias"),
    "as a tag": (f"{OTLP}    headers:\n      A: !{SECRET_CORE} x\n", "plain YAML values"),
    "as a python tag": (f"{OTLP}    headers:\n      A: !!python/name:{SECRET_CORE}\n", "plain"),
    "NUL after it": (f"{OTLP}    headers:\n      A: {SECRET}\x00\n", "#x0000"),
    "long integer after it": (f"{OTLP}    headers: {{A: {SECRET}, B: {'9' * 2000}}}\n", "long"),
}


def _texts(error: BaseException) -> list[str]:
    return [str(error), repr(error), *getattr(error, "errors", [])]


@pytest.mark.parametrize("name", SECRET_DOCUMENTS)
def test_errors_never_show_a_secret(name):
    text, words = SECRET_DOCUMENTS[name]
    with pytest.raises(ConfigError) as info:
        parse_config(text, "s.yaml")
    assert words in str(info.value), str(info.value)
    for shown in _texts(info.value):
        assert SECRET_CORE not in shown


def test_failed_reloads_and_watchers_never_log_a_secret(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    good = tmp_path / "good.yaml"
    good.write_text("policy:\n  sample_size: 2\n")
    policy.reload(good)
    hash_before = policy.config_hash
    errors: list[ConfigError] = []
    for index, (text, _words) in enumerate(SECRET_DOCUMENTS.values()):
        path = tmp_path / f"bad{index}.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError):
            policy.reload(path)
        watcher = ConfigWatcher(path, lambda config: None, errors.append)
        assert watcher.check() and watcher.config is None
    assert policy.config_hash == hash_before
    assert policy.config_reloads["failure"] == len(SECRET_DOCUMENTS) == len(errors)
    assert any("config reload from" in r.getMessage() for r in caplog.records)
    assert any("keeping the last good one" in r.getMessage() for r in caplog.records)
    for record in caplog.records:
        assert SECRET_CORE not in record.getMessage()
    assert SECRET_CORE not in caplog.text  # the formatted records, tracebacks included


def test_constructing_otlp_config_never_shows_a_header():
    with pytest.raises(TypeError) as info:
        OtlpConfig(headers={"Authorization": SECRET, "X-Retries": 3})
    assert str(info.value) == (
        "headers: must be a mapping of strings to strings, got 'X-Retries': an integer "
        "(value hidden)"
    )


@pytest.mark.parametrize(
    ("name", "secret_like"),
    [
        *[(n, True) for n in ("password", "DB_PASSWD", "pwd", "client_secret", "token")],
        *[(n, True) for n in ("X-Auth-Token", "Authorization", "oauth", "credentials")],
        *[(n, True) for n in ("Cookie", "api_key", "apiKey", "X-API-Key", "private-key")],
        *[(n, True) for n in ("access_key", "signing-key", "ClientKey")],
        *[(n, False) for n in ("routing_keys", "key", "keyspace", "monkey", "sample_size")],
        *[(n, False) for n in ("endpoint", "service_name", "local_rack", "keys")],
        *[(n, False) for n in ("token_aware", "password_file", "secret_name", "tokenizer")],
        *[(n, True) for n in ("secret_key", "refresh_tokens", "basic_auth", "auth_header")],
    ],
)
def test_which_names_are_secret_like(name, secret_like):
    with pytest.raises(ConfigError) as info:
        parse_config(f"policy:\n  local_rack: {{'{name}': shown-or-not}}\n")
    assert ("shown-or-not" in str(info.value)) is not secret_like, str(info.value)


def test_dump_config_masks_header_values_unless_asked(capsys, tmp_path):
    config = parse_config(f'{OTLP}    headers:\n      Authorization: "{SECRET}"\n      X: y\n')
    masked = dump_config(config)
    assert SECRET_CORE not in masked
    assert "Authorization: '***'" in masked and "X: '***'" in masked
    assert parse_config(masked).tracing.otlp.headers == {"Authorization": "***", "X": "***"}
    revealed = dump_config(config, reveal_secrets=True)
    assert parse_config(revealed) == config
    assert dump_config(Config()) == dump_config(Config(), reveal_secrets=True)

    from adaptive_lb.tools.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(f'{OTLP}    headers:\n      Authorization: "{SECRET}"\n')
    assert main(["config", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert SECRET_CORE not in shown and "Authorization: '***'" in shown
    assert f"hash {load_config(path).hash}" in shown
    path.write_text(f'{OTLP}    headers:\n      Authorization: "{SECRET}"\n      X: 3\n')
    assert main(["config", "validate", str(path)]) == 1
    assert main(["config", "show", str(path)]) == 1
    captured = capsys.readouterr()
    assert SECRET_CORE not in captured.out + captured.err
    assert "'X': an integer (value hidden)" in captured.out


def test_any_field_marked_secret_is_hidden_and_masked(monkeypatch):
    import adaptive_lb.config.loader as module

    monkeypatch.setattr(module, "SECRET_KEYS", module.SECRET_KEYS | {"tracing.otlp.endpoint"})
    with pytest.raises(ConfigError) as info:
        parse_config(f"{OTLP}    endpoint: [{SECRET}]\n")
    assert str(info.value) == (
        "<string>: tracing.otlp.endpoint: must be a string or null, got a list (value hidden) "
        "(line 3)"
    )
    dumped = dump_config(parse_config(f"{OTLP}    endpoint: {SECRET}\n"))
    assert SECRET_CORE not in dumped and "endpoint: '***'" in dumped
    assert "endpoint: null" in dump_config(Config())


# --------------------------------------------------------------------------- merge keys


def test_merge_keys_merge_and_may_be_overridden():
    merged = parse_config("policy: {<<: &b {sample_size: 3, token_aware: false}}\n")
    assert merged.policy.sample_size == 3 and merged.policy.token_aware is False
    text = "policy:\n  <<: &b {sample_size: 3, token_aware: false}\n  sample_size: 5\n"
    overridden = parse_config(text)  # overriding a merged key is no duplicate key
    assert overridden.policy.sample_size == 5 and overridden.policy.token_aware is False
    listed = "policy:\n  <<: [{sample_size: 3}, {sample_size: 4, token_aware: false}]\n"
    assert parse_config(listed).policy.sample_size == 3  # the first mapping listed wins


def _merge_bomb(levels: int) -> str:
    rows = ["a0: &a0 {x1: 1, x2: 2}"]
    rows += [f"a{i}: &a{i} {{<<: [*a{i - 1}, *a{i - 1}], y: 1}}" for i in range(1, levels + 1)]
    return "\n".join(rows) + "\n"


def test_merged_keys_are_bounded():
    # 10 levels copy 6 K keys in all, under the bound; 14 levels 98 K, over it. (Unbounded,
    # 20 levels -- 511 bytes -- took 12 s.)
    with pytest.raises(ConfigError) as info:
        parse_config(_merge_bomb(10))
    assert "a0: unknown key" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config(_merge_bomb(14), "m.yaml")
    assert re.fullmatch(
        r"m\.yaml: line \d+, column \d+: merge keys \(<<\) make more than 10000 values: "
        r"not a config file\?",
        str(info.value),
    ), str(info.value)
    chain = [f"&a{i} {{<<: *a{i - 1}}}" for i in range(1, 40)]
    text = "defs: [&a0 {x: 1}, " + ", ".join(chain) + "]\npolicy: {<<: *a39}\n"
    with pytest.raises(ConfigError, match=r"merge keys \(<<\) nested deeper than 16 levels"):
        parse_config(text)


def test_values_pyyaml_cannot_build_are_config_errors():
    for text, words in [
        ("policy:\n  token_aware: !!bool maybe\n", "line 2, column 16: not a valid !!bool"),
        ("policy:\n  local_rack: !!timestamp nope\n", "not a valid !!timestamp"),
        ("policy:\n  sample_size: !!int ''\n", "not a valid !!int"),
        ("policy:\n  sample_size: !!float x\n", "not a valid !!float"),
        ("health:\n  percentile: 1" + ":30" * 200 + ".5\n", "not a valid !!float"),
        ("policy:\n  sample_size: " + "9" * 1001 + "\n", "integer too long (over 1000 char"),
        ("policy:\n  sample_size: 0x" + "f" * 999 + "\n", "integer too long"),
        ("policy:\n  sample_size: 1" + ":59" * 400 + "\n", "integer too long"),
        ("policy:\n  sample_size: 0x" + "f" * 997 + "\n", "policy.sample_size: must be <= 64"),
        ("policy: {local_rack: *" + "a" * 5000 + "}\n", "line 1, column 22: found undefined"),
        ("a: 1\n---\nb: 2\n", "expected a single document in the stream, but found another"),
        ("%TAG !a! tag:x,2000:\n" * 1100 + "--- {}\n", "more than 1000 directives"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert words in str(info.value), (text[:80], str(info.value))
        assert len(str(info.value)) < 500


def test_long_keys_are_cut_in_messages():
    with pytest.raises(ConfigError) as info:
        parse_config("policy:\n  ? " + "k" * 5000 + "\n  : 1\n")
    assert str(info.value).startswith("<string>: policy." + "k" * 60 + "...: unknown key")
    assert len(str(info.value)) < 300


# --------------------------------------------------------------------------- JSON Schema

_JSON_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (
        isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()
    ),
}


def schema_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """A small validator for the keywords our schema uses (jsonschema is not a dependency)."""
    if "anyOf" in schema and all(schema_errors(o, value, path) for o in schema["anyOf"]):
        return [f"{path}: matches no alternative"]
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_JSON_TYPES[t](value) for t in types):
            return [f"{path}: not of type {types}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: not in enum")
    if _JSON_TYPES["number"](value):
        if "minimum" in schema and not value >= schema["minimum"]:
            errors.append(f"{path}: below minimum")
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            errors.append(f"{path}: not above exclusiveMinimum")
        if "maximum" in schema and not value <= schema["maximum"]:
            errors.append(f"{path}: above maximum")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: does not match pattern")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(properties[key], item, f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}.{key}: not allowed")
            elif isinstance(extra, dict):
                errors += schema_errors(extra, item, f"{path}.{key}")
    return errors


def test_schema_describes_every_key():
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    policy = schema["properties"]["policy"]
    assert policy["additionalProperties"] is False
    assert policy["properties"]["sample_size"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 64,
        "default": 8,
        "description": "Most candidates scored per plan: replicas first, then random local hosts.",
    }
    health = schema["properties"]["health"]["properties"]
    assert health["outlier_factor"]["exclusiveMinimum"] == 1.0
    assert health["refresh_interval"]["anyOf"][0] == {
        "type": "number",
        "minimum": 0.01,
        "maximum": 60.0,
    }
    tracing = schema["properties"]["tracing"]["properties"]
    assert tracing["mode"]["enum"] == ["event", "span"]
    assert tracing["otlp"]["properties"]["protocol"]["enum"] == ["grpc", "http"]
    for path in leaf_paths():
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
        assert node.get("description"), path
        assert "default" in node, path
        assert node["default"] == get_mapping(config_to_mapping(Config()), path)


def test_schema_accepts_what_the_loader_accepts():
    schema = json_schema()
    for path in [ROOT / "config" / "default.yaml", *EXAMPLES]:
        assert schema_errors(schema, yaml.safe_load(path.read_text()) or {}) == [], path
    assert schema_errors(schema, config_to_mapping(Config())) == []
    for path, good, bad, _words in BOUNDS:
        for value in good:
            assert schema_errors(schema, nest(path, value)) == [], (path, value)
        for value in bad:
            # Durations given as strings are bounded by the loader only.
            if isinstance(value, str) and re.search(r"\d[a-zµ]+$", value):
                continue
            assert schema_errors(schema, nest(path, value)), (path, value)
    assert schema_errors(schema, {"polcy": {}})
    assert schema_errors(schema, {"policy": {"sample_size": 8, "x": 1}})


def test_schema_is_valid_draft_2020_12_if_jsonschema_is_installed():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in [ROOT / "config" / "default.yaml", *EXAMPLES]:
        validator.validate(yaml.safe_load(path.read_text()))
    assert not validator.is_valid({"policy": {"sample_size": 0}})


# --------------------------------------------------------------------------- properties


def _strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Valid values for one key, from its JSON Schema."""
    if "anyOf" in schema:
        schema = schema["anyOf"][0]  # durations: as numbers of seconds
    if "properties" in schema:
        return st.fixed_dictionaries(
            {key: _strategy(sub) for key, sub in schema["properties"].items()}
        )
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema["type"]
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum", -(10**6)), schema.get("maximum", 10**9))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1e9))
        return st.floats(
            min_value=low,
            max_value=schema.get("maximum", 1e9),
            exclude_min="exclusiveMinimum" in schema,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "string":
        return st.text(max_size=20)
    if kind == ["string", "null"]:
        return st.none() | st.text(max_size=20)
    if kind == ["object", "null"]:  # headers; null would come back as {}
        return st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3)
    raise AssertionError(schema)


valid_documents = _strategy(json_schema())


@settings(max_examples=100, deadline=None)
@given(valid_documents)
def test_every_document_the_schema_allows_loads_and_round_trips(data):
    tracking = data["tracking"]
    tracking["latency_min"] = min(tracking["latency_min"], tracking["latency_max"] / 2)
    assume(tracking["latency_min"] > 0)  # not if latency_max is the smallest float
    config = config_from_mapping(data)
    assert config_to_mapping(config) == data
    again = parse_config(dump_config(config, reveal_secrets=True))
    assert again == config and again.hash == config.hash


KEYS = sorted({part for path in leaf_paths() for part in path.split(".")} | {"x", "<<"})
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**30), max_value=10**400)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(["10s", "-1ms", "250ms", "grpc", "span", "1.5m", "nan"])
)
yaml_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def _only_config_errors(call) -> None:
    try:
        assert isinstance(call(), Config)
    except ConfigError as error:
        assert error.errors and all(isinstance(e, str) and e for e in error.errors)


@settings(max_examples=300, deadline=None)
@given(yaml_values)
def test_arbitrary_documents_raise_only_config_errors(data):
    _only_config_errors(lambda: config_from_mapping(data))
    try:
        text = yaml.safe_dump(data)
    except (yaml.YAMLError, ValueError):
        return
    _only_config_errors(lambda: parse_config(text))


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["policy", "tracking", "health", "tracing", "metrics", "privacy"]),
        st.dictionaries(st.sampled_from(KEYS), yaml_values, max_size=6) | yaml_values,
        max_size=6,
    )
)
def test_documents_shaped_like_configs_raise_only_config_errors(data):
    _only_config_errors(lambda: config_from_mapping(data))


@settings(max_examples=500, deadline=None)
@given(
    st.text(max_size=300)
    | st.lists(
        st.sampled_from(
            [
                "policy:",
                "  sample_size: 3",
                "  x: [",
                "- ",
                "&a ",
                "*a",
                "!!python/object:os.system",
                "!!binary",
                "{",
                "}",
                ": ",
                "---",
                "\t",
                "'",
                '"',
                "? ",
                "<<: *a",
                "tracking: {window: 1h}",
                "\n",
                "  ",
            ]
        ),
        max_size=30,
    ).map("".join)
)
def test_arbitrary_text_raises_only_config_errors(text):
    _only_config_errors(lambda: parse_config(text))


# --------------------------------------------------------------------------- hot reload


def _wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def _replace(path, text: str) -> None:
    """Write ``path`` at once (as deployment tools do): ``write_text`` truncates first, and
    a watcher reading in between would see an empty file, a valid config of its own."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_watcher_applies_good_files_and_keeps_the_last_good_one(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    changes: list[Config] = []
    errors: list[ConfigError] = []
    caplog.set_level(logging.ERROR, logger="adaptive_lb.config")
    with ConfigWatcher(path, changes.append, errors.append, interval=0.01) as watcher:
        assert watcher.running
        # Same size, and maybe the same mtime: the content hash sees the change.
        _replace(path, "policy:\n  sample_size: 4\n")
        assert _wait_for(lambda: changes)
        _replace(path, "policy:\n  sample_size: 0\n")
        assert _wait_for(lambda: errors)
        assert watcher.config == changes[-1]
        _replace(path, "policy:\n  sample_size: 5\n")
        assert _wait_for(lambda: len(changes) == 2)
        stopped = time.monotonic()
    assert time.monotonic() - stopped < 1
    assert not watcher.running
    assert [c.policy.sample_size for c in changes] == [4, 5]
    assert len(errors) == 1 and "policy.sample_size: must be >= 1, got 0" in str(errors[0])
    assert any("keeping the last good one" in r.getMessage() for r in caplog.records)


def test_watcher_stops_promptly_even_with_a_long_interval(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("")
    watcher = ConfigWatcher(path, lambda config: None, interval=3600).start()
    start = time.monotonic()
    watcher.stop()
    assert time.monotonic() - start < 1
    assert not watcher.running


def test_watcher_survives_a_missing_file_and_a_failing_callback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    seen: list[int] = []

    def on_change(config: Config) -> None:
        seen.append(config.policy.sample_size)
        if len(seen) == 1:
            raise RuntimeError("callback bug")

    with ConfigWatcher(path, on_change, interval=0.01) as watcher:
        path.unlink()
        time.sleep(0.05)
        path.write_text("policy:\n  sample_size: 4\n")
        assert _wait_for(lambda: seen == [4])
        path.write_text("policy:\n  sample_size: 6\n")
        assert _wait_for(lambda: seen == [4, 6])
        assert watcher.running


def test_watcher_check_can_be_called_directly_and_stop_from_a_callback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    holder: dict[str, ConfigWatcher] = {}
    changes: list[Config] = []

    def on_change(config: Config) -> None:
        changes.append(config)
        holder["watcher"].stop()  # must not deadlock or raise

    watcher = ConfigWatcher(path, on_change, interval=0.01)
    holder["watcher"] = watcher
    assert watcher.check() is True  # never seen: loads it
    assert watcher.check() is False
    assert watcher.config is not None and watcher.config.policy.sample_size == 3
    watcher.start()
    path.write_text("policy:\n  sample_size: 9\n")
    assert _wait_for(lambda: not watcher.running)
    assert [c.policy.sample_size for c in changes] == [3, 9]
    with pytest.raises(ValueError):
        ConfigWatcher(path, on_change, interval=0)


def test_watcher_checks_are_serialised(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  sample_size: 3\n")
    calls: list[Config] = []
    watcher = ConfigWatcher(path, calls.append)
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        watcher.check()

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1


def test_float_formatting_in_messages_is_exact():
    with pytest.raises(ConfigError) as info:
        parse_config("tracing:\n  ratio: 1.0000001\n")
    assert "tracing.ratio: must be <= 1, got 1.0000001" in str(info.value)


# --------------------------------------------------------------------------- the policy


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
    plans_made = []

    def planner():
        rng = random.Random()
        made = 0
        while not stop.is_set():
            made += 1
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
            # Lets the reloading thread have the GIL between plans, as an application's I/O
            # does: eight threads planning flat out leave it a slot every ~40 ms otherwise.
            time.sleep(0)
        plans_made.append(made)

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
    assert min(plans_made) > 100, plans_made  # every planner really ran during the reloads
    assert policy.internal_errors == 0
    assert policy.config_hash in valid_hashes
