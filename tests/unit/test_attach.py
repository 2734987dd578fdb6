"""``adaptive_lb.attach``: what it refuses (before starting anything), idempotence, closing;
and the warning of a policy that plans with no request tracking. The real driver end to end
is in tests/integration/test_attach_simulacron.py."""

from __future__ import annotations

import logging
import os
import socket
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import SimpleStatement
from prometheus_client import CollectorRegistry

import adaptive_lb
from adaptive_lb import AdaptiveLoadBalancingPolicy, ConfigError
from adaptive_lb.config import Config, MetricsConfig, ReloadConfig, parse_config
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.runtime.tracking_watch import (
    UNTRACKED_PLANS_BEFORE_WARNING,
    UNTRACKED_SECONDS_BEFORE_WARNING,
)
from adaptive_lb.tools.sim.driver_topology import build_cluster


class StandInSession:
    """The parts of a driver Session that attach uses (a live Session needs a server: the
    integration tests use one)."""

    def __init__(self, policy):
        profile = types.SimpleNamespace(load_balancing_policy=policy)
        self.cluster = types.SimpleNamespace(
            profile_manager=types.SimpleNamespace(profiles={"default": profile}),
            load_balancing_policy=None,
        )
        self.keyspace = None
        self.listeners = []
        self.shut_down = False

    def add_request_init_listener(self, fn, *args, **kwargs):
        self.listeners.append(fn)

    def remove_request_init_listener(self, fn, *args, **kwargs):
        self.listeners.remove(fn)

    def shutdown(self):
        self.shut_down = True


def make_policy(config=None, clock=None):
    model = build_cluster({"dc1": [2, 2, 2]}, seed=3, real_cluster=False)
    policy = AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config, clock=clock
    )
    policy.populate(model.cluster, model.metadata.all_hosts())
    return policy


def test_attach_is_idempotent_and_shutdown_stops_it():
    policy = make_policy()
    session = StandInSession(policy)
    attachment = adaptive_lb.attach(session)
    try:
        assert adaptive_lb.attach(session) is attachment
        assert len(session.listeners) == 1
        assert policy.request_tracking
    finally:
        session.shutdown()
    assert session.shut_down and attachment.closed
    assert not policy.request_tracking and session.listeners == []
    attachment.close()  # again: nothing happens
    again = adaptive_lb.attach(session)  # a closed attachment is not reused
    assert again is not attachment
    again.close()


def test_a_session_without_an_adaptive_policy_is_refused():
    session = StandInSession(DCAwareRoundRobinPolicy("dc1"))
    with pytest.raises(ValueError, match="AdaptiveLoadBalancingPolicy"):
        adaptive_lb.attach(session)


def test_a_config_object_has_no_file_to_watch():
    policy = make_policy()
    session = StandInSession(policy)
    attachment = adaptive_lb.attach(session, Config(reload=ReloadConfig(enabled=True)))
    try:
        assert attachment.path is None and attachment.watcher is None
        assert policy.request_tracking
    finally:
        attachment.close()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on, for the whole test."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_taken_metrics_port_when_required_is_a_config_error_and_starts_nothing(taken_port):
    policy = make_policy()
    session = StandInSession(policy)
    metrics = MetricsConfig(prometheus_enabled=True, port=taken_port, required=True)
    with pytest.raises(
        ConfigError, match=rf"metrics\.port: cannot serve /metrics on .*:{taken_port}"
    ):
        adaptive_lb.attach(session, Config(metrics=metrics), registry=CollectorRegistry())
    assert session.listeners == [] and not policy.request_tracking


def test_a_taken_metrics_port_leaves_routing_and_tracking_on(taken_port, caplog):
    """Issue 25: the second worker of a pre-fork server found the port taken, and attach
    being all or nothing, routed without tracking. Now it warns and goes on."""
    policy = make_policy()
    session = StandInSession(policy)
    config = Config(metrics=MetricsConfig(prometheus_enabled=True, port=taken_port))
    with caplog.at_level("WARNING", logger="adaptive_lb.attach"):
        attachment = adaptive_lb.attach(session, config, registry=CollectorRegistry())
    try:
        assert policy.request_tracking and session.listeners
        assert attachment.prometheus_port is None
        problem = attachment.prometheus_problem
        assert f"cannot serve /metrics on 127.0.0.1:{taken_port}" in problem
        assert f"pid {os.getpid()}" in caplog.text
    finally:
        attachment.close()


def test_a_worker_takes_the_first_free_port_of_its_range(taken_port):
    """``metrics.port_count``: one port per pre-fork worker; a taken one is skipped."""
    with socket.socket() as probe:  # the next port must be free for the test to mean it
        if probe.connect_ex(("127.0.0.1", taken_port + 1)) == 0:
            pytest.skip(f"port {taken_port + 1} is in use here")
    policy = make_policy()
    session = StandInSession(policy)
    metrics = MetricsConfig(prometheus_enabled=True, port=taken_port, port_count=2)
    attachment = adaptive_lb.attach(session, Config(metrics=metrics), registry=CollectorRegistry())
    try:
        assert attachment.prometheus_port == taken_port + 1
        assert attachment.prometheus_problem is None
    finally:
        attachment.close()


def test_a_config_file_is_applied_to_the_policies(tmp_path):
    policy = make_policy()
    session = StandInSession(policy)
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("policy: {sample_size: 3}\nreload: {enabled: false}\n")
    attachment = adaptive_lb.attach(session, path)
    try:
        assert policy.config.policy.sample_size == 3
        assert attachment.path == str(path) and attachment.watcher is None
    finally:
        attachment.close()


def rewrite(path, text):
    """Replace the file atomically, as docs/configuration.md asks (write, then rename)."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def test_a_config_file_is_watched_by_default(tmp_path, monkeypatch, caplog):
    """The file names no ``reload`` section: flipping ``policy.enabled`` in it takes effect,
    even after the process changed its working directory (the path given was relative)."""
    policy = make_policy()
    session = StandInSession(policy)
    monkeypatch.chdir(tmp_path)
    Path("adaptive-lb.yaml").write_text("policy: {sample_size: 3}\n")
    with caplog.at_level(logging.INFO, logger="adaptive_lb.attach"):
        attachment = adaptive_lb.attach(session, "adaptive-lb.yaml")
    try:
        watcher = attachment.watcher
        assert watcher is not None and watcher.running
        assert attachment.path == str(tmp_path / "adaptive-lb.yaml")
        assert f"watching {attachment.path} for changes every 1s" in caplog.text
        monkeypatch.chdir(tmp_path.parent)
        rewrite(tmp_path / "adaptive-lb.yaml", "policy: {sample_size: 3, enabled: false}\n")
        watcher.check()  # what its thread does every second (it may have done it already)
        assert policy.config.policy.enabled is False
        assert attachment.config.policy.enabled is False
    finally:
        attachment.close()
    assert not watcher.running


def test_reload_enabled_false_written_into_the_file_stops_the_watching(tmp_path, caplog):
    policy = make_policy()
    session = StandInSession(policy)
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("reload: {interval: 1h}\n")
    attachment = adaptive_lb.attach(session, path)
    try:
        watcher = attachment.watcher
        assert watcher is not None and watcher.interval == 3600.0
        rewrite(path, "reload: {interval: 30m}\n")
        assert watcher.check() and watcher.interval == 1800.0 and not watcher.stopped
        with caplog.at_level(logging.INFO, logger="adaptive_lb.attach"):
            rewrite(path, "reload: {enabled: false}\npolicy: {sample_size: 2}\n")
            assert watcher.check()
        assert watcher.stopped
        assert policy.config.policy.sample_size == 2  # the last change still applies
        assert "reload.enabled is now false" in caplog.text
    finally:
        attachment.close()


def attach_warnings(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "adaptive_lb.attach"
    ]


def test_a_reloaded_metrics_change_warns_that_it_waits_for_a_restart(tmp_path, caplog):
    policy = make_policy()
    session = StandInSession(policy)
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("reload: {interval: 1h}\n")
    attachment = adaptive_lb.attach(session, path)
    try:
        with caplog.at_level(logging.WARNING, logger="adaptive_lb.attach"):
            rewrite(path, "reload: {interval: 1h}\npolicy: {sample_size: 5}\n")
            assert attachment.watcher is not None and attachment.watcher.check()
            assert attach_warnings(caplog) == []
            rewrite(path, "reload: {interval: 1h}\nmetrics: {port: 9999}\n")
            assert attachment.watcher.check()
        (warning,) = attach_warnings(caplog)
        assert warning.startswith(f"adaptive-lb: metrics changed in {path}: the exporters keep")
        assert policy.config.metrics.port == 9999 and attachment.prometheus_port is None
    finally:
        attachment.close()


def test_an_invalid_config_file_names_the_key(tmp_path):
    policy = make_policy()
    session = StandInSession(policy)
    path = tmp_path / "adaptive-lb.yaml"
    path.write_text("policy: {sample_size: 0}\n")
    with pytest.raises(ConfigError, match=r"policy\.sample_size: must be >= 1"):
        adaptive_lb.attach(session, path)
    assert policy.config.policy.sample_size == 8 and session.listeners == []


def plan(policy, count):
    statement = SimpleStatement("q", keyspace="ks")
    for _ in range(count):
        list(policy.make_query_plan("ks", statement))


def warnings_in(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and "tracking" in r.message]


def test_planning_without_tracking_warns_once_after_a_bounded_number_of_plans(caplog):
    policy = make_policy(clock=ManualClock(0))
    caplog.set_level(logging.WARNING, logger="adaptive_lb.policy")
    plan(policy, UNTRACKED_PLANS_BEFORE_WARNING - 1)
    assert warnings_in(caplog) == []
    plan(policy, 1)
    (warning,) = warnings_in(caplog)
    assert "adaptive_lb.attach(session)" in warning.message
    plan(policy, 5 * UNTRACKED_PLANS_BEFORE_WARNING)
    assert len(warnings_in(caplog)) == 1
    assert policy.untracked_plans == 6 * UNTRACKED_PLANS_BEFORE_WARNING
    assert not policy.request_tracking


def test_planning_without_tracking_warns_after_a_bounded_time(caplog):
    clock = ManualClock(0)
    policy = make_policy(clock=clock)
    caplog.set_level(logging.WARNING, logger="adaptive_lb.policy")
    plan(policy, 1)
    clock.advance_s(UNTRACKED_SECONDS_BEFORE_WARNING)
    plan(policy, 1)
    assert len(warnings_in(caplog)) == 1


def test_a_tracked_policy_never_warns(caplog):
    policy = make_policy(clock=ManualClock(0))
    session = StandInSession(policy)
    caplog.set_level(logging.WARNING, logger="adaptive_lb.policy")
    attachment = adaptive_lb.attach(session)
    try:
        plan(policy, 2 * UNTRACKED_PLANS_BEFORE_WARNING)
    finally:
        attachment.close()
    assert warnings_in(caplog) == [] and policy.untracked_plans == 0


def test_parse_config_reload_section():
    config = parse_config("reload: {enabled: true, interval: 250ms}\n")
    assert config.reload == ReloadConfig(enabled=True, interval=0.25)
