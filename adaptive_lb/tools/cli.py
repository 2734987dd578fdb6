"""The ``adaptive-lb`` command.

adaptive-lb bench                  plan throughput vs the stock policies (new folder per run)
adaptive-lb loadtest ...           a load at a fixed rate, stock vs adaptive (see --help)
adaptive-lb demo / simulate ...    the simulator (adaptive_lb/tools/sim/cli.py)
adaptive-lb config validate FILE   every error of a config file, exit 1 if any
adaptive-lb config show [FILE]     the effective config (defaults filled in)
adaptive-lb config schema          JSON Schema of the config file, for editors
adaptive-lb config default         config/default.yaml: every key at its default, documented

Every parser uses :class:`HelpFormatter` (``--help`` shows each option's default). By
default no command writes over files of a checkout: ``bench`` makes a new folder each run,
``demo`` and ``simulate`` write to ``./adaptive-lb-demo`` and ``./adaptive-lb-simulate``
(git-ignored), ``loadtest`` and ``config`` only print; ``--out`` says otherwise.

May import every command's module (on first use) and the config; the library never imports a
tool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from adaptive_lb.tools.cli_format import HelpFormatter, format_written

__all__ = ["PROG", "HelpFormatter", "build_parser", "format_written", "main"]

PROG = "adaptive-lb"
"""The command's name (``[project.scripts]``), also shown by ``python -m adaptive_lb``."""


def _config_validate(files: list[str]) -> int:
    from adaptive_lb.config import ConfigError, load_config

    status = 0
    for path in files:
        try:
            config = load_config(path)
        except ConfigError as exc:
            status = 1
            print(f"{path}: {len(exc.errors)} error(s)")
            for error in exc.errors:
                print(f"  {error}")
        else:
            print(f"{path}: ok (hash {config.hash})")
    return status


def _config_show(file: str | None) -> int:
    from adaptive_lb.config import ENV_VAR, ConfigError, dump_config, load_config

    try:
        config = load_config(file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    source = file or os.environ.get(ENV_VAR) or "defaults"
    print(f"# effective adaptive-lb config from {source}, defaults filled in; hash {config.hash}")
    sys.stdout.write(dump_config(config))
    return 0


def _config_schema() -> int:
    from adaptive_lb.config import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _config_default() -> int:
    from adaptive_lb.config import render_default_yaml

    sys.stdout.write(render_default_yaml())
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    """``adaptive-lb config validate|show|schema|default``."""
    if args.config_command == "validate":
        return _config_validate(args.files)
    if args.config_command == "show":
        return _config_show(args.file)
    if args.config_command == "default":
        return _config_default()
    return _config_schema()


def _add_config_commands(commands: Any) -> None:
    """Register ``config validate FILE...``, ``config show [FILE]``, ``config schema`` and
    ``config default``."""
    config = commands.add_parser(
        "config",
        help="validate, show or describe a config file",
        description="Validate, show or describe an adaptive-lb YAML config file "
        "(see docs/configuration.md). Every subcommand prints to stdout.",
        formatter_class=HelpFormatter,
    )
    config.set_defaults(handler=_cmd_config)
    config_commands = config.add_subparsers(dest="config_command", required=True)
    validate = config_commands.add_parser(
        "validate",
        help="check config files: every error, exit status 1 if any",
        description="Check config files: every error of each, with its key path and line; "
        "exit status 1 if any.",
        formatter_class=HelpFormatter,
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="config files to check")
    show = config_commands.add_parser(
        "show",
        help="print the effective config as YAML",
        description="Print the effective config as YAML (defaults filled in) and its hash.",
        formatter_class=HelpFormatter,
    )
    show.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="the config file (default: the file $ADAPTIVE_LB_CONFIG names, else the built-in "
        "defaults)",
    )
    config_commands.add_parser(
        "schema",
        help="print a JSON Schema (2020-12) of the file",
        description="Print a JSON Schema (2020-12) of the config file, for editors.",
        formatter_class=HelpFormatter,
    )
    config_commands.add_parser(
        "default",
        help="print config/default.yaml: every key at its default, documented",
        description="Print config/default.yaml: every key at its default, documented.",
        formatter_class=HelpFormatter,
    )


def _run_bench(argv: list[str]) -> int:
    """``adaptive-lb bench ...``: everything after ``bench`` goes to the benchmark's parser."""
    from adaptive_lb.tools.bench import main as bench_main

    return int(bench_main(argv) or 0)  # its --help says "adaptive-lb bench"


def _bench(args: argparse.Namespace) -> int:
    return _run_bench(args.bench_args)


_FORWARDED: dict[str, Callable[[list[str]], int]] = {"bench": _run_bench}
"""Subcommands with a parser of their own: they get their arguments untouched (argparse's
REMAINDER drops options that come first, e.g. ``bench --plans 5``: bpo-17050)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one subcommand per job; each sets ``handler``)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Adaptive load balancing for the Cassandra / ScyllaDB Python drivers.\n"
        f"'{PROG} COMMAND --help' describes each command.",
        formatter_class=HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = commands.add_parser(
        "bench",
        help="query-plan throughput vs the stock policies (writes a new folder, or --out)",
        add_help=False,
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help=f"see '{PROG} bench --help'")
    bench.set_defaults(handler=_bench)

    from adaptive_lb.tools.loadtest_cli import add_subcommand as add_loadtest

    add_loadtest(commands)

    from adaptive_lb.tools.sandbox import add_subcommand as add_sandbox

    add_sandbox(commands)

    try:
        from adaptive_lb.tools.sim.cli import add_subcommands as add_sim
    except ImportError:
        pass
    else:
        add_sim(commands)

    _add_config_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    forwarded = _FORWARDED.get(argv[0]) if argv else None
    if forwarded is not None:
        return forwarded(argv[1:])
    args: Any = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
