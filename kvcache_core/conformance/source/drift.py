"""Drift inside a source tree, with no contract at all.

Engines grew pool hierarchies whose subclasses quietly narrowed an inherited method (a DSA pool
overriding offload without ``mamba_indices``), and call sites that pass a keyword only some
implementers accept. Both are visible from source alone:

* every class overriding one of ``methods`` is compared with the nearest ancestor that defines
  it, which plays the contract (``compare_signatures``, the one comparison every level uses);
* every call ``<expr>.<method>(..., kw=...)`` is checked against every class of the tree that
  implements ``method``: if one of them does not accept ``kw``, an object of that class raises
  ``TypeError`` at that call.

Receivers are not typed, so a call site is checked against all implementers in scope; narrow
the scope with ``root`` (only the hierarchy under one class). Nothing is imported.
"""

from __future__ import annotations

import ast
import bisect
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ...contracts.signature import MethodSig, ParamKind
from ..members.compare import compare_signatures
from ..members.methods import outcome_for
from ..members.signatures import sig_from_ast
from ..members.sources import (
    ClassSource,
    ExternalBase,
    ModuleSource,
    SourceIndex,
    module_name_for,
    python_files,
)
from ..results.model import CheckResult, Finding, Location, unparsable_file
from ..results.usage import UsageError

__all__ = ["DEFAULT_METHODS", "DRIFT_RULES", "DriftRun", "analyze", "run_drift"]

DEFAULT_METHODS: tuple[str, ...] = ("get_cpu_copy", "load_cpu_copy", "set_kv_buffer")

#: Every rule this analysis can report.
DRIFT_RULES = frozenset(
    {
        "missing-parameter",
        "extra-required-parameter",
        "renamed-parameter",
        "parameter-kind-changed",
        "parameter-order-changed",
        "became-required",
        "default-changed",
        "kwargs-hides-parameter",
        "annotation-mismatch",
        "return-mismatch",
        "unaccepted-keyword",
        "unresolved-base",
        "load-error",
    }
)


@dataclass(frozen=True)
class _Impl:
    cls: ClassSource
    sig: MethodSig

    @property
    def label(self) -> str:
        return f"{self.cls.name}.{self.sig.name}"

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.sig.path or self.cls.path)}:{self.sig.line}"

    def accepts(self, keyword: str) -> bool:
        return any(
            (p.name == keyword and p.kind is not ParamKind.POSITIONAL_ONLY)
            or p.kind is ParamKind.VAR_KEYWORD
            for p in self.sig.params
        )


def _given_files(paths: Sequence[str]) -> dict[str, str]:
    """Every Python file under ``paths``, in order, with the path given that it was found under."""
    files: dict[str, str] = {}
    for given in paths:
        found = python_files(given)
        if not found:
            raise UsageError(f"no Python files at {given}")
        for path in found:
            files.setdefault(path, given)
    return files


def _load_error(path: str, exc: Exception) -> CheckResult:
    return unparsable_file(path, exc, "drift")


def _load_all(
    files: dict[str, str], index: SourceIndex
) -> tuple[list[ModuleSource], list[CheckResult]]:
    """The unfiltered path: every file parsed, every syntax error reported."""
    for path, given in files.items():
        index.add_root(module_name_for(path, given)[1])
    modules: list[ModuleSource] = []
    errors: list[CheckResult] = []
    for path, given in files.items():
        try:
            modules.append(index.load_file(path, given))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            errors.append(_load_error(path, exc))
    return modules, errors


_MARK = b"kvcache:"  # what every inline suppression comment holds (suppressions.scan_inline)


def _prefilter(methods: Sequence[str], root: str | None) -> tuple[list[bytes], re.Pattern[bytes]]:
    """``(needles, pattern)``: a file is parsed when it holds a needle and the pattern matches.

    A class can only define a followed method where the file spells ``def <name>`` (keyword and
    name separated by whitespace or line continuations), and ``_calls`` only finds call sites
    that match ``.<name>(``; with ``root``, the file defining that class spells its name. The
    needles are a fast ``bytes`` search that rejects most files; the pattern confirms.
    """
    names = [m.encode() for m in methods]
    alternatives = b"|".join(map(re.escape, names))
    pattern = rb"\bdef[\s\\]+(?:" + alternatives + rb")\b|\.\s*(?:" + alternatives + rb")\s*\("
    if root is not None:
        name = root.rsplit(".", 1)[-1].encode()
        names.append(name)
        pattern += rb"|" + re.escape(name)
    return names, re.compile(pattern)


def _scan(
    files: Sequence[str], needles: Sequence[bytes], pattern: re.Pattern[bytes]
) -> tuple[list[str], list[str]]:
    """``(files to parse, files holding an inline-suppression mark)``.

    Each file is read once, as bytes, and dropped: nothing is kept for the files that do not
    matter. A file that cannot be read is kept, so that parsing reports it.
    """
    hits: list[str] = []
    marked: list[str] = []
    for path in files:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError:
            hits.append(path)
            continue
        if any(n in raw for n in needles) and pattern.search(raw):
            hits.append(path)
        if _MARK in raw:
            marked.append(path)
    return hits, marked


@dataclass(frozen=True)
class _CallsOnly:
    """A module read only for its call sites: its name, file and calls; its tree is dropped."""

    name: str
    path: str
    calls: list[_CallSite]


def _load_filtered(
    files: dict[str, str], index: SourceIndex, methods: Sequence[str], root: str | None
) -> tuple[list[ModuleSource], list[ModuleSource | _CallsOnly], list[str]]:
    """The prefiltered path: ``(modules kept, every module read in file order, files that may
    hold suppressions)``.

    Every file is registered (for resolution), only candidates are parsed, and bases later,
    when a class's MRO asks for them. A candidate is kept whole only when one of its classes
    defines a followed method (or is the ``root``), or a ``super()`` call needs its classes;
    of the others only their call sites are kept, so memory follows the hierarchy that
    matters, not the number of files that call a method.
    """
    for path, given in files.items():
        index.register_file(path, given)
    hits, marked = _scan(list(files), *_prefilter(methods, root))
    root_name = root.rsplit(".", 1)[-1] if root is not None else None
    kept: list[ModuleSource] = []
    entries: list[ModuleSource | _CallsOnly] = []
    for path in hits:
        module = index.load_given(path, keep=False)
        if module is None:
            continue
        defines = root_name in module.classes or any(
            m in cls.methods for cls in module.classes.values() for m in methods
        )
        calls = [] if defines else _calls(module, methods)
        if defines or any(c.cls is not None and _is_super(c.call) for c in calls):
            module = index.adopt(module)
            kept.append(module)
            entries.append(module)
        else:
            calls = [_CallSite(c.where, None, c.call) for c in calls]  # cls: for super() only
            entries.append(_CallsOnly(module.name, module.path, calls))
    return kept, entries, marked


def _scope(index: SourceIndex, classes: list[ClassSource], root: str | None) -> list[ClassSource]:
    if root is None:
        return classes
    roots = [c for c in classes if root in (c.name, c.qualname)]
    if not roots:
        raise UsageError(f"--root {root}: no class of that name in the given paths")
    return [c for c in classes if any(k is r for r in roots for k in index.mro(c))]


def _nearest_definer(index: SourceIndex, cls: ClassSource, name: str) -> ClassSource | None:
    """The nearest ancestor of ``cls`` (itself excluded) that defines ``name``."""
    return next(
        (k for k in index.mro(cls)[1:] if isinstance(k, ClassSource) and name in k.methods),
        None,
    )


def _unresolved_before_definer(
    index: SourceIndex, cls: ClassSource, name: str
) -> list[ExternalBase]:
    """Bases that could not be read and come, in the MRO, before any class read that defines
    ``name``: any of them may be the real nearest definer, so nothing can be compared."""
    unknown: list[ExternalBase] = []
    for klass in index.mro(cls)[1:]:
        if isinstance(klass, ClassSource) and name in klass.methods:
            break
        if isinstance(klass, ExternalBase) and not klass.known:
            unknown.append(klass)
    return unknown


def _unresolved_findings(
    index: SourceIndex, cls: ClassSource, methods: Sequence[str]
) -> list[Finding]:
    """``unresolved-base``: never a silent pass on a base the tree given does not contain."""
    blind: dict[str, list[str]] = {}
    for name in methods:
        for unknown in _unresolved_before_definer(index, cls, name):
            blind.setdefault(unknown.name, []).append(name)
    findings: list[Finding] = []
    for base, names in blind.items():
        listed = ", ".join(f"`{n}`" for n in names)
        findings.append(
            Finding(
                rule="unresolved-base",
                message=f"base `{base}` of {cls.name} cannot be found in the paths given (nor "
                f"installed), so {cls.name}'s {listed} cannot be compared with the "
                f"{'method' if len(names) == 1 else 'methods'} it overrides: it was not checked",
                target=cls.qualname,
                hint=f"also pass the file or folder that defines `{base}` (absolute imports "
                "are matched against the files given by their module path's last components)",
                impl_location=Location(cls.path, cls.line),
            )
        )
    return findings


def _override_findings(index: SourceIndex, cls: ClassSource, impl: MethodSig) -> list[Finding]:
    if _unresolved_before_definer(index, cls, impl.name):
        return []  # reported as unresolved-base: comparing with a farther class could mislead
    ancestor = _nearest_definer(index, cls, impl.name)
    if ancestor is None:
        return []
    base = sig_from_ast(ancestor.methods[impl.name], path=ancestor.path)
    return compare_signatures(
        base,
        impl,
        target=cls.qualname,
        note=f"{cls.name} overrides {ancestor.qualname}, whose signature is the contract here",
    )


@dataclass(frozen=True)
class _CallSite:
    where: str  # qualname of the enclosing function (or module)
    cls: ClassSource | None  # the enclosing class, for super() calls
    call: ast.Call


_COMPOUND = (
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.ClassDef,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
)


def _scopes(
    module: ModuleSource,
) -> list[tuple[int, int, str, ClassSource | None, ast.AST]]:
    """Every function (with its line span, qualname and class), walking statements only."""
    out: list[tuple[int, int, str, ClassSource | None, ast.AST]] = []

    def visit(body: list[ast.stmt], prefix: str, cls: ClassSource | None) -> None:
        for stmt in body:
            if not isinstance(stmt, _COMPOUND):
                continue
            if isinstance(stmt, ast.ClassDef):
                inner = module.classes.get(stmt.name) if cls is None else None
                visit(stmt.body, f"{prefix}.{stmt.name}", inner)
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{stmt.name}"
                out.append((stmt.lineno, stmt.end_lineno or stmt.lineno, name, cls, stmt))
                visit(stmt.body, name, cls)
                continue
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(stmt, field, []), prefix, cls)
            for handler in getattr(stmt, "handlers", []):
                visit(handler.body, prefix, cls)

    visit(module.tree.body, module.name, None)
    return out


def _calls(module: ModuleSource, methods: Sequence[str]) -> list[_CallSite]:
    """Every ``x.<method>(..., kw=...)`` call of ``module``, with where it is.

    The source text is searched first, and only the functions holding a match are walked, so a
    large module costs little more than its parse.
    """
    if not methods:
        return []
    pattern = re.compile(r"\.\s*(?:" + "|".join(map(re.escape, methods)) + r")\s*\(")
    text = module.source
    lines: set[int] = set()
    line, previous = 1, 0
    for match in pattern.finditer(text):  # in order: count newlines once, incrementally
        line += text.count("\n", previous, match.start())
        previous = match.start()
        lines.add(line)
    if not lines:
        return []
    scopes = sorted(_scopes(module), key=lambda s: s[0])
    scope_starts = [s[0] for s in scopes]
    owners: dict[int, tuple[str, ClassSource | None, ast.AST]] = {}
    for line in lines:
        owners[line] = (module.name, None, module.tree)
        # The innermost function holding the line starts last among those holding it.
        for i in range(bisect.bisect_right(scope_starts, line) - 1, -1, -1):
            first, last, name, cls, node = scopes[i]
            if first <= line <= last:
                owners[line] = (name, cls, node)
                break
    wanted = set(methods)
    sites: list[_CallSite] = []
    for name, cls, node in {id(o[2]): o for o in owners.values()}.values():
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in wanted
                and sub.keywords
                and owners.get(sub.func.end_lineno or sub.lineno, (None,))[0] == name
            ):
                sites.append(_CallSite(name, cls, sub))
    return sorted(sites, key=lambda c: (c.call.lineno, c.call.col_offset))


def _is_super(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "super"
    )


def _receivers(index: SourceIndex, site: _CallSite, implementers: list[_Impl]) -> list[_Impl]:
    """Who may receive the call: for ``super().m()`` the one ancestor, else every implementer."""
    if not _is_super(site.call):
        return implementers
    if site.cls is None:
        return []
    assert isinstance(site.call.func, ast.Attribute)
    method = site.call.func.attr
    ancestor = _nearest_definer(index, site.cls, method)
    if ancestor is None:
        return []
    return [_Impl(ancestor, sig_from_ast(ancestor.methods[method], path=ancestor.path))]


def _call_site_findings(
    index: SourceIndex,
    path: str,
    calls: Sequence[_CallSite],
    implementers: dict[str, list[_Impl]],
) -> list[Finding]:
    findings: list[Finding] = []
    for site in calls:
        call, where = site.call, site.where
        assert isinstance(call.func, ast.Attribute)
        method = call.func.attr
        receivers = _receivers(index, site, implementers[method])
        for kw in call.keywords:
            if kw.arg is None:
                continue
            lacking = [i for i in receivers if not i.accepts(kw.arg)]
            if not lacking:
                continue
            known = implementers[method] + receivers
            donor = next((p for i in known for p in i.sig.params if p.name == kw.arg), None)
            wanted = donor.render() if donor is not None else f"{kw.arg}=None"
            names = ", ".join(f"{i.label} ({i.where})" for i in lacking)
            first = lacking[0]
            findings.append(
                Finding(
                    rule="unaccepted-keyword",
                    message=f"`{ast.unparse(call)}` passes `{kw.arg}=`, which {names} "
                    f"{'does' if len(lacking) == 1 else 'do'} not accept: with such an object "
                    f"this call raises TypeError. {first.label}: {first.sig.render()}",
                    target=where,
                    method=method,
                    parameter=kw.arg,
                    hint=f"add `{wanted}` to " + ", ".join(i.label for i in lacking),
                    contract_location=Location(first.sig.path or first.cls.path, first.sig.line),
                    impl_location=Location(path, call.lineno),
                )
            )
    return findings


@dataclass(frozen=True)
class DriftRun:
    """What one drift run found, and which files inline suppressions can be in."""

    results: list[CheckResult]
    #: Every file given (under the paths), in order.
    files: list[str]
    #: The files that may hold a ``# kvcache: ignore[...]`` comment (all of them, unfiltered).
    suppression_files: list[str]


def run_drift(
    paths: Sequence[str],
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    root: str | None = None,
    index: SourceIndex | None = None,
    prefilter: bool = True,
) -> DriftRun:
    """``analyze``, also saying which files were given and which may hold suppressions.

    With ``prefilter`` (the default) only the files whose text names a followed method (or the
    ``root`` class) are parsed, plus, on demand, the modules their classes' bases come from;
    ``prefilter=False`` parses every file (the reference the tests compare the fast path with).
    The findings are the same, with one difference by design: a file that names none of them
    and does not define a base needed is never parsed, so a syntax error in it is not reported.
    """
    index = index if index is not None else SourceIndex()
    wanted = tuple(dict.fromkeys(methods))
    files = _given_files(paths)
    if prefilter:
        modules, entries, marked = _load_filtered(files, index, wanted, root)
        results: list[CheckResult] = []
    else:
        modules, results = _load_all(files, index)
        entries = list(modules)
        marked = list(files)
    classes = [c for m in modules for c in m.classes.values()]
    scope = _scope(index, classes, root)
    implementers: dict[str, list[_Impl]] = {m: [] for m in wanted}
    for cls in scope:
        started = time.perf_counter()
        overrides = [m for m in wanted if m in cls.methods]
        if not overrides:
            continue
        findings: list[Finding] = []
        for name in overrides:
            impl = sig_from_ast(cls.methods[name], path=cls.path)
            if not cls.is_protocol:
                implementers[name].append(_Impl(cls, impl))
            findings += _override_findings(index, cls, impl)
        findings += _unresolved_findings(index, cls, overrides)
        results.append(
            CheckResult(
                cls.qualname,
                "drift:overrides",
                outcome_for(findings),
                tuple(findings),
                duration_s=time.perf_counter() - started,
            )
        )
    for entry in entries:
        started = time.perf_counter()
        calls = entry.calls if isinstance(entry, _CallsOnly) else _calls(entry, wanted)
        if not calls:
            continue
        findings = _call_site_findings(index, entry.path, calls, implementers)
        results.append(
            CheckResult(
                entry.name,
                "drift:call-sites",
                outcome_for(findings),
                tuple(findings),
                duration_s=time.perf_counter() - started,
            )
        )
    if prefilter:  # files read on demand that failed, first and in file order, as unfiltered
        failed = index.given_errors
        results[:0] = [_load_error(p, failed[p]) for p in files if p in failed]
    return DriftRun(results, list(files), marked)


def analyze(
    paths: Sequence[str],
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    root: str | None = None,
    index: SourceIndex | None = None,
    prefilter: bool = True,
) -> list[CheckResult]:
    """Override drift (``drift:overrides``, per class) and call-site drift
    (``drift:call-sites``, per module) in the Python files under ``paths``."""
    return run_drift(paths, methods=methods, root=root, index=index, prefilter=prefilter).results
