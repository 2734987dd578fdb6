"""The command line as users meet it: ``--help`` of every command names the program and
documents every option with its default; no command writes into the checkout unless told
to; ``demo`` reports its plotting and lists the files it wrote."""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_lb.tools import bench
from adaptive_lb.tools.cli import build_parser, format_written, main
from adaptive_lb.tools.sim.progress import ProgressBar

ROOT = Path(__file__).resolve().parents[2]
BENCH_TINY = ["--plans", "100", "--repeats", "1", "--keys", "100", "--skip-1000"]
DEMO_TINY = ["--scenario", "local-one", "--requests", "200", "--jobs", "1", "--seed", "1"]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple]:
    """Every command line that has its own parser: ``()``, ``("demo",)``,
    ``("config", "show")``... (``bench`` forwards to the benchmark's own parser)."""
    found: list[tuple] = [path]
    # argparse privates (every CPython we support): a parser's _actions, _SubParsersAction.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name == "bench":
                    found.append((*path, name))
                else:
                    found.extend(_commands(sub, (*path, name)))
    return found


COMMANDS = _commands(build_parser())


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def _entries(help_text: str, section: str) -> list[list[str]]:
    """The entries of a ``--help`` section (``options:``...): each its lines, the first one
    starting with the option at two spaces of indentation."""
    lines = help_text.splitlines()
    if f"{section}:" not in lines:
        return []
    entries: list[list[str]] = []
    for line in lines[lines.index(f"{section}:") + 1 :]:
        if not line.strip():
            break
        if re.match(r"  \S", line):
            entries.append([line])
        else:
            entries[-1].append(line)
    return entries


def _help_of(entry: list[str]) -> str:
    """The help text of an entry, without its invocation (``--plans N``)."""
    first = re.split(r"\s{2,}", entry[0].strip(), maxsplit=1)
    return " ".join([*first[1:], *(line.strip() for line in entry[1:])])


def test_every_command_is_covered() -> None:
    assert {" ".join(c) for c in COMMANDS} >= {
        "",
        "bench",
        "loadtest",
        "demo",
        "simulate",
        "config",
        "config validate",
        "config show",
        "config schema",
        "config default",
    }


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "adaptive-lb")
def test_help_names_the_program_and_shows_every_default(command, capsys) -> None:
    text = _help(list(command), capsys)
    assert text.startswith(f"usage: {' '.join(('adaptive-lb', *command))} ")
    options = _entries(text, "options")
    assert options[0][0].lstrip().startswith("-h, --help")
    for entry in options[1:]:
        described = _help_of(entry)
        assert "(default: " in described, entry
        assert re.sub(r"\(default: [^)]*\)", "", described).strip(), f"no help text: {entry}"
    for entry in _entries(text, "positional arguments"):
        if entry[0].strip() != "COMMAND" and not entry[0].startswith("    "):
            assert _help_of(entry), f"no help text: {entry}"


def test_every_bench_option_has_help_and_its_default(capsys) -> None:
    text = _help(["bench"], capsys)
    options = {entry[0].split()[0]: _help_of(entry) for entry in _entries(text, "options")}
    assert set(options) == {"-h,", "--plans", "--repeats", "--keys", "--skip-1000", "--out"}
    assert options["--plans"].endswith("(default: 20000)")
    assert options["--skip-1000"].endswith("(default: False)")
    assert "(default: a new folder ./adaptive-lb-bench-YYYYmmdd-HHMMSS)" in options["--out"]


def _entry_point(name: str) -> list[str]:
    """The installed console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name(name)
    if script.exists():
        return [str(script)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", "adaptive_lb"]


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["bench", "--help"], "usage: adaptive-lb bench "),
        (["-m", "adaptive_lb.tools.sim", "--help"], "usage: python -m adaptive_lb.tools.sim "),
        (
            ["-m", "adaptive_lb.tools.sim", "demo", "--help"],
            "usage: python -m adaptive_lb.tools.sim demo ",
        ),
    ],
)
def test_the_real_entry_points_name_themselves(argv, usage, tmp_path) -> None:
    command = [sys.executable, *argv] if argv[0] == "-m" else [*_entry_point("adaptive-lb"), *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage)
    assert list(tmp_path.iterdir()) == []  # --help writes nothing


def _tracked_results() -> dict[str, bytes]:
    results = ROOT / "benchmarks" / "results"
    return {p.name: p.read_bytes() for p in sorted(results.glob("*"))} if results.exists() else {}


def test_bench_writes_a_new_folder_in_the_current_directory(tmp_path, monkeypatch, capsys):
    before = _tracked_results()
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *BENCH_TINY]) == 0
    out = capsys.readouterr().out
    [folder] = list(tmp_path.iterdir())
    assert re.fullmatch(r"adaptive-lb-bench-\d{8}-\d{6}", folder.name)
    written = sorted(folder.iterdir())
    assert [p.suffix for p in written] == [".json", ".md"]
    # The listing names them, as paths that work from where the command ran.
    listing = out[out.index("wrote 2 files:") :].splitlines()
    assert sorted(Path(line.strip()) for line in listing[1:]) == [
        p.relative_to(tmp_path) for p in written
    ]
    assert json.loads(written[0].read_text())["throughput"]["45"]
    assert _tracked_results() == before

    # An explicit --out is honoured (created, nested), nothing else written.
    assert main(["bench", *BENCH_TINY, "--out", str(tmp_path / "a" / "b")]) == 0
    assert f"  {tmp_path / 'a' / 'b'}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", folder.name]
    assert len(list((tmp_path / "a" / "b").iterdir())) == 2


def test_bench_never_reuses_a_folder(tmp_path) -> None:
    first = bench.new_out_dir(tmp_path, now=0.0)
    (first / "keep.json").write_text("{}")
    second = bench.new_out_dir(tmp_path, now=0.0)
    third = bench.new_out_dir(tmp_path, now=0.0)
    assert second.name == f"{first.name}-2" and third.name == f"{first.name}-3"
    assert (first / "keep.json").read_text() == "{}"


def test_bench_rejects_a_count_below_one(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--plans", "0"])
    assert info.value.code == 2
    assert "--plans: must be >= 1, got 0" in capsys.readouterr().err


def test_default_output_folders_are_not_tracked() -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    parser = build_parser()
    defaults = [parser.parse_args(["demo"]).out, parser.parse_args(["simulate", "x.yaml"]).out]
    assert defaults == ["adaptive-lb-demo", "adaptive-lb-simulate"]
    for default in [*defaults, bench.OUT_PREFIX + "20250101-000000"]:
        listed = subprocess.run(
            ["git", "ls-files", "--", default], cwd=ROOT, capture_output=True, text=True
        )
        assert listed.returncode == 0 and listed.stdout == "", default
        ignored = subprocess.run(["git", "check-ignore", "-q", default + "/"], cwd=ROOT)
        assert ignored.returncode == 0, f"{default}/ is not in .gitignore"


def test_demo_reports_plotting_and_lists_the_files_it_wrote(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", *DEMO_TINY]) == 0
    captured = capsys.readouterr()
    out = Path("adaptive-lb-demo")
    expected = [
        out / "results.json",
        out / "results.md",
        out / "local-one-latency-cdf.png",
        out / "local-one-traffic.png",
    ]
    # The listing, then the tally of targets closes the output.
    listing, _, tally = captured.out.rpartition(format_written(expected) + "\n")
    assert listing and tally.startswith("targets: ") and tally.endswith("\n")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / out).iterdir()) == sorted(expected)
    assert all((tmp_path / p).stat().st_size > 0 for p in expected)
    progress = captured.err.splitlines()
    assert any(line.startswith("[") and "local-one/adaptive" in line for line in progress)
    assert any(line.startswith("plots [") and "local-one (2 PNGs)" in line for line in progress)


def test_demo_with_json_keeps_stdout_for_the_document(tmp_path, capsys) -> None:
    argv = ["demo", *DEMO_TINY, "--json", "--no-plots", "--quiet", "--out", str(tmp_path)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == json.loads((tmp_path / "results.json").read_text())
    # The listing and the tally go to stderr, alone (no progress lines with --quiet).
    written = format_written([tmp_path / "results.json", tmp_path / "results.md"]) + "\n"
    assert captured.err.startswith(written)
    assert captured.err[len(written) :].startswith("targets: ")


def test_format_written() -> None:
    assert format_written([Path("a/x.json")]) == "wrote 1 file:\n  a/x.json"
    assert format_written(["a", "b"]) == "wrote 2 files:\n  a\n  b"


def test_progress_bar_title_prefixes_each_line() -> None:
    stream = io.StringIO()
    bar = ProgressBar(2, stream=stream, width=4, title="plots")
    bar.step("one")
    bar.step("two")
    lines = stream.getvalue().splitlines()
    assert [line.rsplit(" ", 1)[0] for line in lines] == [
        "plots [##..] 1/2 one",
        "plots [####] 2/2 two",
    ]
