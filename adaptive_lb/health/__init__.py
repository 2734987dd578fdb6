"""Judging each host's health from its statistics, periodically and never per request:
the model that keeps the verdicts (``model``), the states, their rules and ways back
(``rules``, ``verdict``), the evidence that a host is slower or failing (``evidence``),
whom it is compared with and what its probes' round trips say (``peers``), which hosts are
probed (``probes``). Pure logic: no driver import; hosts are plain keys.

Imports :mod:`adaptive_lb.plan`, :mod:`adaptive_lb.stats`, :mod:`adaptive_lb.config` and
:mod:`adaptive_lb.core`.
"""
