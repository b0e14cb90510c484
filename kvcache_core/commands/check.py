"""``kvcache check [TARGET ...]``: check plugins, classes or source trees against the contract.

Targets: installed plugin or pool names (none = every installed plugin), ``module:Class``,
or paths (a ``.py`` file or a directory: every class defined under it). Every level runs by
default; the behaviour level needs a plugin's ``PoolSpec`` and skips the other targets.
Exit codes: 0 clean, 1 error findings, 2 usage or internal error (including a level that could
not run).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..conformance.runner import ALL_LEVELS, DEFAULT_LEVELS
from ..contracts.history import CONTRACT_VERSION
from ._output import add_output_options

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "check",
        help="check pool plugins, classes or source trees against the kvcache contract",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="plugin or pool name, module:Class, or a path (.py file or directory); "
        "default: every installed plugin",
    )
    parser.add_argument(
        "--against",
        action="append",
        metavar="PROTOCOL[,...]",
        help="protocols to check paths and module:Class targets against "
        "(default: inferred from the methods each class defines); for a plugin or pool "
        "name, protocols checked on top of what its spec declares; or an engine's class, "
        "PATH:Class or module:Class, read from source: every class under the targets that "
        "subclasses or replaces it is held to its methods, constructor included",
    )
    parser.add_argument(
        "--level",
        action="append",
        metavar="LEVEL[,...]",
        help=f"levels to run, of {', '.join(ALL_LEVELS)} (default: {','.join(DEFAULT_LEVELS)})",
    )
    parser.add_argument(
        "--select",
        action="append",
        metavar="ID[,...]",
        help="only these behaviour check ids or rule ids (repeatable; default: all); "
        "a behaviour check not selected does not run (with --store: store check ids)",
    )
    parser.add_argument(
        "--deselect",
        action="append",
        metavar="ID[,...]",
        help="leave out these behaviour check ids or rule ids (repeatable; with --store: "
        "store check ids)",
    )
    parser.add_argument(
        "--contract-version",
        type=int,
        default=CONTRACT_VERSION,
        metavar="N",
        help=f"contract version to check against (default: {CONTRACT_VERSION})",
    )
    parser.add_argument(
        "--store",
        action="append",
        metavar="URL",
        help="run the snapshot-store battery on the store at URL (memory:, dir:PATH, "
        "redis://HOST:PORT/DB or a plugin's scheme) instead of checking pools; repeatable",
    )
    add_output_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "store", None):
        from .check_stores import run as run_store_checks

        return run_store_checks(args)
    # Imported here, not at module level: registering the parser must stay cheap, and which of
    # these pull in torch depends on the targets (plugins do; paths at --level source do not).
    from ..conformance.results.usage import UsageError
    from ..conformance.runner import check, check_contract_version, parse_levels
    from ..conformance.targets.resolve import parse_protocols
    from ._output import config_path, usage_error, write
    from .progress import Progress

    try:
        # What the library checks too, here first so that the command reports the first
        # mistake in the order it always has, and names --config as the option it is.
        parse_levels(args.level)
        parse_protocols(
            [n for v in args.against or () for n in v.split(",") if n.strip() and ":" not in n]
        )
        check_contract_version(args.contract_version)
        config = config_path(args)
        status = Progress(sys.stderr)  # a status line on a terminal only
        try:
            report = check(
                args.targets,
                levels=args.level,
                against=args.against,
                contract_version=args.contract_version,
                select=args.select,
                deselect=args.deselect,
                pyproject=config or False,
                format=args.format,
                progress=status.update,
            )
        finally:
            status.done()
        write(args, report.text)
        return report.exit_code
    except UsageError as exc:
        return usage_error("check", str(exc))
