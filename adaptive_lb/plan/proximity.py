"""Rack proximity: how much farther each remote rack is than the nearest one (pure logic, no
driver import).

``non_local_rack_penalty`` treats every rack but the client's own alike. In a real cluster
they are not: from zone A, zone C may be 250 µs away and zone B 800 µs. When the local
replica is busy or unhealthy, the request should go to the nearer remote replica, not to a
coin-flip between them. The latency the client measures to a host includes that network
distance, so at each health refresh the median latency of each remote rack's hosts is
compared with the lowest of those medians:

    proximity(rack) = clamp(median(rack) / min over remote racks of median(rack'), 1, cap)

and the rack factor of the score becomes ``non_local_rack_penalty x proximity``. The nearest
remote rack keeps the plain penalty; one 2.4x as far away costs 2.4x more. Medians over the
rack's hosts, of each host's p50, so one slow host does not move its rack. A rack without
enough samples keeps its previous factor (avoided racks get few requests; forgetting what
was learned about them would send traffic back just to learn it again).

Imports the standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence

__all__ = ["rack_proximity"]


def rack_proximity(
    latencies: Mapping[Hashable, Sequence[float]],
    previous: Mapping[Hashable, float],
    cap: float,
) -> dict[Hashable, float]:
    """The proximity factor of each remote rack.

    ``latencies`` maps a remote rack to the p50 latencies (seconds) of its hosts that have
    enough samples; ``previous`` holds the factors of the last refresh. Returns a factor in
    ``[1, cap]`` for every rack of ``latencies`` and of ``previous``. A rack with no
    measured host keeps its previous factor (or 1); so does every rack when fewer than two
    are measured (nothing to compare). ``cap`` <= 1 turns proximity off: every factor 1.
    """
    racks = {*latencies, *previous}
    if cap <= 1.0:
        return dict.fromkeys(racks, 1.0)
    result = {rack: min(cap, max(1.0, previous.get(rack, 1.0))) for rack in racks}
    medians = {rack: statistics.median(values) for rack, values in latencies.items() if values}
    nearest = min(medians.values(), default=0.0)
    if len(medians) < 2 or nearest <= 0.0:
        return result  # nothing to compare with: keep what was learned
    for rack, median in medians.items():
        result[rack] = min(cap, max(1.0, median / nearest))
    return result
