"""Settings of adaptive-lb as frozen attrs objects.

One YAML file (``config/default.yaml`` documents every key) maps onto :class:`Config`.
Every value is validated at construction, so an object that exists is a valid config.
Durations are stored in seconds (float); lists of what may leave the process are in
:class:`PrivacyConfig` and all off by default.

Loading from YAML (:func:`load_config`, :func:`parse_config`), error reporting with key
paths, file and line, and hot reload (:class:`ConfigWatcher`) live further down.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import inspect
import itertools
import json
import logging
import math
import operator
import os
import re
import reprlib
import textwrap
import threading
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from attrs import Attribute, Factory, define, field
from attrs import fields as attrs_fields
from attrs import has as attrs_has

_log = logging.getLogger("adaptive_lb.config")

__all__ = [
    "ENV_VAR",
    "MAX_CONFIG_BYTES",
    "MAX_ERRORS",
    "MAX_NESTING",
    "MAX_NODES",
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

MAX_CONFIG_BYTES = 1024 * 1024
"""Config files larger than this are refused before parsing."""

ENV_VAR = "ADAPTIVE_LB_CONFIG"
"""Names the config file when :func:`load_config` is given none."""

MAX_NESTING = 16
"""Deepest nesting of values in a config file, counting the top mapping (a real file needs 4)."""

MAX_NODES = 10_000
"""Most values (scalars, mappings, lists) in a config file (the full file has about 70), each
key a merge key (``<<``) copies counted too (20 nested ``<<: [*a, *a]`` copy a million)."""

MAX_ERRORS = 100
"""Most errors listed in one :class:`ConfigError` (then a count of the rest)."""


class ConfigError(ValueError):
    """An invalid configuration. ``errors`` lists every problem found, one string each,
    each naming the key path, the value and the reason."""

    def __init__(
        self, errors: list[str] | str, *, source: str | None = None, total: int | None = None
    ) -> None:
        errors = [errors] if isinstance(errors, str) else errors  # words of 100+ characters cut
        self.errors = [re.sub(r"([^\s.,:]{60})[^\s.,:]{40,}", r"\1...", e) for e in errors]
        self.source = source
        self.total = len(self.errors) if total is None else total
        """How many problems were found (``errors`` may list only the first ones)."""
        prefix = f"{source}: " if source else ""
        if len(self.errors) == 1:
            message = prefix + self.errors[0]
        else:
            message = prefix + f"{self.total} errors:\n  " + "\n  ".join(self.errors)
        super().__init__(message)


# --------------------------------------------------------------------------- validators

_SECRET_NAME = re.compile(
    r"(?:secret|passw(?:or)?d|pwd|token|credential|cookie|auth\w*"
    r"|(?:api|access|private|client|signing|secret)[-_ ]?key)s?(?![\w-])",
    re.IGNORECASE,
)


def _is_secret(path: str) -> bool:
    """Whether the value at a key path is secret (no message shows it, nor keys below it):
    the path is or is under a field marked ``secret`` (:data:`SECRET_KEYS`: header values),
    or a key on it is secret-like. A key is when, in its last 40 characters and in any case,
    secret, password, passwd, pwd, token, credential, cookie, auth + letters/digits/_
    (Authorization, OAuth) or api/access/private/client/signing/secret + key (``api_key``,
    ``apiKey``, ``X-API-Key``), plural s optional, is followed by no letter, digit, _ or -:
    the last word decides, ``token_aware``, ``password_file``, ``routing_keys`` are not."""
    under = f"{path}.".startswith(tuple(f"{key}." for key in SECRET_KEYS))
    return under or any(_SECRET_NAME.search(key[-40:]) for key in path.split("."))


# Values in messages are shown through reprlib: a hostile document (a YAML alias bomb) makes
# structures whose full repr would be exponentially large.
_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 2
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 4


def _show(value: Any) -> str:
    """A short, readable rendering of a value for an error message (2.0 shows as 2)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = _repr.repr(value)  # hidden: a mapping with a secret-like key in it, say
    return "value hidden" if not isinstance(value, str) and _SECRET_NAME.search(text) else text


def _bound(kind: str, bound: float) -> Callable[[Any, Attribute, Any], None]:
    """A validator ``value <kind> bound``; ``kind`` and ``bound`` stay readable on the
    function so that the JSON Schema can state them."""
    compare = {">": operator.gt, ">=": operator.ge, "<=": operator.le}[kind]

    def check(instance: Any, attribute: Attribute, value: Any) -> None:
        # Compared as given (no float()): Python compares huge ints with floats exactly.
        if not compare(value, bound):
            raise ValueError(f"{attribute.name}: must be {kind} {_show(bound)}, got {_show(value)}")

    check.kind = kind  # type: ignore[attr-defined]
    check.bound = bound  # type: ignore[attr-defined]
    return check


def _gt(bound: float) -> Callable[[Any, Attribute, Any], None]:
    return _bound(">", bound)


def _ge(bound: float) -> Callable[[Any, Attribute, Any], None]:
    return _bound(">=", bound)


def _le(bound: float) -> Callable[[Any, Attribute, Any], None]:
    return _bound("<=", bound)


def _number(instance: Any, attribute: Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name}: must be a number, got {_show(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(f"{attribute.name}: must be a finite number, got {_show(value)}")


def _integer(instance: Any, attribute: Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name}: must be an integer, got {_show(value)}")


def _boolean(instance: Any, attribute: Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name}: must be true or false, got {_show(value)}")


def _string(instance: Any, attribute: Attribute, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name}: must be a string, got {_show(value)}")


def _optional_string(instance: Any, attribute: Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{attribute.name}: must be a string or null, got {_show(value)}")


def _string_map_problem(value: Any) -> str | None:
    """Why ``value`` is not a mapping of strings to strings (None if it is): the bad entries'
    names and value types, never a value (header values are credentials)."""
    if not isinstance(value, Mapping):
        return f"got {_type_name(value)} (value hidden)"
    bad = [f"{_show(k)}: {_type_name(v)}" for k, v in value.items() if not isinstance(v, str)]
    bad += [f"{_show(k)} (a name)" for k in value if not isinstance(k, str)]
    return f"got {', '.join(bad[:4])}{' ...' if bad[4:] else ''} (value hidden)" if bad else None


def _string_map(instance: Any, attribute: Attribute, value: Any) -> None:
    problem = _string_map_problem(value)
    if problem is not None:
        raise TypeError(f"{attribute.name}: must be a mapping of strings to strings, {problem}")


def _one_of(*options: str) -> Callable[[Any, Attribute, Any], None]:
    """A validator ``value in options`` (``options`` readable for the JSON Schema)."""

    def check(instance: Any, attribute: Attribute, value: Any) -> None:
        if not isinstance(value, str) or value not in options:
            choices = ", ".join(options)
            raise ValueError(f"{attribute.name}: must be one of {choices}, got {_show(value)}")

    check.options = options  # type: ignore[attr-defined]
    return check


def _duration(default: float, *checks: Callable[[Any, Attribute, Any], None]) -> Any:
    """A field holding seconds; in YAML also written ``250ms``, ``10s``, ``2m``..."""
    return field(default=default, validator=[_number, *checks], metadata={"duration": True})


# --------------------------------------------------------------------------- the model


@define(frozen=True, slots=True)
class PolicyConfig:
    """How the candidate list is built and scored (the weighted least-loaded ordering)."""

    sample_size: int = field(default=8, validator=[_integer, _ge(1), _le(64)])
    """Most candidates scored per plan: replicas first, then random local hosts."""
    non_local_rack_penalty: float = field(default=4.0, validator=[_number, _ge(1.0)])
    """Score multiplier for a host outside the local rack (only when a local rack is known)."""
    rack_proximity_cap: float = field(default=4.0, validator=[_number, _ge(1.0), _le(100.0)])
    """Most a remote rack's penalty is multiplied by for being farther than the nearest
    remote rack (ratio of the racks' median p50 latencies, measured at health refresh);
    1 turns proximity off."""
    non_replica_penalty: float = field(default=12.0, validator=[_number, _ge(1.0)])
    """Score multiplier for a candidate that is not a replica of the routing key."""
    token_aware: bool = field(default=True, validator=_boolean)
    """Resolve replicas of the routing key (false: every candidate is scored as a replica)."""
    lwt_deterministic: bool = field(default=True, validator=_boolean)
    """LWT statements: replicas in ring order (unhealthy last), no load-based shuffling."""
    replica_cache_size: int = field(default=4096, validator=[_integer, _ge(0), _le(10_000_000)])
    """Entries of the (keyspace, routing key) -> replicas LRU cache; 0 disables it."""
    local_rack: str | None = field(default=None, validator=_optional_string)
    """The client's rack; default: the child policy's ``local_rack`` if it has one."""


@define(frozen=True, slots=True)
class TrackingConfig:
    """Per-host statistics: the sliding latency window and its histogram."""

    window: float = _duration(10.0, _gt(0.0), _le(3600.0))
    """Length of the sliding window, seconds."""
    intervals: int = field(default=5, validator=[_integer, _ge(1), _le(120)])
    """Number of rotating interval histograms the window is made of."""
    latency_min: float = _duration(1e-6, _gt(0.0))
    """Lowest latency the histogram distinguishes, seconds."""
    latency_max: float = _duration(60.0, _gt(0.0), _le(3600.0))
    """Highest latency the histogram records (larger values are clamped), seconds; must be
    greater than ``latency_min``."""
    significant_digits: int = field(default=2, validator=[_integer, _ge(1), _le(5)])
    """HdrHistogram precision."""
    ewma_alpha: float = field(default=0.1, validator=[_number, _gt(0.0), _le(1.0)])
    """Weight of the newest sample in the smoothed latency."""

    def __attrs_post_init__(self) -> None:
        if self.latency_max <= self.latency_min:
            raise ValueError(
                f"latency_max: must be > latency_min ({_show(self.latency_min)}), "
                f"got {_show(self.latency_max)}"
            )


@define(frozen=True, slots=True)
class HealthPenalties:
    """Score multiplier per health state (WARMING starts at ``warming`` and decays to 1)."""

    healthy: float = field(default=1.0, validator=[_number, _ge(1.0)])
    """Multiplier of a HEALTHY host."""
    slow: float = field(default=64.0, validator=[_number, _ge(1.0)])
    """Multiplier of a SLOW host (latency outlier among its peers)."""
    erroring: float = field(default=64.0, validator=[_number, _ge(1.0)])
    """Multiplier of an ERRORING host (error rate above ``health.error_rate``)."""
    warming: float = field(default=64.0, validator=[_number, _ge(1.0)])
    """Multiplier of a host that just came back (decays to 1 over ``health.slow_start``)."""


@define(frozen=True, slots=True)
class HealthConfig:
    """When a host counts as SLOW, ERRORING or WARMING, and what that costs it."""

    percentile: float = field(default=99.0, validator=[_number, _gt(0.0), _le(100.0)])
    """Latency percentile compared against the local peers' median of the same."""
    outlier_factor: float = field(default=3.0, validator=[_number, _gt(1.0)])
    """SLOW when the percentile exceeds this multiple of the peers' median."""
    slow_floor: float = _duration(0.002, _ge(0.0))
    """...and exceeds this absolute latency, seconds."""
    error_rate: float = field(default=0.25, validator=[_number, _gt(0.0), _le(1.0)])
    """ERRORING when (errors + timeouts) / requests in the window exceeds this."""
    min_samples: int = field(default=50, validator=[_integer, _ge(1)])
    """Requests in the window below which no verdict is given."""
    slow_start: float = _duration(10.0, _ge(0.0))
    """Seconds over which a returning host's penalty decays from ``penalties.warming`` to 1."""
    recovery_factor: float = field(default=0.8, validator=[_number, _gt(0.0), _le(1.0)])
    """Hysteresis: leave SLOW/ERRORING only below this fraction of the entry threshold."""
    min_state_duration: float = _duration(1.0, _ge(0.0))
    """Hysteresis: seconds a host stays in a state before it may leave it."""
    refresh_interval: float = _duration(0.2, _ge(0.01), _le(60.0))
    """Seconds between health refreshes (percentiles are computed only then)."""
    stall_timeout: float = _duration(2.0, _ge(0.0))
    """ERRORING when requests are in flight on the host and it has answered none of them
    (a timeout is not an answer) for this long: a stalled node (long GC pause, hung
    process). 0 disables."""
    penalties: HealthPenalties = field(factory=HealthPenalties)
    """Score multiplier per health state."""


@define(frozen=True, slots=True)
class OtlpConfig:
    """Where traces go."""

    endpoint: str | None = field(default=None, validator=_optional_string)
    """OTLP receiver, e.g. http://127.0.0.1:4317 (grpc); null: no exporter."""
    protocol: str = field(default="grpc", validator=_one_of("grpc", "http"))
    """OTLP transport."""
    headers: dict[str, str] = field(factory=dict, validator=_string_map, metadata={"secret": True})
    """Extra headers sent with every export (e.g. authentication)."""
    timeout: float = _duration(10.0, _gt(0.0))
    """Export timeout, seconds."""
    service_name: str = field(default="adaptive-lb", validator=_string)
    """OpenTelemetry ``service.name`` of the spans."""


@define(frozen=True, slots=True)
class TracingConfig:
    """Decision tracing (OpenTelemetry)."""

    enabled: bool = field(default=True, validator=_boolean)
    """Record decisions on the current span when one is recording."""
    mode: str = field(default="event", validator=_one_of("event", "span"))
    """``event``: an event on the current span; ``span``: a child span per decision."""
    ratio: float = field(default=1.0, validator=[_number, _ge(0.0), _le(1.0)])
    """Fraction of decisions recorded (when a span is recording)."""
    attributes: bool = field(default=True, validator=_boolean)
    """Attach candidate arrays and scores (false: chosen host only)."""
    otlp: OtlpConfig = field(factory=OtlpConfig)
    """Where traces go."""


@define(frozen=True, slots=True)
class MetricsConfig:
    """Prometheus and OpenTelemetry metrics."""

    prometheus_enabled: bool = field(default=False, validator=_boolean)
    """Serve Prometheus metrics (computed at scrape time)."""
    bind_address: str = field(default="127.0.0.1", validator=_string)
    """Address of the Prometheus endpoint."""
    port: int = field(default=9464, validator=[_integer, _ge(0), _le(65535)])
    """Port of the Prometheus endpoint (0: any free port)."""
    otel_enabled: bool = field(default=False, validator=_boolean)
    """Publish the same numbers as OpenTelemetry observable instruments."""


@define(frozen=True, slots=True)
class PrivacyConfig:
    """What may leave the process. Everything off by default."""

    routing_keys: bool = field(default=False, validator=_boolean)
    """Routing keys (hex) on decision events."""
    statement_text: bool = field(default=False, validator=_boolean)
    """Statement text."""
    bound_values: bool = field(default=False, validator=_boolean)
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

    @property
    def hash(self) -> str:
        """A short content hash (12 hex digits): equal configs have equal hashes."""
        canonical = json.dumps(config_to_mapping(self), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- helpers


def _nested_class(attribute: Attribute) -> type | None:
    """The attrs class of a section field (its default factory), or None for a value."""
    default = attribute.default
    if isinstance(default, Factory) and attrs_has(default.factory):
        return default.factory
    return None


def _kind(attribute: Attribute) -> str:
    """What a value field holds: duration, bool, int, float, str, optional_str, str_map."""
    if attribute.metadata.get("duration"):
        return "duration"
    return {
        "bool": "bool",
        "int": "int",
        "float": "float",
        "str": "str",
        "str | None": "optional_str",
        "dict[str, str]": "str_map",
    }[str(attribute.type)]


def _checks(attribute: Attribute) -> list[Any]:
    """The individual validators of a field (attrs wraps a list in an ``and_``)."""
    validator = attribute.validator
    if validator is None:
        return []
    return list(getattr(validator, "_validators", [validator]))


def _flagged_paths(cls: type, flag: str, prefix: str = "") -> frozenset[str]:
    paths: set[str] = set()
    for attribute in attrs_fields(cls):
        path = f"{prefix}{attribute.name}"
        nested = _nested_class(attribute)
        if nested is not None:
            paths |= _flagged_paths(nested, flag, f"{path}.")
        elif attribute.metadata.get(flag):
            paths.add(path)
    return frozenset(paths)


DURATION_KEYS = _flagged_paths(Config, "duration")
"""Key paths whose values are durations: seconds, or ``250ms``, ``10s``, ``2m``, ``500us``."""
SECRET_KEYS = _flagged_paths(Config, "secret")
"""Key paths of the fields holding secrets (see :func:`_is_secret`)."""

_DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(us|µs|ms|s|m|h)\s*$")


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string such as ``250ms``, ``10s``, ``2m``,
    ``1.5s``, ``500us``, ``1h``. Raises :class:`ValueError` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration (e.g. 250ms, 10s, 2m), got {_show(value)}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"must be a finite duration, got {_show(value)}") from None
        if not seconds >= 0:  # also rejects NaN
            raise ValueError(f"must be a non-negative duration, got {_show(value)}")
        return seconds
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    raise ValueError(f"must be a duration (e.g. 250ms, 10s, 2m), got {_show(value)}")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, bytes):
        return "binary data"
    return {int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _convert(kind: str, raw: Any) -> Any:
    """YAML value -> field value of ``kind``, strict about types (no "8" for 8, no 1 for
    true). Raises TypeError/ValueError with a message naming the value."""
    got = f"{_type_name(raw)} ({_show(raw)})"
    if kind == "duration":
        return parse_duration(raw)
    if kind == "bool":
        if not isinstance(raw, bool):
            raise TypeError(f"must be true or false, got {got}")
        return raw
    if kind == "int":
        if isinstance(raw, float) and not isinstance(raw, bool):
            # 1.0e+4 is accepted as 10000; 8.5 is not an integer.
            if math.isfinite(raw) and raw.is_integer():
                return int(raw)
            raise TypeError(f"must be an integer, got a number with a fraction ({_show(raw)})")
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError(f"must be an integer, got {got}")
        return raw
    if kind == "float":
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise TypeError(f"must be a number, got {got}")
        try:
            return float(raw)
        except OverflowError:
            raise ValueError(f"must be a finite number, got {_show(raw)}") from None
    if kind == "str":
        if not isinstance(raw, str):
            raise TypeError(f"must be a string, got {got}")
        return raw
    if kind == "optional_str":
        if raw is not None and not isinstance(raw, str):
            raise TypeError(f"must be a string or null, got {got}")
        return raw
    if kind == "str_map":
        problem = None if raw is None else _string_map_problem(raw)
        if problem is not None:
            raise TypeError(f"must be a mapping of strings to strings, {problem}")
        return dict(raw or {})
    raise AssertionError(f"unhandled field kind {kind}")


def _key_text(key: Any) -> str:
    """A mapping key as YAML spells it (null, true), for key paths."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _strip_name(message: str, name: str) -> str:
    """A validator message without its leading ``name: `` (the loader puts the full path)."""
    prefix = f"{name}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


# --------------------------------------------------------------------------- structuring


class _Structurer:
    """Turns plain YAML data into the attrs classes, collecting every error."""

    def __init__(self, lines: Mapping[str, int]) -> None:
        self.errors: list[str] = []
        self.count = 0
        self.lines = lines

    def error(self, path: str, message: str) -> None:
        self.count += 1
        if self.count <= MAX_ERRORS:
            line = self.lines.get(path)
            where = f" (line {line})" if line is not None else ""
            self.errors.append(f"{path}: {message}{where}")

    def report(self) -> list[str]:
        """The errors, the ones over :data:`MAX_ERRORS` counted in a last entry."""
        more = self.count - len(self.errors)
        return self.errors + ([f"... and {more} more"] if more > 0 else [])

    def build(self, cls: type, data: Any, path: str) -> Any:
        """An instance of ``cls`` from ``data``, or None after recording the errors."""
        if data is None:  # `policy:` with nothing under it: all defaults
            data = {}
        if not isinstance(data, Mapping):
            self.error(path or "<top level>", f"must be a mapping, got {_type_name(data)}")
            return None
        known = {a.name: a for a in attrs_fields(cls)}
        values: dict[str, Any] = {}
        ok = True
        for key, raw in data.items():
            key_path = f"{path}.{_key_text(key)}" if path else _key_text(key)
            attribute = known.get(key) if isinstance(key, str) else None
            if attribute is None:
                # Only for a listed error; no name is close to a key over 51 characters.
                listed = self.count < MAX_ERRORS
                close = listed and difflib.get_close_matches(str(key)[:60], list(known), 1, 0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                valid = ", ".join(sorted(known))
                self.error(key_path, f"unknown key{hint} (valid keys: {valid})")
                ok = False
                continue
            converted, good = self.value(attribute, raw, key_path)
            if good:
                values[key] = converted
            ok = ok and good
        if not ok:
            return None
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:  # checks across fields (__attrs_post_init__)
            message = str(exc)
            name, _, reason = message.partition(": ")
            if reason and name in known:
                self.error(f"{path}.{name}" if path else name, reason)
            else:
                self.error(path or "<top level>", message)
            return None

    def value(self, attribute: Attribute, raw: Any, path: str) -> tuple[Any, bool]:
        """(converted value, True), or (None, False) after recording the error."""
        nested = _nested_class(attribute)
        if nested is not None:
            built = self.build(nested, raw, path)
            return built, built is not None
        try:
            value = _convert(_kind(attribute), raw)
            for check in _checks(attribute):
                check(None, attribute, value)
        except (TypeError, ValueError) as exc:
            message = _strip_name(str(exc), attribute.name)
            if _is_secret(path) and not message.endswith("hidden)"):  # what, not the value
                message = f"{message.partition(', got ')[0]}, got {_type_name(raw)} (value hidden)"
            self.error(path, message)
            return None, False
        return value, True


def _scan_keys(root: yaml.Node | None) -> tuple[dict[str, int], list[str]]:
    """Line (1-based) of every key path in a composed YAML document, and the duplicate
    keys found (PyYAML silently keeps the last of duplicates; we refuse them)."""
    lines: dict[str, int] = {}
    duplicates: list[str] = []
    seen: set[int] = set()  # aliases may share nodes: visit each once (no alias bombs)

    def walk(node: yaml.Node, path: str) -> None:
        if not isinstance(node, yaml.MappingNode) or id(node) in seen:
            return
        seen.add(id(node))
        here: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            key = key_node.value
            key_path = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key in here:
                duplicates.append(
                    f"{key_path}: duplicate key (line {line}, first on line {here[key]})"
                )
            else:
                here[key] = line
                lines[key_path] = line
            if not _is_secret(key_path) or key_path in SECRET_KEYS:  # no keys of a secret
                walk(value_node, key_path)

    if root is not None:
        walk(root, "")
    return lines, duplicates


class _LimitError(yaml.MarkedYAMLError):
    """A document refused by our rules (over a limit, or a value PyYAML cannot build)."""


try:  # libyaml's parser reads 1 MiB in milliseconds, PyYAML's own in about 1 s
    from yaml.cyaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = yaml.SafeLoader
_LOADER_BASES = (yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver)


class _SafeLoader(_Parser, *_LOADER_BASES):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader (libyaml's parser if any) refusing documents nested deeper than
    :data:`MAX_NESTING`, with more than :data:`MAX_NODES` values (merged keys included) or
    integers over 1000 characters: that bounds the work, as aliases are not copied (a node
    is built once) but merges are. Without the depth limits, deep nesting also ends in a
    RecursionError that depends on the caller's stack."""

    get_single_node = yaml.composer.Composer.get_single_node  # not libyaml's: it counts

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        for base in _LOADER_BASES:
            base.__init__(self)
        self._depth = self._nodes = 0
        self._flattening: set[Any] = set()  # mappings being flattened (merged into)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            problem = None
            if self._depth > MAX_NESTING:
                problem = f"nested deeper than {MAX_NESTING} levels"
            elif self._nodes > MAX_NODES:
                problem = f"more than {MAX_NODES} values: not a config file?"
            if problem is not None:
                mark = self.peek_event().start_mark
                raise _LimitError(None, None, problem, mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: Any) -> None:
        # Counts what merges copy before PyYAML copies it (merged mappings flattened first).
        if node in self._flattening:
            return
        if len(self._flattening) >= MAX_NESTING:
            problem = f"merge keys (<<) nested deeper than {MAX_NESTING} levels"
            raise _LimitError(None, None, problem, node.start_mark)
        self._flattening.add(node)
        for key, value in node.value:
            merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
            for mapping in merged if key.tag == "tag:yaml.org,2002:merge" else ():
                if isinstance(mapping, yaml.MappingNode):
                    self.flatten_mapping(mapping)
                    self._nodes += len(mapping.value)
                    if self._nodes > MAX_NODES:
                        problem = f"merge keys (<<) make more than {MAX_NODES} values"
                        problem += ": not a config file?"
                        raise _LimitError(None, None, problem, key.start_mark)
        super().flatten_mapping(node)
        self._flattening.discard(node)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        # CPython converts long integers in quadratic time (hex, sexagesimal).
        if node.tag == "tag:yaml.org,2002:int" and len(node.value) > 1000:
            problem = "integer too long (over 1000 characters)"
            raise _LimitError(None, None, problem, node.start_mark)
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError):
            # PyYAML quotes the value (!!int x: ValueError) or fails (!!bool x: KeyError).
            problem = f"not a valid !!{node.tag.rpartition(':')[2]} (value hidden)"
            raise _LimitError(None, None, problem, node.start_mark) from None


def _yaml_error(exc: yaml.YAMLError) -> str:
    """Line, column, problem: no source snippet, no quoted alias name or tag (user text)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if problem.startswith("but ") and getattr(exc, "context", None):
        problem = f"{exc.context}, {problem}"  # type: ignore[attr-defined]
    if isinstance(exc, (yaml.composer.ComposerError, yaml.constructor.ConstructorError)):
        problem = re.sub(r"""\s*('.*'|".*")""", "", problem, flags=re.DOTALL)
    if isinstance(exc, _LimitError):
        return f"{where}{problem}"
    if isinstance(exc, yaml.constructor.ConstructorError):
        return f"{where}{problem} (only plain YAML values are accepted)"
    return f"not valid YAML: {where}{problem}"


def config_from_mapping(
    data: Any, source: str | None = None, *, lines: Mapping[str, int] | None = None
) -> Config:
    """Build a :class:`Config` from plain data (as YAML gives it: mappings, lists, scalars).
    ``None`` gives the defaults. Every problem is reported at once in one
    :class:`ConfigError`; ``lines`` maps key paths to line numbers for the messages."""
    structurer = _Structurer(lines or {})
    config = structurer.build(Config, data, "")
    if structurer.errors or config is None:
        raise ConfigError(
            structurer.report() or ["invalid configuration"],
            source=source,
            total=structurer.count or None,
        )
    return config


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse a YAML document into a :class:`Config` (an empty document gives defaults).
    Only plain YAML is accepted (no tags that build Python objects)."""
    if not isinstance(text, str):
        raise ConfigError(f"expected text, got {_type_name(text)}", source=source)
    # len(text) <= its UTF-8 size, so the cheap test settles most cases.
    if len(text) > MAX_CONFIG_BYTES or len(text.encode("utf-8", "surrogatepass")) > (
        MAX_CONFIG_BYTES
    ):
        raise ConfigError(
            f"larger than {MAX_CONFIG_BYTES // 1024} KiB: not a config file?", source=source
        )
    if text.count("\n%") + text.count("\r%") > 1000:  # libyaml reads %TAG in quadratic time
        problem = "more than 1000 directives (lines starting with %)"
        raise ConfigError(f"{problem}: not a config file?", source=source)
    loader: _SafeLoader | None = None
    try:
        loader = _SafeLoader(text)  # already checks for unprintable characters
        node = loader.get_single_node()
        lines, duplicates = _scan_keys(node)  # before merges are flattened into the nodes
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(exc), source=source) from None
    except (ValueError, TypeError, RecursionError) as exc:  # deeper than the stack allows?
        raise ConfigError(f"not valid YAML ({type(exc).__name__})", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()
    try:
        config = config_from_mapping(data, source, lines=lines)
    except ConfigError as exc:
        raise ConfigError(
            duplicates + exc.errors, source=source, total=len(duplicates) + exc.total
        ) from None
    if duplicates:
        raise ConfigError(duplicates, source=source)
    return config


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config file at ``path``, or the one ``$ADAPTIVE_LB_CONFIG`` names, or the
    defaults when neither is given. Files over 1 MiB are refused before parsing."""
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
        with open(source, "rb") as handle:
            # Bounded even if the file grew since the stat (or is a device).
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"file is more than {MAX_CONFIG_BYTES // 1024} KiB: not a config file?", source=source
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", source=source) from None
    return parse_config(text, source)


def config_to_mapping(config: Any) -> dict[str, Any]:
    """Plain data (YAML- and JSON-able) with every value, defaults included; durations
    as numbers of seconds. Works on :class:`Config` and on any of its sections."""
    result: dict[str, Any] = {}
    for attribute in attrs_fields(type(config)):
        value = getattr(config, attribute.name)
        if _nested_class(attribute) is not None:
            result[attribute.name] = config_to_mapping(value)
        elif attribute.metadata.get("duration") or str(attribute.type) == "float":
            # 4 and 4.0 are equal configs: one spelling, so one hash.
            result[attribute.name] = float(value)
        elif isinstance(value, Mapping):
            result[attribute.name] = dict(value)
        else:
            result[attribute.name] = value
    return result


def dump_config(config: Config, *, reveal_secrets: bool = False) -> str:
    """The config as YAML, secrets (:data:`SECRET_KEYS`: header values) written ``'***'``
    unless ``reveal_secrets`` (then it round-trips through :func:`parse_config`)."""
    data = config_to_mapping(config)
    for path in () if reveal_secrets else SECRET_KEYS:
        *parents, name = path.split(".")
        section = functools.reduce(operator.getitem, parents, data)
        value = section[name]  # a mapping keeps its keys (header names)
        section[name] = dict.fromkeys(value, "***") if isinstance(value, dict) else value and "***"
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    if yaml.safe_load(text) != data:
        # PyYAML mangles a few characters (NEL) when writing unicode as is; escaped, they
        # survive.
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False)
    return text


# --------------------------------------------------------------------------- hot reload


class ConfigWatcher:
    """Polls a config file and calls ``on_change(config)`` when it changes to a valid
    config, or ``on_error(error)`` (and logs) when it changes to an invalid one -- the last
    good config (:attr:`config`) stays in force. A change is a different mtime, size or
    content hash. Runs on a daemon thread; :meth:`stop` returns promptly.

    Write the file atomically (write elsewhere, then rename) so that a poll never sees it
    half written; a half-written file is only reported as an error and the complete one is
    applied on the next poll.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_change: Callable[[Config], None],
        on_error: Callable[[ConfigError], None] | None = None,
        interval: float = 1.0,
        report_error: Callable[[str, str], None] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval: must be > 0, got {interval!r}")
        if report_error is None:
            from adaptive_lb.clock import SYSTEM_CLOCK
            from adaptive_lb.errors import ErrorLog

            report_error = ErrorLog(SYSTEM_CLOCK, _log).record
        self.report_error = report_error
        """Where an exception inside the watcher (a failing ``on_change``, say) goes:
        ``report_error(stage, what)``, e.g. ``policy.record_error``; by default a counted
        log at most once a minute."""
        self.path = os.fspath(path)
        self.on_change = on_change
        self.on_error = on_error
        self.interval = interval
        self.config: Config | None = None
        """The last good config this watcher loaded (None until one was)."""
        self._stop = threading.Event()
        # One check at a time (the thread vs. a direct check()), callbacks included so that
        # they see the configs in order; reentrant so that a callback may call check().
        self._lock = threading.RLock()
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
        """Look once; True if the file changed (whatever the outcome). A file that
        disappears is not a change: the last good config stays."""
        with self._lock:
            signature = self._signature()
            if signature is None or signature == self._seen:
                return False
            self._seen = signature
            try:
                config = load_config(self.path)
            except ConfigError as exc:
                _log.error(
                    "adaptive-lb: config %s rejected, keeping the last good one: %s",
                    self.path,
                    exc,
                )
                if self.on_error is not None:
                    self.on_error(exc)
                return True
            self.config = config
            self.on_change(config)
            return True

    def start(self) -> ConfigWatcher:
        """Start polling; the file's current content counts as seen (load it yourself
        first). Calling it on a running watcher does nothing."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._seen = self._signature()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="adaptive-lb-config", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a failing callback must not end the watcher
                self.report_error("config_watch", "the config in force stays")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and wait for the thread (not when called from a callback)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """True while the polling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ConfigWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- JSON Schema


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under each field of an attrs class (empty when the source
    is not available, e.g. in a zipped install)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the config file, generated from the attrs classes:
    types, defaults, bounds, enums and descriptions; unknown keys are not allowed."""

    def bounds(attribute: Attribute) -> dict[str, Any]:
        keyword = {">": "exclusiveMinimum", ">=": "minimum", "<=": "maximum"}
        return {
            keyword[check.kind]: check.bound
            for check in _checks(attribute)
            if getattr(check, "kind", None) in keyword
        }

    def value_schema(attribute: Attribute) -> dict[str, Any]:
        kind = _kind(attribute)
        if kind == "duration":
            return {
                "anyOf": [
                    {"type": "number", **bounds(attribute)},
                    {"type": "string", "pattern": _DURATION_RE.pattern},
                ]
            }
        schema: dict[str, Any] = {
            "bool": {"type": "boolean"},
            "int": {"type": "integer"},
            "float": {"type": "number"},
            "str": {"type": "string"},
            "optional_str": {"type": ["string", "null"]},
            "str_map": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        }[kind]
        schema.update(bounds(attribute))
        for check in _checks(attribute):
            options = getattr(check, "options", None)
            if options is not None:
                schema["enum"] = list(options)
        return schema

    def object_schema(cls: type) -> dict[str, Any]:
        docs = _field_docs(cls)
        defaults = config_to_mapping(cls())
        properties: dict[str, Any] = {}
        for attribute in attrs_fields(cls):
            nested = _nested_class(attribute)
            if nested is not None:
                schema = object_schema(nested)
            else:
                schema = value_schema(attribute)
                schema["default"] = defaults[attribute.name]
            description = docs.get(attribute.name)
            if attribute.metadata.get("duration"):
                unit = "Duration: seconds, or a string such as 250ms, 10s, 2m, 500us."
                description = f"{description} {unit}" if description else unit
            if description and "description" not in schema:
                schema["description"] = description
            properties[attribute.name] = schema
        schema = {
            # null: a section written with nothing under it (all defaults).
            "type": ["object", "null"],
            "properties": properties,
            "additionalProperties": False,
        }
        if cls.__doc__:
            schema["description"] = " ".join(cls.__doc__.split())
        return schema

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "adaptive-lb configuration",
        **object_schema(Config),
    }
