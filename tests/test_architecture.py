"""Rules of the house (DESIGN.md section 1), checked on the source."""

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


def test_conformance_has_one_subpackage_per_level():
    conformance = ROOT / "kvcache_core" / "conformance"
    for level in ("source", "signature", "types", "behaviour"):
        assert (conformance / level / "__init__.py").is_file(), level
    # Private modules are shared only inside their own subpackage.
    for path in conformance.rglob("*.py"):
        for module, _, line in _resolved_imports(path):
            parts = module.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_") and p != "__init__"]
            if private and module.startswith("kvcache_core.conformance"):
                owner = ".".join(parts[: private[0]])
                here = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                assert here.startswith(owner + "."), f"{here}:{line} reaches into {module}"


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
