"""Run the checker's levels over resolved targets: one ``CheckResult`` per (target, check).

Every level is one entry of [`LEVELS`][kvcache_core.conformance.runner.LEVELS], cheapest
first: ``source`` (never imports), ``signature`` (imports, compares ``inspect.signature``),
``types`` (mypy) and ``behaviour`` (builds tiny pools through installed plugins' factories and
runs the battery; targets without a ``PoolSpec`` get a SKIPPED result). The runner iterates
that tuple and hands every level the same
[`LevelOptions`][kvcache_core.conformance.runner.LevelOptions]; each level takes what it needs
from them. Adding a level is adding its subpackage and one
entry. Each level's module is loaded by name when it runs: a level that is not installed (a
kvcache without mypy) gives its targets an ERROR result saying so, and a level that crashes
turns into ERROR results for its targets, never into a traceback that hides the other levels'
findings.

[`check`][kvcache_core.conformance.runner.check] is the whole of ``kvcache check`` as a
library function: targets in, [`Report`][kvcache_core.conformance.reporting.report.Report]
out.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..contracts.history import CONTRACT_VERSION, VERSIONS
from ..plugin_loader import summarise_exception
from .members.sources import SourceIndex
from .reporting.report import FORMATS, Report, report
from .results.expected import ExpectedFailure
from .results.model import CheckResult, Outcome
from .results.rules import RULES
from .results.usage import UsageError
from .targets.target import ClassTarget

if TYPE_CHECKING:
    from ..contracts.spec import PoolSpec
    from .results.selection import Selection

__all__ = [
    "ALL_LEVELS",
    "DEFAULT_LEVELS",
    "DRIFT_ONLY_RULES",
    "LEVELS",
    "Level",
    "LevelOptions",
    "LevelUnavailable",
    "ModuleLevel",
    "active_rules",
    "check",
    "check_contract_version",
    "level_named",
    "parse_levels",
    "run_levels",
]


@dataclass(frozen=True)
class LevelOptions:
    """Everything a run offers its levels, in one value: each level reads what it needs.

    One value rather than keyword arguments per level, so the runner calls every level the
    same way and a new level needs no change to it.
    """

    contract_version: int = CONTRACT_VERSION
    """The published contract version to check against."""
    index: SourceIndex = field(default_factory=SourceIndex)
    """The source files read so far, shared so a file is parsed once per run."""
    expected_failures: Sequence[ExpectedFailure] = ()
    """``[tool.kvcache.expected-failures]`` (for the behaviour level, on top of each
    ``PoolSpec``'s own)."""
    progress: Callable[[str], None] | None = None
    """Told, in words, what is running (the CLI shows it on a terminal)."""
    behaviour_checks: Sequence[str] | None = None
    """The only battery checks the behaviour level runs (``--select``/``--deselect``); None:
    all."""

    def expected_by_pool(self) -> dict[str, dict[str, str]]:
        """``expected_failures`` as ``{pool: {check id: reason}}``, the battery's form."""
        by_pool: dict[str, dict[str, str]] = {}
        for expected in self.expected_failures:
            by_pool.setdefault(expected.pool, {})[expected.check] = expected.describe()
        return by_pool


class LevelUnavailable(Exception):
    """A level cannot run in this kvcache (its module or a tool it needs is missing); its
    targets get an ERROR result with this message, and the other levels run."""


class Level(Protocol):
    """One level of the checker: a name, what it needs, and a run that yields results."""

    @property
    def name(self) -> str:
        """The level's name, as ``--level`` spells it and as its results' checks begin."""
        ...

    @property
    def needs(self) -> str:
        """What the level needs to run, in words, for a person choosing which levels to run."""
        ...

    @property
    def imports_targets(self) -> bool:
        """Whether it imports the code it checks (when no chosen level does, installed
        plugins are read from source too, so the run imports nothing)."""
        ...

    @property
    def own_rules(self) -> frozenset[str]:
        """Rules only this level reports (an unused suppression of one is not reported when
        the level did not run)."""
        ...

    def run(self, targets: Sequence[ClassTarget], options: LevelOptions) -> list[CheckResult]:
        """One ``CheckResult`` per (target, check) of this level; may raise
        [`LevelUnavailable`][kvcache_core.conformance.runner.LevelUnavailable]."""
        ...


@dataclass(frozen=True)
class ModuleLevel:
    """A [`Level`][kvcache_core.conformance.runner.Level] whose work is a module's
    ``run_level(targets, options)``, imported only when the level runs (so ``kvcache check
    --help`` and a source-only run never load the other levels)."""

    name: str
    """See [`Level.name`][kvcache_core.conformance.runner.Level.name]."""
    needs: str
    """See [`Level.needs`][kvcache_core.conformance.runner.Level.needs]."""
    module: str
    """The module holding ``run_level``."""
    imports_targets: bool = True
    """See [`Level.imports_targets`][kvcache_core.conformance.runner.Level.imports_targets]."""
    own_rules: frozenset[str] = frozenset()
    """See [`Level.own_rules`][kvcache_core.conformance.runner.Level.own_rules]."""

    def run(self, targets: Sequence[ClassTarget], options: LevelOptions) -> list[CheckResult]:
        """Import ``module`` and call its ``run_level``."""
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            if exc.name != self.module:
                raise LevelUnavailable(f"{self.name} level cannot load: {exc}") from None
            raise LevelUnavailable(
                f"{self.name} level is not available in this kvcache ({self.module} is missing)"
            ) from None
        run_level = getattr(module, "run_level", None)
        if not callable(run_level):
            raise LevelUnavailable(
                f"{self.name} level is not available: {self.module} has no run_level()"
            )
        return list(run_level(targets, options))


_HERE = __name__.rsplit(".", 1)[0]

LEVELS: tuple[Level, ...] = (
    ModuleLevel(
        "source",
        "the targets' source files; nothing is imported",
        f"{_HERE}.source.level",
        imports_targets=False,
    ),
    ModuleLevel(
        "signature",
        "the targets importable (their dependencies installed)",
        f"{_HERE}.signature.level",
    ),
    ModuleLevel(
        "types",
        "mypy, and the targets' source files",
        f"{_HERE}.types.level",
        own_rules=frozenset({"type-error"}),
    ),
    ModuleLevel(
        "behaviour",
        "an installed plugin's PoolSpec (the battery builds pools through its factory); torch",
        f"{_HERE}.behaviour.level",
        own_rules=frozenset({"behaviour-failed"}),
    ),
)
"""Every level, in run order (cheapest first): the one list the runner iterates and
``--level``, the rules a run can report and the architecture tests read. Adding a level is
adding its subpackage (a ``level.py`` with ``run_level(targets, options)``) and one entry."""

ALL_LEVELS: tuple[str, ...] = tuple(level.name for level in LEVELS)
"""The levels' names, in run order (what ``--level`` accepts)."""
DEFAULT_LEVELS: tuple[str, ...] = ALL_LEVELS
"""What runs without ``--level``: every level."""


def level_named(name: str) -> Level:
    """The level called ``name`` (``UsageError`` naming every level otherwise)."""
    for level in LEVELS:
        if level.name == name:
            return level
    names = ", ".join(level.name for level in LEVELS)
    raise UsageError(f"unknown level {name!r}; levels: {names}")


def parse_levels(values: Sequence[str] | None) -> tuple[str, ...]:
    """``--level source --level signature,types`` -> levels in run order, validated."""
    every = tuple(level.name for level in LEVELS)
    if not values:
        return every
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in every]
    if unknown:
        raise UsageError(
            f"unknown level {', '.join(map(repr, unknown))}; levels: {', '.join(every)}"
        )
    return tuple(level for level in every if level in names)


def check_contract_version(version: int) -> int:
    """``version`` when it is a published contract version; ``UsageError`` otherwise."""
    if version not in VERSIONS:
        raise UsageError(
            f"unknown contract version {version}; published: {', '.join(map(str, VERSIONS))}"
        )
    return version


def _for_each(
    targets: Sequence[ClassTarget], check: str, outcome: Outcome, detail: str
) -> list[CheckResult]:
    return [CheckResult(t.name, check, outcome, detail=detail) for t in targets]


def _guarded(
    level: Level, targets: Sequence[ClassTarget], options: LevelOptions
) -> list[CheckResult]:
    try:
        return list(level.run(targets, options))
    except LevelUnavailable as exc:
        return _for_each(targets, level.name, Outcome.ERROR, str(exc))
    except Exception as exc:
        why = f"{level.name} level crashed: {summarise_exception(exc)}"
        return _for_each(targets, level.name, Outcome.ERROR, why)


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

    The keyword arguments become the one
    [`LevelOptions`][kvcache_core.conformance.runner.LevelOptions] every level receives:
    ``behaviour_checks`` (if given) are the only battery checks the behaviour level runs
    (``kvcache check --select/--deselect``); ``progress`` (if given) is told, in words, which
    level (and which pool of the behaviour level) is running; ``expected_failures`` (from
    ``[tool.kvcache.expected-failures]``) are for the behaviour level, on top of what each
    ``PoolSpec`` declares itself.
    """
    options = LevelOptions(
        contract_version=contract_version,
        index=index if index is not None else SourceIndex(),
        expected_failures=expected_failures,
        progress=progress,
        behaviour_checks=behaviour_checks,
    )
    chosen = [level_named(name) for name in levels]
    results: list[CheckResult] = []
    for number, level in enumerate(chosen, start=1):
        if not targets:
            break
        if progress is not None:
            progress(
                f"kvcache check: {level.name} level ({number}/{len(chosen)}), "
                f"{len(targets)} target(s)"
            )
        results += _guarded(level, targets, options)
    return results


DRIFT_ONLY_RULES = frozenset({"unaccepted-keyword"})
"""Rules only ``kvcache drift`` reports (no level of ``kvcache check`` can)."""


def active_rules(levels: Sequence[str]) -> frozenset[str]:
    """The rules that running ``levels`` can report (for unused-suppression detection)."""
    rules = set(RULES) - DRIFT_ONLY_RULES
    for level in LEVELS:
        if level.name not in levels:
            rules -= level.own_rules
    return frozenset(rules)


def check(
    targets: Sequence[str] = (),
    *,
    levels: Sequence[str] | None = None,
    against: Sequence[str] | None = None,
    contract_version: int = CONTRACT_VERSION,
    select: Sequence[str] | None = None,
    deselect: Sequence[str] | None = None,
    pyproject: str | os.PathLike[str] | bool = True,
    format: str = "text",
    progress: Callable[[str], None] | None = None,
) -> Report:
    """``kvcache check`` as a library function: the same targets and options, the same report.

    ``targets``, ``levels``, ``against``, ``select`` and ``deselect`` are spelled as on the
    command line (``levels=["source,signature"]``); no target means every installed plugin.
    ``pyproject`` says where ``[tool.kvcache]`` (suppressions, expected failures) is read: True
    (default) the nearest ``pyproject.toml`` above the current directory, a path, or False for
    none. Everything the options get wrong (``format`` included) is a ``UsageError``
    (``kvcache_core.conformance.results.usage``) raised before a level runs. The report's
    ``text`` is byte for byte what ``kvcache check --format FORMAT`` prints for the same
    results, and its ``exit_code`` is the command's.
    """
    from .results.expected import check_applicable, check_known_ids, load_expected_failures
    from .results.selection import parse_selection
    from .results.suppressions import find_pyproject, load_pyproject
    from .targets.resolve import parse_protocols, resolve_targets

    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}; formats: {', '.join(FORMATS)}")
    from .source.against import check_against_engine, is_engine_class

    chosen = parse_levels(levels)
    requested = [n.strip() for v in against or () for n in v.split(",") if n.strip()]
    engine_specs = [n for n in requested if is_engine_class(n)]
    protocols = parse_protocols([n for n in requested if not is_engine_class(n)])
    version = check_contract_version(contract_version)
    if pyproject is True:
        config = find_pyproject(os.getcwd())
    elif pyproject is False:
        config = None
    else:
        config = os.fspath(pyproject)
        if not os.path.isfile(config):
            raise UsageError(f"{config}: no such file")
    configured = load_pyproject(config) if config else []
    expected = load_expected_failures(config)
    check_known_ids(expected)
    selection = parse_selection(select, deselect)
    index = SourceIndex()
    read_only = bool(chosen) and not any(level_named(n).imports_targets for n in chosen)
    if engine_specs:  # an engine's class as the contract: read from source, the source level's
        if not targets:
            raise UsageError("--against PATH:Class needs targets (paths or module:Class)")
        results = check_against_engine(targets, engine_specs, index)
        if protocols is None:
            return report(
                selection.apply(results),
                format,
                suppressions=configured,
                active_rules=[r for r in active_rules(["source"]) if selection.wants({r})],
            )
    else:
        results = []
    found, resolved = resolve_targets(
        targets, against=protocols, index=index, read_plugins=read_only
    )
    results += resolved
    if expected and "behaviour" in chosen:
        check_applicable(expected, _checked_specs(found))
    results += run_levels(
        found,
        chosen,
        contract_version=version,
        index=index,
        expected_failures=expected,
        progress=progress,
        behaviour_checks=_behaviour_checks(selection, chosen),
    )
    return report(
        selection.apply(results),
        format,
        suppressions=configured,
        scanned=[t.path or "" for t in found],
        active_rules=[r for r in active_rules(chosen) if selection.wants({r})],
    )


def _checked_specs(targets: Sequence[ClassTarget]) -> Mapping[str, PoolSpec]:
    """The specs of the pools the behaviour level will run, by pool name."""
    from .targets.plugins import plugin_specs

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


def _behaviour_checks(selection: Selection, levels: Sequence[str]) -> list[str] | None:
    """The battery checks ``--select``/``--deselect`` leave (None: all, or no behaviour)."""
    if selection.everything or "behaviour" not in levels:
        return None
    from .results.battery_ids import battery_ids

    return selection.behaviour_checks(battery_ids())
