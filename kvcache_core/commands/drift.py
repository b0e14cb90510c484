"""``kvcache drift PATH ...``: contract-free drift inside a source tree.

Finds every class overriding one of ``--methods`` with a signature that cannot accept what the
nearest ancestor defining it accepts, and every call site passing a keyword that some
implementer does not accept. Source only: nothing is imported. Exit codes as ``kvcache check``.
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
        default=",".join(DEFAULT_METHODS),
        metavar="NAME[,...]",
        help=f"methods to follow (default: {','.join(DEFAULT_METHODS)})",
    )
    parser.add_argument(
        "--root", metavar="CLASS", help="only the hierarchy under CLASS (name or module.Class)"
    )
    add_output_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..conformance.results.usage import UsageError
    from ..conformance.source.drift import DRIFT_RULES, run_drift
    from ._output import finish, load_config, usage_error

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        if not methods:
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
