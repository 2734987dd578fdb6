"""The docs quote their figures from one place (benchmarks/figures.py, docs/figures.json),
and a quote that disagrees with its record fails here."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[2]


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("figures", ROOT / "benchmarks" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _figures()


def _scratch(tmp_path: Path) -> Path:
    """A copy of what the check reads: the docs and the records."""
    for name in ("README.md", "CONTRIBUTING.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("docs", "exporters"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.png"))
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    return tmp_path


def test_every_quote_agrees_with_its_record():
    """Every NUMBER<!--fig RECORD FIGURE--> in README.md, CONTRIBUTING.md, docs/ and
    exporters/ is its record's figure, rounded as quoted (`python benchmarks/figures.py
    sync` rewrites them after a change; CONTRIBUTING.md, "Figures")."""
    assert figures.check() == []
    quoted = {(m["record"], m["figure"]) for _, _, m in figures.quotes()}
    assert len(quoted) >= 60
    files = {path.name for path, _, _ in figures.quotes()}
    assert {"README.md", "performance.md", "simulator.md"} <= files


def test_a_changed_quote_fails_and_sync_restores_it(tmp_path):
    root = _scratch(tmp_path)
    readme = root / "docs" / "performance.md"
    marker = "<!--fig e2e_overhead/cassandra-driver/listener adaptive.throughput-->"
    text = readme.read_text(encoding="utf-8")
    data = json.loads((root / "docs" / "figures.json").read_text(encoding="utf-8"))
    record = data["records"]["e2e_overhead/cassandra-driver/listener"]
    quoted = f"{record['figures']['adaptive.throughput']:.3f}"
    wrong = "0.123"
    assert f"{quoted}{marker}" in text
    readme.write_text(text.replace(f"{quoted}{marker}", f"{wrong}{marker}"), encoding="utf-8")
    [problem] = figures.check(root)
    assert problem.startswith("docs/performance.md:") and f"quotes {wrong}" in problem
    assert quoted in problem
    [change] = figures.sync(root)
    assert f"{wrong} -> {quoted}" in change
    assert readme.read_text(encoding="utf-8") == text
    assert figures.check(root) == []


def test_a_new_record_moves_every_quote_of_it(tmp_path):
    """A figure is edited in one place: the record (what --record writes); sync carries it
    into every quote, in each quote's own style."""
    root = _scratch(tmp_path)
    path = root / "docs" / "figures.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    fig = data["records"]["e2e_overhead/cassandra-driver/listener"]["figures"]
    fig["adaptive.throughput"], fig["adaptive.added_us"] = 0.9412, 17.66
    path.write_text(json.dumps(data), encoding="utf-8")
    problems = figures.check(root)
    assert any(p.startswith("CONTRIBUTING.md:") for p in problems)
    assert any(p.startswith("docs/performance.md:") for p in problems)
    figures.sync(root)
    assert figures.check(root) == []
    performance = (root / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "0.941<!--fig e2e_overhead/cassandra-driver/listener adaptive.throughput-->" in (
        performance
    )
    assert "+17.7<!--fig e2e_overhead/cassandra-driver/listener adaptive.added_us-->" in (
        performance
    )


def test_record_run_writes_the_record_and_syncs_the_docs(tmp_path, monkeypatch):
    """What a benchmark's --record does: replace its record (command without --record,
    date, driver, versions), then rewrite the quotes."""
    root = _scratch(tmp_path)
    monkeypatch.setattr(figures, "ROOT", root)
    monkeypatch.setattr(figures, "driver", lambda: "cassandra-driver 9.9.9")
    figures.record_run(
        "tracking_overhead",
        "every",
        {"one_in": 1, "tracking_cost_us": 4.4, "tracking_cost_iqr_us": [4.1, 4.9]},
        ["--one-in", "1", "--record", "every"],
    )
    data = json.loads((root / "docs" / "figures.json").read_text(encoding="utf-8"))
    entry = data["records"]["tracking_overhead/cassandra-driver/every"]
    assert entry["command"] == "python benchmarks/tracking_overhead.py --one-in 1"
    assert entry["driver"] == "cassandra-driver 9.9.9"
    assert entry["figures"]["tracking_cost_iqr_us.1"] == 4.9
    assert {"date", "python", "machine", "commit"} <= set(entry)
    assert "e2e_overhead/scylla-driver/listener" in data["records"]  # the others are kept
    performance = (root / "docs" / "performance.md").read_text(encoding="utf-8")
    marker = "<!--fig tracking_overhead/cassandra-driver/every tracking_cost_us-->"
    assert f"4.40{marker}" in performance
    assert figures.check(root) == []


@pytest.mark.parametrize(
    ("value", "quoted", "written"),
    [
        (0.9159, "0.916", "0.916"),
        (1.19, "1.2", "1.2"),
        (21.608, "+21.6", "+21.6"),
        (-16.906, "\u221216.9", "\u221216.9"),
        (-7.4, "-7.4", "-7.4"),
        (53751, "+53,751", "+53,751"),
        (599494.3, "599,494", "599,494"),
        (17.2, "17", "17"),
        ("2026-11-26", "2026-11-25", "2026-11-26"),
    ],
)
def test_render_keeps_the_quote_style(value, quoted, written):
    assert figures.render(value, quoted) == written


def test_what_the_check_refuses(tmp_path):
    root = tmp_path
    (root / "docs").mkdir()
    (root / "docs" / "figures.json").write_text(
        json.dumps(
            {
                "records": {
                    "b/d": {
                        "command": "c",
                        "date": "2026-01-01",
                        "driver": "d",
                        "figures": {"x": 0.25, "n": 3},
                    }
                }
            }
        ),
        encoding="utf-8",
    )
    (root / "README.md").write_text(
        "ok 25<!--fig b/d x %--> %, 3<!--fig b/d n--> and 2026-01-01<!--fig b/d date-->\n"
        "unknown 1<!--fig b/d y-->, 2<!--fig nope x-->, bare <!--fig b/d x-->\n"
        "```\n0.25<!--fig b/d x-->\n```\n",
        encoding="utf-8",
    )
    problems = figures.check(root)
    assert len(problems) == 4, problems
    assert "without a number" in problems[0]
    assert "README.md:2: record 'b/d' has no figure 'y'" in problems
    assert "README.md:2: no record 'nope'" in problems
    assert "README.md:4: marker inside a code block" in problems
