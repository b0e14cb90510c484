"""Run the checker's levels over resolved targets: one ``CheckResult`` per (target, check).

Levels, cheapest first: ``source`` (never imports), ``signature`` (imports, compares
``inspect.signature``), ``types`` (mypy, built separately and loaded by name: when it is not
installed, each target gets an ERROR result saying so) and ``behaviour`` (builds tiny pools
through installed plugins' factories and runs the battery; targets without a ``PoolSpec`` get
a SKIPPED result). A level that crashes turns into ERROR results for its targets,
never into a traceback that hides the other levels' findings.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Sequence
from typing import cast

from ..contracts.history import CONTRACT_VERSION, VERSIONS
from .members.sources import SourceIndex
from .results.expected import ExpectedFailure
from .results.model import CheckResult, Outcome
from .results.rules import RULES, Severity
from .results.usage import UsageError
from .targets.target import ClassTarget

__all__ = [
    "ALL_LEVELS",
    "DEFAULT_LEVELS",
    "DRIFT_ONLY_RULES",
    "EXIT_ERROR",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "active_rules",
    "check_contract_version",
    "exit_code",
    "parse_levels",
    "run_levels",
]

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

ALL_LEVELS: tuple[str, ...] = ("source", "signature", "types", "behaviour")
DEFAULT_LEVELS: tuple[str, ...] = ALL_LEVELS

LevelRun = Callable[..., list[CheckResult]]
_TYPES_MODULE = "kvcache_core.conformance.types.level"


def parse_levels(values: Sequence[str] | None) -> tuple[str, ...]:
    """``--level source --level signature,types`` -> levels in run order, validated."""
    if not values:
        return DEFAULT_LEVELS
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_LEVELS]
    if unknown:
        raise UsageError(
            f"unknown level {', '.join(map(repr, unknown))}; levels: {', '.join(ALL_LEVELS)}"
        )
    return tuple(level for level in ALL_LEVELS if level in names)


def check_contract_version(version: int) -> int:
    if version not in VERSIONS:
        raise UsageError(
            f"unknown contract version {version}; published: {', '.join(map(str, VERSIONS))}"
        )
    return version


def _for_each(
    targets: Sequence[ClassTarget], check: str, outcome: Outcome, detail: str
) -> list[CheckResult]:
    return [CheckResult(t.name, check, outcome, detail=detail) for t in targets]


def _types_level() -> LevelRun | str:
    """The types level's ``run``, or why it is not available."""
    try:
        module = importlib.import_module(_TYPES_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _TYPES_MODULE:
            return f"types level cannot load: {exc}"
        return f"types level is not available in this kvcache ({_TYPES_MODULE} is missing)"
    run = getattr(module, "run", None)
    if not callable(run):
        return f"types level is not available: {_TYPES_MODULE} has no run()"
    return cast(LevelRun, run)


def _guarded(
    level: str, run: LevelRun, targets: Sequence[ClassTarget], **kwargs: object
) -> list[CheckResult]:
    try:
        return list(run(targets, **kwargs))
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        why = f"{level} level crashed: {type(exc).__name__}: {exc}{where}"
        return _for_each(targets, level, Outcome.ERROR, why)


def run_levels(
    targets: Sequence[ClassTarget],
    levels: Sequence[str] = DEFAULT_LEVELS,
    *,
    contract_version: int = CONTRACT_VERSION,
    index: SourceIndex | None = None,
    expected_failures: Sequence[ExpectedFailure] = (),
    progress: Callable[[str], None] | None = None,
    behaviour_checks: Sequence[str] | None = None,
) -> list[CheckResult]:
    """Every requested level over every target, in level order.

    ``behaviour_checks`` (if given) are the only battery checks the behaviour level runs
    (``kvcache check --select/--deselect``).

    ``progress`` (if given) is told, in words, which level (and which pool of the behaviour
    level) is running; the CLI shows it on a terminal.

    ``expected_failures`` (from ``[tool.kvcache.expected-failures]``) are for the behaviour
    level, on top of what each ``PoolSpec`` declares itself.
    """
    from . import signature, source  # here: `kvcache check --help` must not load the levels

    results: list[CheckResult] = []
    for number, level in enumerate(levels, start=1):
        if not targets:
            break
        if progress is not None:
            progress(
                f"kvcache check: {level} level ({number}/{len(levels)}), {len(targets)} target(s)"
            )
        if level == "source":
            results += _guarded(
                level,
                source.run,
                targets,
                contract_version=contract_version,
                index=index if index is not None else SourceIndex(),
            )
        elif level == "signature":
            results += _guarded(level, signature.run, targets, contract_version=contract_version)
        elif level == "types":
            run = _types_level()
            if isinstance(run, str):
                results += _for_each(targets, "types", Outcome.ERROR, run)
            else:
                results += _guarded(level, run, targets, contract_version=contract_version)
        elif level == "behaviour":
            from .behaviour import level as behaviour_level

            by_pool: dict[str, dict[str, str]] = {}
            for expected in expected_failures:
                by_pool.setdefault(expected.pool, {})[expected.check] = expected.describe()
            results += _guarded(
                level,
                behaviour_level.run,
                targets,
                expected_failures=by_pool,
                progress=progress,
                only=behaviour_checks,
            )
        else:  # parse_levels rejects these; a programming error if reached
            raise UsageError(f"unknown level {level!r}")
    return results


#: Rules that only one level reports; every other rule may come from any level that ran.
_LEVEL_ONLY_RULES: dict[str, frozenset[str]] = {
    "types": frozenset({"type-error"}),
    "behaviour": frozenset({"behaviour-failed"}),
}
#: Rules only ``kvcache drift`` reports.
DRIFT_ONLY_RULES = frozenset({"unaccepted-keyword"})


def active_rules(levels: Sequence[str]) -> frozenset[str]:
    """The rules that running ``levels`` can report (for unused-suppression detection)."""
    rules = set(RULES) - DRIFT_ONLY_RULES
    for level, only in _LEVEL_ONLY_RULES.items():
        if level not in levels:
            rules -= only
    return frozenset(rules)


def exit_code(results: Sequence[CheckResult]) -> int:
    """2 when a check could not run (ERROR without an error finding), 1 on error findings."""
    if any(
        r.outcome is Outcome.ERROR and not any(f.severity is Severity.ERROR for f in r.findings)
        for r in results
    ):
        return EXIT_ERROR
    if any(f.severity is Severity.ERROR for r in results for f in r.findings):
        return EXIT_FINDINGS
    return EXIT_OK
