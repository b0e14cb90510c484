"""Who checks the API reference's checker: docs/hooks/reference_check.py on pages shaped like
mkdocstrings' output, each rule with an input only it catches; and no Sphinx role anywhere in
the source.

The hook runs inside ``make docs`` (CI runs it after ``make test``) on the real pages and fails
the build naming every offender; these tests hold the hook to what it promises without MkDocs
installed.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "docs" / "hooks" / "reference_check.py"


def _hook():
    name = "kvcache_docs_reference_check"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _object(ident: str, prose: str = "", children: str = "", kind: str = "function") -> str:
    """One rendered object, as mkdocstrings-python 2 lays it out."""
    heading = (
        f'<h3 id="{ident}" class="doc doc-heading"><code class="doc-symbol"></code>'
        f'<span class="doc doc-object-name">{ident.rsplit(".", 1)[-1]}</span>'
        f'<a href="#{ident}" class="headerlink" title="Permanent link">&para;</a></h3>'
    )
    signature = (
        '<div class="doc-signature highlight"><pre><code><span class="nf">f</span>'
        '<span class="p">(x: int)</span></code></pre></div>'
    )
    kids = f'<div class="doc doc-children">{children}</div>' if children else ""
    return (
        f'<div class="doc doc-object doc-{kind}">{heading}{signature}'
        f'<div class="doc doc-contents ">{prose}{kids}</div></div>'
    )


def _page(*objects: str) -> str:
    return _object("kvcache_core", "<p>The package.</p>", "".join(objects), kind="module")


def _found(html: str) -> list[tuple[str, str]]:
    return [(f.kind, f.name) for f in _hook().check_page(html, "reference/x.md")]


def test_a_documented_page_passes():
    method = _object("kvcache_core.Pool.write", "<p>Write rows.</p>")
    cls = _object("kvcache_core.Pool", "<p>A pool.</p>", method, kind="class")
    assert _found(_page(cls)) == []


def test_a_member_without_prose_is_named():
    method = _object("kvcache_core.Pool.write")  # signature only
    cls = _object("kvcache_core.Pool", "<p>A pool.</p>", method, kind="class")
    assert _found(_page(cls)) == [("undocumented", "kvcache_core.Pool.write")]


def test_childrens_prose_does_not_document_the_parent():
    method = _object("kvcache_core.Pool.write", "<p>Write rows.</p>")
    cls = _object("kvcache_core.Pool", "", method, kind="class")
    assert _found(_page(cls)) == [("undocumented", "kvcache_core.Pool")]


def test_signatures_and_permalinks_are_not_prose():
    bare = _object("kvcache_core.Pool.write")
    inside = bare.replace(
        '<div class="doc doc-contents ">',
        '<div class="doc doc-contents "><div class="doc-signature"><code>write(x)</code></div>'
        '<a class="headerlink" href="#w">&para;</a>',
    )
    cls = _object("kvcache_core.Pool", "<p>A pool.</p>", inside, kind="class")
    assert _found(_page(cls)) == [("undocumented", "kvcache_core.Pool.write")]


def test_a_private_member_is_named_even_with_a_docstring():
    private = _object("kvcache_core.Pool._settle", "<p>Internal.</p>")
    dunder = _object("kvcache_core.Pool.__str__", "<p>One line.</p>")
    cls = _object("kvcache_core.Pool", "<p>A pool.</p>", private + dunder, kind="class")
    assert _found(_page(cls)) == [("private", "kvcache_core.Pool._settle")]


def test_a_raw_sphinx_role_is_named_with_its_owner():
    prose = "<p>Frees go through :meth:<code>_free_calls</code> first.</p>"
    cls = _object("kvcache_core.FreeGroup", prose, kind="class")
    assert _found(_page(cls)) == [("role", "kvcache_core.FreeGroup")]
    for role in (":attr:", ":class:", ":func:", ":py:meth:", ":exc:"):
        text = _page(_object("kvcache_core.X", f"<p>see {role}<code>y</code></p>"))
        assert [k for k, _ in _found(text)] == ["role"], role
    # A colon-separated word that is not a role is prose.
    fine = _page(_object("kvcache_core.X", "<p>ratio: class: 3; key:value</p>"))
    assert _found(fine) == []


def test_the_message_names_each_offender_and_the_fix():
    hook = _hook()
    role = hook.Finding("role", "reference/kvcache_core.md", "kvcache_core.Pool", ":meth:")
    assert "kvcache_core.Pool (reference/kvcache_core.md)" in str(role)
    assert "[`Name`][kvcache_core.Name]" in str(role)
    bare = hook.Finding("undocumented", "reference/testing.md", "kvcache_core.testing.X.y")
    assert "kvcache_core.testing.X.y" in str(bare) and "docstring" in str(bare)


def test_the_build_runs_the_hook_strictly():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "- docs/hooks/reference_check.py" in config
    assert "strict: true" in config
    assert "mkdocs build --strict" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "make docs" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


ROLE = re.compile(r":(?:py:)?(?:meth|attr|class|func|mod|data|exc|obj|const):`")


def test_no_sphinx_role_in_the_source():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("kvcache_core", "kvcache_plugins")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ROLE.search(line)
    ]
    assert offenders == [], "write [`Name`][kvcache_core.Name] or plain backticks:\n" + "\n".join(
        offenders
    )
