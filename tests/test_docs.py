"""Docs that describe code stay in step with it."""

from __future__ import annotations

from pathlib import Path

from kvcache_core.conformance.results.rules import RULES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_checker_doc_explains_every_rule():
    text = (DOCS / "checker.md").read_text(encoding="utf-8")
    assert [rule for rule in RULES if f"`{rule}`" not in text] == []


def test_every_builtin_pool_has_a_page():
    from kvcache_core import discover

    pages = {p.stem for p in (DOCS / "pools").glob("*.md")}
    assert set(discover().names()) <= pages


def test_contract_page_lists_every_protocol_method_exactly():
    from kvcache_core import contracts
    from kvcache_core.conformance.members.introspect import protocol_methods

    text = (DOCS / "contract.md").read_text(encoding="utf-8")
    protocols = [
        contracts.KVPool,
        contracts.OffloadablePool,
        contracts.MLAPool,
        contracts.IndexerKeyPool,
        contracts.SlidingWindowPool,
        contracts.MambaStatePool,
        contracts.HiSparsePool,
        contracts.TokenAllocator,
        contracts.PagedAllocator,
        contracts.SWAAllocator,
        contracts.MambaSlotAllocator,
    ]
    missing = [
        f"{proto.__name__}.{name}: {sig.render()}"
        for proto in protocols
        for name, sig in protocol_methods(proto).items()
        if sig.render() not in text
    ]
    assert missing == []


def test_every_coming_from_sglang_row_names_a_test_that_exists():
    """Each row of docs/engines.md's "Coming from sglang" table pins kvcache's side with a
    test; a renamed or deleted test must not leave the table pointing at nothing."""
    import ast
    import re

    text = (DOCS / "engines.md").read_text(encoding="utf-8")
    section = text[text.index("## Coming from sglang") :]
    section = section[: section.find("\n### ")]
    rows = [line for line in section.splitlines() if re.match(r"\| `[^`]+`", line)]
    assert len(rows) >= 30
    root = DOCS.parent
    missing = []
    for row in rows:
        (named,) = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row)
        path, name = named
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        if name not in names or not name.startswith("test_"):
            missing.append(f"{path}::{name}")
    assert missing == []
