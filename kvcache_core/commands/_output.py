"""What ``kvcache check`` and ``kvcache drift`` share after their checks ran: suppressions,
rendering through the one renderer module, writing, and the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import cast

from ..conformance.results.expected import ExpectedFailure
from ..conformance.results.expected import load_expected_failures as _load_expected
from ..conformance.results.merge import merge_levels
from ..conformance.results.model import CheckResult
from ..conformance.results.suppressions import (
    Suppression,
    apply_suppressions,
    find_pyproject,
    load_pyproject,
    scan_inline,
)
from ..conformance.results.usage import UsageError
from ..conformance.runner import exit_code

__all__ = [
    "FORMATS",
    "add_output_options",
    "config_path",
    "finish",
    "load_config",
    "load_expected_failures",
    "usage_error",
]

FORMATS: tuple[str, ...] = ("text", "json", "junit", "sarif", "github")
_RENDER_MODULE = "kvcache_core.conformance.reporting.render"

Render = Callable[[Sequence[CheckResult], str], str]


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
    return 2


def config_path(args: argparse.Namespace) -> str | None:
    """``--config``, or the nearest ``pyproject.toml`` above the current directory."""
    if args.config and not os.path.isfile(args.config):
        raise UsageError(f"--config {args.config}: no such file")
    return args.config or find_pyproject(os.getcwd())


def load_config(args: argparse.Namespace) -> list[Suppression]:
    """Suppressions from ``--config`` or the nearest ``pyproject.toml`` (UsageError if bad)."""
    path = config_path(args)
    return load_pyproject(path) if path else []


def load_expected_failures(args: argparse.Namespace) -> list[ExpectedFailure]:
    """``[tool.kvcache.expected-failures]`` of the same file ``load_config`` reads.

    Only the table's shape is checked here; check ids and pool names are checked by the
    behaviour level against the battery and the pools it runs on.
    """
    return _load_expected(config_path(args))


def _renderer() -> Render:
    try:
        module = importlib.import_module(_RENDER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _RENDER_MODULE:
            raise
        raise UsageError(
            f"output renderers are not available in this kvcache ({_RENDER_MODULE} is missing)"
        ) from None
    render = getattr(module, "render", None)
    if not callable(render):
        raise UsageError(f"{_RENDER_MODULE} has no render()")
    return cast(Render, render)


def _paths(results: Sequence[CheckResult], extra: Iterable[str]) -> set[str]:
    paths = {p for p in extra if p}
    for result in results:
        for finding in result.findings:
            if finding.impl_location is not None:
                paths.add(finding.impl_location.path)
    return {p for p in paths if p.endswith(".py") and os.path.isfile(p)}


def finish(
    args: argparse.Namespace,
    results: Sequence[CheckResult],
    *,
    configured: Sequence[Suppression],
    scanned: Iterable[str],
    active_rules: Collection[str] | None = None,
) -> int:
    """Apply suppressions, merge what several levels saw, render in ``args.format``, write,
    and return the exit code."""
    render = _renderer()
    suppressions = [*configured, *scan_inline(_paths(results, scanned))]
    # Suppressions first, then one finding per drift (see conformance/results/merge.py for why).
    final = merge_levels(apply_suppressions(results, suppressions, active_rules=active_rules))
    text = render(final, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return exit_code(final)
