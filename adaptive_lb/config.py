"""Settings of adaptive-lb as frozen attrs objects.

One YAML file (``config/default.yaml`` documents every key) maps onto :class:`Config`.
Every value is validated at construction, so an object that exists is a valid config.
Durations are stored in seconds (float); lists of what may leave the process are in
:class:`PrivacyConfig` and all off by default.

Loading from YAML (:func:`load_config`, :func:`parse_config`), error reporting with key
paths, file and line, and hot reload (:class:`ConfigWatcher`) live further down.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from attrs import Factory, define, field, validators
from attrs import asdict as attrs_asdict
from attrs import fields as attrs_fields
from attrs import has as attrs_has

_log = logging.getLogger("adaptive_lb.config")

__all__ = [
    "Config",
    "ConfigError",
    "ConfigWatcher",
    "HealthConfig",
    "HealthPenalties",
    "MetricsConfig",
    "OtlpConfig",
    "PolicyConfig",
    "PrivacyConfig",
    "TracingConfig",
    "TrackingConfig",
    "config_from_mapping",
    "config_to_mapping",
    "dump_config",
    "json_schema",
    "load_config",
    "parse_config",
    "parse_duration",
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


def _bound(kind: str, bound: float):
    """A validator ``value <kind> bound``; ``kind`` and ``bound`` stay readable on the
    function so that the JSON Schema can state them."""
    test = {">": float.__gt__, ">=": float.__ge__, "<=": float.__le__}[kind]

    def check(instance, attribute, value):
        if not test(float(value), float(bound)):
            raise ValueError(f"{attribute.name}: must be {kind} {bound}, got {value!r}")

    check.kind = kind  # type: ignore[attr-defined]
    check.bound = bound  # type: ignore[attr-defined]
    return check


def _gt(bound: float):
    return _bound(">", bound)


def _ge(bound: float):
    return _bound(">=", bound)


def _le(bound: float):
    return _bound("<=", bound)


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
        import json

        canonical = json.dumps(attrs_asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- loading

MAX_CONFIG_BYTES = 1024 * 1024
"""Config files larger than this are refused before parsing."""

ENV_VAR = "ADAPTIVE_LB_CONFIG"
"""Names the config file when :func:`load_config` is given none."""

# Keys whose values are durations: a number of seconds, or "250ms", "10s", "2m", "500us".
DURATION_KEYS = frozenset(
    {
        "tracking.window",
        "tracking.latency_min",
        "tracking.latency_max",
        "health.slow_floor",
        "health.slow_start",
        "health.min_state_duration",
        "health.refresh_interval",
        "tracing.otlp.timeout",
    }
)

_DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(us|µs|ms|s|m|h)\s*$")


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string such as ``250ms``, ``10s``, ``2m``."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration (e.g. 250ms, 10s, 2m), got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or value != value:
            raise ValueError(f"must be a non-negative duration, got {value!r}")
        return float(value)
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    raise ValueError(f"must be a duration (e.g. 250ms, 10s, 2m), got {value!r}")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return {int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _nested_class(attribute: Any) -> type | None:
    """The attrs class of a section field (its default factory), or None for a value."""
    default = attribute.default
    if isinstance(default, Factory) and attrs_has(default.factory):
        return default.factory
    return None


class _Structurer:
    """Turns plain YAML data into the attrs classes, collecting every error."""

    def __init__(self, lines: Mapping[str, int], source: str | None) -> None:
        self.errors: list[str] = []
        self.lines = lines
        self.source = source

    def error(self, path: str, message: str) -> None:
        line = self.lines.get(path)
        where = f" (line {line})" if line is not None else ""
        self.errors.append(f"{path}: {message}{where}")

    def build(self, cls: type, data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.error(path or "<top level>", f"must be a mapping, got {_type_name(data)}")
            return None
        known = {a.name: a for a in attrs_fields(cls)}
        values: dict[str, Any] = {}
        ok = True
        for key, raw in data.items():
            key_path = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str) or key not in known:
                close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                valid = ", ".join(sorted(known))
                self.error(key_path, f"unknown key{hint} (valid keys: {valid})")
                ok = False
                continue
            attribute = known[key]
            converted, good = self.value(attribute, raw, key_path)
            if good:
                values[key] = converted
            ok = ok and good
        if not ok:
            return None
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            message = str(exc)
            name, _, reason = message.partition(": ")
            if reason and name in known:
                self.error(f"{path}.{name}" if path else name, reason)
            else:
                self.error(path or "<top level>", message)
            return None

    def value(self, attribute: Any, raw: Any, path: str) -> tuple[Any, bool]:
        nested = _nested_class(attribute)
        if nested is not None:
            built = self.build(nested, raw, path)
            return built, built is not None
        try:
            value = self.scalar(attribute, raw, path)
            if attribute.validator is not None:
                attribute.validator(None, attribute, value)
        except (TypeError, ValueError) as exc:
            message = str(exc)
            prefix = f"{attribute.name}: "
            self.error(path, message[len(prefix) :] if message.startswith(prefix) else message)
            return None, False
        return value, True

    def scalar(self, attribute: Any, raw: Any, path: str) -> Any:
        kind = str(attribute.type)
        if path in DURATION_KEYS:
            return parse_duration(raw)
        if attribute.name == "headers":
            if not isinstance(raw, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
            ):
                raise TypeError(f"must be a mapping of strings to strings, got {raw!r}")
            return dict(raw)
        if kind == "bool":
            if not isinstance(raw, bool):
                raise TypeError(f"must be true or false, got {_type_name(raw)} ({raw!r})")
            return raw
        if kind == "int":
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise TypeError(f"must be an integer, got {_type_name(raw)} ({raw!r})")
            return raw
        if kind == "float":
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise TypeError(f"must be a number, got {_type_name(raw)} ({raw!r})")
            return float(raw)
        if kind == "str":
            if not isinstance(raw, str):
                raise TypeError(f"must be a string, got {_type_name(raw)} ({raw!r})")
            return raw
        if kind == "str | None":
            if raw is not None and not isinstance(raw, str):
                raise TypeError(f"must be a string or null, got {_type_name(raw)} ({raw!r})")
            return raw
        return raw


def _key_lines(text: str) -> dict[str, int]:
    """Line (1-based) of every key path in a YAML document, for error messages."""
    lines: dict[str, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines

    def walk(node: Any, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = getattr(key_node, "value", None)
                if not isinstance(key, str):
                    continue
                key_path = f"{path}.{key}" if path else key
                lines[key_path] = key_node.start_mark.line + 1
                walk(value_node, key_path)

    walk(root, "")
    return lines


def config_from_mapping(data: Any, source: str | None = None, lines=None) -> Config:
    """Build a :class:`Config` from plain data (as YAML gives it). Every problem is
    reported at once in one :class:`ConfigError`."""
    structurer = _Structurer(lines or {}, source)
    config = structurer.build(Config, data, "")
    if structurer.errors or config is None:
        raise ConfigError(structurer.errors or ["invalid configuration"], source=source)
    return config


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse a YAML document into a :class:`Config` (an empty document gives defaults)."""
    if not isinstance(text, str):
        raise ConfigError(f"expected text, got {_type_name(text)}", source=source)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"file is larger than {MAX_CONFIG_BYTES // 1024} KiB: not a config file?",
            source=source,
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"not valid YAML: {where}{problem}", source=source) from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from None
    return config_from_mapping(data, source, _key_lines(text))


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config file at ``path``, or the one ``$ADAPTIVE_LB_CONFIG`` names, or the
    defaults when neither is given."""
    if path is None:
        path = os.environ.get(ENV_VAR) or None
        if path is None:
            return Config()
    source = os.fspath(path)
    try:
        size = os.path.getsize(source)
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"file is {size} bytes, more than {MAX_CONFIG_BYTES // 1024} KiB: "
                "not a config file?",
                source=source,
            )
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", source=source) from None
    return parse_config(text, source)


def config_to_mapping(config: Config) -> dict[str, Any]:
    """Plain data (YAML-able) with every value, defaults included."""
    return attrs_asdict(config)


def dump_config(config: Config) -> str:
    """The config as YAML (round-trips through :func:`parse_config`)."""
    return yaml.safe_dump(config_to_mapping(config), sort_keys=False)


class ConfigWatcher:
    """Polls a config file and calls ``on_change(config)`` when it changes to a valid
    config, or ``on_error(error)`` (and logs) when it changes to an invalid one -- the last
    good config stays in force. A daemon thread; ``stop()`` returns promptly."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_change: Callable[[Config], None],
        on_error: Callable[[ConfigError], None] | None = None,
        interval: float = 1.0,
    ) -> None:
        self.path = os.fspath(path)
        self.on_change = on_change
        self.on_error = on_error
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[Any, ...] | None = None

    def _signature(self) -> tuple[Any, ...] | None:
        try:
            stat = os.stat(self.path)
            with open(self.path, "rb") as handle:
                digest = hashlib.sha256(handle.read(MAX_CONFIG_BYTES + 1)).hexdigest()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size, digest)

    def check(self) -> bool:
        """Look once; True if the file changed (whatever the outcome)."""
        signature = self._signature()
        if signature is None or signature == self._seen:
            return False
        self._seen = signature
        try:
            config = load_config(self.path)
        except ConfigError as exc:
            _log.error(
                "adaptive-lb: config %s rejected, keeping the last good one: %s", self.path, exc
            )
            if self.on_error is not None:
                self.on_error(exc)
            return True
        self.on_change(config)
        return True

    def start(self) -> ConfigWatcher:
        """Start polling (the current content counts as seen)."""
        self._seen = self._signature()
        self._thread = threading.Thread(target=self._run, name="adaptive-lb-config", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:
                _log.exception("adaptive-lb: config watcher error")

    def stop(self) -> None:
        """Stop polling and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ConfigWatcher:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the config file, generated from the attrs classes."""

    def field_schema(attribute: Any, path: str) -> dict[str, Any]:
        nested = _nested_class(attribute)
        if nested is not None:
            return object_schema(nested, path)
        kind = str(attribute.type)
        default = attribute.default
        if isinstance(default, Factory):
            default = default.factory()
        schema: dict[str, Any]
        if path in DURATION_KEYS:
            schema = {
                "anyOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": _DURATION_RE.pattern},
                ],
                "description": "seconds, or a duration such as 250ms, 10s, 2m",
            }
        elif attribute.name == "headers":
            schema = {"type": "object", "additionalProperties": {"type": "string"}}
        else:
            schema = {
                "bool": {"type": "boolean"},
                "int": {"type": "integer"},
                "float": {"type": "number"},
                "str": {"type": "string"},
                "str | None": {"type": ["string", "null"]},
            }.get(kind, {})
        validators_ = attribute.validator
        checks = list(getattr(validators_, "_validators", [validators_]))
        for check in checks:
            kind_ = getattr(check, "kind", None)
            if kind_ == ">":
                schema["exclusiveMinimum"] = check.bound
            elif kind_ == ">=":
                schema["minimum"] = check.bound
            elif kind_ == "<=":
                schema["maximum"] = check.bound
            options = getattr(check, "options", None)
            if options is not None:
                schema["enum"] = list(options)
        schema["default"] = default
        return schema

    def object_schema(cls: type, path: str) -> dict[str, Any]:
        properties = {}
        for attribute in attrs_fields(cls):
            key_path = f"{path}.{attribute.name}" if path else attribute.name
            properties[attribute.name] = field_schema(attribute, key_path)
        schema = {"type": ["object", "null"], "properties": properties}
        schema["additionalProperties"] = False
        if cls.__doc__:
            schema["description"] = " ".join(cls.__doc__.split())
        return schema

    schema = object_schema(Config, "")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "adaptive-lb configuration"
    return schema
