"""A real Prometheus server (Debian's package) scrapes adaptive-lb's endpoint."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy
from prometheus_client import CollectorRegistry

from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.exporters import start_prometheus_server
from adaptive_lb.peers.simulacron import free_tcp_port
from adaptive_lb.sim.cluster import build_cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs the `prometheus` binary (Debian package `prometheus`; .ci/run installs it)",
    ),
]


def test_prometheus_scrapes_every_host(tmp_path):
    model = build_cluster({"dc1": [2, 2, 2]}, real_cluster=False, seed=3)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    for i, host in enumerate(model.hosts):
        for _ in range(i):
            policy.stats.get(host).on_send()
    server, _ = start_prometheus_server(0, policies=[policy], registry=CollectorRegistry())
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
        query = urllib.parse.quote("adaptive_lb_host_in_flight")
        url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?query={query}"
        found: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(found) < len(model.hosts):
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    body = json.load(response)
            except OSError:
                continue
            found = {r["metric"]["address"]: float(r["value"][1]) for r in body["data"]["result"]}
        assert found == {h.address: float(i) for i, h in enumerate(model.hosts)}
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        server.shutdown()
        server.server_close()
