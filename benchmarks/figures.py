"""One source for the figures the docs quote, and the check that they agree.

    python benchmarks/figures.py check          # every quote agrees with its source (a unit test)
    python benchmarks/figures.py sync           # rewrite every quote from its source
    python benchmarks/figures.py show [PREFIX]  # the figures, by record

Sources (records):

- ``docs/figures.json``: one record per benchmark and driver (and label), written by the
  benchmark run with ``--record [LABEL]``: the command, date, driver, Python, commit and
  the headline figures. A new ``--record`` replaces its record, then syncs the docs.
- ``plan_throughput/<driver>``: ``benchmarks/results/<driver>.json`` (written by
  ``python benchmarks/plan_throughput.py --out benchmarks/results``).
- ``demo``: ``docs/demo/results.json`` (``adaptive-lb demo --seed 1 --out docs/demo``), plus
  the counts ``scenarios``, ``targets``, ``targets_met`` and ``targets_missed``.

A quote in README.md, CONTRIBUTING.md, docs/*.md or exporters/**/*.md is the number (or
date) just before a marker, an HTML comment that renders as nothing::

    throughput 0.916<!--fig e2e_overhead/cassandra-driver adaptive.throughput-->x
    1.67<!--fig demo thin-slow.adaptive.faulted %--> %

``fig RECORD FIGURE`` names the figure (``show`` lists them; ``date`` is the record's
date); a trailing ``%`` quotes a
fraction as a percentage. The quote agrees when it is the recorded value rounded to the
digits quoted ("1.2" quotes 1.19), sign included. ``sync`` rewrites each quote in the
same style (digits, sign, thousands separator, Unicode minus). Markers are not allowed in
code blocks (they would show). CHANGELOG.md is history: never checked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIGURES = Path("docs/figures.json")
DEMO = Path("docs/demo/results.json")
PLAN_RESULTS = Path("benchmarks/results")
DOCS = ("README.md", "CONTRIBUTING.md", "docs/*.md", "exporters/**/*.md")
DEMO_COMMAND = "adaptive-lb demo --seed 1 --out docs/demo"

MINUS = "\u2212"
_NUMBER = rf"\d{{4}}-\d\d-\d\d(?![\d.])|[+{MINUS}-]?\d[\d,]*(?:\.\d+)?"
MARKER = re.compile(rf"(?P<value>{_NUMBER})<!--fig (?P<record>\S+) (?P<figure>\S+?)(?P<pct> %)?-->")
ANY_MARKER = re.compile(r"<!--\s*fig\b")


# -- sources ----------------------------------------------------------------------------


def _slug(key: object) -> str:
    return re.sub(r"[\s,]+", "_", str(key))


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON as ``a.b.c`` keys; a list of objects is keyed by their name when they
    have one (``name``, ``policy``, ``child``, ``variant``), else by index."""
    if isinstance(value, dict):
        items: Iterator[tuple[str, Any]] = ((_slug(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((_slug(_list_key(item, i)), item) for i, item in enumerate(value))
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in items:
        out.update(flatten(item, f"{prefix}.{key}" if prefix else key))
    return out


def _list_key(item: Any, index: int) -> object:
    if isinstance(item, dict):
        for name in ("name", "policy", "child", "variant"):
            if isinstance(item.get(name), str):
                return item[name]
    return index


def load_records(root: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every record: {name: {"command", "date", ..., "figures": {figure: value}}}."""
    root = root or ROOT
    records: dict[str, dict[str, Any]] = {}
    path = root / FIGURES
    if path.exists():
        records.update(json.loads(path.read_text(encoding="utf-8"))["records"])
    for path in sorted((root / PLAN_RESULTS).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        figures = {k: v for k, v in flatten(data).items() if k not in ("driver", "python")}
        records[f"plan_throughput/{path.stem}"] = {
            "command": f"python benchmarks/plan_throughput.py --out {PLAN_RESULTS}",
            "source": str(path.relative_to(root)),
            "driver": data.get("driver"),
            "python": data.get("python"),
            "figures": figures,
        }
    path = root / DEMO
    if path.exists():
        scenarios = json.loads(path.read_text(encoding="utf-8"))["scenarios"]
        targets = [t for s in scenarios for t in s["targets"]]
        met = sum(1 for t in targets if t["met"])
        figures = flatten(scenarios)
        figures.update(
            scenarios=len(scenarios),
            targets=len(targets),
            targets_met=met,
            targets_missed=len(targets) - met,
        )
        records["demo"] = {"command": DEMO_COMMAND, "source": str(DEMO), "figures": figures}
    return records


# -- quotes -----------------------------------------------------------------------------


def doc_files(root: Path | None = None) -> list[Path]:
    root = root or ROOT
    files: list[Path] = []
    for pattern in DOCS:
        files += sorted(p for p in root.glob(pattern) if p.is_file())
    return files


def _fences(text: str) -> list[tuple[int, int]]:
    """Character spans of the fenced code blocks."""
    spans, start, pos = [], None, 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            if start is None:
                start = pos
            else:
                spans.append((start, pos + len(line)))
                start = None
        pos += len(line)
    if start is not None:
        spans.append((start, pos))
    return spans


def _expected(records: dict[str, dict[str, Any]], m: re.Match[str]) -> tuple[Any, str | None]:
    """The recorded value a marker names, or None and why not."""
    record = records.get(m["record"])
    if record is None:
        return None, f"no record {m['record']!r}"
    figures = {"date": record.get("date"), **record["figures"]}
    if figures.get(m["figure"]) is None:
        return None, f"record {m['record']!r} has no figure {m['figure']!r}"
    value = figures[m["figure"]]
    if m["pct"]:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None, f"{m['record']} {m['figure']} = {value!r} is not a number"
        value = value * 100
    return value, None


def render(value: Any, quoted: str) -> str:
    """``value`` written as ``quoted`` is: digits, sign, thousands separator, minus."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {value!r}")
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    text = f"{value:{',' if ',' in quoted else ''}.{digits}f}"
    if text.startswith("-"):
        text = (MINUS if quoted.startswith(MINUS) else "-") + text[1:]
    elif quoted[0] == "+":
        text = "+" + text
    return text


def _normal(quoted: str) -> str:
    return quoted.replace(MINUS, "-")


def quotes(root: Path | None = None) -> Iterator[tuple[Path, int, re.Match[str]]]:
    """Every (file, line, marker match) in the docs."""
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        for m in MARKER.finditer(text):
            yield path, text.count("\n", 0, m.start()) + 1, m


def check(root: Path | None = None) -> list[str]:
    """What disagrees: one line per problem, empty when every quote agrees."""
    root = root or ROOT
    records = load_records(root)
    problems = []
    for name, record in records.items():
        if name != "demo" and not name.startswith("plan_throughput/"):
            missing = [k for k in ("command", "date", "driver", "figures") if not record.get(k)]
            if missing:
                problems.append(f"{FIGURES}: record {name!r} lacks {', '.join(missing)}")
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        fences = _fences(text)
        found = list(MARKER.finditer(text))
        if len(found) != len(ANY_MARKER.findall(text)):
            problems.append(f"{rel}: a <!--fig ...--> marker without a number just before it")
        for m in found:
            line = text.count("\n", 0, m.start()) + 1
            where = f"{rel}:{line}"
            if any(a <= m.start() < b for a, b in fences):
                problems.append(f"{where}: marker inside a code block")
                continue
            value, why = _expected(records, m)
            if why:
                problems.append(f"{where}: {why}")
                continue
            try:
                want = render(value, m["value"])
            except TypeError as exc:
                problems.append(f"{where}: {m['record']} {m['figure']}: {exc}")
                continue
            if _normal(want) != _normal(m["value"]):
                problems.append(
                    f"{where}: quotes {m['value']} for {m['record']} {m['figure']}, "
                    f"recorded {value!r} (would be {want})"
                )
    return problems


def sync(root: Path | None = None) -> list[str]:
    """Rewrite every quote from its record; returns the changes, one line each."""
    root = root or ROOT
    records = load_records(root)
    changes: list[str] = []
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)

        def replace(m: re.Match[str], text: str = text, rel: Path = rel) -> str:
            value, why = _expected(records, m)
            if why:
                return m[0]
            new = render(value, m["value"])
            if _normal(new) != _normal(m["value"]):
                line = text.count("\n", 0, m.start()) + 1
                changes.append(f"{rel}:{line}: {m['value']} -> {new}  ({m['figure']})")
            return new + m[0][len(m["value"]) :]

        new_text = MARKER.sub(replace, text)
        if new_text != text:
            path.write_text(new_text, encoding="utf-8")
    return changes


# -- recording (the benchmarks' --record) -----------------------------------------------


def add_record_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        nargs="?",
        const="",
        default=None,
        metavar="LABEL",
        help=f"write the headline figures to {FIGURES} (record <benchmark>/<driver>[/LABEL]) "
        "and rewrite the docs' quotes of them",
    )


def driver() -> str:
    """The distribution that provides the ``cassandra`` module, with its version."""
    for dist in ("scylla-driver", "cassandra-driver"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def _commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def command_line(benchmark: str, argv: Sequence[str] | None) -> str:
    """How to repeat the run: the benchmark's command without ``--record``."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--record":
            skip = i + 1 < len(args) and not args[i + 1].startswith("-")
        elif not arg.startswith("--record="):
            kept.append(arg)
    return shlex.join(["python", f"benchmarks/{benchmark}.py", *kept])


def record(
    name: str,
    figures: dict[str, Any],
    *,
    command: str,
    date: str | None = None,
    drv: str | None = None,
    note: str | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    """Replace record ``name`` in docs/figures.json (the other records are kept)."""
    root = root or ROOT
    path = root / FIGURES
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"records": {}}
    entry: dict[str, Any] = {
        "command": command,
        "date": date or datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "driver": drv or driver(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "commit": _commit(root),
    }
    if note:
        entry["note"] = note
    entry["figures"] = dict(sorted(flatten(figures).items()))
    data["records"][name] = entry
    data["records"] = dict(sorted(data["records"].items()))
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return entry


def record_run(
    benchmark: str, label: str | None, figures: dict[str, Any], argv: Sequence[str] | None
) -> None:
    """What ``--record [LABEL]`` does once a benchmark has its figures (None: not asked)."""
    if label is None:
        return
    name = f"{benchmark}/{driver().split()[0]}" + (f"/{label}" if label else "")
    record(name, figures, command=command_line(benchmark, argv))
    print(f"recorded {name} in {FIGURES}", file=sys.stderr)
    for change in sync():
        print(f"  quote updated: {change}", file=sys.stderr)
    for problem in check():
        print(f"  check: {problem}", file=sys.stderr)
    print("  re-read the prose around each updated quote", file=sys.stderr)


# -- command line -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("check", "sync", "show"))
    parser.add_argument("prefix", nargs="?", default="", help="show: records starting so")
    args = parser.parse_args(argv)
    if args.action == "sync":
        for change in sync():
            print(change)
    if args.action in ("check", "sync"):
        problems = check()
        for problem in problems:
            print(problem)
        count = sum(1 for _ in quotes())
        print(f"{count} quotes, {len(problems)} problems", file=sys.stderr)
        return 1 if problems else 0
    for name, rec in load_records().items():
        if name.startswith(args.prefix):
            about = ", ".join(str(rec[k]) for k in ("date", "driver", "command") if rec.get(k))
            print(f"{name}  ({about})")
            for figure, value in rec["figures"].items():
                print(f"    {figure} = {value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
