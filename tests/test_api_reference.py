"""The API reference covers every public name, with a docstring, without building the site.

The reference (docs/reference/) is rendered by mkdocstrings, which reads the *source* (griffe),
never the running package. So what it can show is decided statically: a name in
``kvcache_core.__all__`` that is only in the lazy ``_LAZY`` table (and not in the
``TYPE_CHECKING`` import block) is silently missing from the page, and a name whose definition
has no docstring is rendered as a bare signature. These tests read the same source the same
way and fail on either, so a new public name cannot land undocumented. (``make docs`` then
fails on a docstring it cannot parse or a broken cross-reference.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvcache_core"
REFERENCE = ROOT / "docs" / "reference"


def _module_file(dotted: str) -> Path:
    path = ROOT.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _tree(dotted: str) -> ast.Module:
    return ast.parse(_module_file(dotted).read_text(encoding="utf-8"))


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, with the bodies of ``if TYPE_CHECKING:`` blocks inlined."""
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            out.extend(node.body)
        else:
            out.append(node)
    return out


def _dunder_all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return value
    raise AssertionError("no __all__")


def _absolute(module: str, node: ast.ImportFrom) -> str:
    base = module.split(".")
    if node.level:
        is_package = _module_file(module).name == "__init__.py"
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        return ".".join([*base, node.module] if node.module else base)
    return node.module or ""


def _has_docstring(module: str, name: str, seen: int = 0) -> bool:
    """Whether the definition of ``module.name`` (following re-exports) has a docstring the
    way griffe sees one: a class's or function's docstring, or a string right after an
    assignment (``#:`` comments are not read)."""
    assert seen < 10, f"re-export loop at {module}.{name}"
    statements = _top_level(_tree(module))
    for i, node in enumerate(statements):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return bool(ast.get_docstring(node))
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            after = statements[i + 1] if i + 1 < len(statements) else None
            return (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
                and bool(after.value.value.strip())
            )
        if isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == name for a in node.names
        ):
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            return _has_docstring(_absolute(module, node), original, seen + 1)
    raise AssertionError(f"{module}.{name} is not defined or imported at module level")


def _directive_options(page: Path, target: str) -> str:
    """The indented option lines under ``::: target`` on ``page`` (asserting it is there)."""
    text = page.read_text(encoding="utf-8")
    match = re.search(rf"^::: {re.escape(target)}[ \t]*\n((?:[ \t]+.*\n)*)", text, flags=re.M)
    assert match, f"{page.name} has no '::: {target}' directive"
    return match.group(1)


def test_reference_renders_kvcache_core_from_its_dunder_all():
    # No hand-kept member list: the page follows __all__, so new public names appear on it.
    options = _directive_options(REFERENCE / "kvcache_core.md", "kvcache_core")
    assert "members:" not in options


def test_reference_renders_the_testing_module():
    options = _directive_options(REFERENCE / "testing.md", "kvcache_core.testing")
    assert "members:" not in options


def test_reference_pages_are_in_the_site_nav():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "reference/kvcache_core.md" in config
    assert "reference/testing.md" in config


def test_every_public_name_is_visible_to_the_reference():
    tree = _tree("kvcache_core")
    bound: set[str] = set()
    for node in _top_level(tree):
        if isinstance(node, ast.ImportFrom):
            bound |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    missing = [name for name in _dunder_all(tree) if name not in bound]
    assert missing == [], (
        "public names mkdocstrings cannot see: import them in the TYPE_CHECKING block of "
        f"kvcache_core/__init__.py too: {missing}"
    )


def test_every_public_name_has_a_docstring():
    undocumented = [
        name
        for name in _dunder_all(_tree("kvcache_core"))
        if not _has_docstring("kvcache_core", name)
    ]
    assert undocumented == [], f"public names without a docstring: {undocumented}"


def test_every_testing_name_has_a_docstring():
    module = "kvcache_core.testing"
    undocumented = [name for name in _dunder_all(_tree(module)) if not _has_docstring(module, name)]
    assert undocumented == [], f"kvcache_core.testing names without a docstring: {undocumented}"


def test_the_checks_catch_what_they_claim(tmp_path, monkeypatch):
    # The docstring finder itself: a documented class, an assignment with and without one.
    source = 'class A:\n    """Why."""\n\nB = 1\n"""Why."""\n\n#: not read\nC = 2\n'
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text(source, encoding="utf-8")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _has_docstring("fakepkg", "A")
    assert _has_docstring("fakepkg", "B")
    assert not _has_docstring("fakepkg", "C")
