"""A fleet's budget against the real 3-node Cassandra 5.0 cluster (issue 34 item 5): the
pre-fork workers of ``test_fleet_simulacron`` count themselves in the nodes' real
``system_views.clients`` and space their reads and probes of each node within the budget
(counted by each worker's own snapshot: a real node keeps no log of its requests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cassandra import CassandraCluster
from tests.integration.test_fleet_simulacron import run_fleet
from tests.integration.test_server_load_real import table  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

WORKERS = 6
SECONDS = 11.0
BUDGET = 2.0
"""6 workers, each with a connection to every node and a control connection to one: each
node lists 6 to 12 connections, so a worker reads a node every 6 / 1.8 = 3.3 s or more
(at the shipped 2 s, 3 reads a second per node)."""
CONFIG = f"""
policy: {{local_rack: null}}
health:
  fleet: {{budget: {BUDGET}}}
"""


@pytest.fixture
def contact(table: CassandraCluster) -> Iterator[str]:  # noqa: F811
    yield table.addresses[0]


def test_workers_count_themselves_in_the_real_clients_table_and_keep_the_budget(contact):
    reports = run_fleet(contact, [], workers=WORKERS, seconds=SECONDS, config=CONFIG)
    sizes = sorted(r["fleet_size"] for r in reports)
    print(f"\n{WORKERS} workers on the real cluster: fleet sizes learned {sizes}")
    assert {r["source"] for r in reports} == {"system_views.clients"}
    assert all(WORKERS <= size <= 2 * WORKERS + 1 for size in sizes), sizes
    assert all(r["errors"] == {} for r in reports), reports
    # From each worker's learning on: its reads and probes of each node, summed per node.
    sent: dict[str, float] = {}
    for report in reports:
        seconds = report["end"] - report["learned"]
        for address, total in report["own_at_end"].items():
            rate = (total - report["own_at_learn"].get(address, 0)) / seconds
            sent[address] = sent.get(address, 0.0) + rate
    print(f"  reads and probes per second per node: { {a: round(r, 2) for a, r in sent.items()} }")
    assert len(sent) == 3 and all(0 < rate <= BUDGET for rate in sent.values()), sent
