"""A real Prometheus server (Debian's package) scrapes adaptive-lb's endpoint, and every
query of the Grafana dashboard in exporters/grafana/ returns data through its API."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from prometheus_client import CollectorRegistry

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import OtlpConfig, TracingConfig
from adaptive_lb.exporters import setup_tracing, start_prometheus_server
from adaptive_lb.tools.peers.net import free_tcp_port
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "exporters" / "grafana" / "adaptive-lb.json"
SCRAPE_CONFIG = ROOT / "exporters" / "prometheus" / "prometheus.yml"
MS = 1_000_000

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs the `prometheus` binary (Debian package `prometheus`; .ci/run installs it)",
    ),
]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, with the dashboard variables set to "All"."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "10s")
            expr = expr.replace("$dc", ".*").replace("$policy", ".*")
            queries.append((panel["title"], expr))
    return queries


class Traffic(threading.Thread):
    """Requests on every host (host i gets i + 1 per round), plans with a few routing keys
    (replica cache hits and misses) and health refreshes, until stopped."""

    def __init__(self, policy: AdaptiveLoadBalancingPolicy, hosts: list) -> None:
        super().__init__(daemon=True)
        self.policy, self.hosts = policy, hosts
        self.stop = threading.Event()
        self.statements = [
            SimpleStatement("q", routing_key=key, keyspace="ks")
            for key in murmur3_routing_keys(8, seed=3)
        ]

    def run(self) -> None:
        round_ = 0
        while not self.stop.wait(0.05):
            round_ += 1
            for i, host in enumerate(self.hosts):
                stats = self.policy.stats.get(host)
                for _ in range(i + 1):
                    stats.on_send()
                    stats.on_success((i + 1) * MS)
            statement = self.statements[round_ % len(self.statements)]
            list(self.policy.make_query_plan("ks", statement))
            if round_ % 5 == 0:
                self.policy.refresh_health()


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=2) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_prometheus_scrapes_every_host_and_answers_every_dashboard_query(tmp_path):
    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=3)
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")))
    policy.populate(model.cluster, model.metadata.all_hosts())
    for i, host in enumerate(model.hosts):
        for _ in range(i):
            policy.stats.get(host).on_send()  # host i: i in flight (the traffic adds none)
    # A tracer that can only drop (nothing listens): the dropped-spans panel has data.
    tracer_provider = setup_tracing(
        TracingConfig(otlp=OtlpConfig(endpoint=f"http://127.0.0.1:{closed_port()}", timeout=0.2)),
        max_queue_size=1,
    )
    for _ in range(5):
        with tracer_provider.get_tracer("test").start_as_current_span("span"):
            pass
    server, _ = start_prometheus_server(0, policies=[policy], registry=CollectorRegistry())
    traffic = Traffic(policy, list(model.hosts))
    traffic.start()
    prometheus_port = free_tcp_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: adaptive-lb\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{server.server_port}']\n"
    )
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        expected = {h.address: float(i) for i, h in enumerate(model.hosts)}
        found: dict[str, float] = {}
        empty = [title for title, _ in dashboard_queries()]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (found != expected or empty):
            time.sleep(0.5)
            try:
                results = query(prometheus_port, "adaptive_lb_host_in_flight")
                found = {r["metric"]["address"]: float(r["value"][1]) for r in results}
                empty = [
                    title for title, expr in dashboard_queries() if not query(prometheus_port, expr)
                ]
            except OSError:  # not listening yet
                continue
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        assert found == expected
        assert empty == [], f"dashboard panels without data: {empty}"
        # Traffic share: host i gets (i + 1) / 21 of the requests.
        share_expr = next(e for t, e in dashboard_queries() if t == "Traffic share per host")
        shares = {
            r["metric"]["address"]: float(r["value"][1]) for r in query(prometheus_port, share_expr)
        }
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
        assert shares[model.hosts[5].address] > shares[model.hosts[0].address]
        dropped = query(prometheus_port, "adaptive_lb_trace_spans_dropped_total")
        assert sum(float(r["value"][1]) for r in dropped) >= 4
    finally:
        traffic.stop.set()
        traffic.join(timeout=5)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        server.shutdown()
        server.server_close()
        tracer_provider.shutdown()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs `promtool` (Debian package)")
def test_shipped_scrape_config_is_valid():
    result = subprocess.run(
        ["promtool", "check", "config", str(SCRAPE_CONFIG)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
