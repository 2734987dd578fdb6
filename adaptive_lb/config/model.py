"""The settings of adaptive-lb: frozen attrs classes, one per section of the YAML file.

Every value is validated at construction (:mod:`.validation`), so an object that exists is
a valid config. Durations are stored in seconds (float). The docstring under each field is
its documentation: the JSON Schema's descriptions and the comments of
``config/default.yaml`` are generated from it (:mod:`.schema`, :mod:`.defaults`).

Imports attrs and the config's errors, structure and validation only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import ClassVar

from attrs import define, field

from adaptive_lb.config.errors import show
from adaptive_lb.config.structure import config_to_mapping
from adaptive_lb.config.validation import (
    boolean,
    duration,
    flagged_paths,
    ge,
    gt,
    integer,
    le,
    number,
    one_of,
    optional_string,
    string,
    string_map,
)


@define(frozen=True, slots=True)
class RackLearningConfig:
    """How ``local_rack: auto`` learns the client's rack from the latency it measures: the
    rack of the local datacenter whose healthy hosts (``health.min_samples`` each) answer
    fastest at the median, by a margin, for a while."""

    margin: float = field(default=0.2, validator=[number, gt(0.0), le(0.9)])
    """A rack is learned when its median latency is at most (1 - margin) x every other
    measured rack's; a learned rack is doubted when another rack beats it by the same
    margin, or when it got slower than when it was learned by that much (the client
    moved)."""
    learn_after: float = duration(1.0, ge(0.0), le(3600.0))
    """How long the same rack must stay the clear fastest before it is learned."""
    relearn_after: float = duration(30.0, ge(0.0), le(86400.0))
    """How long a learned rack must stay in doubt before it is forgotten and learned again
    from fresh measurements (no rack penalty meanwhile): one slow local node, a restart or
    a GC pause never lasts that long in a way that counts (unhealthy hosts are not
    measured); a client moved to another zone does."""


@define(frozen=True, slots=True)
class PolicyConfig:
    """How the candidate list is built and scored (the weighted least-loaded ordering):
    the live local replicas of the routing key, then random live local hosts, each scored
    by its in-flight requests times its penalties."""

    enabled: bool = field(default=True, validator=boolean)
    """Order plans by load and health. false: every plan is exactly the child policy's plan,
    in its order (nothing reordered), while request tracking, health, metrics and decision
    events carry on: an off switch to compare with, flipped by a hot reload, no restart."""
    sample_size: int = field(default=8, validator=[integer, ge(1), le(64)])
    """Most candidates scored per plan: replicas first, then random local hosts."""
    non_local_rack_penalty: float = field(default=4.0, validator=[number, ge(1.0)])
    """Score multiplier for a host outside the local rack (only when a local rack is known:
    ``local_rack`` below -- configured or learned -- or the child policy's, e.g.
    RackAwareRoundRobinPolicy)."""
    rack_proximity_cap: float = field(default=4.0, validator=[number, ge(1.0), le(100.0)])
    """Most a remote rack's penalty is multiplied by for being farther than the nearest
    remote rack. Remote racks are not all alike: at each health refresh the median p50
    latency of each remote rack's hosts is divided by the nearest remote rack's, and the
    rack's penalty is multiplied by that ratio, at most this much (a rack 2.4x as far costs
    2.4x more). Racks without ``health.min_samples`` keep their last factor. 1 turns
    proximity off."""
    non_replica_penalty: float = field(default=12.0, validator=[number, ge(1.0)])
    """Score multiplier for a candidate that is not a replica of the routing key."""
    token_aware: bool = field(default=True, validator=boolean)
    """Resolve the replicas of each statement's routing key (false: no replica preference,
    every candidate is scored as a replica)."""
    lwt_deterministic: bool = field(default=True, validator=boolean)
    """Lightweight transactions (scylla-driver's is_lwt(), or SERIAL / LOCAL_SERIAL reads):
    replicas in ring order, so that every client picks the same Paxos coordinator, unhealthy
    last; no load-based shuffling."""
    replica_cache_size: int = field(default=4096, validator=[integer, ge(0), le(10_000_000)])
    """Entries of the (keyspace, routing key) -> replicas LRU cache; 0 disables it. While it
    answers under 70 % of the lookups (many more distinct keys than entries) it costs more
    than it saves, so it steps aside by itself and is tried again now and then."""
    local_rack: str | None = field(default="auto", validator=optional_string)
    """The client's rack (zone): a rack name; ``auto``: the child policy's ``local_rack`` if
    it has one, else learned from the measured latency (``rack_learning``; until then, no
    rack penalty); null: the child policy's ``local_rack`` if it has one, else none."""
    rack_learning: RackLearningConfig = field(factory=RackLearningConfig)
    """How ``local_rack: auto`` learns the client's rack."""


@define(frozen=True, slots=True)
class TrackingConfig:
    """Per-host statistics: the sliding latency window and its histogram."""

    window: float = duration(10.0, gt(0.0), le(3600.0))
    """Length of the sliding statistics window."""
    intervals: int = field(default=5, validator=[integer, ge(1), le(120)])
    """Number of rotating interval histograms the window is made of."""
    latency_min: float = duration(1e-6, gt(0.0))
    """Lowest latency the histogram distinguishes."""
    latency_max: float = duration(60.0, gt(0.0), le(3600.0))
    """Highest latency the histogram records (larger values are clamped); must be greater
    than ``latency_min``."""
    significant_digits: int = field(default=2, validator=[integer, ge(1), le(5)])
    """HdrHistogram precision (significant decimal digits)."""
    samples_per_host: float = field(default=100.0, validator=[number, ge(0.0), le(1e6)])
    """Requests per local host per second whose attempts are tracked (timed, their outcomes
    recorded) once traffic is thicker: then one request in k is tracked, k from the
    measured rate; below it, every request is. In-flight counts come from the driver and
    need no tracking. 0: every request is tracked, whatever the rate."""

    REMOVED: ClassVar[Mapping[str, str]] = {
        "ewma_alpha": "removed in 0.1.0: nothing read the smoothed latency it weighted "
        "(health and the latency factor read the window's histograms); delete the key",
    }
    """Keys this section had: a file that still sets one is refused with this reason
    (:mod:`.structure`), and ``config/default.yaml`` lists them."""

    def __attrs_post_init__(self) -> None:
        if self.latency_max <= self.latency_min:
            raise ValueError(
                f"latency_max: must be > latency_min ({show(self.latency_min)}), "
                f"got {show(self.latency_max)}"
            )


@define(frozen=True, slots=True)
class HealthPenalties:
    """Score multiplier per health state (WARMING starts at ``warming`` and decays to 1)."""

    healthy: float = field(default=1.0, validator=[number, ge(1.0)])
    """Multiplier of a HEALTHY host."""
    slow: float = field(default=64.0, validator=[number, ge(1.0)])
    """Multiplier of a SLOW host (latency outlier among its peers)."""
    erroring: float = field(default=64.0, validator=[number, ge(1.0)])
    """Multiplier of an ERRORING host (error rate above ``health.error_rate``)."""
    stalled: float = field(default=1024.0, validator=[number, ge(1.0)])
    """Multiplier of a host ERRORING because it stalled (requests in flight, no answer for
    ``health.stall_timeout``): a request sent to it hangs until the client's timeout, so it
    ranks below SLOW and erroring hosts even when they are busier."""
    warming: float = field(default=64.0, validator=[number, ge(1.0)])
    """Multiplier of a host that just came back (decays to 1 over ``health.slow_start``)."""


@define(frozen=True, slots=True)
class ServerLoadConfig:
    """The server's own view of its load (Apache Cassandra 4.0+): every ``interval`` each
    live local host is sent ``SELECT name, active_tasks, active_tasks_limit, pending_tasks,
    blocked_tasks FROM system_views.thread_pools`` (to that host only, through the user's
    session, counted apart from the user's requests), and the queueing other clients cause
    there multiplies its score, damped (docs/design.md, "The server's view of its load").
    Where the table does not exist (ScyllaDB, Cassandra 3.x) the host is not asked again
    until it comes back up (a restart, perhaps an upgrade), and its factor stays 1."""

    enabled: bool = field(default=True, validator=boolean)
    """Read the thread pools and weigh them in the score; false: no read, factor 1."""
    interval: float = duration(2.0, ge(0.5), le(60.0))
    """How often each live local host is read (jittered +/- 25 %, one read outstanding per
    host). A reading older than 3 x this no longer counts."""
    timeout: float = duration(0.5, gt(0.0), le(60.0))
    """How long a read may take; one that has not answered by then is dropped (it judges
    nothing: the probes and the user's requests judge health)."""
    half_life: float = duration(4.0, ge(0.0), le(600.0))
    """Smoothing of the readings over time: a step in a node's queues moves its factor
    halfway in this long (0: the last reading alone)."""
    threshold: float = field(default=0.5, validator=[number, ge(0.0), le(100.0)])
    """Mean excess pressure (a pool's (active + pending + blocked) / its thread limit,
    minus the median of the other local hosts') a client ignores: each client draws its
    own threshold per host, uniform in [0, 2 x this), so that a fleet's response grows
    with the excess instead of every client leaving a node at once."""
    cap: float = field(default=4.0, validator=[number, ge(1.0), le(100.0)])
    """Largest score factor from server load (1: read and show, never weigh)."""


@define(frozen=True, slots=True)
class FleetConfig:
    """A budget for what the whole fleet of clients sends each node of its own (thread-pool
    reads, probes), whatever the fleet size, with no control plane: each client learns how
    many clients share the cluster (the server's ``clients`` table, read rarely) and spaces
    its reads and probes of each node so that the fleet's total stays within the budget
    (docs/design.md, "A fleet's reads and probes")."""

    budget: float = field(default=20.0, validator=[number, ge(0.0), le(100_000.0)])
    """Reads and probes per second one node may receive from the whole fleet: nine tenths
    for the thread-pool reads and probes (a client sends a node at most one of them every
    fleet size / (0.9 x this) seconds, random phase, never more often than
    ``server_load.interval`` and ``probe_interval`` allow), one tenth for the clients-table
    reads. Each costs a node about what a single-row read does (0.5-0.8 ms of CPU measured
    on a small Cassandra 5.0 node: ``benchmarks/own_request_cost.py``). 0: no budget (every
    client reads and probes at its own intervals)."""
    size: int = field(default=0, validator=[integer, ge(0), le(10_000_000)])
    """The number of clients (processes with an adaptive-lb session) sharing the cluster,
    if you know it; 0: learned from the server's ``clients`` table (one row per
    connection: Cassandra 4.0+ ``system_views.clients``, ScyllaDB ``system.clients``)."""
    default_size: int = field(default=1, validator=[integer, ge(1), le(10_000_000)])
    """The fleet size assumed where it cannot be learned (Cassandra 3.x, a node that
    refuses the read, Simulacron unprimed)."""
    clients_interval: float = duration(60.0, ge(0.0), le(86400.0))
    """How often this client reads the clients table of one local node (the node picked at
    random, jittered +/- 25 %; a fleet reads it at most budget / 10 times a second per node,
    spacing it further). Such a read costs the node a DNS lookup per distinct client address
    (Cassandra 4.x, 5.0): read it rarely. 0: never (``default_size`` stands)."""


@define(frozen=True, slots=True)
class LatencyFactorConfig:
    """Between health verdicts, the latency each host shows weighs in its score: a factor
    from the lower confidence bound of how much slower than its peers the host answers,
    raised at once by slow answers and halving with time so that the host is tried again
    (docs/design.md, "The latency factor")."""

    cap: float = field(default=4.0, validator=[number, ge(1.0), le(100.0)])
    """Largest score factor from latency (1: computed and shown, never weighed). A SLOW or
    stalled host's penalty (64-1,024) still dominates it."""
    dead_band: float = field(default=1.25, validator=[number, ge(1.0), le(10.0)])
    """Ratio to its peers' median latency that a host may surely have without a factor:
    the factor is (the surely-slower ratio) / this, at least 1. Absorbs small real
    differences between nodes and the histograms' 1 % resolution."""
    certainty: float = field(default=2.0, validator=[number, ge(0.0), le(10.0)])
    """How sure, in standard errors of its median, a host must be slower than its peers
    before the gap weighs: the factor comes from the lower confidence bound of the gap.
    Lower than ``health.certainty`` (a verdict, 64 x): a factor is proportional and
    decays. With 2 and a cluster log-spread of 0.3, one answer 2.7 x the peers' median
    already counts, ten answers 1.5 x."""
    jitter: float = duration(0.001, ge(0.0), le(1.0))
    """Client-side noise an answer may carry without its host being slower (the process's
    scheduling, its event loop, a garbage collection; seen up to ~1 ms on a busy Python
    client): each side of the gap is at least as uncertain as this noise makes it at that
    side's latency (``ln(1 + jitter / latency)``), and so is a host's median in the SLOW
    verdict from fewer than ``min_samples`` answers. Large on sub-millisecond answers,
    small on slow ones. 0: the measured spread alone."""
    half_life: float = duration(10.0, ge(0.0), le(600.0))
    """How fast the factor decays once the evidence no longer holds it up (the host's
    answers have left the window): it halves in this long, and the host is tried again
    when it reaches 1. Slow answers raise it at once; fast ones bring it down at once. 0:
    no memory beyond the window's evidence."""


@define(frozen=True, slots=True)
class HealthConfig:
    """When a host counts as SLOW, ERRORING or WARMING, and what that costs it."""

    percentile: float = field(default=99.0, validator=[number, gt(0.0), le(100.0)])
    """Latency percentile compared between a host and its peers, against the peers' median
    of the same. Peers are the hosts at a comparable distance from this client: the other
    hosts of its rack when at least two of them have ``min_samples``, else of its
    datacenter, each moved by the difference of the two racks' measured distances."""
    outlier_factor: float = field(default=2.0, validator=[number, gt(1.0)])
    """SLOW when the host's percentile exceeds this multiple of its peers' median (its
    peers: the hosts at a comparable distance from this client, see ``percentile``)."""
    slow_floor: float = duration(0.002, ge(0.0))
    """...and exceeds this absolute latency."""
    error_rate: float = field(default=0.25, validator=[number, gt(0.0), le(1.0)])
    """ERRORING when (errors + timeouts) / requests in the window exceeds this."""
    min_samples: int = field(default=50, validator=[integer, ge(1)])
    """Requests (latency samples, for SLOW) in the window from which the tail rules judge a
    host (its ``percentile`` against its peers', its error rate against ``error_rate``).
    With fewer, a verdict needs evidence in proportion to the gap (see ``certainty``)."""
    certainty: float = field(default=3.0, validator=[number, ge(1.0), le(10.0)])
    """How sure the evidence must be, in standard errors, for a verdict from fewer than
    ``min_samples`` answers: SLOW when the host's median latency exceeds
    ``outlier_factor`` x its peers' by this many standard errors (50 ms among peers at
    1 ms: 3 answers; 3 ms: 22), ERRORING when the lower bound of its error rate exceeds
    ``error_rate`` (4 failures in 4 requests). Higher: slower to judge, fewer mistakes."""
    slow_start: float = duration(10.0, ge(0.0))
    """WARMING: how long a returning host's penalty takes to decay from
    ``penalties.warming`` to 1, so that its share of traffic ramps up linearly."""
    recovery_factor: float = field(default=0.8, validator=[number, gt(0.0), le(1.0)])
    """Hysteresis: leave SLOW / ERRORING only below this fraction of the entry threshold
    (for SLOW, without the client's own lateness the entry threshold adds)."""
    min_state_duration: float = duration(1.0, ge(0.0))
    """Hysteresis: how long a host stays in a state before it may leave it."""
    refresh_interval: float = duration(0.2, ge(0.01), le(60.0))
    """How often health is refreshed (percentiles are computed only then)."""
    stall_timeout: float = duration(2.0, ge(0.0))
    """ERRORING when requests are in flight on the host and it has answered none of them
    (a timeout is not an answer) for this long, counted in the client's own running time
    (a pause of the client itself is not the host's): a stalled node (long GC pause, hung
    process). 0 disables."""
    probe_interval: float = duration(1.0, ge(0.0), le(60.0))
    """Active probes: how often, at most, a host that is stalled, erroring, returning from
    a stall, SLOW, suspected (a failure or requests in flight without an answer) or without
    a fresh answer for 2 x this long is sent a probe of adaptive-lb's own
    (``SELECT release_version FROM system.local``, to that host only), jittered by
    +/- 25 %, one outstanding per host. A stalled or erroring host then gets no user
    request until a probe answers. Probes go out only while request tracking is attached
    (``attach`` / ``instrument``). 0 disables them: a stalled or erroring host is tried
    again with one user request (10 for errors) once its hold is over."""
    probe_timeout: float = duration(0.5, gt(0.0), le(60.0))
    """How long a probe may take: one that has not answered by then has failed, and makes
    its host ERRORING (stalled) if it was not already. Keep it well below the client's
    request timeout."""
    max_rack_distance: float = duration(0.005, ge(0.0), le(1.0))
    """Most a rack's measured distance may excuse when a host is judged against the hosts
    of other racks: a rack measured farther than the nearest rack of its datacenter by
    more than this counts as this far. A rack of one host that is slow from its start
    cannot be told apart from a far rack by latency alone; zones of one region are
    0.5-2 ms apart, so a gap beyond this is slowness, and the host is still judged."""
    penalties: HealthPenalties = field(factory=HealthPenalties)
    """Score multiplier per health state."""
    server_load: ServerLoadConfig = field(factory=ServerLoadConfig)
    """The server's own view of its load (Cassandra 4.0+ thread pools) in the score."""
    fleet: FleetConfig = field(factory=FleetConfig)
    """The fleet's budget of thread-pool reads and probes per node."""
    latency_factor: LatencyFactorConfig = field(factory=LatencyFactorConfig)
    """The latency each host shows, in proportion to the evidence, in the score."""


@define(frozen=True, slots=True)
class OtlpConfig:
    """Where traces go: where ``adaptive_lb.exporters.setup_tracing`` sends spans (OTLP,
    e.g. to Jaeger)."""

    endpoint: str | None = field(default=None, validator=optional_string)
    """OTLP receiver, e.g. http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318/v1/traces
    (http); null: no exporter."""
    protocol: str = field(default="grpc", validator=one_of("grpc", "http"))
    """OTLP transport."""
    headers: dict[str, str] = field(factory=dict, validator=string_map, metadata={"secret": True})
    """Extra headers sent with every export (e.g. authentication)."""
    timeout: float = duration(10.0, gt(0.0))
    """Export timeout."""
    service_name: str = field(default="adaptive-lb", validator=string)
    """OpenTelemetry ``service.name`` of the spans."""


@define(frozen=True, slots=True)
class TracingConfig:
    """Decision tracing (OpenTelemetry)."""

    enabled: bool = field(default=True, validator=boolean)
    """Record decisions on the current OpenTelemetry span when one is recording."""
    mode: str = field(default="event", validator=one_of("event", "span"))
    """``event``: an ``adaptive_lb.decision`` event on the current span; ``span``: a child
    span ``adaptive_lb.query_plan`` per decision. With request spans (below) the decision
    is the request span's own attributes instead."""
    ratio: float = field(default=1.0, validator=[number, ge(0.0), le(1.0)])
    """Fraction of decisions recorded (when a span is recording)."""
    attributes: bool = field(default=True, validator=boolean)
    """List every candidate (address, in-flight, health, penalty, score) in
    ``adaptive_lb.candidates``; false: the chosen host only (``adaptive_lb.chosen``)."""
    candidates_ratio: float = field(default=1.0, validator=[number, ge(0.0), le(1.0)])
    """Fraction of the recorded decisions that list every candidate. Every recorded
    decision names the chosen host and why (``adaptive_lb.chosen``: its in-flight, health,
    penalty and score) and the request span its coordinator; 1: every one explains its
    choice against all candidates; e.g. 0.1: one in ten does, for a cheaper trace."""
    request_spans: bool = field(default=True, validator=boolean)
    """With ``adaptive_lb.attach``: one CLIENT span per request (OpenTelemetry database
    conventions), from first send to final answer, retries and speculative executions as
    ``adaptive_lb.attempt`` events, the decision on it. Made when a span records in the
    caller's context, or for every request when adaptive-lb has a tracer provider of its
    own (``otlp.endpoint`` below, or a recording global one)."""
    otlp: OtlpConfig = field(factory=OtlpConfig)
    """Where traces go."""


@define(frozen=True, slots=True)
class MetricsConfig:
    """Prometheus and OpenTelemetry metrics."""

    prometheus_enabled: bool = field(default=False, validator=boolean)
    """Serve Prometheus metrics (computed at scrape time from ``policy.snapshot()``)."""
    bind_address: str = field(default="127.0.0.1", validator=string)
    """Address of the Prometheus endpoint: loopback unless you mean otherwise."""
    port: int = field(default=9464, validator=[integer, ge(0), le(65535)])
    """Port of the Prometheus endpoint (0: any free port)."""
    port_count: int = field(default=1, validator=[integer, ge(1), le(1024)])
    """Ports from ``port`` on (up to 65535) that this process may serve on: it takes the
    first free one. One per worker of a pre-fork server (gunicorn, uwsgi), each worker's endpoint
    scraped as a target of its own (docs/deployment.md)."""
    required: bool = field(default=False, validator=boolean)
    """What attach does when no port is free: false, log a WARNING and route and track
    without ``/metrics`` (a worker is never left without adaptive routing for want of a
    port); true, raise ``ConfigError`` and start nothing."""
    otel_enabled: bool = field(default=False, validator=boolean)
    """Publish the same numbers as OpenTelemetry observable instruments."""


@define(frozen=True, slots=True)
class ReloadConfig:
    """Hot reload of this file by ``adaptive_lb.attach(session, "file.yaml")`` (or the file
    ``$ADAPTIVE_LB_CONFIG`` names). A config given as an object has no file: nothing is
    watched."""

    enabled: bool = field(default=True, validator=boolean)
    """Watch the file and apply each valid change (an invalid one is logged and the last
    good config stays). Applies to policy, tracking, health, tracing and privacy settings
    and to this section; a change to ``metrics`` or ``tracing.otlp`` is logged as a WARNING
    and waits for the next attach (a restart). false: the file is read once, at attach;
    written into a watched file, it stops the watching."""
    interval: float = duration(1.0, gt(0.0), le(3600.0))
    """How often the file is checked for a change."""


@define(frozen=True, slots=True)
class PrivacyConfig:
    """What may leave the process in traces, metrics and logs. Everything off by default."""

    routing_keys: bool = field(default=False, validator=boolean)
    """Routing keys (hex) on decision events."""
    statement_text: bool = field(default=False, validator=boolean)
    """Statement text."""
    bound_values: bool = field(default=False, validator=boolean)
    """Bound values."""


@define(frozen=True, slots=True)
class Config:
    """The whole configuration of adaptive-lb."""

    policy: PolicyConfig = field(factory=PolicyConfig)
    """Candidate choice and scoring."""
    tracking: TrackingConfig = field(factory=TrackingConfig)
    """Per-host statistics window."""
    health: HealthConfig = field(factory=HealthConfig)
    """Health model and penalties."""
    tracing: TracingConfig = field(factory=TracingConfig)
    """Decision tracing."""
    metrics: MetricsConfig = field(factory=MetricsConfig)
    """Prometheus and OpenTelemetry metrics."""
    privacy: PrivacyConfig = field(factory=PrivacyConfig)
    """What may leave the process."""
    reload: ReloadConfig = field(factory=ReloadConfig)
    """Hot reload of the config file."""

    @property
    def hash(self) -> str:
        """A short content hash (12 hex digits): equal configs have equal hashes."""
        canonical = json.dumps(config_to_mapping(self), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


DURATION_KEYS = flagged_paths(Config, "duration")
"""Key paths whose values are durations: seconds, or ``250ms``, ``10s``, ``2m``, ``500us``."""
SECRET_KEYS = flagged_paths(Config, "secret")
"""Key paths of the fields holding secrets (see :func:`.errors.is_secret`)."""
