"""What ``kvcache check`` and ``kvcache drift`` share around the report: the output options,
reading ``--config``, writing the report and the usage-error line. The report itself (suppress,
merge, render, exit code) is the library's
([`report`][kvcache_core.conformance.reporting.report.report]), so a library caller gets the
same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Collection, Iterable, Sequence

from ..conformance.reporting.report import EXIT_ERROR, FORMATS, report
from ..conformance.results.model import CheckResult
from ..conformance.results.suppressions import Suppression, find_pyproject, load_pyproject
from ..conformance.results.usage import UsageError

__all__ = [
    "add_output_options",
    "config_path",
    "finish",
    "load_config",
    "usage_error",
    "write",
]


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=FORMATS, default="text", help="output format (default: text)"
    )
    parser.add_argument("--output", metavar="FILE", help="write the report to FILE, not stdout")
    parser.add_argument(
        "--config",
        metavar="PYPROJECT",
        help="pyproject.toml with [tool.kvcache] suppressions and expected failures (default: "
        "the nearest one above the current directory)",
    )


def usage_error(command: str, message: str) -> int:
    print(f"kvcache {command}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def config_path(args: argparse.Namespace) -> str | None:
    """``--config``, or the nearest ``pyproject.toml`` above the current directory."""
    if args.config and not os.path.isfile(args.config):
        raise UsageError(f"--config {args.config}: no such file")
    return args.config or find_pyproject(os.getcwd())


def load_config(args: argparse.Namespace) -> list[Suppression]:
    """Suppressions from ``--config`` or the nearest ``pyproject.toml`` (UsageError if bad)."""
    path = config_path(args)
    return load_pyproject(path) if path else []


def write(args: argparse.Namespace, text: str) -> None:
    """The report to ``--output`` as it is, or to stdout ending in one newline."""
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def finish(
    args: argparse.Namespace,
    results: Sequence[CheckResult],
    *,
    configured: Sequence[Suppression],
    scanned: Iterable[str],
    active_rules: Collection[str] | None = None,
) -> int:
    """The report of ``results`` in ``args.format``, written; returns the exit code."""
    done = report(
        results,
        args.format,
        suppressions=configured,
        scanned=scanned,
        active_rules=active_rules,
    )
    write(args, done.text)
    return done.exit_code
