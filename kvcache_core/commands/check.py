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
from typing import TYPE_CHECKING, Any

from ..conformance.runner import ALL_LEVELS, DEFAULT_LEVELS
from ..contracts.history import CONTRACT_VERSION
from ._output import add_output_options

if TYPE_CHECKING:  # annotations only: registering the parser stays cheap
    from collections.abc import Sequence

    from ..conformance.selection import Selection
    from ..conformance.target import ClassTarget
    from ..contracts.spec import PoolSpec

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
        "name, protocols checked on top of what its spec declares",
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
    from ..conformance.expected import check_applicable, check_known_ids
    from ..conformance.resolve import parse_protocols, resolve_targets
    from ..conformance.runner import (
        active_rules,
        check_contract_version,
        parse_levels,
        run_levels,
    )
    from ..conformance.selection import parse_selection
    from ..conformance.sources import SourceIndex
    from ..conformance.usage import UsageError
    from ..progress import Progress
    from ._output import finish, load_config, load_expected_failures, usage_error

    try:
        levels = parse_levels(args.level)
        against = parse_protocols(args.against)
        version = check_contract_version(args.contract_version)
        configured = load_config(args)
        expected = load_expected_failures(args)
        check_known_ids(expected)
        selection = parse_selection(args.select, args.deselect)
        index = SourceIndex()
        targets, results = resolve_targets(
            args.targets, against=against, index=index, read_plugins=levels == ("source",)
        )
        if expected and "behaviour" in levels:
            check_applicable(expected, _checked_specs(targets))
        status = Progress(sys.stderr)  # a status line on a terminal only
        try:
            results += run_levels(
                targets,
                levels,
                contract_version=version,
                index=index,
                expected_failures=expected,
                progress=status.update,
                behaviour_checks=_behaviour_checks(selection, levels),
            )
        finally:
            status.done()
        return finish(
            args,
            selection.apply(results),
            configured=configured,
            scanned=[t.path or "" for t in targets],
            active_rules=[r for r in active_rules(levels) if selection.wants({r})],
        )
    except UsageError as exc:
        return usage_error("check", str(exc))


def _checked_specs(targets: Sequence[ClassTarget]) -> dict[str, PoolSpec]:
    """The specs of the pools the behaviour level will run, by pool name."""
    from ..conformance.plugins import plugin_specs

    pairs: set[tuple[str, str]] = set()
    for t in targets:
        pairs.update(t.serves)
        if t.plugin is not None and t.pool is not None:
            pairs.add((t.plugin, t.pool))
    return {
        spec.name: spec
        for plugin in sorted({p for p, _ in pairs})
        for spec in plugin_specs(plugin)
        if (plugin, spec.name) in pairs
    }


def _behaviour_checks(selection: Selection, levels: tuple[str, ...]) -> list[str] | None:
    """The battery checks ``--select``/``--deselect`` leave (None: all, or no behaviour)."""
    if selection.everything or "behaviour" not in levels:
        return None
    from ..conformance.battery_ids import battery_ids

    return selection.behaviour_checks(battery_ids())
