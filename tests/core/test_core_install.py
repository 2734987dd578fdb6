"""What the core install promises, with nothing but ``pip install ".[cassandra]"``
(or ``[scylla]``): the policy over a real driver topology, request tracking, health,
decisions on the application's spans through the OpenTelemetry API alone, the Prometheus
endpoint, the OpenTelemetry metrics through the API, and YAML config.

``.ci/run`` runs this folder in a virtualenv holding only the core install (plus pytest),
with ``ADAPTIVE_LB_CORE_ONLY=1``: there, the OpenTelemetry SDK, the OTLP exporters and
grpcio must be absent. In the full (``dev``) environments the same tests run too; the
absence check is skipped there, and the missing-SDK error is checked with the SDK's imports
blocked in a subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ResultMessage
from cassandra.query import SimpleStatement
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import TracingConfig, load_config
from adaptive_lb.exporters import register_otel_metrics, start_prometheus_server
from adaptive_lb.runtime.attempts import Attempts
from adaptive_lb.tools.sim.driver_topology import build_topology, murmur3_routing_keys

CORE_ONLY = os.environ.get("ADAPTIVE_LB_CORE_ONLY") == "1"
"""Set by .ci/run in the core-only virtualenv: the absence checks may not be skipped."""

OPTIONAL_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter", "grpc", "google.protobuf")
"""Top-level modules of the ``otlp`` extra (none may be imported by the core)."""

MS = 1_000_000

BLOCK_OPTIONAL = f"PREFIXES = {OPTIONAL_MODULES!r}\n" + textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        # The otlp extra is "not installed": any import of it fails as a missing module.
        def find_spec(self, name, path=None, target=None):
            if name.startswith(PREFIXES):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    """
)
"""Python source that makes the ``otlp`` extra look uninstalled, for a subprocess."""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (this one's)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def loaded_optional(code: str) -> list[str]:
    """The optional modules loaded by running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprefixes = {OPTIONAL_MODULES!r}\n" + (
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(prefixes))))"
    )
    result = run_python(probe)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model():
    """A real driver topology: a ``Cluster`` (never connected), its ``Metadata`` and token
    map, 6 hosts over 3 racks."""
    model = build_topology({"dc1": [2, 2, 2]}, seed=11)
    yield model
    model.shutdown()


def make_policy(model, config: Config | None = None) -> AdaptiveLoadBalancingPolicy:
    policy = AdaptiveLoadBalancingPolicy(TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config)
    policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def test_the_otlp_extra_is_not_installed():
    """The core install pulls in neither the SDK nor the OTLP exporters nor grpcio."""
    present = [m for m in ("opentelemetry.sdk", "grpc") if importlib.util.find_spec(m)]
    if present and not CORE_ONLY:
        pytest.skip(f"full install ({', '.join(present)} present): checked by the core venv")
    assert not present
    assert importlib.util.find_spec("opentelemetry.trace") is not None  # the API is core


def test_importing_adaptive_lb_loads_no_sdk():
    """Nothing reachable from the package, its exporters or the CLI imports the SDK."""
    code = (
        "import adaptive_lb, adaptive_lb.exporters, adaptive_lb.tools.cli, adaptive_lb.config\n"
        "import adaptive_lb.exporters.otlp, adaptive_lb.tools.sim.cli\n"
        "adaptive_lb.tools.cli.build_parser()"
    )
    assert loaded_optional(code) == []


def test_cli_help_works_without_the_sdk():
    result = run_python(
        BLOCK_OPTIONAL + "\nfrom adaptive_lb.tools.cli import main\nmain(['--help'])"
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


def test_setup_tracing_without_the_sdk_names_the_extra():
    """OTLP export is the one thing the core does not do: asking for it says what to
    install (an ImportError), and nothing else breaks."""
    code = BLOCK_OPTIONAL + textwrap.dedent(
        """
        from adaptive_lb.config import OtlpConfig, TracingConfig
        from adaptive_lb.exporters import setup_tracing
        config = TracingConfig(otlp=OtlpConfig(endpoint="http://127.0.0.1:4318"))
        try:
            setup_tracing(config)
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            print("no error")
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ImportError:"), result.stdout
    assert "pip install opentelemetry-sdk" in result.stdout


def test_attach_with_otlp_but_without_the_extra_is_a_config_error():
    """A config that enables OTLP export without the extra installed: attach refuses it,
    naming the key and what to install, and starts nothing."""
    code = BLOCK_OPTIONAL + textwrap.dedent(
        """
        import types
        from cassandra.policies import DCAwareRoundRobinPolicy
        import adaptive_lb
        from adaptive_lb.config import parse_config

        policy = adaptive_lb.AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
        profile = types.SimpleNamespace(load_balancing_policy=policy)
        session = types.SimpleNamespace(
            cluster=types.SimpleNamespace(
                profile_manager=types.SimpleNamespace(profiles={"default": profile}),
                load_balancing_policy=None,
            ),
            keyspace=None,
        )
        config = parse_config("tracing: {otlp: {endpoint: 'http://127.0.0.1:4318'}}")
        try:
            adaptive_lb.attach(session, config)
        except adaptive_lb.ConfigError as exc:
            print("ConfigError:", exc, policy.request_tracking)
        else:
            print("no error")
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ConfigError: tracing.otlp.endpoint: set, but"), result.stdout
    assert "pip install opentelemetry-sdk" in result.stdout
    assert result.stdout.rstrip().endswith("False")


def test_plans_tracking_and_health_over_a_real_topology(model):
    policy = make_policy(model)
    keys = murmur3_routing_keys(50, seed=3)
    for key in keys:
        plan = list(policy.make_query_plan("ks", SimpleStatement("q", routing_key=key)))
        assert sorted(h.address for h in plan) == sorted(h.address for h in model.hosts)
        host = plan[0]
        attempts = Attempts.of(policy)
        attempts.sent(host)
        attempts.answered(host, ResultMessage(2))
        attempts.ended(None)
    policy.refresh_health()
    snapshot = policy.snapshot()
    assert sum(h.requests_total for h in snapshot.hosts) == len(keys)
    assert {h.health_state for h in snapshot.hosts} == {"healthy"}
    assert all(h.in_flight == 0 for h in snapshot.hosts)
    assert policy.internal_errors == 0


@pytest.mark.parametrize("mode", ["event", "span"])
def test_planning_under_the_api_tracer(model, mode):
    """Decisions go on the application's spans through the OpenTelemetry API: with no SDK
    the API's tracer makes non-recording spans, and planning under them just works."""
    policy = make_policy(model, Config(tracing=TracingConfig(mode=mode)))
    tracer = trace.get_tracer("app")
    for key in murmur3_routing_keys(20, seed=4):
        with tracer.start_as_current_span("request") as span:
            plan = list(policy.make_query_plan("ks", SimpleStatement("q", routing_key=key)))
            assert len(plan) == len(model.hosts)
            if CORE_ONLY:
                assert not span.is_recording()  # the API's own tracer: no SDK
    assert policy.internal_errors == 0


def test_prometheus_endpoint_serves_the_policy(model):
    policy = make_policy(model)
    policy.stats.get(model.hosts[0]).on_send()
    policy.stats.get(model.hosts[0]).on_success(2 * MS)
    policy.refresh_health()
    server, _thread = start_prometheus_server(0, policies=[policy], registry=CollectorRegistry())
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    for family in (
        "adaptive_lb_host_in_flight",
        "adaptive_lb_host_requests_total",
        "adaptive_lb_host_latency_seconds",
        "adaptive_lb_host_health",
        "adaptive_lb_decisions_total",
        "adaptive_lb_replica_cache_hits_total",
        "adaptive_lb_config_info",
    ):
        assert f"\n{family}" in text, family
    assert f'address="{model.hosts[0].address}"' in text


def test_otel_metrics_register_on_the_api_meter_provider(model):
    instruments = register_otel_metrics(make_policy(model))
    assert len(instruments) > 10


def test_yaml_config(tmp_path, model):
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("tracing:\n  mode: span\nmetrics:\n  port: 0\n")
    config = load_config(path)
    assert config.tracing.mode == "span" and config.metrics.port == 0
    policy = make_policy(model, config)
    path.write_text("tracing:\n  mode: event\n")
    assert policy.reload(path).tracing.mode == "event"


def test_driver_free_modules_do_not_import_the_driver():
    """The scoring, health and statistics code needs no driver."""
    for module in (
        "adaptive_lb.plan.scoring",
        "adaptive_lb.health.model",
        "adaptive_lb.stats.host",
        "adaptive_lb.stats.window",
    ):
        result = run_python(f"import sys, {module}\nprint('cassandra' in sys.modules)")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "False", module
