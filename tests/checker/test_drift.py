"""``kvcache drift``: overrides and call sites drifted apart, with no contract."""

from __future__ import annotations

import pytest

from kvcache_core.conformance.model import Outcome
from kvcache_core.conformance.source.drift import analyze

from ._corpus import CORPUS, diff, expectations, reported
from ._generated import generate

TREE = CORPUS / "drift_tree"


def test_drift_tree_reports_exactly_the_expected_findings():
    results = analyze([str(TREE)])
    expected = expectations("drift", TREE)
    got = reported(results)
    assert got == expected, diff(expected, got)


def test_override_finding_names_the_ancestor_and_both_signatures():
    results = analyze([str(TREE)])
    (f,) = [f for r in results for f in r.findings if f.rule == "missing-parameter"]
    assert "TreeNarrowPool overrides drift_corpus.drift_tree.base.TreeBasePool" in f.message
    assert "implementation: get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot" in f.message
    assert f.contract_location is not None
    assert f.contract_location.path.endswith("drift_tree/base.py")


def test_call_site_finding_says_which_implementer_and_what_to_add():
    results = analyze([str(TREE)])
    calls = [f for r in results for f in r.findings if f.rule == "unaccepted-keyword"]
    assert len(calls) == 2
    f = calls[0]
    assert "TreeNarrowPool.get_cpu_copy" in f.message
    assert (
        f.hint == "add `mamba_indices: torch.Tensor | None = None` to TreeNarrowPool.get_cpu_copy"
    )
    assert f.contract_location is not None and f.contract_location.path.endswith("impls.py")


def test_root_limits_the_hierarchy():
    results = analyze([str(TREE)], root="TreeGoodPool")
    assert {r.target for r in results if r.check == "drift:overrides"} == {
        "drift_corpus.drift_tree.impls.TreeGoodPool"
    }
    assert not [f for r in results for f in r.findings]


def test_root_must_exist():
    from kvcache_core.conformance.resolve import UsageError

    with pytest.raises(UsageError, match="no class of that name"):
        analyze([str(TREE)], root="Nope")


def test_methods_option_narrows_what_is_followed():
    results = analyze([str(TREE)], methods=["load_cpu_copy"])
    assert not [f for r in results for f in r.findings]


def test_large_generated_module(tmp_path):
    source, narrowed, keyword_calls = generate(150_000)
    assert len(source) >= 150_000
    path = tmp_path / "big_pools.py"
    path.write_text(source, encoding="utf-8")
    results = analyze([str(path)])
    over = {
        r.target.rsplit(".", 1)[-1]
        for r in results
        if r.check == "drift:overrides" and r.outcome is Outcome.FAILED
    }
    assert over == narrowed
    calls = [f for r in results for f in r.findings if f.rule == "unaccepted-keyword"]
    assert len(calls) == keyword_calls


def test_cli_drift(run_cli, tmp_path):
    run = run_cli("drift", str(TREE))
    assert run.code == 1
    assert len(run.findings("unaccepted-keyword")) == 2
    run = run_cli("drift", str(TREE), "--methods", "load_cpu_copy")
    assert run.code == 0
    run = run_cli("drift", str(tmp_path / "nothing"))
    assert run.code == 2 and "no Python files" in run.err
