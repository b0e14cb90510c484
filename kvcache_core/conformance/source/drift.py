"""Drift inside a source tree, with no contract at all.

Engines grew pool hierarchies whose subclasses quietly narrowed an inherited method (a DSA pool
overriding offload without ``mamba_indices``), call sites that pass a keyword only some
implementers accept, and third-party plugins that subclass an engine's pool and fall behind its
next release. All are visible from source alone:

* every class overriding one of ``methods`` (module-level, or defined inside a function as
  plugins do) is compared with the nearest ancestor that defines it, which plays the contract
  (``compare_signatures``, the one comparison every level uses); a class installed in another's
  place (``engine_mod.Pool = MyPool``) is compared with the class it replaces;
* every call ``<receiver>.<method>(...)`` (and, with ``__init__`` followed, every ``Class(...)``)
  is checked only against the methods its receiver can resolve to (``receivers.Typer``): an
  implementation that cannot bind the call is the drift, and the calls that break are attached
  to its one finding as related locations;
* what a finding rests on sets its severity: a drift that a typed call in the paths given
  breaks is an error; one no call shows breaking is a warning (a caller outside may still), and
  against an abstract stub (``...``, ``raise NotImplementedError``, ``@abstractmethod``) it is
  no drift at all; a method whose whole body refuses (``raise ...``) is not compared, unless a
  caller catches that exception; ``*args``/``**kwargs`` forwarded unchanged are pass-through.

Untyped receivers are conservative: checked only against the implementers of families that
declare the keyword, and reported as warnings that say the receiver is untyped. Nothing is
imported.
"""

from __future__ import annotations

import ast
import bisect
import fnmatch
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from ...contracts.signature import MethodSig, ParamKind
from ..members.bodies import dropped_parameters
from ..members.compare import compare_signatures
from ..members.methods import forward_hint, outcome_for
from ..members.signatures import sig_from_ast
from ..members.sources import (
    ClassSource,
    ExternalBase,
    FunctionNode,
    LocalScope,
    ModuleSource,
    SourceIndex,
    module_name_for,
    python_files,
)
from ..results.model import CheckResult, Finding, Location, Related, unparsable_file
from ..results.rules import Severity
from ..results.usage import UsageError
from .receivers import Break, Context, Typed, Typer, binding_breaks, is_stub, raises_only

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
        "parameter-not-forwarded",
        "annotation-mismatch",
        "return-mismatch",
        "unaccepted-keyword",
        "unresolved-base",
        "missing-engine-name",
        "load-error",
    }
)

#: Rules about a parameter a caller passes: a call that breaks on it is their evidence.
_PASSING_RULES = frozenset(
    {
        "missing-parameter",
        "renamed-parameter",
        "parameter-kind-changed",
        "parameter-order-changed",
        "kwargs-hides-parameter",
        "parameter-not-forwarded",
    }
)
#: Rules about a parameter a caller omits.
_OMITTING_RULES = frozenset({"became-required", "extra-required-parameter", "default-changed"})
#: Handlers that catch whatever a refusal raises.
_BROAD = frozenset({"Exception", "BaseException"})
#: Handlers that make a missing engine name a fallback, not a breakage.
#: (A broad ``except Exception`` is no fallback: the patch then fails, logged or not.)
_IMPORT_GUARDS = frozenset({"ImportError", "ModuleNotFoundError", "AttributeError"})


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


def _prefilter(
    methods: Sequence[str], roots: Sequence[str]
) -> tuple[list[bytes], re.Pattern[bytes]]:
    """``(needles, pattern)``: a file is parsed when it holds a needle and the pattern matches.

    A class can only define a followed method where the file spells ``def <name>`` (keyword and
    name separated by whitespace or line continuations), and call sites are only found where
    ``.<name>(`` matches; with ``roots``, the file defining such a class spells its name (a
    glob's literal part). The needles are a fast ``bytes`` search that rejects most files; the
    pattern confirms.
    """
    names = [m.encode() for m in methods if m != "__init__"]
    needles = list(names)
    parts: list[bytes] = []
    if names:
        alternatives = b"|".join(map(re.escape, names))
        parts.append(
            rb"\bdef[\s\\]+(?:" + alternatives + rb")\b|\.\s*(?:" + alternatives + rb")\s*\("
        )
    for root in roots:
        literal = re.split(r"[*?\[]", root.rsplit(".", 1)[-1])
        for piece in literal:
            if piece:
                needles.append(piece.encode())
                parts.append(re.escape(piece.encode()))
    if "__init__" in methods:
        needles.append(b"__init__")
        parts.append(rb"\bdef[\s\\]+__init__\b")
    return needles, re.compile(b"|".join(parts) or rb"(?!)")


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


def _load_filtered(
    files: dict[str, str], index: SourceIndex, methods: Sequence[str], roots: Sequence[str]
) -> tuple[list[ModuleSource], list[str]]:
    """The prefiltered path: ``(modules read, in file order; files that may hold
    suppressions)``. Every file is registered (for resolution), only candidates are parsed, and
    bases later, when a class's MRO asks for them."""
    for path, given in files.items():
        index.register_file(path, given)
    hits, marked = _scan(list(files), *_prefilter(methods, roots))
    hits += [p for p in _plugin_files(files) if p not in set(hits)]
    names = set(methods)
    root_names = [r.rsplit(".", 1)[-1] for r in roots]
    kept: list[ModuleSource] = []
    for path in hits:
        module = index.load_given(path, keep=False)
        if module is None:
            continue
        # Remembered by the index only when one of its classes matters (defines a followed
        # method, or is a root): a module read for its calls alone is dropped after the run.
        if any(
            names & set(c.methods) or any(fnmatch.fnmatchcase(c.name, r) for r in root_names)
            for c in module.all_classes
        ):
            module = index.adopt(module)
        kept.append(module)
    return kept, marked


def _plugin_files(files: dict[str, str]) -> list[str]:
    """Files that import from another folder given by its package name (a plugin importing
    the engine it patches): they are read for the engine names they take. A file is searched
    only for the package names of the other folders given, never for its own package's."""
    parts: dict[str, set[str]] = {
        given: {p for p in os.path.abspath(given).split(os.sep) if p.isidentifier()}
        for given in dict.fromkeys(files.values())
    }
    every = set().union(*parts.values()) if parts else set()
    out: list[str] = []
    patterns: dict[frozenset[str], re.Pattern[bytes] | None] = {}
    packages: dict[tuple[str, str | None], tuple[list[str], str]] = {}
    for path, given in files.items():
        name, root = module_name_for(path, given, packages)
        own = frozenset(_folders_above(root) | {name.split(".")[0]})
        if own not in patterns:
            foreign = sorted(every - own)
            patterns[own] = (
                re.compile(
                    rb"^[ \t]*(?:from|import)[ \t]+(?:"
                    + b"|".join(re.escape(n.encode()) for n in foreign)
                    + rb")\b|target_module\s*=",
                    re.MULTILINE,
                )
                if foreign
                else None
            )
        pattern = patterns[own]
        if pattern is None:
            continue
        try:
            with open(path, "rb") as fh:
                if pattern.search(fh.read()):
                    out.append(path)
        except OSError:
            continue
    return out


def _folders_above(root: str) -> set[str]:
    return {p for p in os.path.abspath(root).split(os.sep) if p}


def _matches(cls: ClassSource, pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for name in (cls.name, cls.qualname))


def _scope(
    index: SourceIndex, classes: list[ClassSource], roots: Sequence[str]
) -> list[ClassSource]:
    if not roots:
        return classes
    found: list[ClassSource] = []
    for root in roots:
        matched = [c for c in classes if _matches(c, root)]
        if not matched:
            raise UsageError(f"--root {root}: no class of that name in the given paths")
        found += matched
    return [c for c in classes if any(k is r for r in found for k in index.mro(c))]


def _root_methods(
    index: SourceIndex, classes: list[ClassSource], roots: Sequence[str]
) -> list[str]:
    """Every method the root classes and the classes read above them define, ``__init__``
    included: what ``--root`` follows when no ``--methods`` are given."""
    names: dict[str, None] = {"__init__": None}
    for cls in classes:
        if any(_matches(cls, r) for r in roots):
            for klass in index.mro(cls):
                if isinstance(klass, ClassSource):
                    names.update(dict.fromkeys(klass.methods))
    return list(names)


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


# -- call sites ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Site:
    """One call, with where it is: module, enclosing class and function, local scope."""

    module: ModuleSource
    where: str  # qualname of the enclosing function (or the module)
    cls: ClassSource | None
    func: FunctionNode | None
    scope: LocalScope | None
    call: ast.Call
    method: str  # the method called ("__init__" for a constructor call)
    caught: frozenset[str]  # exception names the enclosing ``try`` blocks catch

    @property
    def ctx(self) -> Context:
        return Context(self.module, self.cls, self.func, self.scope)

    @property
    def location(self) -> Location:
        return Location(self.module.path, self.call.lineno)

    @property
    def text(self) -> str:
        text = ast.unparse(self.call)
        return text if len(text) <= 120 else text[:117] + "..."


def _functions(
    module: ModuleSource,
) -> Iterator[tuple[str, ClassSource | None, FunctionNode | None, LocalScope | None]]:
    """Every function of ``module`` (methods of module-level and nested classes included), with
    its qualname, class and local scope; ``None`` first, for module-level code."""
    yield module.name, None, None, None
    nested = {id(c.node): c for c in module.nested_classes}

    def visit(
        fn: FunctionNode, prefix: str, cls: ClassSource | None, parent: LocalScope | None
    ) -> Iterator[tuple[str, ClassSource | None, FunctionNode | None, LocalScope | None]]:
        name = f"{prefix}.{fn.name}"
        scope = LocalScope(module, fn, cls, parent)
        yield name, cls, fn, scope
        stack: list[ast.AST] = list(fn.body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(node, name, cls, scope)
            elif isinstance(node, ast.ClassDef):
                inner = nested.get(id(node))
                for method in inner.methods.values() if inner else ():
                    yield from visit(method, f"{name}.{node.name}", inner, scope)
            elif isinstance(node, ast.stmt):
                stack.extend(
                    c
                    for c in ast.iter_child_nodes(node)
                    if isinstance(c, (ast.stmt, ast.ExceptHandler))
                )
            elif isinstance(node, ast.ExceptHandler):
                stack.extend(node.body)

    for stmt in module.tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from visit(stmt, module.name, None, None)
    for cls in module.classes.values():
        for method in cls.methods.values():
            yield from visit(method, cls.qualname, cls, None)


def _own_calls(fn: FunctionNode | ast.Module) -> Iterator[tuple[ast.Call, frozenset[str]]]:
    """Calls in a body (not in nested functions or classes), each with the exception names the
    ``try`` blocks around it catch."""

    def walk(node: ast.AST, caught: frozenset[str]) -> Iterator[tuple[ast.Call, frozenset[str]]]:
        if isinstance(node, ast.Call):
            yield node, caught
        if isinstance(node, ast.Try):
            names = frozenset(_handler_names(node))
            for stmt in node.body:
                yield from walk(stmt, caught | names)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                yield from walk(part, caught)
            return
        for child in ast.iter_child_nodes(node):
            if not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
            ):
                yield from walk(child, caught)

    body = fn.body
    for stmt in body:
        if isinstance(fn, ast.Module) and isinstance(
            stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        ):
            continue
        yield from walk(stmt, frozenset())


def _handler_names(node: ast.Try) -> Iterator[str]:
    for handler in node.handlers:
        if handler.type is None:
            yield "BaseException"
            continue
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for t in types:
            yield ast.unparse(t).split(".")[-1]


def _call_sites(
    module: ModuleSource, methods: frozenset[str], ctor_names: frozenset[str]
) -> list[_Site]:
    """Every call of a followed method in ``module``, and, with ``ctor_names``, every call of
    something that may be one of those classes (``Name(...)``, ``mod.Name(...)``, ``x.cls(...)``,
    ``Base.__init__(...)``). The text is searched first; only functions holding a match are
    walked."""
    words = [re.escape(m) for m in methods if m != "__init__"]
    parts = [r"\.\s*(?:" + "|".join(words) + r")\s*\("] if words else []
    if ctor_names:
        names = "|".join(map(re.escape, sorted(ctor_names)))
        parts.append(r"\b(?:" + names + r"|\w*_cls|__init__)\s*\(")
    if not parts:
        return []
    text = module.source
    lines: list[int] = []
    line, previous = 1, 0
    for match in re.finditer("|".join(parts), text):
        line += text.count("\n", previous, match.start())
        previous = match.start()
        lines.append(line)
    if not lines:
        return []
    sites: list[_Site] = []
    for where, cls, fn, scope in _functions(module):
        if fn is not None:
            first, last = fn.lineno, fn.end_lineno or fn.lineno
            at = bisect.bisect_left(lines, first)
            if at >= len(lines) or lines[at] > last:
                continue
        body: FunctionNode | ast.Module = fn if fn is not None else module.tree
        for call, caught in _own_calls(body):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in methods and func.attr != "__init__":
                sites.append(_Site(module, where, cls, fn, scope, call, func.attr, caught))
            elif ctor_names and (
                (isinstance(func, ast.Name) and func.id in ctor_names)
                or (
                    isinstance(func, ast.Attribute)
                    and (func.attr in ctor_names or func.attr.endswith("_cls"))
                )
                or (isinstance(func, ast.Attribute) and func.attr == "__init__")
            ):
                sites.append(_Site(module, where, cls, fn, scope, call, "__init__", caught))
    return sorted(sites, key=lambda c: (c.call.lineno, c.call.col_offset))


def _is_super(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "super"
    )


@dataclass(frozen=True)
class _Hit:
    """One call reaching one implementation: who runs it, how sure, and how the call breaks."""

    site: _Site
    owner: ClassSource  # the class defining the implementation that runs
    reached: ClassSource  # the class of the object (owner or a subclass inheriting it)
    how: str  # why the receiver can be that class, for messages
    #: "typed": the object is of that class (built there, ``self``, ``super()``, or declared
    #: as a class whose implementation it runs); "declared": a strict subclass of a declared
    #: class (an annotation: any subclass may arrive, and relies on the declared signature);
    #: "narrowed": a strict subclass of a class an ``isinstance`` test dispatched on (a branch
    #: for what arrived, not a promise that every subclass does); "union": one of several
    #: unrelated classes assigned, whichever a branch chose; "untyped": matched by keyword
    strength: str
    drop_first: bool
    breaks: tuple[Break, ...]
    #: For "declared" hits: the parameters the declared class's own method names (the
    #: contract the caller relies on); a keyword outside it is an extension some members lack.
    declared: frozenset[str] = frozenset()

    def passes(self, name: str, sig: MethodSig) -> bool:
        """Whether the call passes ``name`` (by keyword, or at its position in ``sig``)."""
        call = self.site.call
        if any(k.arg == name for k in call.keywords):
            return True
        args = call.args[1:] if self.drop_first else call.args
        if any(isinstance(a, ast.Starred) for a in args):
            return False
        positional = [p.name for p in sig.params if p.positional]
        return name in positional[: len(args)]


_STRENGTH = {"typed": 0, "declared": 1, "narrowed": 2, "union": 3, "untyped": 4}


@dataclass
class _Run:
    """One drift analysis: the index, the classes read, what each call reaches."""

    index: SourceIndex
    methods: tuple[str, ...]
    scope: list[ClassSource]
    typer: Typer
    sigs: dict[int, MethodSig] = field(default_factory=dict)
    #: Hits by the implementation (``id`` of its ``def``) they run.
    hits: dict[int, list[_Hit]] = field(default_factory=dict)
    #: Per (implementation, parameter): hits explained by an override's finding.
    explained: set[tuple[int, str]] = field(default_factory=set)
    #: (call, keyword) that no implementation the call reaches accepts: the call is wrong.
    call_level: set[tuple[int, str]] = field(default_factory=set)
    #: Hits by call (``id`` of its node).
    site_hits: dict[int, list[_Hit]] = field(default_factory=dict)
    #: ``implementations`` by (declared class, exact, method).
    implemented: dict[
        tuple[int, bool, str], list[tuple[ClassSource, bool, tuple[ClassSource, FunctionNode]]]
    ] = field(default_factory=dict)
    #: Breaks by (implementation, call shape).
    bound: dict[tuple[object, ...], tuple[Break, ...]] = field(default_factory=dict)

    def breaks(
        self,
        call: ast.Call,
        owner: ClassSource,
        node: FunctionNode,
        drop_first: bool,
        shape: tuple[object, ...],
    ) -> tuple[Break, ...]:
        """``binding_breaks`` of the call, computed once per call shape (positional count,
        unpacking, keyword names) and implementation: a tree of many subclasses reached by
        many alike calls binds each shape once."""
        key = (id(node), drop_first, shape)
        known = self.bound.get(key)
        if known is None:
            known = tuple(binding_breaks(call, self.sig(owner, node), drop_first=drop_first))
            self.bound[key] = known
        return known

    def sig(self, cls: ClassSource, node: FunctionNode) -> MethodSig:
        key = id(node)
        if key not in self.sigs:
            self.sigs[key] = sig_from_ast(node, path=cls.path)
        return self.sigs[key]

    # -- what a call reaches -----------------------------------------------------------------
    def reach(self, site: _Site) -> list[_Hit]:
        method = site.method
        call = site.call
        found: dict[int, _Hit] = {}
        shape = (
            len(call.args),
            any(isinstance(a, ast.Starred) for a in call.args),
            tuple(k.arg for k in call.keywords),
        )

        def add(
            reached: ClassSource,
            how: str,
            strength: str,
            drop_first: bool = False,
            declared: frozenset[str] = frozenset(),
            definer: tuple[ClassSource, FunctionNode] | None = None,
        ) -> None:
            if definer is None:
                definer = self.index.find_method(reached, method)
                if definer is None:
                    return
            owner, node = definer
            key = id(node)
            known = found.get(key)
            if known is not None and _STRENGTH[known.strength] <= _STRENGTH[strength]:
                return
            breaks = self.breaks(call, owner, node, drop_first, shape)
            # The class that defines what runs names the object: subclasses inheriting it run
            # the same code (and which one was met first depends on the reading order).
            found[key] = _Hit(site, owner, owner, how, strength, drop_first, breaks, declared)

        if _is_super(call):
            if site.cls is not None:
                ancestor = _nearest_definer(self.index, site.cls, method)
                if ancestor is not None:
                    add(ancestor, f"`super()` in {site.cls.name}", "typed")
            return list(found.values())
        if method == "__init__":
            for typed in self._constructed(site):
                for klass in self.typer.reached(typed):
                    add(klass, typed.how, "typed", drop_first=typed.how.startswith("explicit"))
            return list(found.values())
        assert isinstance(call.func, ast.Attribute)
        receiver = call.func.value
        types = self.typer.of(receiver, site.ctx, call)
        instances = [t.cls for t in types.known if not t.is_class]
        mixed = any(
            not any(k is b for k in self.index.mro(a))
            and not any(k is a for k in self.index.mro(b))
            for a in instances
            for b in instances
        )
        for typed in types.known:
            if typed.is_class:  # `Class.m(self, ...)`: the class's own method, self explicit
                definer = self.index.find_method(typed.cls, method)
                if definer is None:
                    continue
                explicit = _self_passed(site, definer[1])
                add(typed.cls, f"`{ast.unparse(receiver)}` itself", "typed", drop_first=explicit)
                continue
            declared = self.index.find_method(typed.cls, method)
            names = (
                frozenset(p.name for p in self.sig(*declared).params)
                if declared is not None
                else frozenset()
            )
            self_call = site.func is not None and typed.cls is site.cls
            for klass, inherits, definer in self.implementations(typed, method):
                if self_call and not _runs_caller(self.index, site, typed, klass):
                    continue
                strength = "typed"
                if mixed:
                    strength = "union"
                elif not inherits:
                    strength = "narrowed" if typed.guard else "declared"
                add(klass, typed.how, strength, declared=names, definer=definer)
        if types.unknown and not types.known:
            self._untyped(site, add)
        return list(found.values())

    def implementations(
        self, typed: Typed, method: str
    ) -> list[tuple[ClassSource, bool, tuple[ClassSource, FunctionNode]]]:
        """The classes an object typed so can be, one per implementation of ``method`` that
        runs (the class, or a subclass with its own), each with whether it runs the declared
        class's own implementation. Cached: many calls share a declaration."""
        key = (id(typed.cls), typed.exact, method)
        known = self.implemented.get(key)
        if known is not None:
            return known
        declared = self.index.find_method(typed.cls, method)
        out: list[tuple[ClassSource, bool, tuple[ClassSource, FunctionNode]]] = []
        seen: set[int] = set()
        for klass in self.typer.reached(typed):
            runs = self.index.find_method(klass, method)
            if runs is None:
                continue
            inherits = (
                typed.exact
                or klass is typed.cls
                or (declared is not None and runs[1] is declared[1])
            )
            if id(runs[1]) in seen and inherits:
                continue
            seen.add(id(runs[1]))
            out.append((klass, inherits, runs))
        self.implemented[key] = out
        return out

    def _constructed(self, site: _Site) -> list[Typed]:
        """The classes a constructor call can build (``super().__init__`` excluded above)."""
        func = site.call.func
        if isinstance(func, ast.Attribute) and func.attr == "__init__":
            owner = self.typer.of(func.value, site.ctx, site.call)
            return [
                Typed(t.cls, True, f"explicit `{t.cls.name}.__init__`", False)
                for t in owner.known
                if t.is_class
            ]
        callee = self.typer.of(func, site.ctx, site.call)
        return [
            Typed(t.cls, t.exact, f"`{ast.unparse(func)}(...)`") for t in callee.known if t.is_class
        ]

    def _untyped(self, site: _Site, add: object) -> None:
        """An untyped receiver: only the families (classes sharing the method's topmost
        definer) in which some implementer declares a keyword the call passes."""
        assert callable(add)
        keywords = {k.arg for k in site.call.keywords if k.arg is not None}
        if not keywords:
            return
        for family in self.families(site.method):
            declared = {
                p.name
                for owner, node in family
                for p in self.sig(owner, node).params
                if p.kind is not ParamKind.VAR_KEYWORD
            }
            if keywords & declared:
                for owner, _ in family:
                    add(owner, f"untyped receiver `{ast.unparse(site.call.func.value)}`", "untyped")  # type: ignore[attr-defined]

    def families(self, method: str) -> list[list[tuple[ClassSource, FunctionNode]]]:
        groups: dict[int, list[tuple[ClassSource, FunctionNode]]] = {}
        for cls in self.scope:
            node = cls.methods.get(method)
            if node is None or cls.is_protocol:
                continue
            top = cls
            for klass in self.index.mro(cls):
                if isinstance(klass, ClassSource) and method in klass.methods:
                    top = klass
            groups.setdefault(id(top), []).append((cls, node))
        return list(groups.values())


def _self_passed(site: _Site, node: FunctionNode) -> bool:
    """``Class.m(self, ...)``: the call passes the instance as its first argument."""
    from .receivers import method_kind

    if method_kind(node) != "method":
        return False
    args = site.call.args
    me = site.func.args.args[0].arg if site.func is not None and site.func.args.args else None
    return bool(args) and isinstance(args[0], ast.Name) and args[0].id == me


def _runs_caller(index: SourceIndex, site: _Site, typed: Typed, klass: ClassSource) -> bool:
    """For ``self.m()`` in a method of ``K``: a subclass runs this call only if it inherits the
    calling method (one that overrides it never gets here)."""
    if site.func is None or site.cls is None or typed.cls is not site.cls:
        return True
    found = index.find_method(klass, site.func.name)
    return found is None or found[1] is site.func


# -- findings -----------------------------------------------------------------------------------


def _related(hits: Sequence[_Hit], param: str | None = None) -> tuple[Related, ...]:
    out: dict[tuple[str, int], Related] = {}
    for hit in sorted(hits, key=lambda h: (h.site.module.path, h.site.call.lineno)):
        key = (hit.site.module.path, hit.site.call.lineno)
        if key in out:
            continue
        mine = [b for b in hit.breaks if b.parameter == param] or list(hit.breaks)
        reason = mine[0].reason if mine else "passes it"
        out[key] = Related(
            hit.site.location,
            f"`{hit.site.where.rsplit('.', 2)[-2] + '.' if hit.site.cls else ''}"
            f"{hit.site.where.rsplit('.', 1)[-1]}` calls `{hit.site.text}` ({hit.how}); "
            f"with a {hit.reached.name} there: TypeError: {reason}"
            if hit.breaks
            else f"`{hit.site.where.rsplit('.', 1)[-1]}` calls `{hit.site.text}` ({hit.how}) "
            f"on a {hit.reached.name}",
        )
    return tuple(out.values())


def _caller_sentence(hits: Sequence[_Hit], broken: bool = True) -> str:
    first = min(hits, key=lambda h: (_STRENGTH[h.strength], h.site.module.path, h.site.call.lineno))
    caller = first.site.where.split(".")[-1]
    if first.site.cls is not None:
        caller = f"{first.site.cls.name}.{caller}"
    where = f"{os.path.basename(first.site.module.path)}:{first.site.call.lineno}"
    more = len({(h.site.module.path, h.site.call.lineno) for h in hits}) - 1
    tail = (
        f", and {more} more call{'s' if more != 1 else ''} (related locations)" if more > 0 else ""
    )
    if broken and first.breaks:
        outcome = f"with a {first.reached.name} there it raises TypeError: {first.breaks[0].reason}"
    else:
        outcome = f"with a {first.reached.name} there, the value never arrives"
    untyped = (
        " The receiver is untyped: the call is matched by the keyword alone."
        if first.strength == "untyped"
        else ""
    )
    return f" {caller} ({where}) calls `{first.site.text}` ({first.how}); {outcome}{tail}.{untyped}"


def _severity(hits: Sequence[_Hit], param: str | None, *, declared: bool = True) -> Severity:
    """Error when a call certainly reaches the class, or (with ``declared``) reaches it as a
    subclass of a declared class whose own method names ``param``: the caller relies on that
    signature, and this class narrowed it (Liskov). A warning otherwise."""
    for hit in hits:
        if hit.strength == "typed":
            return Severity.ERROR
        if declared and hit.strength == "declared" and (param is None or param in hit.declared):
            return Severity.ERROR
    return Severity.WARNING


def _forwards_unchanged(node: FunctionNode, method: str) -> bool:
    """``*args``/``**kwargs`` handed on as they came (``super().m(..., *args, **kwargs)`` or
    ``self.inner.m(...)`` with the same method), or read by name (``kwargs.get("x")``)."""
    a = node.args
    star = a.vararg.arg if a.vararg else None
    double = a.kwarg.arg if a.kwarg else None
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            for arg in sub.args:
                if (
                    isinstance(arg, ast.Starred)
                    and isinstance(arg.value, ast.Name)
                    and arg.value.id == star
                    and double is None
                ):
                    return True
            for kw in sub.keywords:
                if kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id == double:
                    return True
        if (
            double is not None
            and isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == double
        ):
            return True  # kwargs.get / kwargs.pop: read by name
        if (
            double is not None
            and isinstance(sub, ast.Subscript)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == double
        ):
            return True
    return False


def _misrouted(node: FunctionNode, method: str) -> list[tuple[str, ast.Call, str]]:
    """``(parameter, call, how)`` where a delegate call of ``method`` gets ``*args`` or
    ``**kwargs`` as one plain argument, or a keyword from ``kwargs`` under another name."""
    a = node.args
    star = a.vararg.arg if a.vararg else None
    double = a.kwarg.arg if a.kwarg else None
    out: list[tuple[str, ast.Call, str]] = []
    for sub in ast.walk(node):
        if not (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == method
        ):
            continue
        values = [*sub.args, *(k.value for k in sub.keywords if k.arg is not None)]
        for value in values:
            if isinstance(value, ast.Name) and value.id in (star, double):
                mark = "*" if value.id == star else "**"
                out.append(
                    (
                        value.id,
                        sub,
                        f"passes `{value.id}` as one argument instead of `{mark}{value.id}`",
                    )
                )
        for kw in sub.keywords:
            read = _kwargs_read(kw.value, double)
            if kw.arg is not None and read is not None and read != kw.arg:
                out.append((read, sub, f"passes the caller's `{read}` as `{kw.arg}=`"))
    return out


def _kwargs_read(expr: ast.expr, double: str | None) -> str | None:
    """``"x"`` of ``kwargs.get("x")``, ``kwargs.pop("x", ...)`` or ``kwargs["x"]``."""
    if double is None:
        return None
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in ("get", "pop")
        and isinstance(expr.func.value, ast.Name)
        and expr.func.value.id == double
        and expr.args
        and isinstance(expr.args[0], ast.Constant)
        and isinstance(expr.args[0].value, str)
    ):
        return expr.args[0].value
    if (
        isinstance(expr, ast.Subscript)
        and isinstance(expr.value, ast.Name)
        and expr.value.id == double
        and isinstance(expr.slice, ast.Constant)
        and isinstance(expr.slice.value, str)
    ):
        return expr.slice.value
    return None


def _delegates_up(node: FunctionNode, method: str) -> ast.Call | None:
    """The first ``super().m(...)`` or ``Base.m(self, ...)`` call in the body."""
    me = node.args.args[0].arg if node.args.args else None
    calls = sorted(
        (
            c
            for c in ast.walk(node)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute)
            and c.func.attr == method
            and (
                _is_super(c)
                or (
                    c.args
                    and isinstance(c.args[0], ast.Name)
                    and c.args[0].id == me
                    and isinstance(c.func.value, ast.Name)
                    and c.func.value.id != me
                )
            )
        ),
        key=lambda c: (c.lineno, c.col_offset),
    )
    return calls[0] if calls else None


@dataclass(frozen=True)
class _Contract:
    """What an implementation is held to: the nearest definer above it, or the class it
    replaces (``engine_mod.Pool = Replacement``), and how to say so."""

    cls: ClassSource
    node: FunctionNode
    note: str


def _override_findings(
    run: _Run, cls: ClassSource, name: str, contract: _Contract
) -> list[Finding]:
    node = cls.methods[name]
    impl = run.sig(cls, node)
    base = run.sig(contract.cls, contract.node)
    hits = run.hits.get(id(node), [])
    refusal = raises_only(node)
    if refusal is not None and not any(
        refusal in h.site.caught or h.site.caught & _BROAD for h in hits if h.strength != "untyped"
    ):
        return []  # a refusal: no caller relies on more than the exception
    stub = is_stub(contract.node)
    findings: list[Finding] = []
    kwargs_ok = _forwards_unchanged(node, name)
    for finding in compare_signatures(base, impl, target=cls.qualname, note=contract.note):
        param = finding.parameter
        if finding.rule == "kwargs-hides-parameter" and kwargs_ok:
            continue
        evidence = _evidence(finding.rule, param, hits, base, impl) if param is not None else []
        findings += _judged(run, finding, node, param, evidence, stub)
    if refusal is None:
        findings += _forwarding_findings(run, cls, name, contract, hits)
    return findings


def _evidence(
    rule: str, param: str, hits: Sequence[_Hit], base: MethodSig, impl: MethodSig
) -> list[_Hit]:
    """The calls that show a drift of ``param`` matters: they break on it, or (a pass-through
    that swallows it) pass it."""
    out: list[_Hit] = []
    for hit in hits:
        named = any(b.parameter == param for b in hit.breaks)
        counted = any(b.parameter is None for b in hit.breaks)
        by_keyword = any(k.arg == param for k in hit.site.call.keywords)
        if rule in ("missing-parameter", "parameter-kind-changed"):
            ok = named or (counted and hit.passes(param, base) and not by_keyword)
        elif rule == "renamed-parameter":
            ok = named and by_keyword
        elif rule == "kwargs-hides-parameter":
            ok = hit.passes(param, base)
        elif rule == "parameter-order-changed":
            ok = hit.passes(param, base) and not by_keyword  # only a positional caller mixes up
        elif rule in ("became-required", "extra-required-parameter"):
            ok = named
        elif rule == "default-changed":
            ok = not hit.passes(param, impl) and not hit.breaks
        else:
            ok = False
        if ok:
            out.append(hit)
    return out


def _judged(
    run: _Run,
    finding: Finding,
    node: FunctionNode,
    param: str | None,
    evidence: Sequence[_Hit],
    stub: bool,
    *,
    explain: bool = True,
) -> list[Finding]:
    """The finding with the severity and callers its evidence gives it (none: dropped)."""

    if param is not None and explain:
        run.explained.add((id(node), param))
    if evidence:
        # Through a declared base, a class breaks its callers when it narrowed a working
        # implementation; against a stub, the base promised nothing that ran.
        severity = _severity(evidence, param, declared=not stub)
        if finding.rule in ("kwargs-hides-parameter", "parameter-not-forwarded"):
            sentence = " A call whose value is lost:" + _caller_sentence(evidence, broken=False)
        else:
            sentence = " It breaks a call:" + _caller_sentence(evidence)
        return [
            replace(
                finding,
                message=finding.message + sentence,
                severity=severity if finding.is_error else finding.severity,
                related=_related(evidence, param),
            )
        ]
    if stub:
        return []  # an abstract stub no call relies on: the names are the implementer's choice
    if finding.rule in ("annotation-mismatch", "return-mismatch"):
        return [finding]
    shown = f"`{param}`" if param else "it"
    return [
        replace(
            finding,
            message=finding.message
            + f" No call in the paths given passes {shown} to this class; a caller that does "
            "breaks.",
            severity=Severity.WARNING,
        )
    ]


def _forwarding_findings(
    run: _Run, cls: ClassSource, name: str, contract: _Contract, hits: Sequence[_Hit]
) -> list[Finding]:
    """``parameter-not-forwarded`` for an override handing its call up (``super().m(...)``):
    a parameter the ancestor takes, accepted here and dropped, or ``*args``/``**kwargs``
    misrouted on the way."""
    node = cls.methods[name]
    up = _delegates_up(node, name)
    if up is None:
        return []
    base = run.sig(contract.cls, contract.node)
    wanted = {p.name for p in base.params}
    impl = run.sig(cls, node)
    out: list[Finding] = []
    loc = Location(cls.path, up.lineno)
    used = _names_read(contract.node)
    takes_var = {p.kind for p in base.params}
    for drop in dropped_parameters(node, name, wanted):
        if drop.star == "" and drop.param not in wanted:
            continue
        if drop.star == "*" and ParamKind.VAR_POSITIONAL not in takes_var:
            continue
        if drop.star == "**" and ParamKind.VAR_KEYWORD not in takes_var:
            continue
        ignored = drop.star == "" and drop.param not in used
        shown = f"{drop.star}{drop.param}"
        evidence = [h for h in hits if h.passes(drop.param, impl)] if not drop.star else list(hits)
        text = ast.unparse(up)
        from ..members.methods import dropped_how

        finding = Finding(
            rule="parameter-not-forwarded",
            message=f"`{name}` accepts `{shown}` but never passes it on: "
            + dropped_how(text, drop.param, drop.star)
            + f" ({cls.name} overrides {contract.cls.qualname}, which takes it).",
            target=cls.qualname,
            method=name,
            parameter=drop.param,
            hint=forward_hint(text, drop.param, drop.star),
            contract_location=Location(contract.cls.path, contract.node.lineno),
            impl_location=loc,
        )
        if ignored:  # the ancestor ignores it too: harmless until it starts reading it
            finding = replace(
                finding,
                message=finding.message
                + f" {contract.cls.name}.{name} does not read it today, so nothing is lost yet.",
                severity=Severity.WARNING,
            )
            out.append(finding)
            continue
        out += _judged(run, finding, node, drop.param, evidence, False, explain=False)
    for param, call, how in _misrouted(node, name):
        evidence = list(hits)
        finding = Finding(
            rule="parameter-not-forwarded",
            message=f"`{name}` {how} in `{ast.unparse(call)}`: the callee gets another argument "
            f"than the caller passed ({cls.name} overrides {contract.cls.qualname}).",
            target=cls.qualname,
            method=name,
            parameter=param,
            hint=forward_hint(
                ast.unparse(call),
                param,
                "**" if param == (node.args.kwarg.arg if node.args.kwarg else None) else "",
            ),
            contract_location=Location(contract.cls.path, contract.node.lineno),
            impl_location=Location(cls.path, call.lineno),
        )
        out += _judged(run, finding, node, param, evidence, False, explain=False)
    return out


def _names_read(node: FunctionNode) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _contract_for(
    run: _Run, cls: ClassSource, name: str, replaces: dict[int, tuple[ClassSource, str]]
) -> _Contract | None:
    ancestor = _nearest_definer(run.index, cls, name)
    replaced = replaces.get(id(cls))
    # What a class replaces says more than an abstract stub above it: engines call the
    # replaced class's own signature (`PagedAllocator.alloc_extend(..., num_new_pages=)`).
    if ancestor is not None and (replaced is None or not is_stub(ancestor.methods[name])):
        return _Contract(
            ancestor,
            ancestor.methods[name],
            f"{cls.name} overrides {ancestor.qualname}, whose signature is the contract here",
        )
    if replaced is not None:
        original, where = replaced
        found = run.index.find_method(original, name)
        if found is not None:
            return _Contract(
                found[0],
                found[1],
                f"{cls.name} replaces {original.qualname} ({where}), whose signature is the "
                "contract here",
            )
    return None


def _unaccepted_findings(run: _Run, cls: ClassSource, name: str) -> list[Finding]:
    """Calls that break on this implementation and no override finding explains: one finding
    per keyword, the calls attached."""
    node = cls.methods[name]
    hits = run.hits.get(id(node), [])
    refusal = raises_only(node)
    by_param: dict[str, list[_Hit]] = {}
    for hit in hits:
        if refusal is not None and not (refusal in hit.site.caught or hit.site.caught & _BROAD):
            continue
        for b in hit.breaks:
            if b.parameter is None or (id(node), b.parameter) in run.explained:
                continue
            if not b.reason.startswith(f"{name}() got"):
                continue  # counts of positionals: evidence for override findings only
            if _all_refuse(run, hit.site, b.parameter):
                continue  # reported at the call: no implementation reached accepts it
            by_param.setdefault(b.parameter, []).append(hit)
    sig = run.sig(cls, node)
    out: list[Finding] = []
    for param, evidence in by_param.items():
        donor = next(
            (
                p
                for f in run.families(name)
                for o, n in f
                for p in run.sig(o, n).params
                if p.name == param
            ),
            None,
        )
        wanted = donor.render() if donor is not None else f"{param}=None"
        out.append(
            Finding(
                rule="unaccepted-keyword",
                message=f"{cls.name}.{name} does not accept `{param}=`, which callers pass."
                + _caller_sentence(evidence)
                + f" {cls.name}.{name}: {sig.render()}",
                target=cls.qualname,
                method=name,
                parameter=param,
                hint=f"add `{wanted}` to {cls.name}.{name}",
                impl_location=Location(cls.path, node.lineno),
                severity=_severity(evidence, param),
                related=_related(evidence, param),
            )
        )
    return out


def _all_refuse(run: _Run, site: _Site, param: str) -> bool:
    """Whether the call is itself wrong: it is reported once, at the call."""
    return (id(site.call), param) in run.call_level


def _call_level_findings(run: _Run, sites: Sequence[_Site]) -> dict[str, list[Finding]]:
    """Calls passing a keyword that no implementation they reach accepts (typed receivers
    only): the call is wrong, whichever object arrives. By caller module."""
    out: dict[str, list[Finding]] = {}
    for site in sites:
        hits = [
            h
            for h in run.site_hits.get(id(site.call), [])
            if h.strength != "untyped" and not _refuses(h)
        ]
        if not hits:
            continue
        for kw in site.call.keywords:
            if kw.arg is None:
                continue
            refusing = [
                h
                for h in hits
                if any(
                    b.parameter == kw.arg and b.reason.startswith(f"{site.method}() got")
                    for b in h.breaks
                )
            ]
            explained = all(
                (id(h.owner.methods.get(site.method)), kw.arg) in run.explained for h in refusing
            )
            if refusing and len(refusing) == len(hits) and not explained:
                run.call_level.add((id(site.call), kw.arg))
                names = ", ".join(sorted({f"{h.owner.name}.{site.method}" for h in hits}))
                first = refusing[0]
                out.setdefault(site.module.name, []).append(
                    Finding(
                        rule="unaccepted-keyword",
                        message=f"`{site.text}` passes `{kw.arg}=`, which no implementation the "
                        f"receiver can be ({first.how}) accepts: {names}; this call raises "
                        f"TypeError: {first.breaks[0].reason}",
                        target=site.where,
                        method=site.method,
                        parameter=kw.arg,
                        hint=f"drop `{kw.arg}=` from the call, or add it to {names}",
                        contract_location=Location(first.owner.path, _def_line(first)),
                        impl_location=site.location,
                        severity=_severity(hits, kw.arg),
                    )
                )
    return out


def _refuses(hit: _Hit) -> bool:
    """The implementation only raises, and the call is not inside a ``try`` catching that:
    the call fails whatever it passes, so its arguments are no drift."""
    node = hit.owner.methods.get(hit.site.method)
    refusal = _refusal(node) if node is not None else None
    return refusal is not None and not (refusal in hit.site.caught or hit.site.caught & _BROAD)


_REFUSALS: dict[int, tuple[FunctionNode, str | None]] = {}


def _refusal(node: FunctionNode) -> str | None:
    """``raises_only`` of a ``def``, read once per node (the node is kept with its answer, so
    an id is never reused for another node while the entry lives)."""
    known = _REFUSALS.get(id(node))
    if known is None or known[0] is not node:
        known = (node, raises_only(node))
        if len(_REFUSALS) > 100_000:
            _REFUSALS.clear()
        _REFUSALS[id(node)] = known
    return known[1]


def _def_line(hit: _Hit) -> int:
    found = hit.owner.methods.get(hit.site.method)
    return found.lineno if found is not None else hit.owner.line


# -- plugins: rebinding and engine names --------------------------------------------------------


def _statements_with_scope(
    module: ModuleSource,
) -> Iterator[tuple[ast.stmt, LocalScope | None, frozenset[str], bool]]:
    """Every statement of ``module`` (function bodies included), with its local scope, the
    exceptions the ``try`` blocks around it catch, and whether it only runs for type checkers
    (``if TYPE_CHECKING:``)."""

    def walk(
        body: Sequence[ast.stmt],
        scope: LocalScope | None,
        caught: frozenset[str],
        typing: bool,
        owner: ClassSource | None,
    ) -> Iterator[tuple[ast.stmt, LocalScope | None, frozenset[str], bool]]:
        for stmt in body:
            yield stmt, scope, caught, typing
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = LocalScope(module, stmt, owner, scope)
                yield from walk(stmt.body, inner, frozenset(), False, owner)
            elif isinstance(stmt, ast.ClassDef):
                cls = next((c for c in module.all_classes if c.node is stmt), None)
                yield from walk(stmt.body, scope, caught, typing, cls)
            elif isinstance(stmt, ast.Try):
                names = frozenset(_handler_names(stmt))
                yield from walk(stmt.body, scope, caught | names, typing, owner)
                for handler in stmt.handlers:
                    yield from walk(handler.body, scope, caught, typing, owner)
                yield from walk([*stmt.orelse, *stmt.finalbody], scope, caught, typing, owner)
            elif isinstance(stmt, ast.If):
                checking = "TYPE_CHECKING" in ast.unparse(stmt.test)
                yield from walk(stmt.body, scope, caught, typing or checking, owner)
                yield from walk(stmt.orelse, scope, caught, typing, owner)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                yield from walk(stmt.body, scope, caught, typing, owner)
                yield from walk(getattr(stmt, "orelse", []), scope, caught, typing, owner)

    yield from walk(module.tree.body, None, frozenset(), False, None)


#: ``engine_mod.Name = Value`` on a line of its own (``self.x = ...`` is no rebinding).
_REBIND = re.compile(
    r"^[ \t]*(?!self\.|cls\.)\w+(?:\.\w+)+[ \t]*=[ \t]*[A-Za-z_][\w.]*[ \t]*(?:#.*)?$",
    re.MULTILINE,
)


def _attribute_sets(
    index: SourceIndex, modules: Sequence[ModuleSource]
) -> Iterator[tuple[ModuleSource, ast.stmt, LocalScope | None, str, str, ast.expr]]:
    """``(module, statement, scope, engine module, name, value)`` of every
    ``engine_mod.Name = value`` and ``setattr(engine_mod, "Name", value)`` whose owner is a
    module read (a plugin installing its classes in an engine's namespace)."""
    for module in modules:
        if "setattr(" not in module.source and not _REBIND.search(module.source):
            continue
        for stmt, scope, _, _ in _statements_with_scope(module):
            owner: ast.expr | None = None
            name: str | None = None
            value: ast.expr | None = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Attribute):
                    owner, name, value = target.value, target.attr, stmt.value
            elif (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name)
                and stmt.value.func.id == "setattr"
                and len(stmt.value.args) == 3
                and isinstance(stmt.value.args[1], ast.Constant)
                and isinstance(stmt.value.args[1].value, str)
            ):
                owner, name, value = (
                    stmt.value.args[0],
                    stmt.value.args[1].value,
                    stmt.value.args[2],
                )
            if owner is None or name is None or value is None:
                continue
            engine = index.module_of(module, owner, scope)
            found = index.module(engine) if engine is not None else None
            if found is not None:
                yield module, stmt, scope, found.name, name, value


def rebindings(
    index: SourceIndex, modules: Sequence[ModuleSource]
) -> list[tuple[ClassSource, ClassSource, str]]:
    """``(replaced, replacement, where)`` for every ``engine_mod.Name = Replacement`` (or
    ``setattr(engine_mod, "Name", Replacement)``) whose both sides resolve to classes read. A
    replacement read back from the engine module (``X = getattr(mod, "ElasticX")`` after
    ``setattr(mod, "ElasticX", ElasticX)``) is the class the plugin installed there."""
    sets = list(_attribute_sets(index, modules))
    installed: dict[tuple[str, str], ClassSource] = {}
    for module, _, scope, engine, name, value in sets:
        cls = index.resolve_expr(module, value, scope=scope)
        if isinstance(cls, ClassSource):
            installed[(engine, name)] = cls
    out: list[tuple[ClassSource, ClassSource, str]] = []
    for module, stmt, scope, engine, name, value in sets:
        replaced = index.resolve_attr(engine, name)
        replacement = index.resolve_expr(module, value, scope=scope)
        if not isinstance(replacement, ClassSource):
            replacement = _read_back(index, module, scope, value, installed)
        if (
            isinstance(replaced, ClassSource)
            and isinstance(replacement, ClassSource)
            and replaced is not replacement
        ):
            text = ast.unparse(stmt).splitlines()[0]
            where = f"`{text}` at {os.path.basename(module.path)}:{stmt.lineno}"
            out.append((replaced, replacement, where))
    return out


def _read_back(
    index: SourceIndex,
    module: ModuleSource,
    scope: LocalScope | None,
    value: ast.expr,
    installed: dict[tuple[str, str], ClassSource],
) -> ClassSource | None:
    """The class a plugin installed that ``value`` reads back (``getattr(mod, "X")``, or a
    local bound to it)."""
    if isinstance(value, ast.Name) and scope is not None:
        bound = scope.lookup(value.id)
        if isinstance(bound, ast.expr):
            value = bound
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "getattr"
        and len(value.args) >= 2
        and isinstance(value.args[1], ast.Constant)
        and isinstance(value.args[1].value, str)
    ):
        engine = index.module_of(module, value.args[0], scope)
        found = index.module(engine) if engine is not None else None
        if found is not None:
            return installed.get((found.name, value.args[1].value))
    return None


def _plugin_modules(modules: Sequence[ModuleSource], given: Sequence[str]) -> list[ModuleSource]:
    """The modules that spell an import of another package given (or a patch class's
    ``target_module``): where rebinding an engine's names can happen."""
    engines = {part for path in given for part in os.path.abspath(path).split(os.sep) if part}
    return [
        m
        for m in modules
        if _may_take_engine_names(m, engines, _own_folders(m), m.name.split(".")[0])
    ]


def _installed_names(index: SourceIndex, modules: Sequence[ModuleSource]) -> set[tuple[str, str]]:
    """``(module, name)`` a plugin sets on an engine module itself (``setattr(mod, "X", ...)``,
    ``mod.X = ...``): reading it back later is no missing name."""
    return {(engine, name) for _, _, _, engine, name, _ in _attribute_sets(index, modules)}


def _engine_name_findings(
    index: SourceIndex,
    modules: Sequence[ModuleSource],
    given: Sequence[str],
    files: dict[str, str],
) -> list[CheckResult]:
    """``missing-engine-name``: a plugin module takes a name (``from engine.mod import name``,
    ``getattr(engine_mod, "name")``) from a module of another package given, and that module
    no longer defines it: the plugin breaks at import, or its patch silently fails."""
    results: list[CheckResult] = []
    engines = {part for path in given for part in os.path.abspath(path).split(os.sep) if part}
    installed = _installed_names(index, _plugin_modules(modules, given))
    for module in modules:
        top = module.name.split(".")[0]
        own = _own_folders(module)
        if not _may_take_engine_names(module, engines, own, top):
            continue
        findings: list[Finding] = []
        for stmt, scope, caught, typing in _statements_with_scope(module):
            if typing or caught & _IMPORT_GUARDS:
                continue
            wanted: list[tuple[str, str, int, str]] = []
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                for alias in stmt.names:
                    if alias.name != "*":
                        wanted.append((stmt.module, alias.name, stmt.lineno, "ImportError"))
            for node in _shallow(stmt):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "getattr"
                    and len(node.args) == 2
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)
                ):
                    engine = index.module_of(module, node.args[0], scope)
                    if engine is not None:
                        wanted.append((engine, node.args[1].value, node.lineno, "AttributeError"))
            for engine, name, line, error in wanted:
                if not _foreign(engine, engines, own, top):
                    continue
                target = index.module(engine)
                if target is None or not _given(index, target) or target.name.split(".")[0] == top:
                    continue
                if _defines(index, target, name) or (target.name, name) in installed:
                    continue
                moved = _moved_to(index, target, name, files)
                findings.append(
                    Finding(
                        rule="missing-engine-name",
                        message=f"`{engine}` no longer defines `{name}` (read from "
                        f"{target.path}): this line raises {error}"
                        + (f"; `{name}` is now defined in `{moved}`" if moved else ""),
                        target=module.name,
                        parameter=name,
                        hint=f"take `{name}` from `{moved}`"
                        if moved
                        else f"stop relying on `{engine}.{name}`, or guard it "
                        f"(`except {error}:` with a fallback)",
                        impl_location=Location(module.path, line),
                        contract_location=Location(target.path, 1),
                    )
                )
        if findings:
            results.append(
                CheckResult(
                    module.name, "drift:engine-names", outcome_for(findings), tuple(findings)
                )
            )
    return results


_LOCAL_IMPORT = re.compile(r"^[ \t]+from[ \t]+[\w.]+[ \t]+import\b", re.MULTILINE)
_GETATTR_NAME = re.compile(r"\bgetattr\(\s*[\w.]+\s*,\s*[\"']\w+[\"']\s*\)")


_SPELLED = re.compile(
    r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import|import[ \t]+([\w.]+))"
    r"|target_module\s*=\s*[\"']([\w.]+)[\"']",
    re.MULTILINE,
)


def _own_folders(module: ModuleSource) -> set[str]:
    """The module's own package and the folders above its import root: the names it imports
    itself by (``sglang`` for ``.../sglang/srt/mem_cache/pool.py`` given as ``mem_cache``)."""
    parts = os.path.abspath(module.path).split(os.sep)
    depth = len(module.name.split(".")) + (1 if module.is_package else 0)
    return set(parts[: max(len(parts) - depth, 0)]) | {module.name.split(".")[0]}


def _foreign(spelled: str, engines: set[str], own: set[str], top: str) -> bool:
    """An absolute module name that belongs to another package given (an engine)."""
    first = spelled.split(".")[0]
    return first in engines and first not in own and first != top


def _may_take_engine_names(
    module: ModuleSource, engines: set[str], own: set[str], top: str
) -> bool:
    """Whether the module spells an import (or a patch class's ``target_module``) of another
    package given: only then are its statements read. An engine's own modules cost nothing."""
    for match in _SPELLED.finditer(module.source):
        spelled = next(g for g in match.groups() if g)
        if _foreign(spelled, engines, own, top):
            return True
    return False


def _shallow(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of one statement, not descending into the bodies of compound statements."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        for name, value in ast.iter_fields(node):
            if name in ("body", "orelse", "finalbody", "handlers"):
                continue
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, ast.AST))


def _given(index: SourceIndex, module: ModuleSource) -> bool:
    return module.path in index.given_paths()


def _defines(index: SourceIndex, module: ModuleSource, name: str, hops: int = 0) -> bool:
    if name in module.defined_names or "__getattr__" in module.defined_names:
        return True
    if module.is_package and index.module(f"{module.name}.{name}") is not None:
        return True
    if hops < 8:
        for star in module.star_imports:
            target = index.module(star)
            if target is None or _defines(index, target, name, hops + 1):
                return True
    return False


def _moved_to(
    index: SourceIndex, near: ModuleSource, name: str, files: dict[str, str]
) -> str | None:
    """The given module of the same package that now defines ``name`` at its top level
    (``def``, ``class`` or an assignment), if exactly one does: where the name went."""
    top = near.name.split(".")[0]
    pattern = re.compile(
        rb"^(?:(?:async[ \t]+)?def|class)[ \t]+"
        + re.escape(name.encode())
        + rb"\b|^"
        + re.escape(name.encode())
        + rb"[ \t]*[:=]",
        re.MULTILINE,
    )
    found: list[str] = []
    packages: dict[tuple[str, str | None], tuple[list[str], str]] = {}
    for path, anchor in files.items():
        if path == near.path:
            continue
        module_name = module_name_for(path, anchor, packages)[0]
        if module_name.split(".")[0] != top:
            continue
        try:
            with open(path, "rb") as fh:
                if pattern.search(fh.read()):
                    found.append(module_name)
        except OSError:
            continue
    return found[0] if len(found) == 1 else None


# -- the run ------------------------------------------------------------------------------------


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
    methods: Sequence[str] | None = None,
    root: str | Sequence[str] | None = None,
    index: SourceIndex | None = None,
    prefilter: bool = True,
) -> DriftRun:
    """``analyze``, also saying which files were given and which may hold suppressions.

    ``methods`` default to ``DEFAULT_METHODS``, or, with ``root``, to every method the root
    classes (and the classes read above them) define, ``__init__`` included. ``root`` is a class
    name, ``module.Class`` or a glob, or several. With ``prefilter`` (the default) only the
    files whose text names a followed method (or a root class) are parsed, plus, on demand, the
    modules their classes' bases come from; ``prefilter=False`` parses every file (the
    reference the tests compare the fast path with). The findings are the same, with one
    difference by design: a file that names none of them and does not define a base needed is
    never parsed, so a syntax error in it is not reported.
    """
    index = index if index is not None else SourceIndex()
    roots = [root] if isinstance(root, str) else list(root or ())
    files = _given_files(paths)
    results: list[CheckResult] = []
    if prefilter:
        wanted_first = (
            tuple(dict.fromkeys(methods or DEFAULT_METHODS))
            if methods or not roots
            else ("__init__",)
        )
        modules, marked = _load_filtered(files, index, wanted_first, roots)
    else:
        modules, results = _load_all(files, index)
        marked = list(files)
    classes = [c for m in modules for c in m.all_classes]
    if methods:
        wanted = tuple(dict.fromkeys(methods))
    elif roots:
        _scope(index, classes, roots)  # a root that names nothing is a usage error first
        wanted = tuple(_root_methods(index, classes, roots))
        if prefilter:
            modules, _ = _load_filtered(files, index, wanted, roots)
            classes = [c for m in modules for c in m.all_classes]
    else:
        wanted = DEFAULT_METHODS
    scope = _scope(index, classes, roots)
    rebinds = rebindings(index, _plugin_modules(modules, paths))
    replaces: dict[int, tuple[ClassSource, str]] = {}
    typer = Typer(index, classes)
    for replaced, replacement, where in rebinds:
        typer.replaced.setdefault(id(replaced), []).append(replacement)
        replaces.setdefault(id(replacement), (replaced, where))
    run = _Run(index, wanted, scope, typer)
    in_scope = {id(c) for c in scope}
    ctor_names = frozenset(
        name
        for c in scope
        for name in (c.name,)
        if "__init__" in wanted and index.find_method(c, "__init__") is not None
    )
    if ctor_names:
        ctor_names = ctor_names | {replaced.name for replaced, r, _ in rebinds if id(r) in in_scope}
    sites: list[_Site] = []
    for module in modules:
        sites += _call_sites(module, frozenset(wanted), ctor_names)
    for site in sites:
        hits = [h for h in run.reach(site) if id(h.reached) in in_scope or id(h.owner) in in_scope]
        run.site_hits[id(site.call)] = hits
        for hit in hits:
            node = hit.owner.methods.get(site.method)
            if node is not None:
                run.hits.setdefault(id(node), []).append(hit)
    compared: dict[int, list[Finding]] = {}
    for cls in scope:
        for name in [m for m in wanted if m in cls.methods]:
            if _unresolved_before_definer(index, cls, name):
                continue  # unresolved-base: comparing with a farther class could mislead
            contract = _contract_for(run, cls, name, replaces)
            if contract is not None:
                compared.setdefault(id(cls), []).extend(
                    _override_findings(run, cls, name, contract)
                )
    by_caller = _call_level_findings(run, sites)  # after overrides: what they explain is theirs
    for cls in scope:
        started = time.perf_counter()
        overrides = [m for m in wanted if m in cls.methods]
        if not overrides:
            continue
        findings: list[Finding] = list(compared.get(id(cls), []))
        for name in overrides:
            if not cls.is_protocol:
                findings += _unaccepted_findings(run, cls, name)
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
    for module in modules:
        found = by_caller.get(module.name, [])
        if any(s.module is module for s in sites):
            results.append(
                CheckResult(module.name, "drift:call-sites", outcome_for(found), tuple(found))
            )
    results += _engine_name_findings(index, modules, paths, files)
    if prefilter:  # files read on demand that failed, first and in file order, as unfiltered
        failed = index.given_errors
        results[:0] = [_load_error(p, failed[p]) for p in files if p in failed]
    return DriftRun(results, list(files), marked)


def analyze(
    paths: Sequence[str],
    *,
    methods: Sequence[str] | None = None,
    root: str | Sequence[str] | None = None,
    index: SourceIndex | None = None,
    prefilter: bool = True,
) -> list[CheckResult]:
    """Override drift (``drift:overrides``, per class), call-site drift (``drift:call-sites``,
    per module) and engine names a plugin lost (``drift:engine-names``) under ``paths``."""
    return run_drift(paths, methods=methods, root=root, index=index, prefilter=prefilter).results
