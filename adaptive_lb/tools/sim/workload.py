"""The clients: application instances that send reads through their own driver policy.

Each :class:`Client` is one application instance in one zone with its own policy object
(its own in-flight counts, health and round-robin state, as in production). A request:

1. asks the client's policy for a plan (``make_query_plan(keyspace, statement)`` with a
   real driver ``SimpleStatement`` carrying the routing key and consistency level);
2. sends an attempt to the plan's next host; the policy's feedback hooks (for adaptive-lb:
   the per-host ``HostStats`` lifecycle methods the driver-side tracking calls) see the
   send and exactly one outcome per attempt: success, fast error, or timeout -- for
   adaptive-lb only on the requests its :class:`~adaptive_lb.stats.sampling.Sampler` picks
   (``Client.sampler``), while its in-flight counts come from the client's simulated
   pools (``Client.pools``: :mod:`adaptive_lb.tools.sim.driver_side`), which see every attempt
   until the node answers it;
3. on a fast error (Overloaded, Unavailable, ReadFailure, connection reset) moves to the
   next host of the plan, like the driver's default retry policy (``RETRY_NEXT_HOST``);
4. on the client-side timeout (``request_timeout``) gives up: the outstanding attempt is
   released as a timeout (the driver raises ``OperationTimedOut``; no retry).

Load: *closed loop* (each client keeps ``concurrency`` requests outstanding, with an
optional exponential think time) or *open loop* (Poisson arrivals at ``rate``, spread over
the clients at random). Keys are uniform or Zipf over ``keys.count`` partitions.

Imports the driver's public API and the simulator's engine, nodes, servers, policies and
scenario only.
"""

from __future__ import annotations

import bisect
import itertools
import random
from typing import Any, Protocol

from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from adaptive_lb.tools.sim.engine import NS_PER_S, Engine
from adaptive_lb.tools.sim.node import Node
from adaptive_lb.tools.sim.policies import NoFeedback
from adaptive_lb.tools.sim.scenario import KeysSpec, Scenario, WorkloadSpec
from adaptive_lb.tools.sim.servers import OK, SimulatedServers

__all__ = [
    "FAILED",
    "SUCCEEDED",
    "TIMED_OUT",
    "Attempt",
    "Client",
    "Feedback",
    "KeyChooser",
    "LoadGenerator",
    "Request",
    "make_statements",
]

SUCCEEDED = 0
FAILED = 1
"""Every host of the plan answered with a fast error (``NoHostAvailable``)."""
TIMED_OUT = 2


class Feedback(Protocol):
    """What a policy learns from the requests it routed (one call per event)."""

    def sent(self, host: Any) -> None: ...
    def success(self, host: Any, latency_ns: int) -> None: ...
    def error(self, host: Any, latency_ns: int) -> None: ...
    def timeout(self, host: Any, latency_ns: int) -> None: ...


_UNTRACKED = NoFeedback()
"""What an untracked request's attempts feed: nothing."""


class Request:
    """One application request (one or more attempts)."""

    __slots__ = (
        "attempts",
        "client",
        "crossed",
        "current",
        "done",
        "feedback",
        "key",
        "measured",
        "plan",
        "span",
        "start_ns",
        "touched",
    )

    def __init__(self, client: Client, key: int, start_ns: int, measured: bool) -> None:
        self.client = client
        self.key = key
        self.start_ns = start_ns
        self.measured = measured
        self.plan: Any = None
        self.current: Attempt | None = None
        self.attempts = 0
        self.done = False
        self.feedback: Feedback = client.feedback
        """What learns from this request's attempts (nothing: an untracked request)."""
        self.crossed = False
        self.span: Any = None
        """The request's trace span, when it is sampled (see
        :mod:`adaptive_lb.tools.sim.tracing`)."""
        """An attempt went to a coordinator outside the client's zone."""
        self.touched = False
        """An attempt or one of its replica reads reached a node while a fault was active."""


class Attempt:
    """One try of a request on one coordinator."""

    __slots__ = ("dead", "got", "needed", "node", "request", "sent_ns", "tried")

    def __init__(self, request: Request, node: Node, sent_ns: int) -> None:
        self.request = request
        self.node = node
        self.sent_ns = sent_ns
        self.dead = False
        """The coordinator answered (or died): late replica responses are ignored."""
        self.needed = 1
        self.got = 0
        self.tried: list[Node] = []


def make_statements(scenario: Scenario, routing_keys: list[bytes]) -> list[SimpleStatement]:
    """One real driver statement per partition key (reused by every request for it)."""
    level = getattr(ConsistencyLevel, scenario.workload.consistency)
    return [
        SimpleStatement(
            "SELECT v FROM ks.t WHERE k = ?",
            routing_key=key,
            keyspace="ks",
            consistency_level=level,
        )
        for key in routing_keys
    ]


class KeyChooser:
    """Draws partition indexes: uniform, or Zipf (rank r with weight 1 / r^s, the ranks
    placed on random partitions so hot keys land on random token ranges)."""

    def __init__(self, spec: KeysSpec, rng: random.Random) -> None:
        self._rng = rng
        self._count = spec.count
        self._cdf: list[float] | None = None
        if spec.distribution == "zipf":
            weights = [1.0 / (rank**spec.zipf_exponent) for rank in range(1, spec.count + 1)]
            self._cdf = list(itertools.accumulate(weights))
            self._placement = list(range(spec.count))
            rng.shuffle(self._placement)

    def next(self) -> int:
        """The next key index."""
        if self._cdf is None:
            return int(self._rng.random() * self._count)
        cdf = self._cdf
        rank = bisect.bisect_left(cdf, self._rng.random() * cdf[-1])
        return self._placement[min(rank, self._count - 1)]


class Client:
    """One application instance: a zone, a policy, its feedback hooks."""

    __slots__ = (
        "_timeout_ns",
        "engine",
        "feedback",
        "generator",
        "keyspace",
        "max_attempts",
        "name",
        "pauses",
        "policy",
        "pools",
        "recorder",
        "sampler",
        "servers",
        "statements",
        "tracer",
        "zone",
    )

    def __init__(
        self,
        name: str,
        zone: str,
        policy: Any,
        feedback: Feedback,
        servers: SimulatedServers,
        statements: list[SimpleStatement],
        recorder: Any,
        workload: WorkloadSpec,
    ) -> None:
        self.name = name
        self.zone = zone
        self.policy = policy
        self.feedback = feedback
        self.servers = servers
        self.engine: Engine = servers.engine
        self.statements = statements
        self.recorder = recorder
        self.keyspace = "ks"
        self.max_attempts = workload.max_attempts
        self._timeout_ns = round(workload.request_timeout * NS_PER_S)
        self.generator: LoadGenerator | None = None
        self.tracer: Any = None
        """A :class:`~adaptive_lb.tools.sim.tracing.RequestTracer` when the run is traced."""
        self.pools: Any = None
        """The driver's in-flight counts per host (a
        :class:`~adaptive_lb.tools.sim.driver_side.PoolCounts`; None: the policy reads none)."""
        self.sampler: Any = None
        """Picks the requests whose attempts feed :attr:`feedback` (the policy's
        :class:`~adaptive_lb.stats.sampling.Sampler`; None: every request)."""
        self.pauses: Any = None
        """Its own pauses (:class:`~adaptive_lb.tools.sim.client_pauses.ClientPauses`)."""

    def start(self, key: int, measured: bool) -> None:
        """Begin a request for partition ``key`` (if the client is paused, at the pause's
        end, the wait counted in the request's latency)."""
        token = (key, measured, self.engine.now)
        if self.pauses is not None and self.pauses.defer(self.engine, self._start_late, token):
            self.pauses.sends_late += 1
        else:
            self._begin(*token)

    def _start_late(self, token: tuple[int, bool, int]) -> None:
        if not self.pauses.defer(self.engine, self._start_late, token):  # a pause right after
            self._begin(*token)

    def _begin(self, key: int, measured: bool, start_ns: int) -> None:
        engine = self.engine
        request = Request(self, key, start_ns, measured)
        if self.tracer is None:
            request.plan = iter(self.policy.make_query_plan(self.keyspace, self.statements[key]))
        else:
            with self.tracer.planning(request, self):
                statement = self.statements[key]
                request.plan = iter(self.policy.make_query_plan(self.keyspace, statement))
        if self.sampler is not None and not self.sampler.take():
            request.feedback = _UNTRACKED
        engine.at(engine.now + self._timeout_ns, self._timeout, request)
        self._attempt(request)

    def _attempt(self, request: Request) -> None:
        host = next(request.plan, None)
        if host is None:
            self._finish(request, FAILED)
            return
        engine = self.engine
        node = self.servers.node_of(host)
        if self.pools is not None:
            self.pools.sent(host)
        request.feedback.sent(host)
        attempt = Attempt(request, node, engine.now)
        request.current = attempt
        request.attempts += 1
        if node.zone != self.zone:
            request.crossed = True
        if request.measured:
            self.recorder.attempt(engine.now, node)
        delay = self.servers.network.delay(self.zone, node.zone)
        engine.at(engine.now + delay, self.servers.arrive, attempt)

    def on_reply(self, token: tuple[Attempt, int]) -> None:
        """The coordinator's answer to ``attempt`` arrives."""
        if self.pauses is not None and self.pauses.defer(self.engine, self.on_reply, token):
            self.pauses.answers_late += 1
            return
        attempt, outcome = token
        if self.pools is not None:
            self.pools.answered(attempt.node.host)  # also a late answer: the stream is freed
        request = attempt.request
        if request.done or request.current is not attempt:
            return  # timed out before: already released
        latency = self.engine.now - attempt.sent_ns
        host = attempt.node.host
        if outcome == OK:
            request.feedback.success(host, latency)
            self._finish(request, SUCCEEDED)
            return
        request.feedback.error(host, latency)
        request.current = None
        if self.max_attempts is not None and request.attempts >= self.max_attempts:
            self._finish(request, FAILED)
        else:
            self._attempt(request)

    def _timeout(self, request: Request) -> None:
        if request.done:
            return
        if self.pauses is not None and self.pauses.defer(self.engine, self._timeout, request):
            self.pauses.answers_late += 1
            return
        attempt = request.current
        if attempt is not None:
            request.feedback.timeout(attempt.node.host, self.engine.now - attempt.sent_ns)
        self._finish(request, TIMED_OUT)

    def _finish(self, request: Request, status: int) -> None:
        if request.span is not None:
            current = request.current
            coordinator = current.node.host.address if current is not None else None
            self.tracer.finish(request, status, coordinator)
        request.done = True
        request.current = None
        if request.measured:
            self.recorder.finish(request, status, self.engine.now)
        if self.generator is not None:
            self.generator.done(self)


class LoadGenerator:
    """Issues requests until the budget of measured requests is spent."""

    def __init__(
        self,
        scenario: Scenario,
        engine: Engine,
        clients: list[Client],
        keys: KeyChooser,
        rng: random.Random,
    ) -> None:
        self.scenario = scenario
        self.engine = engine
        self.clients = clients
        self.keys = keys
        self.rng = rng
        workload = scenario.workload
        self.closed = workload.mode == "closed"
        self._think_ns = workload.think_time_us * 1000
        self._mean_gap_ns = NS_PER_S / workload.rate
        self._warmup_ns = round(scenario.warmup * NS_PER_S)
        self._end_ns = round(scenario.max_duration * NS_PER_S)
        self.budget = scenario.requests
        self.measured = 0
        self.outstanding = 0
        self.stopped = False
        self.last_issue_ns = 0
        for client in clients:
            client.generator = self

    def start(self) -> None:
        """Schedule the first requests."""
        if self.closed:
            concurrency = self.scenario.workload.concurrency
            for client in self.clients:
                for _ in range(concurrency):
                    # Stagger the loops over the first 100 us.
                    self.engine.at(int(self.rng.random() * 100_000), self._issue, client)
        else:
            self.engine.at(0, self._arrival, None)

    def _can_issue(self) -> bool:
        if self.stopped:
            return False
        if self.measured >= self.budget or self.engine.now >= self._end_ns:
            self.stopped = True
            if self.outstanding == 0:
                self.engine.stop()
            return False
        return True

    def _issue(self, client: Client) -> None:
        if not self._can_issue():
            return
        measured = self.engine.now >= self._warmup_ns
        if measured:
            self.measured += 1
        self.outstanding += 1
        self.last_issue_ns = self.engine.now
        client.start(self.keys.next(), measured)

    def _arrival(self, _: Any) -> None:
        if not self._can_issue():
            return
        client = self.clients[int(self.rng.random() * len(self.clients))]
        self._issue(client)
        gap = int(self.rng.expovariate(1.0) * self._mean_gap_ns)
        self.engine.at(self.engine.now + gap, self._arrival, None)

    def done(self, client: Client) -> None:
        """A request of ``client`` finished."""
        self.outstanding -= 1
        if self.stopped:
            if self.outstanding == 0:
                self.engine.stop()
            return
        if self.closed:
            if self._think_ns:
                gap = int(self.rng.expovariate(1.0) * self._think_ns)
                self.engine.at(self.engine.now + gap, self._issue, client)
            else:
                self.engine.at(self.engine.now, self._issue, client)
