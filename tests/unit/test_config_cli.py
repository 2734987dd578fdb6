"""``adaptive-lb config validate|show|schema|default``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_lb.config import (
    Config,
    json_schema,
    load_config,
    parse_config,
    render_default_yaml,
)
from adaptive_lb.tools.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "examples" / "low-latency-local-one.yaml"


@pytest.fixture(autouse=True)
def no_env_config(monkeypatch):
    monkeypatch.delenv("ADAPTIVE_LB_CONFIG", raising=False)


def test_validate_good_files(capsys):
    files = [ROOT / "config" / "default.yaml", *sorted((ROOT / "config" / "examples").glob("*"))]
    assert main(["config", "validate", *map(str, files)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{path}: ok (hash {load_config(path).hash})" for path in files]
    assert lines[0].endswith(f"(hash {Config().hash})")


def test_validate_lists_every_error_of_every_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  sample_size: 0\n  tokenaware: true\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("policy: [\n")
    missing = tmp_path / "missing.yaml"
    assert main(["config", "validate", str(EXAMPLE), str(bad), str(broken), str(missing)]) == 1
    out = capsys.readouterr().out
    assert f"{EXAMPLE}: ok (hash " in out
    assert f"{bad}: 2 error(s)\n" in out
    assert "  policy.sample_size: must be >= 1, got 0 (line 2)\n" in out
    assert "  policy.tokenaware: unknown key; did you mean 'token_aware'?" in out
    assert f"{broken}: 1 error(s)\n  not valid YAML: line 2" in out
    assert f"{missing}: 1 error(s)\n  cannot read" in out


def test_show_prints_the_effective_config(tmp_path, capsys, monkeypatch):
    assert main(["config", "show", str(EXAMPLE)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# effective adaptive-lb config from {EXAMPLE}")
    assert parse_config(shown) == load_config(EXAMPLE)
    assert "non_replica_penalty: 12.0" in shown  # a default, filled in

    assert main(["config", "show"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("# effective adaptive-lb config from defaults")
    assert parse_config(shown) == Config()

    monkeypatch.setenv("ADAPTIVE_LB_CONFIG", str(EXAMPLE))
    assert main(["config", "show"]) == 0
    assert parse_config(capsys.readouterr().out) == load_config(EXAMPLE)


def test_show_an_invalid_file_fails_on_stderr(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("health:\n  outlier_factor: 0.5\n")
    assert main(["config", "show", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{bad}: health.outlier_factor: must be > 1, got 0.5 (line 2)" in captured.err


def test_schema_is_json(capsys):
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json.loads(json.dumps(json_schema()))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["policy"]["additionalProperties"] is False
    assert schema["properties"]["policy"]["properties"]["sample_size"]["maximum"] == 64


def test_default_prints_the_generated_default_yaml(capsys):
    assert main(["config", "default"]) == 0
    out = capsys.readouterr().out
    assert out == render_default_yaml()
    assert out == (ROOT / "config" / "default.yaml").read_text(encoding="utf-8")
    assert parse_config(out) == Config()


@pytest.mark.parametrize(
    "argv", [["config"], ["config", "validate"], ["config", "nope"], ["config", "show", "a", "b"]]
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_the_parser_has_room_for_other_commands():
    parser = build_parser()
    args = parser.parse_args(["config", "validate", "a.yaml", "b.yaml"])
    assert args.command == "config" and args.files == ["a.yaml", "b.yaml"]
    assert callable(args.handler)


def test_module_runs_without_installation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  sample_size: 100\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ADAPTIVE_LB_CONFIG", None)
    command = [sys.executable, "-m", "adaptive_lb.tools.cli", "config", "validate"]
    good = subprocess.run(
        [*command, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=120
    )
    assert good.returncode == 0, good.stderr
    assert good.stdout == f"{EXAMPLE}: ok (hash {load_config(EXAMPLE).hash})\n"
    failed = subprocess.run(
        [*command, str(bad)], capture_output=True, text=True, env=env, timeout=120
    )
    assert failed.returncode == 1
    assert "policy.sample_size: must be <= 64, got 100 (line 2)" in failed.stdout


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--plans", "5", "--repeats", "1", "--skip-1000"],
        ["--keys", "10", "--out", "some/dir"],
    ],
)
def test_bench_forwards_its_arguments_untouched(argv, monkeypatch):
    import adaptive_lb.tools.bench

    received = []
    monkeypatch.setattr(adaptive_lb.tools.bench, "main", lambda args: received.append(args) or 0)
    assert main(["bench", *argv]) == 0
    assert received == [argv]
    # Through the parser too (``args.handler``), for callers that parse first.
    args = build_parser().parse_args(["bench"])
    assert args.handler(args) == 0
    assert received[-1] == []
