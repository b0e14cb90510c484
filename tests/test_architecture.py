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
