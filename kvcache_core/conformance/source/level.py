"""The source level: check classes against the contract from their source text alone.

Nothing is imported or executed, so it is safe on untrusted code and works where a plugin's
GPU-only dependencies are missing. Base classes are followed across files and packages (see
``_sources``), so an inherited method is compared where it is really defined, and every
finding points at that definition. The comparison itself is the one every level shares.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...contracts.history import CONTRACT_VERSION
from ..members.methods import (
    attribute_finding,
    contract_attributes,
    contract_methods,
    method_findings,
    missing_method,
    outcome_for,
    split_by_protocol,
)
from ..members.signatures import sig_from_ast
from ..members.sources import ClassSource, ExternalBase, SourceIndex
from ..results.model import CheckResult, Finding, Location, Outcome
from ..targets.target import ClassTarget

if TYPE_CHECKING:
    from ..runner import LevelOptions

__all__ = ["LEVEL", "check_class", "outcome_for", "run", "run_level"]

LEVEL = "source"


def _load_error(target: ClassTarget, message: str) -> CheckResult:
    where = Location(target.path) if target.path else None
    finding = Finding(
        rule="load-error",
        message=message,
        target=target.name,
        hint="fix the file so that it parses, or point the checker at the right class",
        impl_location=where,
    )
    return CheckResult(target.name, LEVEL, Outcome.ERROR, (finding,), detail=message)


def find_class(index: SourceIndex, target: ClassTarget) -> ClassSource | str:
    """The class ``target`` names, read from its file (or its module); else why not."""
    try:
        if target.path:
            module = index.load_file(target.path)
        elif target.module:
            found = index.module(target.module)
            if found is None:
                why = index.errors.get(target.module, "no source file found")
                return f"cannot read module {target.module}: {why}"
            module = found
        else:
            return f"{target.name}: neither a file nor a module to read"
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot parse {target.path}: {type(exc).__name__}: {exc}"
    cls = module.classes.get(target.class_name)
    if cls is None:
        return f"{module.path} defines no top-level class {target.class_name!r}"
    return cls


def _bases_text(index: SourceIndex, cls: ClassSource) -> str:
    names = [
        k.name if isinstance(k, ClassSource) else k.qualname
        for k in index.mro(cls)[1:]
        if not (isinstance(k, ExternalBase) and k.known)
    ]
    return f" (nor do its bases {', '.join(names)})" if names else ""


def check_class(
    index: SourceIndex,
    cls: ClassSource,
    protocol: str,
    methods: Sequence[str],
    attributes: Sequence[str],
    *,
    target: str,
    contract_version: int = CONTRACT_VERSION,
) -> list[Finding]:
    """Findings of ``cls`` against ``protocol``, restricted to the given members."""
    # The contract by name: read from its source, as the target is (no import, no torch).
    contract = contract_methods(protocol, contract_version)
    annotations = contract_attributes(protocol)
    class_at = Location(cls.path, cls.line)
    unknown = index.unknown_bases(cls)
    unchecked: list[str] = []
    findings: list[Finding] = []
    for name in methods:
        want = contract[name]
        found = index.find_method(cls, name)
        if found is None:
            if unknown:
                unchecked.append(f"`{name}`")
            else:
                findings.append(
                    missing_method(
                        want,
                        protocol=protocol,
                        target=target,
                        class_name=cls.name,
                        where=class_at,
                        why="does not define it" + _bases_text(index, cls),
                    )
                )
            continue
        owner, node = found
        if owner.is_protocol:
            findings.append(
                missing_method(
                    want,
                    protocol=protocol,
                    target=target,
                    class_name=cls.name,
                    where=class_at,
                    why=f"only inherits the Protocol stub from {owner.name}",
                )
            )
            continue
        impl = sig_from_ast(node, path=owner.path)
        findings += method_findings(
            want,
            impl,
            node,
            protocol=protocol,
            target=target,
            owner=None if owner is cls else owner.name,
            contract_version=contract_version,
            path=owner.path,
        )
    for name in attributes:
        if index.has_attribute(cls, name):
            continue
        if unknown:
            unchecked.append(f"`{name}`")
        else:
            findings.append(
                attribute_finding(
                    name,
                    annotations[name],
                    protocol=protocol,
                    target=target,
                    class_name=cls.name,
                    where=class_at,
                    from_source=True,
                )
            )
    if unchecked:
        for base in unknown:
            findings.append(
                Finding(
                    rule="unresolved-base",
                    message=f"base `{base.name}` of {cls.name} cannot be found without importing "
                    f"it, and {', '.join(unchecked)} (required by {protocol}) "
                    f"{'is' if len(unchecked) == 1 else 'are'} not defined in the sources read: "
                    f"{'it' if len(unchecked) == 1 else 'they'} may be inherited from it",
                    target=target,
                    hint="check this class with the signature level too (`--level signature`), "
                    "or pass the base's source file or package to the checker",
                    impl_location=class_at,
                )
            )
    return findings


def run(
    targets: Sequence[ClassTarget],
    *,
    contract_version: int = CONTRACT_VERSION,
    index: SourceIndex | None = None,
) -> list[CheckResult]:
    """One result per (target, Protocol it claims); a target that cannot be read is an ERROR."""
    index = index if index is not None else SourceIndex()
    results: list[CheckResult] = []
    for target in targets:
        started = time.perf_counter()
        cls = find_class(index, target)
        if isinstance(cls, str):
            results.append(_load_error(target, cls))
            continue
        for protocol, methods, attributes in split_by_protocol(target.protocols, from_source=True):
            findings = check_class(
                index,
                cls,
                protocol,
                methods,
                attributes,
                target=target.name,
                contract_version=contract_version,
            )
            now = time.perf_counter()
            results.append(
                CheckResult(
                    target=target.name,
                    check=f"{LEVEL}:{protocol}",
                    outcome=outcome_for(findings),
                    findings=tuple(findings),
                    duration_s=now - started,
                )
            )
            started = now
    return results


def run_level(targets: Sequence[ClassTarget], options: LevelOptions) -> list[CheckResult]:
    """The runner's entry: the contract version and the run's shared source index."""
    return run(targets, contract_version=options.contract_version, index=options.index)
