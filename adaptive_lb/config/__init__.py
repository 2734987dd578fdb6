"""Settings of adaptive-lb: one YAML file -> frozen attrs objects, validated.

One YAML file (``config/default.yaml`` documents every key) maps onto :class:`Config`.
Every value is validated at construction, so an object that exists is a valid config; a
file is read with every problem reported at once, each with its key path and line.

=================  =======================================================================
``model``          the settings classes (:class:`Config` and its sections); their field
                   docstrings are the documentation of every key
``validation``     field validators (bounds, types, choices, durations), strict conversion
``structure``      plain data -> settings objects, every error with its key path; and back
``errors``         :class:`ConfigError`; values shown short, secrets never shown
``safe_yaml``      hardened YAML: size, nesting, node and merge limits; key lines
``loader``         :func:`parse_config`, :func:`load_config`, :func:`dump_config`
``watcher``        :class:`ConfigWatcher`: hot reload, the last good config kept
``schema``         :func:`json_schema` (JSON Schema 2020-12) of the file
``defaults``       :func:`render_default_yaml`: ``config/default.yaml``, generated
=================  =======================================================================

The simulator's scenario files (:mod:`adaptive_lb.tools.sim.scenario`) are read with the same
toolkit: same limits, same messages.

Imports its own modules only.
"""

from adaptive_lb.config.defaults import render_default_yaml
from adaptive_lb.config.errors import ConfigError
from adaptive_lb.config.loader import (
    ENV_VAR,
    config_from_mapping,
    dump_config,
    load_config,
    parse_config,
)
from adaptive_lb.config.model import (
    DURATION_KEYS,
    SECRET_KEYS,
    Config,
    FleetConfig,
    HealthConfig,
    HealthPenalties,
    LatencyFactorConfig,
    MetricsConfig,
    OtlpConfig,
    PolicyConfig,
    PrivacyConfig,
    RackLearningConfig,
    ReloadConfig,
    ServerLoadConfig,
    TracingConfig,
    TrackingConfig,
)
from adaptive_lb.config.safe_yaml import MAX_CONFIG_BYTES, MAX_NESTING, MAX_NODES
from adaptive_lb.config.schema import json_schema
from adaptive_lb.config.structure import MAX_ERRORS, config_to_mapping
from adaptive_lb.config.validation import parse_duration
from adaptive_lb.config.watcher import ConfigWatcher

__all__ = [
    "DURATION_KEYS",
    "ENV_VAR",
    "MAX_CONFIG_BYTES",
    "MAX_ERRORS",
    "MAX_NESTING",
    "MAX_NODES",
    "SECRET_KEYS",
    "Config",
    "ConfigError",
    "ConfigWatcher",
    "FleetConfig",
    "HealthConfig",
    "HealthPenalties",
    "LatencyFactorConfig",
    "MetricsConfig",
    "OtlpConfig",
    "PolicyConfig",
    "PrivacyConfig",
    "RackLearningConfig",
    "ReloadConfig",
    "ServerLoadConfig",
    "TracingConfig",
    "TrackingConfig",
    "config_from_mapping",
    "config_to_mapping",
    "dump_config",
    "json_schema",
    "load_config",
    "parse_config",
    "parse_duration",
    "render_default_yaml",
]
