"""Docs that describe code stay in step with it."""

from __future__ import annotations

from pathlib import Path

from kvcache_core.conformance.rules import RULES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_checker_doc_explains_every_rule():
    text = (DOCS / "checker.md").read_text(encoding="utf-8")
    assert [rule for rule in RULES if f"`{rule}`" not in text] == []


def test_every_builtin_pool_has_a_page():
    from kvcache_core import discover

    pages = {p.stem for p in (DOCS / "pools").glob("*.md")}
    assert set(discover().names()) <= pages
