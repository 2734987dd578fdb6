"""The discrete-event simulator behind ``adaptive-lb demo``: real policy objects, virtual time.

Two views of one simulated cluster, kept apart by name:

* :mod:`~adaptive_lb.tools.sim.driver_topology` -- what the *driver* sees: real ``Metadata``,
  ``Host`` objects and a Murmur3 ``TokenMap``, with no server behind them (also used by the
  tests and benchmarks);
* :mod:`~adaptive_lb.tools.sim.servers` -- what *answers*: the simulated servers
  (:mod:`~adaptive_lb.tools.sim.node` each, :mod:`~adaptive_lb.tools.sim.network` between
  them) and a coordinator's work.

Around them: :mod:`~adaptive_lb.tools.sim.engine` (the event queue),
:mod:`~adaptive_lb.tools.sim.faults`, :mod:`~adaptive_lb.tools.sim.workload` (the clients),
:mod:`~adaptive_lb.tools.sim.policies` (what is compared, with the
:mod:`~adaptive_lb.tools.sim.baselines` of other drivers),
:mod:`~adaptive_lb.tools.sim.runner`, :mod:`~adaptive_lb.tools.sim.metrics`,
:mod:`~adaptive_lb.tools.sim.report`, :mod:`~adaptive_lb.tools.sim.tracing` and
:mod:`~adaptive_lb.tools.sim.cli`; scenarios are read by :mod:`~adaptive_lb.tools.sim.scenario`.

Imports nothing. Its modules may import the library, each other and the CLI's formatter,
never another tool.
"""
