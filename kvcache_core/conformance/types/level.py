"""The types level: mypy judges each class against each contract Protocol it claims, and every
conflicting member is reported (mypy itself lists two and stops).

How: one generated module holds a one-member Protocol per contract member (the contract's own
text) and one assignment per (class, member); a single mypy run over it, against the small torch
stub in ``stubs/`` and with bodies of imported code skipped, answers for every class at once
(see docs/types-level.md for the timings). The class is never imported: like the source level,
this level is safe on code whose dependencies are not installed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...contracts.history import CONTRACT_VERSION
from ..members.methods import protocol_by_name, split_by_protocol
from ..members.sources import SourceIndex, module_name_for
from ..results.model import CheckResult, Finding, Location, Outcome
from ..targets.target import ClassTarget
from ._contract import ContractMember, contract_member
from ._findings import member_finding
from ._gen import MODULE_NAME, Generated, Role, TargetPlan, generate
from ._locate import impl_location, impl_signature
from ._mypy import MypyMessage, MypyRun, default_cache_dir, find_stubs_dir, link_roots, run_mypy

if TYPE_CHECKING:
    from ..runner import LevelOptions

__all__ = ["LEVEL", "run", "run_level"]

LEVEL = "types"


@dataclass
class _Plan:
    """A target ready for mypy: where it lives and what it is checked on, per Protocol."""

    target: ClassTarget
    path: Path
    module: str
    top: str
    top_path: Path
    groups: list[tuple[str, list[ContractMember]]]
    errors: list[CheckResult] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, tuple[ContractMember, ...]]:
        """Targets with equal keys (one class behind several specs) are checked once."""
        return self.module, self.target.class_name, self.members

    @property
    def members(self) -> tuple[ContractMember, ...]:
        return tuple(m for _, members in self.groups for m in members)


def _check(protocol: str) -> str:
    return f"{LEVEL}:{protocol}"


def _root(path: Path, module: str) -> Path | None:
    """The import root ``path`` lives under as module ``module`` (None when they disagree)."""
    parts = module.split(".")
    base = path.parent if path.name == "__init__.py" else path.with_suffix("")
    if len(base.parts) <= len(parts) or base.parts[-len(parts) :] != tuple(parts):
        return None
    return Path(*base.parts[: -len(parts)])


def _load_error(
    target: ClassTarget, protocols: Sequence[str], message: str, hint: str
) -> list[CheckResult]:
    where = Location(target.path) if target.path else None
    finding = Finding(
        rule="load-error", message=message, target=target.name, hint=hint, impl_location=where
    )
    return [
        CheckResult(target.name, _check(p), Outcome.ERROR, (finding,), detail=message)
        for p in protocols
    ]


def _source_path(target: ClassTarget, index: SourceIndex) -> Path | None:
    """The target's file: as given, or found by looking (never importing) for its module."""
    if target.path:
        return Path(target.path).resolve()
    if target.module:
        found = index.module(target.module)
        return Path(found.path).resolve() if found is not None else None
    return None


def _prepare(target: ClassTarget, version: int, index: SourceIndex) -> _Plan | list[CheckResult]:
    unknown: list[CheckResult] = []
    known: list[str] = []
    for name in dict.fromkeys(target.protocols):
        try:
            protocol_by_name(name)
            known.append(name)
        except KeyError as exc:
            detail = str(exc.args[0])
            unknown.append(CheckResult(target.name, _check(name), Outcome.ERROR, detail=detail))
    path = _source_path(target, index)
    if path is None or not path.is_file():
        where = target.path or target.module or target.name
        return unknown + _load_error(
            target,
            known,
            f"cannot find the source of {where}",
            "give the checker a path to the class's file, or install its package",
        )
    module = target.module or module_name_for(str(path))[0]
    root = _root(path, module)
    if root is None:
        module, root_text = module_name_for(str(path))
        root = Path(root_text)
    try:
        index.load_file(str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
        return unknown + _load_error(
            target,
            known,
            f"cannot parse {path}: {type(exc).__name__}: {exc}",
            "fix the file; mypy cannot check a class it cannot parse",
        )
    top = module.split(".")[0]
    top_path = root / top if (root / top).is_dir() else root / f"{top}.py"
    groups = []
    for proto, methods, attrs in split_by_protocol(known):
        members = [contract_member(protocol_by_name(proto), m, version) for m in methods + attrs]
        groups.append((proto, sorted(members, key=lambda m: (m.path, m.line))))
    return _Plan(target, path, module, top, top_path, groups, unknown)


def _batches(plans: list[_Plan], fixed: dict[str, Path]) -> list[list[_Plan]]:
    """Split plans so that, within one mypy run, a top-level name means one directory."""
    batches: list[tuple[dict[str, Path], list[_Plan]]] = []
    for plan in plans:
        for mapping, members in batches:
            if mapping.get(plan.top, plan.top_path) == plan.top_path:
                mapping[plan.top] = plan.top_path
                members.append(plan)
                break
        else:
            batches.append(({**fixed, plan.top: plan.top_path}, [plan]))
    return [members for _, members in batches]


def _run_failed(plans: Sequence[_Plan], why: str) -> list[CheckResult]:
    return [
        CheckResult(p.target.name, _check(proto), Outcome.ERROR, detail=why)
        for p in plans
        for proto, _ in p.groups
    ]


def _failure_text(run: MypyRun) -> str:
    lines = [*run.foreign, *run.stderr.strip().splitlines()]
    shown = "\n".join(lines[:20]) or "no output"
    return f"mypy could not check (exit status {run.returncode}):\n{shown}"


@dataclass
class _Answers:
    """mypy's errors of one run, looked up by (generated target, role, member)."""

    generated: Generated
    run: MypyRun
    results: int
    lines: dict[tuple[int, Role, ContractMember | None], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for line, role in self.generated.roles.items():
            if role.target is not None:
                self.lines[(role.target, role.role, role.member)] = line
        self.by_line = {m.line: m for m in self.run.messages}

    def error(
        self, target: int, role: Role, member: ContractMember | None = None
    ) -> MypyMessage | None:
        line = self.lines.get((target, role, member))
        return self.by_line.get(line) if line is not None else None

    def notes(self, target: int, role: Role, member: ContractMember) -> list[str] | None:
        found = self.error(target, role, member)
        return found.notes if found is not None else None


def _target_results(
    plan: _Plan, number: int, answers: _Answers, index: SourceIndex, version: int
) -> list[CheckResult]:
    target = plan.target
    protocols = [proto for proto, _ in plan.groups]
    imported = answers.error(number, Role.TARGET_IMPORT)
    if imported is not None:
        return _load_error(
            target,
            protocols,
            f"mypy cannot import {target.class_name} from {plan.module}: {imported.text}",
            "check the class and module names",
        )
    if answers.error(number, Role.PROBE_ANY) is None:
        return _load_error(
            target,
            protocols,
            f"mypy sees {target.class_name} as Any (its module, or a module it needs, cannot be "
            "found without site-packages), so nothing about it can be checked",
            "check the module name, or use the signature level, which imports the class",
        )
    extra: list[Finding] = []
    if answers.error(number, Role.PROBE_ANY_BASE) is None:
        extra.append(
            Finding(
                rule="unresolved-base",
                message=f"{target.class_name} has a base class mypy cannot see (a missing import "
                "or stub); members it inherits from there are not checked",
                target=target.name,
                hint="members the class defines itself are still checked; the signature level "
                "imports the class and sees every base",
                impl_location=impl_location(index, plan.path, target.class_name, None),
            )
        )
    share = answers.run.seconds / max(1, answers.results)
    results: list[CheckResult] = []
    for proto, members in plan.groups:
        findings, extra = extra, []
        for member in members:
            notes = answers.notes(number, Role.MEMBER, member)
            call_notes = answers.notes(number, Role.MEMBER_CALL, member)
            if notes is None and call_notes is None:
                continue
            source_sig = None
            if notes is None:
                source_sig = impl_signature(index, plan.path, target.class_name, member.name)
            findings.append(
                member_finding(
                    member,
                    notes,
                    call_notes=call_notes,
                    impl_sig=source_sig,
                    protocol=proto,
                    target=target.name,
                    class_name=target.class_name,
                    impl_location=impl_location(index, plan.path, target.class_name, member.name),
                    protocol_names=answers.generated.protocol_names,
                    contract_version=version,
                )
            )
        results.append(
            CheckResult(
                target.name,
                _check(proto),
                Outcome.FAILED if any(f.is_error for f in findings) else Outcome.PASSED,
                tuple(findings),
                duration_s=share,
                extra={"mypy_seconds": round(answers.run.seconds, 3)},
            )
        )
    return results


def _check_batch(
    batch: list[_Plan],
    mapping: dict[str, Path],
    *,
    stubs: Path,
    cache: Path,
    timeout: float,
    index: SourceIndex,
    version: int,
) -> list[CheckResult]:
    started = time.perf_counter()
    firsts: dict[tuple[str, str, tuple[ContractMember, ...]], _Plan] = {}
    for plan in batch:
        firsts.setdefault(plan.key, plan)
    unique = {key: number for number, key in enumerate(firsts)}
    generated = generate(
        [
            TargetPlan(unique[key], plan.module, plan.target.class_name, plan.members)
            for key, plan in firsts.items()
        ]
    )
    run = run_mypy(
        generated.text,
        module_name=MODULE_NAME,
        search_path=[stubs, link_roots(mapping, cache)],
        cache_dir=cache,
        timeout=timeout,
    )
    run.seconds = time.perf_counter() - started
    if run.failed:
        return _run_failed(batch, _failure_text(run))
    stray = [m for m in run.messages if generated.role(m.line).role is Role.SCAFFOLD]
    if stray:
        text = "; ".join(f"line {m.line}: {m.text}" for m in stray[:5])
        return _run_failed(batch, f"internal error: the generated module does not check: {text}")
    answers = _Answers(generated, run, results=sum(len(p.groups) for p in batch))
    results: list[CheckResult] = []
    for plan in batch:
        results += _target_results(plan, unique[plan.key], answers, index, version)
    return results


def run(
    targets: Sequence[ClassTarget],
    *,
    contract_version: int = CONTRACT_VERSION,
    cache_dir: str | os.PathLike[str] | None = None,
    timeout: float = 600.0,
) -> list[CheckResult]:
    """One ``CheckResult`` per (target, claimed Protocol), check name ``types:<Protocol>``.

    ``cache_dir`` holds mypy's cache (default: ``$KVCACHE_CACHE_DIR`` or the user cache dir);
    with it warm, a run over every built-in plugin takes well under a second.
    """
    import kvcache_core

    index = SourceIndex()
    results: list[CheckResult] = []
    plans: list[_Plan] = []
    for target in targets:
        prepared = _prepare(target, contract_version, index)
        if isinstance(prepared, list):
            results += prepared
            continue
        results += prepared.errors
        if prepared.groups:
            plans.append(prepared)
    if not plans:
        return results
    stubs = find_stubs_dir()
    if stubs is None:
        why = "the types level needs kvcache's stubs/ directory next to the kvcache_core package"
        return results + _run_failed(plans, why)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fixed = {"kvcache_core": Path(kvcache_core.__file__).resolve().parent}
    for batch in _batches(plans, fixed):
        mapping = {**fixed, **{p.top: p.top_path for p in batch}}
        results += _check_batch(
            batch,
            mapping,
            stubs=stubs,
            cache=cache,
            timeout=timeout,
            index=index,
            version=contract_version,
        )
    return results


def run_level(targets: Sequence[ClassTarget], options: LevelOptions) -> list[CheckResult]:
    """The runner's entry: this level needs only the contract version."""
    return run(targets, contract_version=options.contract_version)
