"""MkDocs hook: the built API reference shows no raw Sphinx role, no private member and no
public member without prose; the build fails naming each offender.

Why on the built site and not on the source: what readers get is what mkdocstrings renders,
after its filters, re-exports, inherited members and merged ``__init__`` docstrings; a source
check can agree with itself and still miss a member the page shows bare. Why a hook: ``make
docs`` (and any ``mkdocs build``) runs it, so a new public name without a docstring fails CI
with its full dotted name, whoever added it.

Pure standard library (``html.parser``): the checker is imported by the tests without MkDocs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

__all__ = ["Finding", "check_page", "on_page_content", "on_post_build", "on_pre_build"]

#: A Sphinx role as it survives Markdown rendering (``:meth:`x``` becomes ``:meth:<code>x``).
ROLE = re.compile(
    r"(?<![\w:]):(?:py:)?(?:meth|attr|class|func|mod|data|exc|obj|const|ref|term)(?=:)"
)

_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


@dataclass(frozen=True)
class Finding:
    """One problem on one page: ``kind`` is ``role``, ``private`` or ``undocumented``."""

    kind: str
    page: str
    name: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.name} ({self.page})" if self.name else self.page
        if self.kind == "role":
            return (
                f"{where}: raw Sphinx role {self.detail!r} in the rendered text; write a "
                "Markdown cross-reference ([`Name`][kvcache_core.Name]) or plain backticks"
            )
        if self.kind == "private":
            return f"{where}: a private member is documented; keep it out of the reference"
        return (
            f"{where}: a public member without prose; give it a docstring that says what it "
            "is for (or make it private)"
        )


@dataclass
class _Object:
    name: str = ""
    prose: list[str] = field(default_factory=list)


class _Reader(HTMLParser):
    """Collects each rendered object's own prose (not its children's, not its signature)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str]] = []  # (tag, role): role in object/contents/children/skip
        self.objects: list[_Object] = []
        self.open: list[_Object] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = set((dict(attrs).get("class") or "").split())
        role = ""
        if tag == "div" and "doc-object" in classes:
            role = "object"
            obj = _Object()
            self.objects.append(obj)
            self.open.append(obj)
        elif tag == "div" and "doc-contents" in classes:
            role = "contents"
        elif tag == "div" and "doc-children" in classes:
            role = "children"
        elif "doc-signature" in classes or "headerlink" in classes:
            role = "skip"
        if tag in _HEADINGS and self.open and not self.open[-1].name:
            ident = dict(attrs).get("id")
            if ident and self._innermost() == "object":
                self.open[-1].name = ident
        if tag not in ("br", "img", "hr", "input", "meta", "link", "col", "wbr"):
            self.stack.append((tag, role))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            open_tag, role = self.stack.pop()
            if role == "object":
                self.open.pop()
            if open_tag == tag:
                break

    def _innermost(self) -> str:
        for _, role in reversed(self.stack):
            if role:
                return role
        return ""

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if not data.strip() or not self.open:
            return
        if self._innermost() == "contents":
            self.open[-1].prose.append(data)


def _is_private(name: str) -> bool:
    return any(p.startswith("_") and not p.endswith("__") for p in name.split("."))


def check_page(html: str, page: str) -> list[Finding]:
    """Every finding on one rendered page (its HTML body)."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    findings: list[Finding] = []
    text = "".join(reader.text)
    for match in sorted(set(ROLE.findall(text))):
        owners = [o.name for o in reader.objects if any(match in p for p in o.prose)]
        findings.append(Finding("role", page, ", ".join(owners), f"{match}:"))
    for obj in reader.objects:
        if not obj.name:
            continue
        if _is_private(obj.name):
            findings.append(Finding("private", page, obj.name))
        elif not "".join(obj.prose).strip():
            findings.append(Finding("undocumented", page, obj.name))
    return findings


# -- MkDocs hook events ------------------------------------------------------------------------

_FOUND: list[Finding] = []


def on_pre_build(config: Any) -> None:
    _FOUND.clear()


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    _FOUND.extend(check_page(html, page.file.src_uri))
    return html


def on_post_build(config: Any) -> None:
    if not _FOUND:
        return
    from mkdocs.exceptions import PluginError

    lines = [str(f) for f in _FOUND]
    raise PluginError(
        f"the API reference has {len(lines)} problem(s) (docs/hooks/reference_check.py):\n  "
        + "\n  ".join(lines)
    )
