"""How a query plan is made: the score (``scoring``), the cluster's topology, the client's
rack and the others' proximity (``topology``, ``locality``), replica resolution and its
cache (``replicas``, ``replica_cache``), the plan algorithm (``planner``), and every
private access to the driver's policies and token map (``_driver_policies``). ``scoring``,
``locality`` and ``replica_cache`` import no driver module.

Imports :mod:`adaptive_lb.stats`, :mod:`adaptive_lb.config` and :mod:`adaptive_lb.core`.
"""
