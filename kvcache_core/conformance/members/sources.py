"""Python source read as classes and imports, never imported or executed.

Why: the source level must be safe on untrusted code and must work where a plugin's GPU-only
dependencies are missing. So this module finds files by walking directories (and, for packages
outside the given tree, by asking import machinery only *where* a top-level package lives, which
runs none of its code), parses them with ``ast`` and resolves a base class by following the
import statements that bind its name, module by module, the way Python would at run time.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

__all__ = [
    "ClassSource",
    "ExternalBase",
    "ImportRef",
    "LocalScope",
    "ModuleSource",
    "SourceIndex",
    "flatten_statements",
    "module_name_for",
    "python_files",
]

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef

#: Top-level packages never parsed: they define no kvcache contract member, and reading them
#: (torch is megabytes of source) would only cost time.
_OPAQUE = frozenset({"torch", "numpy", "typing_extensions", "triton", "mypy_extensions"})

#: Directories a tree walk never enters.
_SKIP_DIRS = frozenset(
    {"__pycache__", ".git", ".hg", ".tox", ".nox", ".venv", "venv", "node_modules", "build"}
)

_MAX_HOPS = 16  # re-export chains longer than this are treated as unresolvable


def python_files(path: str) -> list[str]:
    """``path`` itself if it is a file, else every ``.py`` file under it, sorted."""
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    found: list[str] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        found.extend(os.path.abspath(os.path.join(root, f)) for f in files if f.endswith(".py"))
    return sorted(found)


def module_name_for(
    path: str,
    anchor: str | None = None,
    packages: dict[tuple[str, str | None], tuple[list[str], str]] | None = None,
) -> tuple[str, str]:
    """``(dotted module name, import root)`` of a file, from the ``__init__.py`` files above it.

    ``anchor`` is the folder the file was found under, as given on the command line. Folders
    without ``__init__.py`` between the file and that folder are namespace packages: the name
    then starts at the given folder itself (``srt/mem_cache/memory_pool.py`` found under
    ``srt/mem_cache`` is ``mem_cache.memory_pool``), so that two files of one name in two
    folders stay two modules, and relative imports between given folders resolve.

    ``packages`` caches the package part by folder, for callers naming many files of a tree.
    """
    path = os.path.abspath(path)
    folder, filename = os.path.split(path)
    known = packages.get((folder, anchor)) if packages is not None else None
    if known is None:
        known = _package_of(folder, anchor)
        if packages is not None:
            packages[(folder, anchor)] = known
    prefix, directory = known
    parts = [*prefix] if filename == "__init__.py" else [*prefix, filename[:-3]]
    return ".".join(parts) or filename[:-3], directory


def _package_of(directory: str, anchor: str | None) -> tuple[list[str], str]:
    """``(package names, import root)`` of the files in ``directory`` (see module_name_for)."""
    parts: list[str] = []
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    if anchor is not None and os.path.isdir(anchor):
        top = os.path.dirname(os.path.abspath(anchor).rstrip(os.sep))
        while directory.startswith(top + os.sep):
            parent, package = os.path.split(directory)
            if not package.isidentifier():
                break
            directory = parent
            parts.insert(0, package)
    return parts, directory


@dataclass(frozen=True)
class ImportRef:
    """What an ``import`` binds a local name to: a module, or one name inside a module."""

    module: str
    attr: str | None = None


@dataclass(frozen=True)
class ExternalBase:
    """A base class not read from source.

    ``known`` is True for classes of the standard library and of opaque packages (torch, ...),
    which are known to define no contract member; False when the class could not be found.
    """

    name: str
    known: bool

    @property
    def qualname(self) -> str:
        return self.name


def _first_arg(node: FunctionNode) -> str | None:
    args = node.args.posonlyargs + node.args.args
    return args[0].arg if args else None


def _self_attributes(method: FunctionNode) -> Iterator[str]:
    """Names assigned as ``self.X`` (or set through ``setattr(self, "X", ...)``) in a method."""
    me = _first_arg(method)
    if me is None:
        return
    for node in ast.walk(method):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == me
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "setattr")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__")
            )
        ):
            yield node.args[1].value
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == me
                ):
                    yield sub.attr


@dataclass(eq=False)
class LocalScope:
    """The names a function body binds, for what it defines inside (a class in a patch method).

    Plugins often define their pool subclasses inside a function, with the base taken from the
    engine's module at run time (``Base = getattr(mem_pool_mod, "MambaPool")``, a local
    ``from engine.mod import Base``): those names are looked up here before the module's own.
    ``owner`` is the class whose method this is: a patch class naming its engine module as
    ``target_module = "engine.mod"`` makes a ``ModuleType`` parameter that module.
    """

    module: ModuleSource
    node: FunctionNode
    owner: ClassSource | None
    parent: LocalScope | None

    @property
    def qualname(self) -> str:
        head = (
            self.parent.qualname
            if self.parent is not None
            else (self.owner.qualname.removeprefix(self.module.name + ".") if self.owner else "")
        )
        return f"{head}.{self.node.name}" if head else self.node.name

    @cached_property
    def bindings(self) -> dict[str, ast.expr | ImportRef]:
        """Local names: assignments, imports and module parameters (first binding wins)."""
        out: dict[str, ast.expr | ImportRef] = {}
        target = _target_module(self.owner) if self.owner is not None else None
        a = self.node.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs:
            note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if target is not None and note.split(".")[-1] == "ModuleType":
                out[arg.arg] = ImportRef(target)
        for stmt in flatten_statements(self.node.body, loops=True):
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        out.setdefault(alias.asname, ImportRef(alias.name))
                    else:
                        top = alias.name.split(".")[0]
                        out.setdefault(top, ImportRef(top))
            elif isinstance(stmt, ast.ImportFrom):
                base = self.module.absolute(stmt.module, stmt.level)
                for alias in stmt.names:
                    if alias.name != "*":
                        out.setdefault(alias.asname or alias.name, ImportRef(base, alias.name))
            elif (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                out.setdefault(stmt.targets[0].id, stmt.value)
        return out

    @cached_property
    def classes(self) -> dict[str, ClassSource]:
        """Classes defined directly in this body."""
        return {
            c.name: c
            for c in self.module.nested_classes
            if c.scope is not None and c.scope.node is self.node
        }

    def lookup(self, name: str) -> ast.expr | ImportRef | ClassSource | None:
        """What ``name`` is bound to in this function or an enclosing one (None: not local)."""
        scope: LocalScope | None = self
        while scope is not None:
            if name in scope.classes:
                return scope.classes[name]
            if name in scope.bindings:
                return scope.bindings[name]
            scope = scope.parent
        return None


def _target_module(cls: ClassSource) -> str | None:
    """``target_module = "engine.mod"`` in a patch class body (or a base's), if any."""
    stmt = cls.class_assignments.get("target_module")
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
        value = stmt.value.value
        return value if isinstance(value, str) and value else None
    return None


@dataclass(eq=False)
class ClassSource:
    """One class statement, as written: at module level, or inside a function (``scope``)."""

    name: str
    module: ModuleSource
    node: ast.ClassDef
    #: The function body the class is defined in (None: at module level).
    scope: LocalScope | None = None

    @property
    def qualname(self) -> str:
        if self.scope is not None:
            return f"{self.module.name}.{self.scope.qualname}.{self.name}"
        return f"{self.module.name}.{self.name}"

    @property
    def path(self) -> str:
        return self.module.path

    @property
    def line(self) -> int:
        return self.node.lineno

    @cached_property
    def methods(self) -> dict[str, FunctionNode]:
        """Functions defined in the class body; a later ``def`` wins, as at run time."""
        out: dict[str, FunctionNode] = {}
        for stmt in flatten_statements(self.node.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[stmt.name] = stmt
        return out

    @cached_property
    def class_assignments(self) -> dict[str, ast.stmt]:
        """Names bound in the class body by assignment (``x = ...``, ``x: int``)."""
        out: dict[str, ast.stmt] = {}
        for stmt in flatten_statements(self.node.body):
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            out[sub.id] = stmt
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out[stmt.target.id] = stmt
        return out

    @cached_property
    def attributes(self) -> frozenset[str]:
        """Every data member this class body defines: class-level names and ``self.X``."""
        names = set(self.class_assignments) | set(self.methods)
        for method in self.methods.values():
            names.update(_self_attributes(method))
        return frozenset(names)

    @cached_property
    def base_texts(self) -> tuple[str, ...]:
        return tuple(ast.unparse(b) for b in self.node.bases)

    @property
    def is_protocol(self) -> bool:
        return any(t.split("[")[0].split(".")[-1] == "Protocol" for t in self.base_texts)

    @property
    def is_abstract(self) -> bool:
        """Declared abstract (``ABC`` base, ``ABCMeta``, ``@abstractmethod``): never served."""
        if any(t.split(".")[-1] == "ABC" for t in self.base_texts):
            return True
        if any(
            kw.arg == "metaclass" and ast.unparse(kw.value).split(".")[-1] == "ABCMeta"
            for kw in self.node.keywords
        ):
            return True
        return any(
            (d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else "")
            == "abstractmethod"
            for m in self.methods.values()
            for d in m.decorator_list
        )


def flatten_statements(body: Iterable[ast.stmt], *, loops: bool = False) -> Iterator[ast.stmt]:
    """Statements of a body, descending into ``if``/``try``/``with`` (never into defs), and
    into loop bodies too when ``loops``."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If) or (
            loops and isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
        ):
            yield from flatten_statements(stmt.body, loops=loops)
            yield from flatten_statements(stmt.orelse, loops=loops)
        elif isinstance(stmt, ast.Try):
            yield from flatten_statements(stmt.body, loops=loops)
            for handler in stmt.handlers:
                yield from flatten_statements(handler.body, loops=loops)
            yield from flatten_statements(stmt.orelse, loops=loops)
            yield from flatten_statements(stmt.finalbody, loops=loops)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from flatten_statements(stmt.body, loops=loops)


@dataclass(eq=False)
class ModuleSource:
    """One parsed file: its classes and the names its imports bind."""

    name: str
    path: str
    is_package: bool
    tree: ast.Module
    source: str
    classes: dict[str, ClassSource] = field(default_factory=dict)
    imports: dict[str, ImportRef] = field(default_factory=dict)
    aliases: dict[str, ast.expr] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)

    @cached_property
    def nested_classes(self) -> list[ClassSource]:
        """Classes defined inside functions (and methods), each with the scope it lives in."""
        out: list[ClassSource] = []

        def visit(fn: FunctionNode, owner: ClassSource | None, parent: LocalScope | None) -> None:
            scope = LocalScope(self, fn, owner, parent)
            for stmt in flatten_statements(fn.body, loops=True):
                if isinstance(stmt, ast.ClassDef):
                    cls = ClassSource(stmt.name, self, stmt, scope)
                    out.append(cls)
                    for inner in cls.methods.values():
                        visit(inner, cls, scope)
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(stmt, owner, scope)

        for stmt in flatten_statements(self.tree.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(stmt, None, None)
            elif isinstance(stmt, ast.ClassDef) and stmt.name in self.classes:
                owner = self.classes[stmt.name]
                for method in owner.methods.values():
                    visit(method, owner, None)
        return out

    @property
    def all_classes(self) -> list[ClassSource]:
        """Module-level classes, then the ones defined inside functions."""
        return [*self.classes.values(), *self.nested_classes]

    @cached_property
    def defined_names(self) -> frozenset[str]:
        """Every name bound at the top level (classes, functions, assignments, imports)."""
        names: set[str] = set(self.classes) | set(self.imports) | set(self.aliases)
        for stmt in flatten_statements(self.tree.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                names |= {
                    n.id
                    for n in ast.walk(stmt)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
            elif isinstance(stmt, ast.Global):
                names.update(stmt.names)
        return frozenset(names)

    def absolute(self, module: str | None, level: int) -> str:
        """The absolute name of ``from <level dots><module> import ...`` in this module."""
        if level == 0:
            return module or ""
        package = self.name.split(".") if self.is_package else self.name.split(".")[:-1]
        if level > 1:
            package = package[: len(package) - (level - 1)]
        return ".".join([*package, module] if module else package)

    def index(self) -> None:
        # Import bindings win over assignments, so `try: from gpu import X / except: X = None`
        # resolves to the real class, which is what runs where the plugin is deployed.
        assigned: dict[str, ast.expr] = {}
        for stmt in flatten_statements(self.tree.body):
            if isinstance(stmt, ast.ClassDef):
                self.classes[stmt.name] = ClassSource(stmt.name, self, stmt)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        self.imports[alias.asname] = ImportRef(alias.name)
                    else:
                        top = alias.name.split(".")[0]
                        self.imports.setdefault(top, ImportRef(top))
            elif isinstance(stmt, ast.ImportFrom):
                base = self.absolute(stmt.module, stmt.level)
                for alias in stmt.names:
                    if alias.name == "*":
                        self.star_imports.append(base)
                    else:
                        self.imports[alias.asname or alias.name] = ImportRef(base, alias.name)
            elif (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                assigned.setdefault(stmt.targets[0].id, stmt.value)
        for name, value in assigned.items():
            if name not in self.imports and name not in self.classes:
                self.aliases[name] = value


def parse_module(path: str, name: str | None = None) -> ModuleSource:
    """Parse one file (raises ``OSError``/``SyntaxError``/``UnicodeDecodeError``)."""
    path = os.path.abspath(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    source = raw.decode("utf-8-sig")
    tree = ast.parse(source, filename=path)
    module = ModuleSource(
        name=name or module_name_for(path)[0],
        path=path,
        is_package=os.path.basename(path) == "__init__.py",
        tree=tree,
        source=source,
    )
    module.index()
    return module


Resolved = ClassSource | ExternalBase


class SourceIndex:
    """Modules read from given roots (and located lazily elsewhere), with class resolution.

    ``roots`` are import roots: ``pkg.mod`` is looked for as ``<root>/pkg/mod.py`` or
    ``<root>/pkg/mod/__init__.py``. With ``external`` on, a module under no root is located
    through ``importlib.util.find_spec`` of its *top-level* package only, which imports nothing.
    """

    def __init__(self, roots: Iterable[str] = (), *, external: bool = True) -> None:
        self.roots: list[str] = []
        for root in roots:
            self.add_root(root)
        self.external = external
        self.modules: dict[str, ModuleSource] = {}
        self.errors: dict[str, str] = {}
        self._missing: set[str] = set()
        self._mro: dict[int, list[Resolved]] = {}
        #: Files given (not found through an import), by the last component of their module
        #: path (``memory_pool`` for ``.../memory_pool.py``), for resolving absolute imports by
        #: suffix (``_by_suffix``), in the order given. Only paths are held, so that a tree of
        #: many files costs little until a file is read.
        self._given: dict[str, list[str]] = {}
        self._given_set: set[str] = set()
        self._by_path: dict[str, ModuleSource] = {}
        #: Given files registered unread (``register_file``): their module name, and, by name,
        #: the files of that name in the order given (the last that parses wins, as with
        #: ``load_file``); a name leaves the second once looked up.
        self._deferred_name: dict[str, str] = {}
        self._deferred: dict[str, list[str]] = {}
        self._packages: dict[tuple[str, str | None], tuple[list[str], str]] = {}
        #: Given files that could not be read, with why (``register_file``d ones only).
        self.given_errors: dict[str, Exception] = {}

    def add_root(self, root: str) -> None:
        root = os.path.abspath(root)
        if root not in self.roots:
            self.roots.append(root)

    # -- loading -----------------------------------------------------------------------------
    def load_file(self, path: str, anchor: str | None = None) -> ModuleSource:
        """Parse ``path`` (once) under the module name its package layout gives it (``anchor``:
        the folder it was found under, see ``module_name_for``)."""
        name, root = module_name_for(path, anchor)
        self.add_root(root)
        path = self._give(os.path.abspath(path))
        known = self._by_path.get(path) or self.modules.get(name)
        if known is not None and known.path == path:
            self.modules.setdefault(name, known)
            return known
        module = parse_module(path, name)
        self.modules[name] = module
        self._by_path[path] = module
        return module

    def register_file(self, path: str, anchor: str | None = None) -> str:
        """Know ``path`` as a given file without reading it; returns its module name.

        The file is parsed the first time it is needed (``load_given``, or a lookup that leads
        to its name or its path), under the name it was registered with, so that resolution
        gives what it would give had every given file been loaded at once with ``load_file``:
        this is what lets ``kvcache drift`` read only the files that matter in a large tree.
        """
        name, root = module_name_for(path, anchor, self._packages)
        self.add_root(root)
        absolute = os.path.abspath(path)
        path = path if absolute == path else absolute  # one string per path, not two
        if path in self._deferred_name:  # registered already
            return name
        self._give(path, seen=path in self._by_path)
        if path not in self._by_path:
            self._deferred_name[path] = name
            self._deferred.setdefault(name, []).append(path)
        return name

    def _give(self, path: str, *, seen: bool = True) -> str:
        """Record ``path`` (absolute) as given; ``seen``: it may be recorded already."""
        same = self._given.setdefault(_reversed_parts(path)[0], [])
        if not seen or path not in same:
            same.append(path)
        self._given_set.add(path)
        return path

    def given_paths(self) -> set[str]:
        """Every file given (registered or loaded as given), absolute."""
        return self._given_set

    def given_modules(self) -> list[ModuleSource]:
        """The given files parsed so far."""
        return [m for path, m in self._by_path.items() if path in self._given_set]

    def load_given(self, path: str, *, keep: bool = True) -> ModuleSource | None:
        """The registered file ``path``, parsed now if not yet (None, and ``given_errors``
        says why, when it cannot be read).

        With ``keep`` off, a module parsed now is not remembered (``adopt`` it to keep it): a
        caller reading many files keeps only those that matter, and one needed later (as a
        base) is parsed again then.
        """
        path = os.path.abspath(path)
        known = self._by_path.get(path)
        if known is not None:
            return known
        name = self._deferred_name.get(path)
        if name is None or path in self.given_errors:
            return None
        try:
            module = parse_module(path, name)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            self.given_errors[path] = exc
            return None
        if keep:
            self._by_path[path] = module
        return module

    def adopt(self, module: ModuleSource) -> ModuleSource:
        """Remember a module ``load_given(keep=False)`` returned (the one already remembered
        for its file, if any, wins: one file, one set of classes)."""
        return self._by_path.setdefault(module.path, module)

    def parsed_files(self) -> list[str]:
        """Every file parsed so far, in the order it was read."""
        return list(self._by_path)

    def _deferred_module(self, name: str) -> ModuleSource | None:
        """The registered module ``name``: of several files of that name, the last that parses
        (what ``load_file`` over all of them in order would have left in ``modules``)."""
        for path in reversed(self._deferred.pop(name, [])):
            module = self.load_given(path)
            if module is not None:
                self.modules[name] = module
                return module
        return None

    def _by_suffix(self, name: str) -> str | None:
        """The given file whose path ends like the dotted ``name``, if exactly one does best.

        Engines import their own modules absolutely (``from sglang.srt.mem_cache.memory_pool
        import X``) while the checker is handed folders deep inside the tree, often inside
        namespace packages (no ``__init__.py``), so no import root is known. A file
        ``.../srt/mem_cache/memory_pool.py`` that was given answers for that name when at least
        its last two components match (or all of them, for a one-component name). The longest
        match wins; a tie between two files resolves nothing.
        """
        parts = tuple(reversed(name.split(".")))
        need = min(2, len(parts))
        best: str | None = None
        best_len = 0
        tie = False
        for path in self._given.get(parts[0], ()):  # the last components must match
            rparts = _reversed_parts(path)
            n = 0
            for a, b in zip(parts, rparts, strict=False):
                if a != b:
                    break
                n += 1
            if n < need:
                continue
            if n > best_len:
                best, best_len, tie = path, n, False
            elif n == best_len and path != best:
                tie = True
        return None if tie else best

    def _locate(self, name: str) -> str | None:
        rel = name.replace(".", os.sep)
        for root in self.roots:
            for candidate in (
                os.path.join(root, rel + ".py"),
                os.path.join(root, rel, "__init__.py"),
            ):
                if os.path.isfile(candidate):
                    return candidate
        given = self._by_suffix(name)
        if given is not None:
            return given
        if not self.external:
            return None
        top, _, rest = name.partition(".")
        if top in sys.stdlib_module_names or top in _OPAQUE or top in sys.builtin_module_names:
            return None
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: nothing is executed
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
        if not rest:
            if locations:
                init = os.path.join(locations[0], "__init__.py")
                return init if os.path.isfile(init) else None
            origin = spec.origin or ""
            return origin if origin.endswith(".py") and os.path.isfile(origin) else None
        sub = rest.replace(".", os.sep)
        for base in locations:
            for candidate in (
                os.path.join(base, sub + ".py"),
                os.path.join(base, sub, "__init__.py"),
            ):
                if os.path.isfile(candidate):
                    return candidate
        return None

    def module(self, name: str) -> ModuleSource | None:
        """The module ``name``, parsed on first use; None when it cannot be found or read."""
        if name in self.modules:
            return self.modules[name]
        if name in self._deferred:
            found = self._deferred_module(name)
            if found is not None:
                return found
        if name in self._missing:
            return None
        path = self._locate(name)
        if path is None:
            self._missing.add(name)
            return None
        same = self._by_path.get(os.path.abspath(path))
        if same is None and os.path.abspath(path) in self._deferred_name:
            same = self.load_given(path)  # a given file, read under the name it was given as
        if same is not None:  # already read under another name: one module, one set of classes
            self.modules[name] = same
            return same
        try:
            module = parse_module(path, name)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            self._missing.add(name)
            return None
        self.modules[name] = module
        self._by_path[os.path.abspath(path)] = module
        return module

    def is_opaque(self, module_name: str) -> bool:
        top = module_name.split(".")[0]
        return top in sys.stdlib_module_names or top in _OPAQUE or top in sys.builtin_module_names

    # -- resolution --------------------------------------------------------------------------
    def resolve_name(self, module: ModuleSource, name: str, hops: int = 0) -> Resolved | None:
        """What ``name`` denotes at the top level of ``module`` (None: a module or unknown)."""
        if hops > _MAX_HOPS:
            return ExternalBase(f"{module.name}.{name}", known=False)
        if name in module.classes:
            return module.classes[name]
        ref = module.imports.get(name)
        if ref is not None:
            if ref.attr is None:
                return None  # a module object, not a class
            return self.resolve_attr(ref.module, ref.attr, hops + 1)
        alias = module.aliases.get(name)
        if alias is not None:
            return self.resolve_expr(module, alias, hops + 1)
        for star in module.star_imports:
            target = self.module(star)
            if target is not None and name in (
                *target.classes,
                *target.imports,
                *target.aliases,
            ):
                return self.resolve_name(target, name, hops + 1)
        if hasattr(builtins, name):
            return ExternalBase(name, known=True)
        return None

    def resolve_attr(self, module_name: str, attr: str, hops: int = 0) -> Resolved | None:
        """The class ``module_name.attr``, following re-exports."""
        if self.is_opaque(module_name):
            return ExternalBase(f"{module_name}.{attr}", known=True)
        module = self.module(module_name)
        if module is None:
            return ExternalBase(f"{module_name}.{attr}", known=False)
        found = self.resolve_name(module, attr, hops)
        if found is None and self.module(f"{module_name}.{attr}") is None:
            return ExternalBase(f"{module_name}.{attr}", known=False)
        return found

    def _module_of(
        self, module: ModuleSource, expr: ast.expr, scope: LocalScope | None = None
    ) -> str | None:
        """The absolute module name an expression like ``pkg.sub`` denotes, if it is one."""
        if isinstance(expr, ast.Name):
            local = scope.lookup(expr.id) if scope is not None else None
            if isinstance(local, ast.expr):
                return self._module_of(module, local, scope.parent if scope else None)
            ref = local if isinstance(local, ImportRef) else module.imports.get(expr.id)
            if ref is None:
                return None
            if ref.attr is None:
                return ref.module
            candidate = f"{ref.module}.{ref.attr}"
            return candidate if self.is_opaque(candidate) or self.module(candidate) else None
        if isinstance(expr, ast.Attribute):
            parent = self._module_of(module, expr.value, scope)
            return f"{parent}.{expr.attr}" if parent is not None else None
        return None

    def module_of(
        self, module: ModuleSource, expr: ast.expr, scope: LocalScope | None = None
    ) -> str | None:
        """The absolute name of the module ``expr`` denotes (``mod``, ``pkg.sub``, a patch
        method's module parameter), or None when it is not known to be a module."""
        return self._module_of(module, expr, scope)

    def resolve_expr(
        self,
        module: ModuleSource,
        expr: ast.expr,
        hops: int = 0,
        scope: LocalScope | None = None,
    ) -> Resolved | None:
        """The class a base-class expression denotes (``Base``, ``mod.Base``, ``Base[T]``,
        ``getattr(mod, "Base")``), names looked up in ``scope`` first."""
        if hops > _MAX_HOPS:
            return ExternalBase(ast.unparse(expr), known=False)
        if isinstance(expr, ast.Subscript):
            return self.resolve_expr(module, expr.value, hops, scope)
        if isinstance(expr, ast.Name):
            local = scope.lookup(expr.id) if scope is not None else None
            if isinstance(local, ClassSource):
                return local
            if isinstance(local, ImportRef):
                if local.attr is None:
                    return None
                return self.resolve_attr(local.module, local.attr, hops + 1)
            if isinstance(local, ast.expr):
                if isinstance(local, ast.Name) and local.id == expr.id:  # `X = X`: the outer one
                    return self.resolve_expr(
                        module, local, hops + 1, scope.parent if scope else None
                    )
                return self.resolve_expr(module, local, hops + 1, scope)
            found = self.resolve_name(module, expr.id, hops)
            return found if found is not None else ExternalBase(expr.id, known=False)
        if isinstance(expr, ast.Attribute):
            owner = self._module_of(module, expr.value, scope)
            if owner is not None:
                return self.resolve_attr(owner, expr.attr, hops + 1)
            return ExternalBase(ast.unparse(expr), known=False)
        got = _getattr_of(expr)
        if got is not None:
            owner = self._module_of(module, got[0], scope)
            if owner is not None:
                return self.resolve_attr(owner, got[1], hops + 1)
        return ExternalBase(ast.unparse(expr), known=False)

    def bases(self, cls: ClassSource) -> list[Resolved]:
        return [
            self.resolve_expr(cls.module, b, scope=cls.scope)
            or ExternalBase(ast.unparse(b), known=False)
            for b in cls.node.bases
        ]

    def mro(self, cls: ClassSource) -> list[Resolved]:
        """C3 linearisation over what could be resolved; unresolved bases are leaves."""
        return self._linearize(cls, ())

    def _linearize(self, cls: ClassSource, stack: tuple[int, ...]) -> list[Resolved]:
        key = id(cls)
        if key in self._mro:
            return self._mro[key]
        if key in stack:  # an inheritance cycle (broken code): stop here
            return [cls]
        bases = self.bases(cls)
        seqs: list[list[Resolved]] = []
        for base in bases:
            if isinstance(base, ClassSource):
                seqs.append(list(self._linearize(base, (*stack, key))))
            else:
                seqs.append([base])
        seqs.append(list(bases))
        result = [cls, *_merge(seqs)]
        self._mro[key] = result
        return result

    # -- queries -----------------------------------------------------------------------------
    def find_method(self, cls: ClassSource, name: str) -> tuple[ClassSource, FunctionNode] | None:
        """The class along the MRO that really defines ``name``, and its ``def``."""
        for klass in self.mro(cls):
            if isinstance(klass, ClassSource) and name in klass.methods:
                return klass, klass.methods[name]
        return None

    def unknown_bases(self, cls: ClassSource) -> list[ExternalBase]:
        return [k for k in self.mro(cls) if isinstance(k, ExternalBase) and not k.known]

    def has_attribute(self, cls: ClassSource, name: str) -> bool:
        for klass in self.mro(cls):
            if (
                isinstance(klass, ClassSource)
                and not klass.is_protocol  # a Protocol's `size: int` declares, never defines
                and (name in klass.attributes or "__getattr__" in klass.methods)
            ):
                return True
        return False

    def subclasses_of(self, root: ClassSource) -> list[ClassSource]:
        """Classes of the loaded modules that have ``root`` in their MRO (``root`` included)."""
        modules = {id(m): m for m in list(self.modules.values())}  # aliases read once
        return [
            cls
            for module in modules.values()
            for cls in module.all_classes
            if any(k is root for k in self.mro(cls))
        ]


def _getattr_of(expr: ast.expr) -> tuple[ast.expr, str] | None:
    """``(owner, "name")`` of ``getattr(owner, "name")`` (with or without a default)."""
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "getattr"
        and len(expr.args) in (2, 3)
        and not expr.keywords
        and isinstance(expr.args[1], ast.Constant)
        and isinstance(expr.args[1].value, str)
    ):
        return expr.args[0], expr.args[1].value
    return None


def _reversed_parts(path: str) -> tuple[str, ...]:
    """Path components of a file's module path, last first (``pkg/mod/__init__.py``: mod, pkg)."""
    stem = path[:-3] if path.endswith(".py") else path
    parts = stem.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return tuple(reversed(parts))


def _merge(seqs: list[list[Resolved]]) -> list[Resolved]:
    """C3 merge; on an inconsistent hierarchy, falls back to depth-first, left to right."""
    pending = [list(s) for s in seqs if s]
    out: list[Resolved] = []

    def key(x: Resolved) -> object:
        return x.name if isinstance(x, ExternalBase) else id(x)

    while pending:
        for seq in pending:
            head = seq[0]
            if not any(key(head) in {key(x) for x in s[1:]} for s in pending):
                break
        else:
            seen = {key(x) for x in out}
            for seq in pending:
                for item in seq:
                    if key(item) not in seen:
                        seen.add(key(item))
                        out.append(item)
            return out
        out.append(head)
        pending = [[x for x in s if key(x) != key(head)] for s in pending]
        pending = [s for s in pending if s]
    return out
