"""What the driver and request tracking do for adaptive-lb in production, simulated per
client on the virtual clock, so that the simulator drives the same rules as production:

* :class:`PoolCounts` -- the driver's in-flight count of each host's connection pool
  (:func:`adaptive_lb.runtime._driver.pool_in_flight_reader`), given to the policy as its in-flight
  source (``policy.stats.add_in_flight_source``): an attempt (or probe) counts from its
  send until *the node* answers it. An attempt the client timed out on stays counted until
  the simulated node's late answer arrives (the driver's orphaned stream), so a stalled
  node's count keeps rising; every request counts, tracked or not. A host marked down has
  no pool: 0.
* request sampling -- the policy's own :class:`~adaptive_lb.stats.sampling.Sampler` is asked once
  per request (:meth:`~adaptive_lb.stats.sampling.Sampler.take`, on the virtual clock), and only
  the requests it picks feed the policy's statistics, every attempt of them
  (:class:`~adaptive_lb.tools.sim.workload.Client`).
* :class:`SimProber` -- the active probes (:mod:`adaptive_lb.runtime.prober`): the policy's
  ``use_prober`` sender, sending each ordered probe to its node as a coordinator-only task
  (:mod:`adaptive_lb.tools.sim.own_requests`: network both ways, the node's queue, pauses,
  injected faults, down) with
  ``health.probe_timeout``, its outcome recorded on the host's
  :class:`~adaptive_lb.stats.probe_record.ProbeRecord` exactly as the prober's callbacks do.
* server-load reads -- where the scenario says what the nodes report
  (``nodes.thread_pools``), the policy's ``read_load`` sender
  (:mod:`adaptive_lb.tools.sim.load_reads`): each node's thread pools from its simulated queue.

Not modelled: the driver replacing a connection whose orphaned streams pass its threshold
(the simulated nodes answer every request they accept, except under a ``timeouts`` fault).

Imports the library's probes and probe record and the simulator's own requests, servers and
load reads only.
"""

from __future__ import annotations

import random
from typing import Any

from adaptive_lb.health.probes import ProbeOrder
from adaptive_lb.stats.probe_record import ANSWERED, FAILED, TIMEOUT
from adaptive_lb.tools.sim.load_reads import SimClientsReader, SimLoadReader
from adaptive_lb.tools.sim.own_requests import OwnRequests, Trip
from adaptive_lb.tools.sim.servers import SimulatedServers

__all__ = ["PoolCounts", "SimProber", "attach_driver_side"]


class PoolCounts:
    """One client's connection pools: in-flight count per host (see the module
    docstring). Called with a host, as an in-flight source, it reads that host's count."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def sent(self, host: Any) -> None:
        """An attempt or probe borrowed a stream of ``host``'s pool."""
        key = id(host)
        self._counts[key] = self._counts.get(key, 0) + 1

    def answered(self, host: Any) -> None:
        """``host`` answered one of them (in time or late): its stream is released."""
        key = id(host)
        count = self._counts.get(key, 0)
        if count > 0:
            self._counts[key] = count - 1

    def __call__(self, host: Any) -> int:
        if host.is_up is False:
            return 0  # the driver dropped the host's pool
        return self._counts.get(id(host), 0)


class SimProber(OwnRequests):
    """Sends one client's probes (``policy.use_prober(prober.send)``); see the module
    docstring. ``zone`` is the client's, ``pools`` its :class:`PoolCounts`."""

    failed = FAILED
    kind = "probe"

    def send(self, order: ProbeOrder) -> None:
        """Send the probe ``order`` asks for (what :class:`adaptive_lb.runtime.prober.Prober` does
        through the driver)."""
        stats = order.stats
        record = stats.probes
        if not record.begin(self.policy.now_ns(), order.next_ns, order.reason):
            return
        failures = stats.errors_total + stats.timeouts_total
        self.dispatch(order.key, record, failures, self.policy.config.health.probe_timeout)

    def served(self, trip: Trip) -> str:
        return ANSWERED

    def end(self, trip: Trip, answer: str) -> None:
        if answer == ANSWERED:
            trip.record.end(ANSWERED, self.policy.now_ns(), trip.note)
        else:
            trip.record.end(answer, self.policy.now_ns())

    def expire(self, trip: Trip) -> None:
        trip.record.end(TIMEOUT, self.policy.now_ns())


def attach_driver_side(
    policy: Any,
    zone: str,
    servers: SimulatedServers,
    rng: random.Random,
    thread_pools: bool | None = None,
    pauses: Any = None,
    sessions: int | None = None,
) -> tuple[PoolCounts, SimProber]:
    """Give an adaptive ``policy`` of a client in ``zone`` what request tracking gives it
    in production: its in-flight source (the client's pools) and its probe sender, with a
    probe scheduler jittered from ``rng`` (so a run stays a function of its seed); with
    ``thread_pools`` not None, its server-load reads too
    (:class:`~adaptive_lb.tools.sim.load_reads.SimLoadReader`: the nodes have the table or not);
    with ``pauses`` (the client's :class:`~adaptive_lb.tools.sim.client_pauses.ClientPauses`),
    their answers and timeouts wait for the client's pauses to end; with ``sessions``, its
    clients-table reads too (:class:`~adaptive_lb.tools.sim.load_reads.SimClientsReader`:
    every node lists that many sessions)."""
    pools = PoolCounts()
    policy.stats.add_in_flight_source(pools)
    prober = SimProber(policy, zone, servers, pools)
    prober.pauses = pauses
    read_load = None
    if thread_pools is not None:
        reader = SimLoadReader(policy, zone, servers, pools, thread_pools)
        reader.pauses = pauses
        read_load = reader.read
    read_clients = None
    if sessions is not None:
        clients_reader = SimClientsReader(policy, zone, servers, pools, sessions)
        clients_reader.pauses = pauses
        read_clients = clients_reader.read
    policy.use_prober(
        prober.send, read_load=read_load, rng=rng, read_clients=read_clients
    )  # the same rules, seeded
    return pools, prober
