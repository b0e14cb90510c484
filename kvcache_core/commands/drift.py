"""``kvcache drift PATH ...``: contract-free drift inside a source tree.

Finds every class overriding one of ``--methods`` with a signature that cannot accept what the
nearest ancestor defining it accepts, and every call site passing a keyword that some
implementer does not accept. Source only: nothing is imported. Exit codes as ``kvcache check``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..conformance.resolve import UsageError
from ..conformance.source.drift import DEFAULT_METHODS, DRIFT_RULES, analyze
from ..conformance.sources import python_files
from ._output import add_output_options, finish, load_config, usage_error

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
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        if not methods:
            raise UsageError("--methods names no method")
        configured = load_config(args)
        results = analyze(args.paths, methods=methods, root=args.root)
        files = [f for p in args.paths for f in python_files(p)]
        return finish(args, results, configured=configured, scanned=files, active_rules=DRIFT_RULES)
    except UsageError as exc:
        return usage_error("drift", str(exc))
