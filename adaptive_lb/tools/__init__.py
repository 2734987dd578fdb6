"""The tools around the library: what adaptive-lb's developers and operators run, never what
a service imports on a request.

* :mod:`~adaptive_lb.tools.cli` -- the ``adaptive-lb`` command (``[project.scripts]``;
  ``python -m adaptive_lb`` and ``python -m adaptive_lb.tools.cli`` run it too), with
  :mod:`~adaptive_lb.tools.cli_format` (help and "written" lines shared by its commands);
* :mod:`~adaptive_lb.tools.sim` -- the simulator (``adaptive-lb demo`` / ``simulate``,
  ``python -m adaptive_lb.tools.sim``) and its stock scenarios (``sim/scenarios/``);
* :mod:`~adaptive_lb.tools.bench` -- plan throughput against the stock policies
  (``adaptive-lb bench``);
* :mod:`~adaptive_lb.tools.loadtest` and :mod:`~adaptive_lb.tools.loadtest_cli` -- the
  load test, open loop or closed, against your cluster or Simulacron (``adaptive-lb loadtest``);
* :mod:`~adaptive_lb.tools.sandbox` -- a local Simulacron cluster to try things against;
* :mod:`~adaptive_lb.tools.peers` -- the CQL test servers (Simulacron, the JVM harness)
  and load loops that the load test, the sandbox, the integration tests and the
  benchmarks run against.

May import: the whole library and each other; the library never imports a tool
(``tests/unit/test_imports.py`` checks it). Importing this package imports nothing.
"""
