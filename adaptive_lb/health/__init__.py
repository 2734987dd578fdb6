"""Judging each host's health from its statistics, periodically and never per request:
the model that keeps the verdicts and how long each host has gone unanswered (``model``),
the states, their rules and ways back (``rules``, ``verdict``), the evidence that a host
is slower or failing (``evidence``, ``slowness``), whom it is compared with (``peers``,
``baselines``), which hosts are probed and what their round trips say (``probes``,
``probe_latency``). Pure logic: no driver import; hosts are plain keys.

Imports :mod:`adaptive_lb.plan`, :mod:`adaptive_lb.stats`, :mod:`adaptive_lb.config` and
:mod:`adaptive_lb.core`.
"""
