"""``adaptive-lb loadtest --simulated --slow-node 2 --compare`` end to end."""

from __future__ import annotations

import io
import json
import shutil
import threading
from http.server import ThreadingHTTPServer

import pytest

from adaptive_lb.loadtest import LoadtestOptions, run_loadtest
from tests.unit.test_otlp import Receiver, otlp_spans

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


def test_otlp_endpoint_exports_each_request_with_its_decision():
    """``--otlp-endpoint``: one span per request, carrying the policy's decision event, at a
    real OTLP/HTTP receiver on 127.0.0.1."""
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        options = LoadtestOptions(
            simulated=True,
            duration=2,
            concurrency=2,
            otlp_endpoint=f"http://127.0.0.1:{server.server_port}",
            json=True,
        )
        (report,) = run_loadtest(options, out=io.StringIO(), err=io.StringIO())
    finally:
        server.shutdown()
        server.server_close()
    spans = otlp_spans(Receiver.received)
    assert len(spans) == report.requests > 0  # every request, none lost (flushed at exit)
    coordinators = set()
    for span in spans:
        assert span.name == "loadtest adaptive request"
        (event,) = [e for e in span.events if e.name == "adaptive_lb.decision"]
        attributes = {a.key: a.value for a in event.attributes}
        coordinators.add(attributes["server.address"].string_value)
    local = {h["address"] for h in report.hosts if h["dc"] == "dc1"}
    assert coordinators and coordinators <= local
