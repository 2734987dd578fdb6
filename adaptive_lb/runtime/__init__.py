"""The library at work inside a driver session: the policy (the driver contract,
``policy``, ``policy_controls``), how it follows the cluster's hosts (``membership``), the
health refresh and the probe sender (``refresher``, ``prober``), the request lifecycle
(``tracking``, ``tracking_watch``, ``attempts``, ``request_spans``), ``attach``
(``attachment``) and every private access to the driver's request path (``_driver``).

May import every other package of the library; never a tool.
"""
