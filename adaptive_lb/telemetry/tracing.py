"""Decision tracing on the OpenTelemetry *API* (the SDK and exporters live in
:mod:`adaptive_lb.exporters`).

When a span is recording in the current context -- the application's own, or the one
``opentelemetry-instrumentation-cassandra`` opens around a driver call -- the policy records
its decision on it, as an event ``adaptive_lb.decision`` or, by config, as a child span
``adaptive_lb.query_plan``. When nothing records, the cost is one context lookup
(:func:`current_recording_span`, ~0.1 us).

Privacy: the keyspace is recorded, never the routing key, the statement text or bound
values (unless :class:`~adaptive_lb.config.PrivacyConfig` allows the routing key).

May import: the score, the config, the OpenTelemetry API; the health model and the planner
for their types only (under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import trace

from adaptive_lb.config import Config, PrivacyConfig, TracingConfig
from adaptive_lb.telemetry.candidate_entries import candidate_entry

if TYPE_CHECKING:
    from adaptive_lb.health.model import HealthTransition
    from adaptive_lb.plan.planner import PlanRecord

__all__ = [
    "CANDIDATES_ATTRIBUTE",
    "CHOSEN_ATTRIBUTE",
    "EVENT_NAME",
    "SPAN_NAME",
    "Decision",
    "DecisionRecorder",
    "DecisionTracer",
    "build_decision",
    "current_recording_span",
]

EVENT_NAME = "adaptive_lb.decision"
SPAN_NAME = "adaptive_lb.query_plan"
CHOSEN_ATTRIBUTE = "adaptive_lb.chosen"
"""The chosen host and why: its entry as in :data:`CANDIDATES_ATTRIBUTE`, on every recorded
decision whose :data:`CANDIDATES_ATTRIBUTE` (recorded on ``tracing.candidates_ratio`` of
them) does not begin with it."""
CANDIDATES_ATTRIBUTE = "adaptive_lb.candidates"
"""Every candidate in the order tried, as one string: entries ``address:port in_flight=N
health=STATE penalty=P score=S replica=True|False server_load=L latency=F`` (numbers to 6
significant digits, the server-load and latency factors to 3; the score is
``(in_flight + 1) x penalty``, the penalty includes both factors) separated by ``"; "``. One
string, not an array per field: the SDK checks every element of an array attribute (~60 us
per decision)."""


try:  # The context variable behind opentelemetry.context.get_current() (private, faster).
    from opentelemetry.context import _RUNTIME_CONTEXT
    from opentelemetry.trace.propagation import _SPAN_KEY

    # Declared as the abstract _RuntimeContext; the contextvars implementation has it.
    _context_var = _RUNTIME_CONTEXT._current_context  # type: ignore[attr-defined]
    _context_var.get()
except Exception:  # another runtime context implementation: use the public API
    _context_var = None


def current_recording_span() -> Any | None:
    """The current span if it is recording, else None -- the hot path's only tracing cost."""
    if _context_var is not None:
        span = _context_var.get().get(_SPAN_KEY)
    else:
        span = trace.get_current_span()
    if span is not None and span.is_recording():
        return span
    return None


class Decision(NamedTuple):
    """Why a plan starts the way it does (a named tuple: one is made per recorded plan, and
    a frozen attrs instance costs several times more to build)."""

    keyspace: str | None
    lwt: bool
    replica_count: int
    candidates: str
    """Every candidate in the order they were yielded, as :data:`CANDIDATES_ATTRIBUTE`
    records them."""
    chosen_address: str | None
    chosen_port: int | None
    position: str
    """Where the first host came from, as counted in
    ``AdaptiveLoadBalancingPolicy.decisions_by_position``: ``replica``, ``non_replica`` (a
    non-replica scored best), ``local`` (no replicas: the least-loaded local host),
    ``child`` (no local candidate: the child's plan decided) or ``fallback`` (internal
    error: the child's plan unchanged)."""
    cache_hit: bool | None
    """None: no replica lookup (no routing key) or a tablet lookup (never cached)."""
    fallback: bool
    config_hash: str
    routing_key: bytes | None = None
    """Only set when ``privacy.routing_keys`` allows it."""
    local_rack: str | None = None
    """The client's rack in force (None: none known, no rack penalty)."""
    local_rack_source: str = "unknown"
    """``configured``, ``child``, ``learned`` or ``unknown``."""
    enabled: bool = True
    """False: the ordering was off (``policy.enabled``); the plan is the child's own and its
    first host is the child's first (``position`` ``child``, no candidates)."""
    chosen: str = ""
    """The chosen host's entry, as in :data:`CANDIDATES_ATTRIBUTE` (its reason: in-flight,
    health, penalty, score), or ``address:port`` when it was not a scored candidate; empty
    when the plan is empty."""
    host: Any = None
    """The chosen host itself (the driver's ``Host``): the request span names it as its
    coordinator until another one answers. Not recorded as such."""


def build_decision(
    record: PlanRecord,
    hosts: Sequence[Any],
    working_keyspace: str | None,
    query: Any,
    *,
    non_replica_penalty: float,
    config_hash: str,
    routing_keys: bool,
    pop_transition: Callable[[Any], HealthTransition | None],
    candidates: bool = True,
) -> tuple[Decision, list[tuple[str, dict[str, Any]]]]:
    """The :class:`Decision` of a plan made with ``record`` (a
    :class:`~adaptive_lb.plan.planner.PlanRecord`) that yielded ``hosts``, and the events to add
    beside it: one ``adaptive_lb.health_transition`` per candidate whose health changed
    since it was last shown in a trace (``pop_transition(host)`` hands them over once).
    ``routing_keys``: ``privacy.routing_keys`` allows recording the statement's key.
    ``candidates``: list every candidate (false: the chosen host's entry only)."""
    replicas = record.replicas
    replica_ids = {id(view.host) for view in replicas}
    chosen = hosts[0] if hosts else None
    entries = []
    chosen_entry = ""
    events = []
    for view in record.candidates:
        host = view.host
        if candidates or host is chosen:
            is_replica = id(host) in replica_ids
            # Without a replica set, every candidate is scored as a replica would be.
            entry = candidate_entry(
                view, is_replica, is_replica or not replicas, non_replica_penalty
            )
            if candidates:
                entries.append(entry)
            if host is chosen:
                chosen_entry = entry
        transition = pop_transition(host)
        if transition is not None:
            events.append(
                (
                    "adaptive_lb.health_transition",
                    {
                        "server.address": str(view.host.address),
                        "adaptive_lb.health.from": transition.old.state.value,
                        "adaptive_lb.health.to": transition.new.state.value,
                        "adaptive_lb.health.penalty": transition.new.penalty,
                        "adaptive_lb.health.reason": transition.new.reason,
                    },
                )
            )
    if chosen is not None and not chosen_entry:
        port = getattr(chosen.endpoint, "port", None)
        chosen_entry = f"{chosen.address}:{port}" if port is not None else str(chosen.address)
    keyspace = record.keyspace if record.keyspace is not None else working_keyspace
    # A bound statement computes its key: only when it may be recorded.
    routing_key = getattr(query, "routing_key", None) if routing_keys else None
    # Positional, in field order: a named tuple's keywords cost twice as much.
    decision = Decision(
        keyspace,
        record.lwt,
        len(replicas),  # replica_count
        "; ".join(entries),  # candidates
        str(chosen.address) if chosen is not None else None,  # chosen_address
        getattr(chosen.endpoint, "port", None) if chosen is not None else None,  # chosen_port
        "fallback" if record.fallback else record.position,  # position
        record.cache_hit,
        record.fallback,
        config_hash,
        routing_key,
        record.local_rack,
        record.local_rack_source,
        record.enabled,
        chosen_entry,  # chosen
        chosen,  # host
    )
    return decision, events


class DecisionTracer:
    """Records :class:`Decision` objects on spans, per :class:`TracingConfig`."""

    def __init__(
        self,
        config: TracingConfig,
        privacy: PrivacyConfig,
        tracer_provider: Any | None = None,
    ) -> None:
        self.config = config
        self.privacy = privacy
        self._tracer = trace.get_tracer("adaptive_lb", tracer_provider=tracer_provider)
        self.recorded = 0

    def attributes(self, decision: Decision, on_request: bool = False) -> dict[str, Any]:
        """The attributes of a decision (semantic-convention names where they exist).
        ``on_request``: for the request span's own attributes (which already say
        ``db.system.name`` and ``db.namespace``, and name the chosen host as coordinator
        until another one answers)."""
        attributes: dict[str, Any] = {
            "adaptive_lb.position": decision.position,
            "adaptive_lb.replica_count": decision.replica_count,
            "adaptive_lb.config_hash": decision.config_hash,
            "adaptive_lb.local_rack.source": decision.local_rack_source,
        }
        if not on_request:
            attributes["db.system.name"] = "cassandra"
        # Flags only when raised: each attribute costs the SDK ~0.7 us to check.
        if decision.lwt:
            attributes["adaptive_lb.lwt"] = True
        if decision.fallback:
            attributes["adaptive_lb.fallback"] = True
        if not decision.enabled:
            attributes["adaptive_lb.enabled"] = False
        if decision.local_rack is not None:
            attributes["adaptive_lb.local_rack"] = decision.local_rack
        if decision.keyspace is not None and not on_request:
            attributes["db.namespace"] = decision.keyspace
        if decision.cache_hit is not None:
            attributes["adaptive_lb.replica_cache.hit"] = decision.cache_hit
        if decision.chosen_address is not None and not on_request:
            attributes["server.address"] = decision.chosen_address
            if decision.chosen_port is not None:
                attributes["server.port"] = decision.chosen_port
        candidates = decision.candidates if self.config.attributes else ""
        if candidates:
            attributes[CANDIDATES_ATTRIBUTE] = candidates
        # Each attribute costs the SDK ~5k instructions: the chosen host's entry only when
        # the list does not begin with it.
        if decision.chosen and not candidates.startswith(decision.chosen):
            attributes[CHOSEN_ATTRIBUTE] = decision.chosen
        if self.privacy.routing_keys and decision.routing_key is not None:
            attributes["adaptive_lb.routing_key"] = decision.routing_key.hex()
        return attributes

    def record(
        self,
        span: Any,
        decision: Decision,
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        made_ns: int | None = None,
    ) -> None:
        """Record ``decision`` on ``span`` (event mode) or as a child span of it (span mode);
        ``events`` (e.g. health transitions of candidate hosts) are added alongside.
        ``made_ns``: when the plan began (``time.time_ns()``), the time of the events and
        the start of the child span (default: now)."""
        attributes = self.attributes(decision)
        if self.config.mode == "span":
            context = trace.set_span_in_context(span)
            with self._tracer.start_as_current_span(
                SPAN_NAME, context=context, attributes=attributes, start_time=made_ns
            ) as child:
                for name, event_attributes in events:
                    child.add_event(name, event_attributes, made_ns)
        else:
            span.add_event(EVENT_NAME, attributes, made_ns)
            for name, event_attributes in events:
                span.add_event(name, event_attributes, made_ns)
        self.recorded += 1


Pending = tuple[Any, Decision | None, list[tuple[str, dict[str, Any]]], int]
"""A plan waiting for its request span: ``(statement, decision, events, started_ns)``, the
decision None when ``tracing.ratio`` left it out; ``started_ns`` is when the plan began
(``time.time_ns()``), where the request span starts."""


class DecisionRecorder:
    """Where one policy's decisions go: the tracer (per ``tracing`` config and tracer
    provider), the fraction recorded, and -- with request spans
    (:mod:`adaptive_lb.runtime.request_spans`) -- the hand-over of each plan's decision to the span
    of the request it was made for, since the driver makes the plan before the request
    exists. The policy reads :attr:`tracer`, :attr:`ratio` and :attr:`without_parent` on
    its hot path."""

    def __init__(
        self,
        config: Config,
        tracer_provider: Any | None,
        report_error: Callable[[str, str], None],
    ) -> None:
        self._provider = tracer_provider
        self._config = config
        self._report_error = report_error
        self.tracer: DecisionTracer | None = None
        """None when ``tracing.enabled`` is false."""
        self.ratio = 1.0
        """``tracing.ratio``."""
        self.candidates_ratio = 1.0
        """``tracing.candidates_ratio``."""
        self.without_parent = False
        """Decide even with no span current: the request span will be a root span."""
        self._handoff: threading.local | None = None
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Apply ``config`` (at construction and on reload)."""
        self._config = config
        if config.tracing.enabled:
            self.tracer = DecisionTracer(config.tracing, config.privacy, self._provider)
            self.ratio = config.tracing.ratio
            # tracing.attributes false: no candidate list to build.
            tracing = config.tracing
            self.candidates_ratio = tracing.candidates_ratio if tracing.attributes else 0.0
        else:
            self.tracer = None

    def use_tracer_provider(self, tracer_provider: Any | None) -> None:
        """Record through ``tracer_provider`` from now on (None: the global one)."""
        self._provider = tracer_provider
        self.configure(self._config)

    def send_to_requests(self, enabled: bool, *, without_parent: bool = False) -> None:
        """Hand each decision to its request span instead of recording it on the current
        span; ``without_parent``: decide even when no span is current.
        :func:`adaptive_lb.attach` turns it on with request spans."""
        self._handoff = threading.local() if enabled else None
        self.without_parent = enabled and without_parent

    def deliver(
        self,
        span: Any | None,
        query: Any,
        decision: Decision | None,
        events: list[tuple[str, dict[str, Any]]],
        started_ns: int,
    ) -> None:
        """Record a plan's decision (None: only the plan's start, ``tracing.ratio`` left
        the decision out): handed over for ``query``'s request span when request spans are
        on, else on ``span`` (the current recording span). ``started_ns``: when the plan
        began (``time.time_ns()``), where the request span starts."""
        handoff = self._handoff
        if handoff is not None and query is not None:
            handoff.pending = (query, decision, events, started_ns)
        elif span is not None and decision is not None and self.tracer is not None:
            # Recorded as the plan is made: the span's clock (a wrapper's may be virtual).
            self.tracer.record(span, decision, events)

    def take(self, query: Any) -> Pending | None:
        """The plan just made on this thread for ``query`` (handed over once), or None."""
        handoff = self._handoff
        if handoff is None:
            return None
        pending = getattr(handoff, "pending", None)
        if pending is None or pending[0] is not query:
            return None
        handoff.pending = None
        return pending

    def request_attributes(self, pending: Pending) -> dict[str, Any] | None:
        """The attributes of a decision obtained with :meth:`take`, for its request span to
        start with (None: no decision to record). A failure is counted in the ``tracing``
        stage, never raised."""
        tracer = self.tracer
        decision = pending[1]
        if tracer is None or decision is None:
            return None
        try:
            attributes = tracer.attributes(decision, on_request=True)
        except Exception:
            self._report_error("tracing", "the decision is not recorded on the span")
            return None
        tracer.recorded += 1
        return attributes

    def record_events(self, span: Any, pending: Pending) -> None:
        """Add the events handed over with a decision (health transitions of candidate
        hosts, rare) to its request ``span``, at the plan's time."""
        try:
            for name, attributes in pending[2]:
                span.add_event(name, attributes, pending[3])
        except Exception:
            self._report_error("tracing", "the decision's events are not recorded on the span")
