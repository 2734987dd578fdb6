"""``adaptive-lb loadtest`` without a cluster: its options, the sentence saying which loop
ran, and its progress, in place on a terminal and once elsewhere. The runs themselves, open
and closed loop against Simulacron, are in tests/integration/test_loadtest.py."""

from __future__ import annotations

import io

import pytest

from adaptive_lb.tools.cli import main
from adaptive_lb.tools.loadtest import LoadtestOptions, RunReport, _print_report, _Progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_rewrites_its_line_on_a_terminal_only():
    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        progress = _Progress("stock", stream, 10.0)
        for second in range(1, 11):
            progress.show(float(second), 500 * second)
        progress.done()
    assert terminal.getvalue().count("\r") == 10 and terminal.getvalue().endswith("\n")
    # A pipe or a file gets the last state, one line, no carriage return.
    assert pipe.getvalue() == "  stock      10.0/10s     5,000 requests      500 req/s\n"


def report(policy: str, load: dict, requests: int = 5000) -> RunReport:
    return RunReport(
        policy=policy,
        requests=requests,
        throughput=requests / 10,
        p50_ms=1.0,
        p95_ms=2.0,
        p99_ms=3.0,
        errors={},
        error_messages={},
        hosts=[],
        load=load,
    )


def test_the_report_says_which_loop_ran():
    out = io.StringIO()
    load = {"loop": "open", "rate": 500.0, "offered": 5000}
    _print_report([report("stock", load), report("adaptive", load)], out)
    assert out.getvalue().startswith("open loop: 500 requests a second offered to each policy")
    assert "could not keep up" not in out.getvalue()
    out = io.StringIO()
    _print_report([report("stock", {"loop": "closed", "in_flight": 8})], out)
    assert out.getvalue().startswith("closed loop: 8 requests in flight, each sent when one")


def test_a_client_that_could_not_send_the_rate_is_told():
    out = io.StringIO()
    load = {"loop": "open", "rate": 5000.0, "offered": 50_000}
    _print_report([report("stock", load, requests=31_000)], out)
    assert "stock: sent 31,000 of the 50,000 requests offered: the client could not" in (
        out.getvalue()
    )


def test_the_open_loop_is_the_default():
    options = LoadtestOptions()
    assert (options.rate, options.closed) == (500.0, None)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--rate", "0"], "argument --rate: must be > 0, got 0"),
        (["--closed", "-1"], "argument --closed: must be > 0, got -1"),
        (["--closed", "x"], "argument --closed: not a number: 'x'"),
        (["--rate", "100", "--closed", "8"], "--closed: not allowed with argument --rate"),
    ],
)
def test_bad_load_options_are_refused_saying_why(arguments, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["loadtest", *arguments])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
