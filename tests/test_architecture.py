"""Rules of the house (docs/architecture.md, "Rules the tests enforce"), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_core_never_imports_the_builtin_plugins():
    offenders = {
        path: sorted(n for n in names if n.split(".")[0] == "kvcache_plugins")
        for path, names in imported_modules("kvcache_core").items()
    }
    assert {p: n for p, n in offenders.items() if n} == {}


def test_plugins_use_only_the_public_face_of_core():
    offenders = {
        path: sorted(n for n in names if n.startswith("kvcache_core."))
        for path, names in imported_modules("kvcache_plugins").items()
    }
    assert {p: n for p, n in offenders.items() if n} == {}


def _resolved_imports(path: Path) -> list[tuple[str, str, int]]:
    """``(absolute module, imported name, line)`` for every ``from ... import`` in ``path``."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            absolute = ".".join(base + ([node.module] if node.module else []))
        else:
            absolute = node.module or ""
        found += [(absolute, alias.name, node.lineno) for alias in node.names]
    return found


def test_contracts_never_import_the_checker():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in (ROOT / "kvcache_core" / "contracts").rglob("*.py")
        for module, _, line in _resolved_imports(path)
        if module.startswith("kvcache_core.conformance")
    ]
    assert offenders == []


def test_no_module_imports_another_modules_private_names():
    """Private modules may serve their own subpackage; private *names* stay in their module."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name} from {module}"
        for package in ("kvcache_core", "kvcache_plugins")
        for path in (ROOT / package).rglob("*.py")
        for module, name, line in _resolved_imports(path)
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


CONFORMANCE = ROOT / "kvcache_core" / "conformance"
#: The checker's rooms by job; every level has its own room besides (see ``LEVELS``).
CHECKER_JOBS = ("members", "results", "targets", "reporting")
#: The only modules at the top of ``conformance/``: its public face and the runner.
CHECKER_TOP = {"__init__.py", "runner.py"}


def _level_names() -> tuple[str, ...]:
    from kvcache_core.conformance import LEVELS

    return tuple(level.name for level in LEVELS)


def test_conformance_has_one_subpackage_per_level():
    levels = _level_names()
    assert levels == ("source", "signature", "types", "behaviour")
    for level in levels:
        assert (CONFORMANCE / level / "__init__.py").is_file(), level
    # Private modules are shared only inside their own subpackage.
    for path in CONFORMANCE.rglob("*.py"):
        for module, _, line in _resolved_imports(path):
            parts = module.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_") and p != "__init__"]
            if private and module.startswith("kvcache_core.conformance"):
                owner = ".".join(parts[: private[0]])
                here = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                assert here.startswith(owner + "."), f"{here}:{line} reaches into {module}"


def test_every_level_is_in_the_one_tuple_and_runs_through_it():
    """A subpackage whose ``level.py`` offers ``run_level`` is a level: it is listed in
    ``LEVELS`` (and every entry there names such a module). No other module picks levels by
    name: the runner iterates the tuple."""
    from kvcache_core.conformance import LEVELS

    offered = {
        path.parent.name
        for path in CONFORMANCE.glob("*/level.py")
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "run_level"
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    }
    assert offered == set(_level_names())
    for level in LEVELS:
        assert getattr(level, "module", None) == f"kvcache_core.conformance.{level.name}.level"
    runner = ast.parse((CONFORMANCE / "runner.py").read_text(encoding="utf-8"))
    compared = [
        ast.unparse(node)
        for node in ast.walk(runner)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(c, ast.Constant) and c.value in offered
            for c in (node.left, *node.comparators)
        )
    ]
    # Only the behaviour level's own options (expected failures, --select) are named there.
    assert all("'behaviour'" in text for text in compared), compared


def test_each_checker_module_lives_in_the_room_of_its_job():
    """``conformance/`` holds its face and the runner; everything else sits in a job's room
    (member comparison, results, target resolution, reporting) or a level's."""
    rooms = set(CHECKER_JOBS) | set(_level_names())
    top = {path.name for path in CONFORMANCE.glob("*.py")}
    assert top == CHECKER_TOP
    folders = {p.name for p in CONFORMANCE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == rooms
    for room in rooms:
        assert (CONFORMANCE / room / "__init__.py").is_file(), room
        assert ast.get_docstring(ast.parse((CONFORMANCE / room / "__init__.py").read_text()))


def test_formats_and_exit_codes_are_defined_once():
    names = {"FORMATS", "EXIT_OK", "EXIT_FINDINGS", "EXIT_ERROR"}
    defined: dict[str, list[str]] = {name: [] for name in names}
    for path in (ROOT / "kvcache_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Name) and part.id in names:
                        defined[part.id].append(str(path.relative_to(ROOT)))
    where = "kvcache_core/conformance/reporting/report.py"
    assert defined == {name: [where] for name in names}


def test_the_reference_engine_speaks_only_the_public_face():
    """The engine proves the contract is enough: it may import ``kvcache_core``'s public names
    and its own modules, never a plugin and never core's internals."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, names in imported_modules("kvcache_core/engine").items()
        for name in names
        if name.split(".")[0] in ("kvcache_core", "kvcache_plugins")
        and name != "kvcache_core"
        and not name.startswith("kvcache_core.engine")
    ]
    assert offenders == []


# -- private attributes ------------------------------------------------------------------------

#: The protected hooks [`FreeGroup`] documents for its subclasses (a mixin's contract with the
#: class that mixes it in): the only private names a class may use from a base in another package.
FREE_GROUP_HOOKS = frozenset({"_collect", "_flush_group", "_forget_collected", "_group"})


def _names_defined(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, assigned names and attributes
    (``anything._x = ...`` defines ``_x`` here), parameters and imported names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute):
                        names.add(part.attr)
                    elif isinstance(part, ast.Name):
                        names.add(part.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def private_attribute_offenders(sources: dict[str, str]) -> list[str]:
    """``obj._name`` reads that reach into another module's privates.

    ``sources`` maps a path (``package/module.py``) to its text. Two rules:

    - on any object but ``self``/``cls`` (``self.side._reserve``, ``other._held``), a private
      name must be defined in the same module: another module's object is used through its
      public methods only;
    - on ``self``/``cls``, it must be defined in the same package (a subclass may use its own
      package's protected members) or be one of ``FREE_GROUP_HOOKS``.
    """
    trees = {path: ast.parse(text) for path, text in sources.items()}
    defined = {path: _names_defined(tree) for path, tree in trees.items()}
    by_package: dict[str, set[str]] = {}
    for path, names in defined.items():
        by_package.setdefault(path.rsplit("/", 1)[0], set()).update(names)
    offenders: list[str] = []
    for path, tree in trees.items():
        package = by_package[path.rsplit("/", 1)[0]]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__"):
                continue
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            allowed = (package | FREE_GROUP_HOOKS) if on_self else defined[path]
            if name not in allowed:
                offenders.append(f"{path}:{node.lineno} reads {ast.unparse(node)}")
    return sorted(offenders)


def _package_sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for package in ("kvcache_core", "kvcache_plugins")
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_no_module_reads_another_modules_private_attributes():
    """Composite allocators once reached into ``PagedSlotAllocator``'s privates from the plugin
    package (``self.full_attn_allocator._reserve(...)``); they use its public interface now."""
    assert private_attribute_offenders(_package_sources()) == []


def test_the_private_attribute_rule_catches_each_kind_of_reach():
    """Who checks the rule: each kind of reach is reported, and what is allowed is not."""
    sources = {
        "core/alloc.py": (
            "class Side:\n"
            "    def __init__(self):\n"
            "        self._reserve = 1\n"
            "    def _settle(self):\n"
            "        return self._reserve\n"
        ),
        "plugins/composite.py": (
            "class Composite(Side):\n"
            "    def __init__(self, side):\n"
            "        self.side = side\n"
            "        self._held = {}\n"
            "    def alloc(self, other):\n"
            "        self._held.clear()\n"  # own attribute: fine
            "        self._collect(1)\n"  # a documented FreeGroup hook: fine
            "        self.side._reserve\n"  # another module's private, on an attribute
            "        other._settle()\n"  # on a parameter
            "        return self._settle()\n"  # inherited across packages
        ),
        "plugins/sibling.py": "def peek(c):\n    return c._held\n",  # same package, other module
    }
    assert private_attribute_offenders(sources) == [
        "plugins/composite.py:10 reads self._settle",
        "plugins/composite.py:8 reads self.side._reserve",
        "plugins/composite.py:9 reads other._settle",
        "plugins/sibling.py:2 reads c._held",
    ]


def test_design_references_point_at_the_architecture_page():
    """The founding design note is not in the repository: code, tests and docs that need the
    design point at docs/architecture.md, which exists and is in the site's nav."""
    import os

    design_note = "DESIGN" + ".md"
    offenders = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("site", "build")]
        for name in files:
            if name.endswith((".py", ".md", ".yml", ".toml", ".cfg", ".ini")) or name == "Makefile":
                path = Path(top) / name
                if design_note in path.read_text(encoding="utf-8", errors="replace"):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
    assert (ROOT / "docs" / "architecture.md").is_file()
    assert "architecture.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


# -- the import graph ----------------------------------------------------------------------------


def _module_name(path: str) -> str:
    """``kvcache_core/stores/__init__.py`` -> ``kvcache_core.stores``."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(sources: dict[str, str]) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line}, among the modules of ``sources`` (path -> text).

    Relative imports are resolved; ``from package import name`` points at the submodule
    ``package.name`` when there is one, else at ``package``. Imports inside functions count;
    imports under ``if TYPE_CHECKING:`` do not (they never run: annotations only).
    """
    modules = {_module_name(path): path for path in sources}
    return {
        name: _edges(ast.parse(sources[path]), name, path.endswith("__init__.py"), set(modules))
        for name, path in modules.items()
    }


def _edges(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> dict[str, int]:
    """The modules (of ``modules``) that the module ``name`` imports, each with a line."""
    package = name if is_package else name.rpartition(".")[0]
    edges: dict[str, int] = {}
    todo = [tree]
    while todo:
        for child in ast.iter_child_nodes(todo.pop()):
            if isinstance(child, ast.If) and _is_type_checking(child):
                todo += child.orelse
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    kept = parts[: len(parts) - (child.level - 1)]
                    base = ".".join(kept + ([child.module] if child.module else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in child.names
                ]
            for target in targets:
                if target in modules and target != name:
                    edges[target] = min(edges.get(target, child.lineno), child.lineno)
            todo.append(child)
    return edges


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each set of modules that import each other (directly or round a loop), as one cycle
    through them: ``[a, b, a]``. Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(_loop(graph, set(component)))
    return sorted(found)


def _loop(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """One concrete loop through a strongly connected ``component``, from its first module."""
    first = min(component)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        nxt = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ == first:
                    return paths[node] + [first]
                if succ in component and succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    nxt.append(succ)
        frontier = nxt
    raise AssertionError(f"no loop through {sorted(component)}")


def test_no_import_cycle_between_kvcache_core_modules():
    """No two ``kvcache_core`` modules depend on each other, directly or round a loop.

    Imports inside functions count: an import moved into a function only delays its cost, the
    dependency is still there, and such a pair can no more be understood, tested or moved
    apart than one importing each other at the top (``conformance.plugin_source`` and
    ``conformance.plugins`` were such a pair). ``if TYPE_CHECKING:`` imports do not count:
    they never run. Neither does the implicit import of a module's parent package, which
    every submodule has.
    """
    sources = {p: t for p, t in _package_sources().items() if p.startswith("kvcache_core/")}
    assert import_cycles(import_graph(sources)) == []


def test_the_cycle_rule_catches_each_kind_of_loop():
    """Who checks the rule: a relative import, a function-level import and a loop of three are
    each found; a ``TYPE_CHECKING`` import and the import of a parent package are not."""
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
    sources = {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "from . import b\nA = 1\n",  # a -> b (a submodule named in from-import)
        "pkg/b.py": "def f():\n    from .a import A\n",  # b -> a, inside a function
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "import pkg.sub.d\n",
        "pkg/sub/d.py": "from ..e import E\n",
        "pkg/e.py": f"{typing_only}    from .sub.c import C\ndef g():\n    from .sub import c\n",
        "pkg/lone.py": f"{typing_only}    from .f import F\n",
        "pkg/f.py": "from .lone import X\n",
    }
    assert import_cycles(import_graph(sources)) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.e", "pkg.sub.c", "pkg.sub.d", "pkg.e"],
    ]


def test_the_checker_never_imports_discovery():
    """Discovery may use the checker's signature level; the checker never uses discovery (it
    loads plugins through ``plugin_loader``, as discovery does), so the two cannot drift into
    depending on each other again. Any import counts, even one inside a function."""
    sources = _package_sources()
    graph = import_graph({p: t for p, t in sources.items() if p.startswith("kvcache_core/")})
    offenders = [
        f"{module}:{line}"
        for module, edges in graph.items()
        if module.startswith("kvcache_core.conformance")
        for target, line in edges.items()
        if target == "kvcache_core.discovery"
    ]
    assert offenders == []


# -- one definition each -------------------------------------------------------------------------

#: The one module that names the entry-point groups and summarises a plugin's exception.
LOADER = "kvcache_core/plugin_loader.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """``id()`` of every string that stands alone as a statement: docstrings of modules,
    classes, functions and attributes (prose may name a group freely)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def group_names(sources: dict[str, str], groups: set[str]) -> list[str]:
    """``path:line group`` of every string constant (not prose) that spells one of ``groups``."""
    found: list[str] = []
    for path, text in sources.items():
        tree = ast.parse(text)
        prose = _docstrings(tree)
        found += [
            f"{path}:{node.lineno} {node.value}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in groups and id(node) not in prose
        ]
    return sorted(found)


def test_each_entry_point_group_is_named_once():
    """The entry-point groups (``plugin_loader``'s ``*_ENTRY_POINT_GROUP``) are spelled there
    and nowhere else in code (docstrings may name them): everything else imports the
    constants, so a group cannot be renamed in one place and not in another."""
    loader = ast.parse((ROOT / LOADER).read_text(encoding="utf-8"))
    constants = {
        ast.unparse(n.targets[0]): n
        for n in loader.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]).endswith("_ENTRY_POINT_GROUP")
    }
    assert set(constants) == {"POOL_ENTRY_POINT_GROUP", "STORE_ENTRY_POINT_GROUP"}
    groups = {ast.literal_eval(n.value) for n in constants.values()}
    assert groups == {"kvcache.pools", "kvcache.stores"}
    assert group_names(_package_sources(), groups) == sorted(
        f"{LOADER}:{n.lineno} {ast.literal_eval(n.value)}" for n in constants.values()
    )


def exception_summary_helpers(sources: dict[str, str]) -> list[str]:
    """``path:line name`` of every function that turns an exception into a string: one
    parameter annotated as an exception type, and ``-> str``."""
    exception_types = {"BaseException", "Exception"}
    found: list[str] = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            takes_exception = any(
                p.annotation is not None and exception_types & _names_in(p.annotation)
                for p in params
            )
            returns_str = node.returns is not None and ast.unparse(node.returns) in ("str", "'str'")
            if takes_exception and returns_str:
                found.append(f"{path}:{node.lineno} {node.name}")
    return sorted(found)


def _names_in(annotation: ast.expr) -> set[str]:
    """The names an annotation mentions, also inside a string annotation."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}


def test_one_exception_summary_helper():
    """One way to say in a line what a plugin raised (``plugin_loader.summarise_exception``):
    rejection reasons and load errors of every loader read alike. A second helper fails here."""
    helpers = exception_summary_helpers(_package_sources())
    assert [h.split(" ")[1] for h in helpers] == ["summarise_exception"], helpers
    assert helpers[0].startswith(f"{LOADER}:")


def inline_summaries(sources: dict[str, str]) -> list[str]:
    """``path:line`` of every call reading a traceback's frames outside the loader: an inline
    copy of the summary (type, message, innermost frame) that no helper definition shows."""
    return sorted(
        f"{path}:{node.lineno}"
        for path, text in sources.items()
        if path != LOADER
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Attribute) and node.attr in ("extract_tb", "walk_tb")
    )


def test_no_inline_exception_summary():
    """The summary is also not rebuilt inline (the runner and the battery once did): a crash
    in a level or a check reads like a plugin's rejection."""
    assert inline_summaries(_package_sources()) == []
    planted = {"c.py": "import traceback\nframes = traceback.extract_tb(None)\n"}
    assert inline_summaries(planted) == ["c.py:2"]


def test_the_one_definition_rules_catch_a_second_one():
    """Who checks the rules: a group spelled in code (not in prose) and a second summary
    helper, however named, are reported."""
    sources = {
        "a.py": '"""Reads kvcache.pools."""\nGROUP = "kvcache.pools"\n"""kvcache.stores"""\n',
        "b.py": "def why(exc: BaseException) -> str:\n    return repr(exc)\n"
        "def fine(exc: BaseException) -> None:\n    pass\n"
        "def also(value: object, error: 'Exception | None' = None) -> str:\n    return ''\n",
    }
    assert group_names(sources, {"kvcache.pools", "kvcache.stores"}) == ["a.py:2 kvcache.pools"]
    assert exception_summary_helpers(sources) == ["b.py:1 why", "b.py:5 also"]


# -- the package root ----------------------------------------------------------------------------

#: Every module directly in ``kvcache_core/``, with why it belongs there: the public face, what
#: the face needs, or an entry point others name by its path. A module for the CLI alone goes in
#: ``commands/``, one for tests or benchmarks alone under ``tests/``.
ROOT_MODULES = {
    "__init__": "the public face: every name of kvcache_core.__all__, imported on first use",
    "_lazy": "the lazy-import helper of the two lazy faces (kvcache_core, contracts)",
    "cli": "the `kvcache` console script's entry point (pyproject [project.scripts])",
    "discovery": "discover(), Registry, Rejection: the face engines call",
    "errors": "the exception types of the face",
    "hookspecs": "hookimpl, the marker of the face plugin authors use, and the hook specs",
    "hostmem": "host_cache_stats, set_host_cache_limit, release_host_cache of the face",
    "plugin_loader": "the one plugin loader discovery (and the checker) load plugins with",
    "pytest_plugin": "the pytest11 entry point (pyproject), a documented interface",
    "quantized": "QuantizedLayerRows of the face",
    "snapshot_wire": "the byte form behind KVSnapshot.to_bytes/from_bytes (documented)",
    "storage": "LayerRows, host_empty, storage_dtype of the face",
    "testing": "kvcache_core.testing: the battery in a pool author's suite (documented API)",
    "validation": "check_rows, check_slots of the face",
}

#: Root modules that other software names by their path rather than reaching them through the
#: face: entry points and the documented testing API.
ENTRY_MODULES = frozenset({"cli", "pytest_plugin", "testing"})


def test_the_package_root_holds_the_public_face_and_what_it_needs():
    """A new module in ``kvcache_core/`` must say why it is there (``ROOT_MODULES``), and every
    root module but the entry points is imported, directly or not, by a module the face
    exports from: one only the CLI, tests or benchmarks use does not belong in the root."""
    root = ROOT / "kvcache_core"
    here = {p.stem for p in root.glob("*.py")}
    assert here == set(ROOT_MODULES), "justify each root module in ROOT_MODULES (or move it)"
    assert all(len(why) > 20 for why in ROOT_MODULES.values())

    face = ast.parse((root / "__init__.py").read_text(encoding="utf-8"))
    lazy = next(
        n.value
        for n in ast.walk(face)
        if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "_LAZY"
    )
    assert isinstance(lazy, ast.Dict)
    exported = {"kvcache_core" + ast.literal_eval(v) for v in lazy.values if v is not None}
    sources = {p: t for p, t in _package_sources().items() if p.startswith("kvcache_core/")}
    graph = import_graph(sources)
    reached, todo = set(), ["kvcache_core", *exported]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph.get(module, {})
    unreached = {m for m in ROOT_MODULES if m not in ENTRY_MODULES and _root(m) not in reached}
    assert unreached == set(), "root modules the public face never needs"


def _root(module: str) -> str:
    return "kvcache_core" if module == "__init__" else f"kvcache_core.{module}"


def test_one_lazy_import_helper():
    """The lazy faces (PEP 562) share ``_lazy.lazy_exports``: no module writes its own module
    ``__getattr__``, so the two faces cannot come to resolve names differently."""
    offenders = [
        f"{path}:{node.lineno}"
        for path, text in _package_sources().items()
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__")
    ]
    assert offenders == []
    faces = [
        path
        for path, text in _package_sources().items()
        if "__getattr__, __dir__ = _lazy_exports(globals(), _LAZY)" in text
    ]
    assert faces == ["kvcache_core/__init__.py", "kvcache_core/contracts/__init__.py"]
