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
