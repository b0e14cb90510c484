"""An engine's own class as the contract: ``kvcache check PATH --against engine/mod.py:Base``.

A third-party pool package for an engine is held to the engine's base class, not to kvcache's
Protocols: every class under the targets that subclasses the engine class, or is installed in
its place (``engine_mod.Base = Replacement``), must accept every call the engine class
accepts, method by method, the constructor included (``Class(kw=...)`` is a call of
``__init__``). Both sides are read from source: nothing is imported, so an engine whose GPU
dependencies are missing can still be the contract.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from ..members.compare import compare_signatures
from ..members.methods import outcome_for
from ..members.signatures import sig_from_ast
from ..members.sources import ClassSource, SourceIndex, python_files
from ..results.model import CheckResult, Finding
from ..results.rules import Severity
from ..results.usage import UsageError

__all__ = ["engine_class", "is_engine_class", "check_against_engine"]


def is_engine_class(spec: str) -> bool:
    """``PATH:Class`` or ``module.path:Class``: an engine class, not a Protocol name."""
    return ":" in spec


def engine_class(spec: str, index: SourceIndex) -> ClassSource:
    """The class ``spec`` names, read from its source (a file, or a module located without
    importing it); a usage error when it cannot be found."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UsageError(f"--against {spec}: expected PATH:Class or module:Class")
    if where.endswith(".py") or os.sep in where or os.path.isfile(where):
        if not os.path.isfile(where):
            raise UsageError(f"--against {spec}: no file {where}")
        module = index.load_file(where, os.path.dirname(os.path.abspath(where)))
    else:
        found = index.module(where)
        if found is None:
            raise UsageError(
                f"--against {spec}: module {where} cannot be found (nothing is imported)"
            )
        module = found
    cls = module.classes.get(name)
    if cls is None:
        resolved = index.resolve_name(module, name)
        if isinstance(resolved, ClassSource):
            cls = resolved
    if cls is None:
        raise UsageError(f"--against {spec}: {module.path} defines no class {name}")
    return cls


def _methods(index: SourceIndex, cls: ClassSource) -> list[str]:
    """Every method the engine class and the classes read above it define, ``__init__``
    first: what a caller of the engine class may call."""
    names: dict[str, None] = {"__init__": None}
    for klass in index.mro(cls):
        if isinstance(klass, ClassSource):
            names.update(
                dict.fromkeys(n for n in klass.methods if not n.startswith("__") or n == "__init__")
            )
    return [n for n in names if index.find_method(cls, n) is not None]


def _replacements(
    index: SourceIndex, modules: Sequence[object], engine: ClassSource
) -> dict[int, str]:
    """Classes installed in the engine class's place, with where (``mod.Base = X``)."""
    from .drift import rebindings

    out: dict[int, str] = {}
    for replaced, replacement, where in rebindings(index, modules):  # type: ignore[arg-type]
        if replaced is engine:
            out[id(replacement)] = where
    return out


def check_against_engine(
    targets: Sequence[str], specs: Sequence[str], index: SourceIndex
) -> list[CheckResult]:
    """``source:<Class>`` results: each class under ``targets`` (paths, or ``module:Class``)
    that subclasses or replaces an engine class in ``specs``, compared method by method."""
    engines = [engine_class(spec, index) for spec in specs]
    modules = []
    classes: list[ClassSource] = []
    for target in targets:
        if ":" in target and not os.path.exists(target):
            mod_name, _, cls_name = target.rpartition(":")
            module = index.module(mod_name)
            if module is None or cls_name not in module.classes:
                raise UsageError(f"{target}: no such class in the sources found")
            modules.append(module)
            classes.append(module.classes[cls_name])
            continue
        for path in python_files(target):
            module = index.load_file(path, target if os.path.isdir(target) else None)
            modules.append(module)
            classes.extend(module.all_classes)
    results: list[CheckResult] = []
    for engine in engines:
        replaced = _replacements(index, modules, engine)
        wanted = _methods(index, engine)
        for cls in classes:
            if cls is engine:
                continue
            mro = index.mro(cls)
            if not any(k is engine for k in mro) and id(cls) not in replaced:
                continue
            how = (
                f"{cls.name} replaces {engine.qualname} ({replaced[id(cls)]})"
                if id(cls) in replaced
                else f"{cls.name} subclasses {engine.qualname}"
            )
            findings: list[Finding] = []
            for name in wanted:
                ours = index.find_method(cls, name)
                theirs = index.find_method(engine, name)
                if ours is None or theirs is None or ours[1] is theirs[1]:
                    continue
                if any(k is ours[0] for k in index.mro(engine)):
                    continue  # inherited from above the engine class: the same code it runs
                for finding in compare_signatures(
                    sig_from_ast(theirs[1], path=theirs[0].path),
                    sig_from_ast(ours[1], path=ours[0].path),
                    target=cls.qualname,
                    note=f"{how}; {engine.name}'s signature is the contract here",
                ):
                    if finding.rule == "renamed-parameter":
                        # An engine class is no published keyword contract: its own callers
                        # mostly pass these positionally. `kvcache drift` with the engine's
                        # sources shows whether one passes it by keyword.
                        finding = replace(
                            finding,
                            severity=Severity.WARNING,
                            message=finding.message
                            + " Only a caller passing it by keyword breaks: `kvcache drift` on "
                            "the plugin and the engine's sources lists them.",
                        )
                    findings.append(finding)
            results.append(
                CheckResult(
                    cls.qualname, f"source:{engine.name}", outcome_for(findings), tuple(findings)
                )
            )
    if not results:
        names = ", ".join(e.qualname for e in engines)
        raise UsageError(f"no class under the targets subclasses or replaces {names}")
    return results
