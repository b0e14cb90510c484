"""``kvcache drift PATH ...``: contract-free drift inside a source tree.

Finds every class overriding one of ``--methods`` with a signature that cannot accept what the
nearest ancestor defining it accepts (or the class it replaces), with the calls in the paths
that break on it; calls whose receiver can only be an implementation that refuses them; and
names a plugin takes from an engine module that no longer defines them. Source only: nothing is
imported. Exit codes as ``kvcache check``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ._output import add_output_options

# Only what registering the parser needs is imported at module level (`kvcache --help` must
# start like a linter); the analysis is imported by `run`. The default methods are spelled out
# here for that reason; a test keeps them equal to drift.DEFAULT_METHODS.
DEFAULT_METHODS: tuple[str, ...] = ("get_cpu_copy", "load_cpu_copy", "set_kv_buffer")

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "drift",
        help="find overrides and call sites that drifted apart in a source tree (no contract)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".py files or directories")
    parser.add_argument(
        "--methods",
        default=None,
        metavar="NAME[,...]",
        help=f"methods to follow (default: {','.join(DEFAULT_METHODS)}; with --root, every "
        "method of the root classes and the classes above them, __init__ included)",
    )
    parser.add_argument(
        "--root",
        action="append",
        metavar="CLASS",
        help="only the hierarchy under CLASS (name, module.Class or a glob such as 'Elastic*'; "
        "repeatable)",
    )
    add_output_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..conformance.results.usage import UsageError
    from ..conformance.source.drift import DRIFT_RULES, run_drift
    from ._output import finish, load_config, usage_error

    methods = (
        [m.strip() for m in args.methods.split(",") if m.strip()]
        if args.methods is not None
        else None
    )
    try:
        if methods is not None and not methods:
            raise UsageError("--methods names no method")
        configured = load_config(args)
        found = run_drift(args.paths, methods=methods, root=args.root)
        return finish(
            args,
            found.results,
            configured=configured,
            scanned=found.suppression_files,
            active_rules=DRIFT_RULES,
        )
    except UsageError as exc:
        return usage_error("drift", str(exc))
