"""``adaptive-lb loadtest --simulated --slow-node 2 --compare`` end to end."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from adaptive_lb.loadtest import LoadtestOptions, run_loadtest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs `java` for Simulacron"),
]


def test_simulated_compare_with_a_slow_node():
    out, err = io.StringIO(), io.StringIO()
    options = LoadtestOptions(
        simulated=True, slow_node=2, delay_ms=20, compare=True, duration=4, json=True
    )
    reports = run_loadtest(options, out=out, err=err)
    assert [r.policy for r in reports] == ["stock", "adaptive"]
    stock, adaptive = ({h["address"]: h for h in r.hosts} for r in reports)
    slow = sorted(stock)[1]  # dc1 node 2
    # A smoke test of the command (the policy's own acceptance test is in
    # test_adaptive_simulacron.py): the slow node's share must collapse.
    assert stock[slow]["share"] > 0.2
    assert adaptive[slow]["share"] < 0.1
    assert adaptive[slow]["health"] in ("slow", "warming")
    assert reports[1].p99_ms < reports[0].p99_ms
    assert json.loads(out.getvalue())[1]["policy"] == "adaptive"
    assert "slow node" in err.getvalue()
