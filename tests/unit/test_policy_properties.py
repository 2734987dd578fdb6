"""Property: whatever the topology, states, loads and child, the adaptive plan is a
permutation of the child's plan."""

from __future__ import annotations

from cassandra.query import SimpleStatement
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptive_lb import AdaptiveLoadBalancingPolicy, Config
from adaptive_lb.config import PolicyConfig
from adaptive_lb.tools.sim.driver_topology import build_cluster

from .test_policy import CHILD_FACTORIES


@st.composite
def scenarios(draw):
    dcs = {}
    for index in range(draw(st.integers(1, 3))):
        racks = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        dcs[f"dc{index + 1}"] = racks
    model = build_cluster(
        dcs,
        vnodes=draw(st.integers(1, 8)),
        replication={dc: draw(st.integers(1, 3)) for dc in dcs},
        seed=draw(st.integers(0, 2**16)),
        real_cluster=False,
    )
    child_name = draw(st.sampled_from(sorted(CHILD_FACTORIES)))
    down = draw(st.lists(st.sampled_from(model.hosts), unique=True, max_size=len(model.hosts)))
    loads = draw(
        st.lists(
            st.tuples(st.integers(0, 200), st.sampled_from([1.0, 1.0, 3.5, 64.0])),
            min_size=len(model.hosts),
            max_size=len(model.hosts),
        )
    )
    sample_size = draw(st.integers(1, 10))
    keys = draw(st.lists(st.binary(min_size=0, max_size=12), min_size=1, max_size=5))
    lwt = draw(st.booleans())
    return model, child_name, down, loads, sample_size, keys, lwt


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios())
def test_plan_is_a_permutation_of_the_childs_plan(scenario):
    model, child_name, down, loads, sample_size, keys, lwt = scenario
    hosts = model.metadata.all_hosts()
    config = Config(policy=PolicyConfig(sample_size=sample_size, local_rack="r1"))
    policy = AdaptiveLoadBalancingPolicy(CHILD_FACTORIES[child_name](), config)
    reference = CHILD_FACTORIES[child_name]()
    policy.populate(model.cluster, hosts)
    reference.populate(model.cluster, hosts)
    for host in down:
        host.set_down()
        policy.on_down(host)
        reference.on_down(host)
    for host, (in_flight, penalty) in zip(model.hosts, loads, strict=False):
        stats = policy.stats.get(host)
        stats.in_flight = in_flight
        stats.health_penalty = penalty
    for key in [*keys, None]:
        for keyspace in ("ks", None):
            stmt = SimpleStatement("SELECT v FROM ks.t WHERE k = %s", routing_key=key)
            if lwt:
                stmt.is_lwt = lambda: True
            plan = list(policy.make_query_plan(keyspace, stmt))
            expected = list(reference.make_query_plan(keyspace, stmt))
            assert len(plan) == len(set(plan)), plan
            assert sorted(plan) == sorted(expected), (child_name, plan, expected)
    assert policy.internal_errors == 0
