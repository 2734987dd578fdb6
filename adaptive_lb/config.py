"""Settings of adaptive-lb as frozen attrs objects.

One YAML file (``config/default.yaml`` documents every key) maps onto :class:`Config`.
Every value is validated at construction, so an object that exists is a valid config.
Durations are stored in seconds (float); lists of what may leave the process are in
:class:`PrivacyConfig` and all off by default.

Loading from YAML, error reporting with key paths and hot reload live further down in
this module (see :func:`load_config`).
"""

from __future__ import annotations

from attrs import define, field, validators

__all__ = [
    "Config",
    "ConfigError",
    "HealthConfig",
    "HealthPenalties",
    "MetricsConfig",
    "OtlpConfig",
    "PolicyConfig",
    "PrivacyConfig",
    "TracingConfig",
    "TrackingConfig",
]


class ConfigError(ValueError):
    """An invalid configuration. ``errors`` lists every problem found, one string each,
    each naming the key path, the value and the reason."""

    def __init__(self, errors: list[str] | str, *, source: str | None = None) -> None:
        self.errors: list[str] = [errors] if isinstance(errors, str) else list(errors)
        self.source = source
        prefix = f"{source}: " if source else ""
        if len(self.errors) == 1:
            message = prefix + self.errors[0]
        else:
            message = prefix + f"{len(self.errors)} errors:\n  " + "\n  ".join(self.errors)
        super().__init__(message)


def _gt(bound: float):
    def check(instance, attribute, value):
        if not value > bound:
            raise ValueError(f"{attribute.name}: must be > {bound}, got {value!r}")

    return check


def _ge(bound: float):
    def check(instance, attribute, value):
        if not value >= bound:
            raise ValueError(f"{attribute.name}: must be >= {bound}, got {value!r}")

    return check


def _le(bound: float):
    def check(instance, attribute, value):
        if not value <= bound:
            raise ValueError(f"{attribute.name}: must be <= {bound}, got {value!r}")

    return check


def _number(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name}: must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{attribute.name}: must be a finite number, got {value!r}")


def _integer(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name}: must be an integer, got {value!r}")


def _boolean(instance, attribute, value):
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name}: must be true or false, got {value!r}")


@define(frozen=True, slots=True)
class PolicyConfig:
    """How the candidate list is built and scored (the weighted least-loaded ordering)."""

    sample_size: int = field(default=8, validator=[_integer, _ge(1), _le(64)])
    """Most candidates scored per plan: replicas first, then random local hosts."""
    non_local_rack_penalty: float = field(default=4.0, validator=[_number, _ge(1.0)])
    """Score multiplier for a host outside the local rack (only when a local rack is known)."""
    non_replica_penalty: float = field(default=12.0, validator=[_number, _ge(1.0)])
    """Score multiplier for a candidate that is not a replica of the routing key."""
    token_aware: bool = field(default=True, validator=_boolean)
    """Resolve replicas of the routing key (false: every candidate is scored as a replica)."""
    lwt_deterministic: bool = field(default=True, validator=_boolean)
    """LWT statements: replicas in ring order (unhealthy last), no load-based shuffling."""
    replica_cache_size: int = field(default=4096, validator=[_integer, _ge(0), _le(10_000_000)])
    """Entries of the (keyspace, routing key) -> replicas LRU cache; 0 disables it."""
    local_rack: str | None = field(
        default=None, validator=validators.optional(validators.instance_of(str))
    )
    """The client's rack; default: the child policy's ``local_rack`` if it has one."""


@define(frozen=True, slots=True)
class TrackingConfig:
    """Per-host statistics: the sliding latency window and its histogram."""

    window: float = field(default=10.0, validator=[_number, _gt(0.0), _le(3600.0)])
    """Length of the sliding window, seconds."""
    intervals: int = field(default=5, validator=[_integer, _ge(1), _le(120)])
    """Number of rotating interval histograms the window is made of."""
    latency_min: float = field(default=1e-6, validator=[_number, _gt(0.0)])
    """Lowest latency the histogram distinguishes, seconds."""
    latency_max: float = field(default=60.0, validator=[_number, _gt(0.0), _le(3600.0)])
    """Highest latency the histogram records (larger values are clamped), seconds."""
    significant_digits: int = field(default=2, validator=[_integer, _ge(1), _le(5)])
    """HdrHistogram precision."""
    ewma_alpha: float = field(default=0.1, validator=[_number, _gt(0.0), _le(1.0)])
    """Weight of the newest sample in the smoothed latency."""

    def __attrs_post_init__(self) -> None:
        if self.latency_max <= self.latency_min:
            raise ValueError(
                f"latency_max: must be > latency_min ({self.latency_min}), got {self.latency_max}"
            )


@define(frozen=True, slots=True)
class HealthPenalties:
    """Score multiplier per health state (WARMING starts at ``warming`` and decays to 1)."""

    healthy: float = field(default=1.0, validator=[_number, _ge(1.0)])
    slow: float = field(default=64.0, validator=[_number, _ge(1.0)])
    erroring: float = field(default=64.0, validator=[_number, _ge(1.0)])
    warming: float = field(default=64.0, validator=[_number, _ge(1.0)])


@define(frozen=True, slots=True)
class HealthConfig:
    """When a host counts as SLOW, ERRORING or WARMING, and what that costs it."""

    percentile: float = field(default=99.0, validator=[_number, _gt(0.0), _le(100.0)])
    """Latency percentile compared against the local peers' median of the same."""
    outlier_factor: float = field(default=3.0, validator=[_number, _gt(1.0)])
    """SLOW when the percentile exceeds this multiple of the peers' median."""
    slow_floor: float = field(default=0.002, validator=[_number, _ge(0.0)])
    """...and exceeds this absolute latency, seconds."""
    error_rate: float = field(default=0.25, validator=[_number, _gt(0.0), _le(1.0)])
    """ERRORING when (errors + timeouts) / requests in the window exceeds this."""
    min_samples: int = field(default=50, validator=[_integer, _ge(1)])
    """Requests in the window below which no verdict is given."""
    slow_start: float = field(default=10.0, validator=[_number, _ge(0.0)])
    """Seconds over which a returning host's penalty decays from ``penalties.warming`` to 1."""
    recovery_factor: float = field(default=0.8, validator=[_number, _gt(0.0), _le(1.0)])
    """Hysteresis: leave SLOW/ERRORING only below this fraction of the entry threshold."""
    min_state_duration: float = field(default=1.0, validator=[_number, _ge(0.0)])
    """Hysteresis: seconds a host stays in a state before it may leave it."""
    refresh_interval: float = field(default=0.2, validator=[_number, _ge(0.01), _le(60.0)])
    """Seconds between health refreshes (percentiles are computed only then)."""
    penalties: HealthPenalties = field(factory=HealthPenalties)


@define(frozen=True, slots=True)
class OtlpConfig:
    """Where traces go."""

    endpoint: str | None = field(
        default=None, validator=validators.optional(validators.instance_of(str))
    )
    protocol: str = field(default="grpc", validator=validators.in_(("grpc", "http")))
    headers: dict[str, str] = field(factory=dict)
    timeout: float = field(default=10.0, validator=[_number, _gt(0.0)])
    service_name: str = field(default="adaptive-lb", validator=validators.instance_of(str))


@define(frozen=True, slots=True)
class TracingConfig:
    """Decision tracing (OpenTelemetry)."""

    enabled: bool = field(default=True, validator=_boolean)
    mode: str = field(default="event", validator=validators.in_(("event", "span")))
    """``event``: an event on the current span; ``span``: a child span per decision."""
    ratio: float = field(default=1.0, validator=[_number, _ge(0.0), _le(1.0)])
    """Fraction of decisions recorded (when a span is recording)."""
    attributes: bool = field(default=True, validator=_boolean)
    """Attach candidate arrays and scores (false: chosen host only)."""
    otlp: OtlpConfig = field(factory=OtlpConfig)


@define(frozen=True, slots=True)
class MetricsConfig:
    """Prometheus and OpenTelemetry metrics."""

    prometheus_enabled: bool = field(default=False, validator=_boolean)
    bind_address: str = field(default="127.0.0.1", validator=validators.instance_of(str))
    port: int = field(default=9464, validator=[_integer, _ge(0), _le(65535)])
    otel_enabled: bool = field(default=False, validator=_boolean)


@define(frozen=True, slots=True)
class PrivacyConfig:
    """What may leave the process. Everything off by default."""

    routing_keys: bool = field(default=False, validator=_boolean)
    statement_text: bool = field(default=False, validator=_boolean)
    bound_values: bool = field(default=False, validator=_boolean)


@define(frozen=True, slots=True)
class Config:
    """The whole configuration of adaptive-lb."""

    policy: PolicyConfig = field(factory=PolicyConfig)
    tracking: TrackingConfig = field(factory=TrackingConfig)
    health: HealthConfig = field(factory=HealthConfig)
    tracing: TracingConfig = field(factory=TracingConfig)
    metrics: MetricsConfig = field(factory=MetricsConfig)
    privacy: PrivacyConfig = field(factory=PrivacyConfig)

    @property
    def hash(self) -> str:
        """A short content hash (12 hex digits): equal configs have equal hashes."""
        import hashlib
        import json

        from attrs import asdict

        canonical = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]
