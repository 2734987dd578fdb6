"""The CQL test servers that ``adaptive-lb loadtest`` and the integration tests run against.

"Peers" here means *test servers*, not the peer hosts of the health model (a host's
datacenter peers) nor the baseline policies of ``adaptive_lb.tools.sim.baselines``. Modules:

* ``jvm`` - the JVM harness shared by every Java test server: Maven Central fetch into a
  cache, one JVM process (log file, readiness, log tail, stop by PID).
* ``simulacron`` - Simulacron, a simulated CQL cluster: its jar, its 1 ms-timer launcher
  (``SimulacronFineTimer.java``) and its process; ``simulacron_rest`` (clusters, faults,
  activity log) and ``simulacron_primes`` (what the nodes answer) are its REST client.
* ``connect`` - connecting the real driver to a test cluster.
* ``net`` - free loopback ports.
* ``load`` - a closed-loop load generator.

The real Apache Cassandra cluster of the integration tests (``tests/integration/cassandra.py``)
runs on ``jvm`` too.

Imports nothing. Its modules import the standard library, each other and (``load``) the
library's driver access, never another tool.
"""
