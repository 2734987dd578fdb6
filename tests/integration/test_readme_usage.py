"""The README's usage program, run as a user would (a fresh Python process) against
Simulacron, as written for ``adaptive-lb sandbox`` (``protocol_version=4,
compression=False``: what Simulacron needs). Only what must differ here is substituted: the
contact point when it is not the sandbox, and the Prometheus port (a free one)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simulacron import Simulacron

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
CLUSTER = "readme"


def usage_program() -> str:
    """The first ``python`` block of the README."""
    match = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README.md has no python block"
    return match.group(1)


@pytest.fixture(scope="module")
def nodes(simulacron: Simulacron) -> Iterator[list[str]]:
    created = simulacron.create_cluster(CLUSTER, [["r1", "r2", "r3"]])
    try:
        yield created["dc1"]
    finally:
        simulacron.remove_cluster(CLUSTER)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_readme_usage_program_runs(nodes):
    program = usage_program()
    assert program.count('["127.0.2.1"],') == 1 and program.count("9464") >= 1
    port = free_port()
    program = program.replace('["127.0.2.1"],', f'["{nodes[0]}"],').replace("9464", str(port))
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("release ")
    hosts = [line.split() for line in lines[1:]]
    assert sorted(h[0] for h in hosts) == sorted(nodes)
    assert {h[1] for h in hosts} == {"r1", "r2", "r3"}
    assert all(h[2] == "healthy" for h in hosts)
    assert sum(int(h[3]) for h in hosts) >= 1  # the query was tracked
    assert "WARNING" not in result.stderr  # attach was called: no half-setup warning


def test_the_readme_usage_program_runs_against_the_sandbox(tmp_path):
    """The first hour, in two terminals: ``adaptive-lb sandbox`` (a real process) prints its
    contact point; the README's program runs against it; Ctrl-C (SIGINT, by PID) stops it,
    and nothing was written into the current directory."""
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "adaptive_lb", "sandbox", "--seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert sandbox.stdout is not None
        contact = None
        for line in sandbox.stdout:  # ends by itself: the sandbox stops after 120 s
            match = re.match(r"contact point: (\S+), port 9042", line)
            if match:
                contact = match.group(1)
                break
        # 127.0.2.1, as the README says, unless another Simulacron holds it (this session's).
        program = (
            usage_program()
            .replace('["127.0.2.1"],', f'["{contact}"],')
            .replace("9464", str(free_port()))
        )
        result = subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == 1 + 3 and lines[0].startswith("release ")  # then 3 hosts
        hosts = [line.split() for line in lines[1:]]
        prefix = contact.rsplit(".", 1)[0]
        assert [h[:3] for h in hosts] == [
            [f"{prefix}.1", "r1", "healthy"],
            [f"{prefix}.2", "r2", "healthy"],
            [f"{prefix}.3", "r3", "healthy"],
        ]
        assert 0 < sum(int(h[3]) for h in hosts) <= 100  # tracked: all, or a sample
    finally:
        sandbox.send_signal(signal.SIGINT)
        try:
            rest, _ = sandbox.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            sandbox.kill()
            rest, _ = sandbox.communicate()
    assert sandbox.returncode == 0
    assert "Simulacron stopped." in rest
    assert list(tmp_path.iterdir()) == []
