"""Every drift of the corpus is reported, by every level that can see it, at the right line,
with the right rule; every class not named in an expectation (the fixed twins) passes."""

from __future__ import annotations

import pytest

from kvcache_core.conformance import signature as signature_level
from kvcache_core.conformance import source as source_level
from kvcache_core.conformance.results.model import Outcome

from ._corpus import CORPUS, diff, expectations, reported

FIXED_TWINS = [
    "SWALikePoolFixed",
    "SWALikeAllocatorFixed",
    "KwargsCompositePoolFixed",
    "DeliberateDropPool",
    "DroppingAllocatorFixed",
    "DSALikePoolFixed",
    "DSAInheritsAll",
    "MLALikePoolFixed",
    "ValidatingPoolFixed",
    "WideningPool",
    "ValidateThenDropAllocatorFixed",
    "RenamedPoolFixed",
    "SignatureDriftsFixed",
    "ImplementsAbstract",
    "ExplicitProtocolPool",
    "ReferencePool",
    "ReferenceAllocator",
    "SideEffectPool",
    "TreeGoodPool",
    "TreeBasePool",
]


@pytest.fixture(scope="module")
def source_results(corpus_targets):
    targets, index = corpus_targets
    return source_level.run(targets, index=index)


@pytest.fixture(scope="module")
def signature_results(corpus_targets):
    targets, _ = corpus_targets
    importable = [t for t in targets if "source_only" not in (t.path or "")]
    return signature_level.run(importable)


def test_source_level_reports_exactly_the_expected_findings(source_results):
    expected = expectations("source")
    got = reported(source_results)
    assert got == expected, diff(expected, got)


def test_signature_level_reports_exactly_the_expected_findings(signature_results):
    expected = expectations("signature")
    got = reported(signature_results)
    assert got == expected, diff(expected, got)


@pytest.mark.parametrize("level", ["source", "signature"])
def test_fixed_twins_pass(level, source_results, signature_results):
    results = source_results if level == "source" else signature_results
    by_class: dict[str, list[object]] = {}
    for r in results:
        assert r.outcome is not Outcome.ERROR, r
        by_class.setdefault(r.target.rsplit(".", 1)[-1], []).extend(r.findings)
    for name in FIXED_TWINS:
        assert name in by_class, f"{name} was not checked at the {level} level"
        assert by_class[name] == [], f"{name}: {by_class[name]}"


def test_every_rule_with_a_drifted_example_is_in_the_corpus():
    rules = {e.rule for level in ("source", "drift") for e in expectations(level)}
    assert rules >= {
        "missing-method",
        "missing-parameter",
        "extra-required-parameter",
        "renamed-parameter",
        "parameter-kind-changed",
        "parameter-order-changed",
        "became-required",
        "default-changed",
        "kwargs-hides-parameter",
        "parameter-not-forwarded",
        "annotation-mismatch",
        "return-mismatch",
        "not-implemented",
        "writeloc-not-unwrapped",
        "missing-attribute",
        "unresolved-base",
        "unaccepted-keyword",
    }


def _one(results, cls: str, rule: str):
    found = [
        f for r in results for f in r.findings if f.rule == rule and f.target.endswith("." + cls)
    ]
    assert found, f"no {rule} for {cls}"
    return found[0]


@pytest.mark.parametrize("level", ["source", "signature"])
def test_messages_name_both_signatures_and_the_older_contract(
    level, source_results, signature_results
):
    results = source_results if level == "source" else signature_results
    f = _one(results, "SWALikeAllocator", "missing-parameter")
    assert f.method == "get_cpu_copy" and f.parameter == "mamba_indices"
    assert "matches contract 1; contract 2 added `mamba_indices" in f.message
    assert "contract: get_cpu_copy(self, indices: torch.Tensor, mamba_indices:" in f.message
    assert "implementation: get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot" in f.message
    assert f.hint == "add `mamba_indices: torch.Tensor | None = None`"
    assert f.contract_location is not None
    assert f.contract_location.path.endswith("kvcache_core/contracts/allocator.py")


@pytest.mark.parametrize("level", ["source", "signature"])
def test_hints_say_exactly_what_to_write(level, source_results, signature_results):
    results = source_results if level == "source" else signature_results
    drop = _one(results, "DroppingAllocator", "parameter-not-forwarded")
    assert drop.hint == ("write `self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)`")
    kwargs = _one(results, "KwargsCompositePool", "parameter-not-forwarded")
    assert kwargs.parameter == "kwargs"
    assert kwargs.hint == "write `self.attn.get_cpu_copy(indices, **kwargs)`"
    rename = _one(results, "RenamedPool", "renamed-parameter")
    assert rename.hint == "rename `idx` to `indices: torch.Tensor`"
    loc = _one(results, "MLALikePool", "writeloc-not-unwrapped")
    assert "unwrap_write_loc(loc)" in loc.hint
    inherited = _one(results, "InheritsRaising", "not-implemented")
    assert "inherited from RaisingPool" in inherited.message


def test_inherited_findings_point_at_the_defining_file(source_results, signature_results):
    for results in (source_results, signature_results):
        f = _one(results, "DSAGrandchild", "missing-parameter")
        assert f.impl_location is not None
        assert f.impl_location.path == str(CORPUS / "dsa_sub.py")


# What mypy can see: an incompatible signature. It cannot see defaults, bodies (not-forwarded,
# not-implemented, a KVWriteLoc used raw), or a **kwargs that swallows a contract parameter.
TYPES_VISIBLE = {
    "missing-method",
    "missing-parameter",
    "renamed-parameter",
    "parameter-kind-changed",
    "parameter-order-changed",
    "became-required",
    "extra-required-parameter",
}


def test_types_level_reports_every_drift_mypy_can_see(corpus_targets, tmp_path):
    from kvcache_core.conformance.types import level as types_level

    targets, _ = corpus_targets
    checked = [t for t in targets if "source_only" not in (t.path or "")]
    results = types_level.run(checked, contract_version=2, cache_dir=tmp_path)
    got = {(e.path, e.line, e.owner, e.method) for e in reported(results) if e.rule == "type-error"}
    # Two blind spots of mypy itself, covered by the other levels: a class that subclasses the
    # Protocol explicitly inherits its stubs as implementations, and a method behind a
    # decorator the torch stub leaves untyped (``torch.no_grad``) is ``Any``.
    blind = {"OnlyStub", "DecoratedPool"}
    expected = {
        (e.path, e.line, e.owner, e.method)
        for e in expectations("signature")
        if e.rule in TYPES_VISIBLE and e.owner not in blind
    }
    assert expected, "the corpus has no drift the types level can see"
    assert expected <= got, diff(
        {
            e
            for e in expectations("signature")
            if (e.path, e.line, e.owner, e.method) in expected - got
        },
        set(),
    )
    # and the fixed twins pass this level too
    flagged = {r.target.rsplit(".", 1)[-1] for r in results if r.findings}
    assert not flagged & set(FIXED_TWINS), flagged & set(FIXED_TWINS)


@pytest.mark.parametrize("level", ["source", "signature"])
def test_a_kwargs_signature_is_not_called_contract_1(level, source_results, signature_results):
    results = source_results if level == "source" else signature_results
    for method in ("get_cpu_copy", "load_cpu_copy"):
        (f,) = [
            f
            for r in results
            for f in r.findings
            if r.target.endswith(".KwargsCompositePool")
            and f.rule == "kwargs-hides-parameter"
            and f.method == method
        ]
        assert f.parameter == "mamba_indices"
        assert f.impl_location is not None
        assert f.impl_location.path.endswith("kwargs_composite.py")
        assert "matches contract" not in f.message


@pytest.mark.parametrize("level", ["source", "signature"])
def test_only_a_narrower_parameter_or_a_wider_return_is_an_annotation_finding(
    level, source_results, signature_results
):
    results = source_results if level == "source" else signature_results
    widening = [f for r in results if r.target.endswith(".WideningPool") for f in r.findings]
    assert widening == []
    narrow = _one(results, "NarrowingPool", "annotation-mismatch")
    assert (narrow.method, narrow.parameter) == ("get_cpu_copy", "mamba_indices")
    assert narrow.impl_location is not None
    assert narrow.impl_location.path.endswith("annotation_widths.py")
    wide = _one(results, "NarrowingPool", "return-mismatch")
    assert (wide.method, wide.parameter) == ("get_kv_size_bytes", None)


@pytest.mark.parametrize("level", ["source", "signature"])
def test_body_findings_name_rule_method_parameter_and_line(
    level, source_results, signature_results
):
    results = source_results if level == "source" else signature_results

    def where(cls: str, rule: str) -> tuple[str | None, str | None, str, int | None]:
        f = _one(results, cls, rule)
        assert f.impl_location is not None
        return (
            f.method,
            f.parameter,
            f.impl_location.path.rsplit("/", 1)[-1],
            f.impl_location.line,
        )

    assert where("AliasingPool", "writeloc-not-unwrapped") == (
        "set_kv_buffer",
        "loc",
        "body_aliases.py",
        27,
    )
    assert where("ValidatingPool", "writeloc-not-unwrapped") == (
        "set_kv_buffer",
        "loc",
        "body_aliases.py",
        41,
    )
    assert where("DeadCodePool", "not-implemented") == (
        "get_cpu_copy",
        None,
        "body_aliases.py",
        63,
    )
    assert where("ValidateThenDropAllocator", "parameter-not-forwarded") == (
        "get_cpu_copy",
        "mamba_indices",
        "body_aliases.py",
        74,
    )
    for fixed in ("ValidatingPoolFixed", "ValidateThenDropAllocatorFixed"):
        assert [f for r in results if r.target.endswith("." + fixed) for f in r.findings] == []
