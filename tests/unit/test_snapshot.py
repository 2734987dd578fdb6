"""PolicySnapshot / HostSnapshot: plain JSON over real driver Host objects, one unit per
kind, and docs/observability.md ("The snapshot") generated from the fields' docstrings.

After changing a snapshot field, run ``python tests/unit/test_snapshot.py --write``: it
rewrites the field tables and the JSON example of the docs (the tests fail until they match).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.pool import Host
from cassandra.query import SimpleStatement

import adaptive_lb.stats.host as stats_module
from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.telemetry.snapshot import AS_OF, HostSnapshot, PolicySnapshot
from adaptive_lb.tools.sim.driver_topology import build_cluster, murmur3_routing_keys

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"
MS = 1_000_000
S = 1_000_000_000

DIMENSIONLESS = {
    "window_error_rate",
    "health_penalty",
    "rack_penalty",
    "server_load",
    "server_pressure",
    "server_load_excess",
    "latency_factor",
    "latency_ratio",
    "latency_ratio_low",
}
"""The float fields that are not durations: ratios and score multipliers (``latency_*``:
ratios of latencies)."""
DURATION_WORDS = {"latency", "since", "age", "time", "duration", "interval", "taken", "elapsed"}
"""Words of a field name that make it a duration or a time."""
OTHER_UNITS = ("_ns", "_us", "_ms", "_s", "_nanos", "_micros", "_millis", "_sec", "_secs")


# ----------------------------------------------------------------- the example policy


@contextmanager
def example_policy() -> Iterator[tuple[AdaptiveLoadBalancingPolicy, ManualClock]]:
    """A policy over a made-up cluster of real driver objects (dc1: 127.1.0.1 fast with a
    few errors, a timeout and one attempt in flight, 127.1.0.2 twenty times slower; dc2:
    127.2.0.1, idle), on a manual clock, after one health refresh. Deterministic: it makes
    the JSON example of the docs."""
    model = build_cluster({"dc1": [2], "dc2": [1]}, seed=3)
    try:
        clock = ManualClock(3600 * S)
        policy = AdaptiveLoadBalancingPolicy(
            TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), clock=clock
        )
        policy.populate(model.cluster, model.metadata.all_hosts())
        fast, slow = sorted(model.hosts_by_dc["dc1"], key=lambda h: h.address)
        keys = murmur3_routing_keys(8, seed=1)
        for key in keys[:2]:  # before tracking is attached: untracked plans
            list(policy.make_query_plan("ks", SimpleStatement("q", routing_key=key)))
        policy.tracking_attached()
        for key in keys + keys[:4]:  # 4 cache hits
            list(policy.make_query_plan("ks", SimpleStatement("q", routing_key=key)))
        feed(policy, fast, 40, 2 * MS)  # then out of the window
        clock.advance_s(12.0)
        feed(policy, fast, 100, 2 * MS, errors=3, timeouts=1)
        feed(policy, slow, 100, 40 * MS)
        stats = policy.stats.get(fast)
        stats.on_send()
        stats.on_abandon()  # another attempt won
        stats.on_send()  # still in flight
        clock.advance_s(1.0)
        policy.refresh_health()
        feed(policy, slow, 5, 40 * MS)  # after the refresh: in the totals only
        clock.advance_s(2.5)
        yield policy, clock
    finally:
        model.shutdown()


def feed(
    policy: AdaptiveLoadBalancingPolicy,
    host: Host,
    successes: int,
    latency_ns: int,
    errors: int = 0,
    timeouts: int = 0,
) -> None:
    """Count attempts on ``host`` as request tracking does: ``successes`` taking from 1 to
    1.9 x ``latency_ns``, ``errors`` fast errors, ``timeouts`` timeouts after 1 s."""
    stats = policy.stats.get(host)
    for i in range(successes):
        stats.on_send()
        stats.on_success(latency_ns + (i % 10) * latency_ns // 10)
    for _ in range(errors):
        stats.on_send()
        stats.on_error(latency_ns)
    for _ in range(timeouts):
        stats.on_send()
        stats.on_timeout(S)


# ----------------------------------------------------------------- docs generation


def field_sources(cls: type) -> dict[str, tuple[str, str]]:
    """Each attrs field of ``cls``: its annotation as written, and the string literal under
    it in the source (the annotations, not ``attrs.fields``' types: cattrs resolves those)."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    sources: dict[str, tuple[str, str]] = {}
    body = node.body
    for statement, following in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        doc = ""
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            doc = following.value.value
        sources[statement.target.id] = (ast.unparse(statement.annotation), doc)
    return sources


def _markdown(text: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split())).replace("|", "\\|")


def fields_table(cls: type) -> str:
    """The markdown table of ``cls``'s fields: name, type, as of, docstring."""
    sources = field_sources(cls)
    rows = ["| field | type | as of | meaning |", "| --- | --- | --- | --- |"]
    for field in attrs.fields(cls):
        kind, doc = sources[field.name]
        rows.append(
            f"| `{field.name}` | {_markdown(kind.replace(' | ', ' or '))} "
            f"| {field.metadata['as_of']} | {_markdown(doc)} |"
        )
    return "\n".join(rows)


def example_json() -> str:
    """The snapshot of :func:`example_policy`, as the docs show it."""
    with example_policy() as (policy, _):
        return policy.snapshot().to_json(indent=2)


def generated_blocks(with_example: bool = True) -> dict[str, str]:
    """The docs' generated blocks: opening marker -> content."""
    blocks = {
        f"snapshot-fields {cls.__name__}": fields_table(cls)
        for cls in (PolicySnapshot, HostSnapshot)
    }
    if with_example:
        blocks["snapshot-example"] = f"```json\n{example_json()}\n```"
    return blocks


def block_pattern(name: str) -> re.Pattern[str]:
    """The generated block ``name`` of the docs: (opening marker)(content)(closing marker)."""
    return re.compile(
        rf"(<!-- {re.escape(name)}: generated by [^>]* -->\n)(.*?)(<!-- end {re.escape(name)} -->)",
        re.DOTALL,
    )


def doc_block(text: str, name: str) -> str:
    """The content of the generated block ``name`` in ``text``."""
    match = block_pattern(name).search(text)
    assert match is not None, f"no generated block {name!r} in {DOC}"
    return match.group(2).strip("\n")


def snapshot_section(text: str) -> str:
    """The "The snapshot" section of the docs."""
    start = text.index("\n## The snapshot\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def write_docs() -> None:
    """Rewrite the generated blocks of the docs."""
    text = DOC.read_text()
    for name, content in generated_blocks().items():
        text, count = block_pattern(name).subn(
            lambda m, content=content: f"{m.group(1)}{content}\n{m.group(3)}", text
        )
        assert count == 1, name
    DOC.write_text(text)


# ----------------------------------------------------------------- tests


def is_plain_json(value: Any) -> bool:
    """``value`` is made of dicts with str keys, lists, str, int, float, bool and None."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_plain_json(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def test_json_round_trip_over_real_driver_hosts():
    with example_policy() as (policy, _):
        assert all(isinstance(view.host, Host) for view in policy.topology.by_id.values())
        snapshot = policy.snapshot()
    data = snapshot.to_dict()
    assert is_plain_json(data)
    text = json.dumps(data)
    assert json.loads(text) == data
    assert json.loads(snapshot.to_json(indent=2)) == data
    assert PolicySnapshot.from_dict(json.loads(text)) == snapshot
    assert HostSnapshot.from_dict(json.loads(json.dumps(data["hosts"][0]))) == snapshot.hosts[0]
    assert data["hosts"] == [host.to_dict() for host in snapshot.hosts]
    assert set(data) == {f.name for f in attrs.fields(PolicySnapshot)}
    for host in data["hosts"]:
        assert set(host) == {f.name for f in attrs.fields(HostSnapshot)}

    # The numbers are the policy's, not defaults: every kind of field is exercised.
    fast, slow, remote = snapshot.hosts
    assert (fast.address, slow.address, remote.address) == ("127.1.0.1", "127.1.0.2", "127.2.0.1")
    assert (fast.in_flight, fast.requests_total, fast.abandons_total) == (1, 144, 1)
    assert (fast.window_requests, fast.window_errors, fast.window_timeouts) == (104, 3, 1)
    assert fast.window_samples == 101  # 3 fast errors: no latency sample
    assert fast.window_error_rate == pytest.approx(4 / 104)
    assert (slow.health_state, slow.health_penalty) == ("slow", 64.0)
    assert slow.health_reason.startswith("p50 0.05") and "ms" not in slow.health_reason
    assert slow.health_state_age_seconds == pytest.approx(2.5)
    assert (slow.window_requests, slow.requests_total) == (100, 105)
    assert slow.window_latency_p50_seconds == pytest.approx(0.056, rel=0.01)
    assert slow.window_latency_p99_seconds == pytest.approx(0.076, rel=0.01)
    assert remote.window_latency_p99_seconds is None and not remote.is_local
    assert snapshot.taken_seconds == pytest.approx(3615.5)
    assert (snapshot.request_tracking, snapshot.untracked_plans) == (True, 2)
    assert snapshot.decisions_by_position["replica"] == 14
    assert (snapshot.replica_cache_hits, snapshot.replica_cache_misses) == (6, 8)
    assert snapshot.health_refreshes == 1
    assert snapshot.internal_errors == 0 and set(snapshot.internal_errors_by_stage) >= {"plan"}


def test_every_duration_is_in_seconds():
    for cls in (PolicySnapshot, HostSnapshot):
        sources = field_sources(cls)
        for field in attrs.fields(cls):
            name, kind = field.name, sources[field.name][0]
            seconds = name.endswith("_seconds")
            assert seconds or not name.endswith(OTHER_UNITS), name
            if DURATION_WORDS & set(name.split("_")) and name not in DIMENSIONLESS:
                assert seconds, f"{cls.__name__}.{name} looks like a duration"
            if "float" in kind and name not in DIMENSIONLESS:
                assert seconds, f"{cls.__name__}.{name}: a float that is not in seconds"
            if seconds:
                assert kind in ("float", "float | None"), name
    # Values too: every *_seconds value of a real snapshot is a number of seconds or None,
    # and the health reasons state their latencies in seconds.
    with example_policy() as (policy, _):
        data = policy.snapshot().to_dict()
    for record in (data, *data["hosts"]):
        for name, value in record.items():
            if name.endswith("_seconds"):
                assert value is None or (isinstance(value, float) and value >= 0), name
    reasons = [host["health_reason"] for host in data["hosts"] if host["health_reason"]]
    assert reasons
    for reason in reasons:
        assert not re.search(r"\d(ms|us|ns)\b", reason), reason
    assert all(re.search(r"p(99|50) \d\.\d{4}s ", reason) for reason in reasons[:2]), reasons


def test_every_field_has_a_docstring_and_says_when_it_was_made():
    for cls in (PolicySnapshot, HostSnapshot):
        sources = field_sources(cls)
        assert set(sources) == {f.name for f in attrs.fields(cls)}
        for field in attrs.fields(cls):
            assert sources[field.name][1].strip(), f"{cls.__name__}.{field.name}: no docstring"
            assert field.metadata.get("as_of") in AS_OF, field.name
    as_of = {f.name: f.metadata["as_of"] for f in attrs.fields(HostSnapshot)}
    assert {n for n in as_of if n.startswith("window_")} <= {
        n for n, when in as_of.items() if when == "refresh"
    }
    assert {n for n in as_of if n.endswith("_total")} <= {
        n for n, when in as_of.items() if when == "lifetime"
    }


def test_the_docs_tables_are_generated_from_the_docstrings():
    text = DOC.read_text()
    for name, content in generated_blocks(with_example=False).items():
        assert doc_block(text, name) == content, (
            f"{DOC.name}: {name} is out of date; run python tests/unit/test_snapshot.py --write"
        )


def test_the_docs_mention_every_field_and_show_a_real_example():
    text = DOC.read_text()
    section = snapshot_section(text)
    for cls in (PolicySnapshot, HostSnapshot):
        for field in attrs.fields(cls):
            assert f"`{field.name}`" in section, f"{cls.__name__}.{field.name} not documented"
    block = doc_block(text, "snapshot-example")
    assert block.startswith("```json\n") and block.endswith("\n```")
    example = json.loads(block.removeprefix("```json\n").removesuffix("\n```"))
    # The values depend on the config's defaults (its hash, the health rules' thresholds):
    # the structure must match what the code produces now.
    with example_policy() as (policy, _):
        data = policy.snapshot().to_dict()
    assert list(example) == list(data)
    assert [list(host) for host in example["hosts"]] == [list(host) for host in data["hosts"]]
    assert [h["address"] for h in example["hosts"]] == [h["address"] for h in data["hosts"]]
    assert PolicySnapshot.from_dict(example).hosts[1].health_state == "slow"


def test_a_snapshot_computes_no_percentile(monkeypatch):
    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"), clock=ManualClock(S))
    policy.populate(model.cluster, model.metadata.all_hosts())
    for host in model.hosts:
        feed(policy, host, 60, 3 * MS)
    policy.refresh_health()
    expected = [h.window_latency_p99_seconds for h in policy.snapshot().hosts]
    assert all(p99 == pytest.approx(0.0057, rel=0.01) for p99 in expected)

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a snapshot computed a percentile")

    monkeypatch.setattr(stats_module, "percentile_values", forbidden)
    monkeypatch.setattr(stats_module.HostStats, "window_stats", forbidden)
    snapshot = policy.snapshot()
    assert [h.window_latency_p99_seconds for h in snapshot.hosts] == expected
    assert policy.internal_errors == 0


def test_window_counts_lag_the_totals_and_ages_grow():
    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    clock = ManualClock(S)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"), clock=clock)
    policy.populate(model.cluster, model.metadata.all_hosts())
    host = model.hosts[0]
    address = str(host.address)
    before = policy.snapshot().host(address)
    assert before is not None
    assert (before.health_state_age_seconds, before.health_reason) == (None, "")
    assert policy.snapshot().health_refreshes == 0

    feed(policy, host, 50, MS)
    first = policy.snapshot().host(address)
    assert first is not None
    assert (first.window_requests, first.requests_total) == (0, 50)  # no refresh yet
    policy.refresh_health()
    clock.advance_s(0.5)
    refreshed = policy.snapshot().host(address)
    assert refreshed is not None
    assert (refreshed.window_requests, refreshed.requests_total) == (50, 50)
    assert refreshed.health_state_age_seconds == pytest.approx(0.5)

    clock.advance_s(policy.config.tracking.window + 1)
    feed(policy, host, 7, MS)
    policy.refresh_health()
    later = policy.snapshot()
    moved = later.host(address)
    assert moved is not None
    assert (moved.window_requests, moved.requests_total) == (7, 57)  # the 50 left the window
    assert moved.health_state_age_seconds == pytest.approx(later.taken_seconds - 1.0)
    assert later.window_seconds == policy.config.tracking.window
    assert later.health_refresh_interval_seconds == policy.config.health.refresh_interval


def test_the_policy_counters_are_copied():
    model = build_cluster({"dc1": [1, 1]}, real_cluster=False, seed=1)
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.populate(model.cluster, model.metadata.all_hosts())
    list(policy.make_query_plan("ks", SimpleStatement("q")))
    snapshot = policy.snapshot()
    assert snapshot.request_tracking is policy.request_tracking is False
    assert snapshot.untracked_plans == policy.untracked_plans == 1
    assert snapshot.decisions_by_position == policy.decisions_by_position
    assert snapshot.config_reloads == policy.config_reloads
    assert snapshot.internal_errors_by_stage == policy.internal_errors_by_stage
    assert snapshot.untracked_attempts == snapshot.unknown_host_events == 0
    snapshot.config_reloads["success"] += 1
    assert policy.config_reloads["success"] == 0
    hash(snapshot)  # frozen: usable as a key although it holds dicts


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write  (rewrites the generated parts of {DOC})")
    write_docs()
    print(f"rewrote the generated parts of {DOC}")
