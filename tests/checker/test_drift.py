"""``kvcache drift``: overrides and call sites drifted apart, with no contract."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_one_finding_per_drift_with_the_calls_that_break_as_related_locations():
    results = analyze([str(TREE)])
    (f,) = [f for r in results for f in r.findings if f.rule == "missing-parameter"]
    assert f.severity.value == "error"
    lines = sorted((Path(r.location.path).name, r.location.line) for r in f.related)
    assert lines == [("callers.py", 11), ("callers.py", 22)]
    first = min(f.related, key=lambda r: r.location.line)
    assert "`retract` calls `pool.get_cpu_copy(slots, mamba_indices=state)`" in first.message
    assert "(`pool: TreeBasePool`)" in first.message
    assert "TypeError: get_cpu_copy() got an unexpected keyword argument 'mamba_indices'" in (
        first.message
    )
    assert "retract (callers.py:11) calls" in f.message  # the message names the caller too
    assert f.hint == "add `mamba_indices: torch.Tensor | None = None`"


def test_root_limits_the_hierarchy():
    results = analyze([str(TREE)], root="TreeGoodPool")
    assert {r.target for r in results if r.check == "drift:overrides"} == {
        "drift_corpus.drift_tree.impls.TreeGoodPool"
    }
    # TreeNarrowPool is out of scope; the one call no implementation takes still is wrong on a
    # TreeGoodPool (a subclass of the declared TreeBasePool, hence a warning)
    found = [f for r in results for f in r.findings]
    assert [(f.rule, f.parameter, str(f.severity)) for f in found] == [
        ("unaccepted-keyword", "stream", "warning")
    ]


def test_root_must_exist():
    from kvcache_core.conformance.targets.resolve import UsageError

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
    found = [f for r in results for f in r.findings]
    assert {f.target.rsplit(".", 1)[-1] for f in found} == narrowed
    # each narrowed pool: one finding, every `pool: BasePool` call passing the keyword attached
    assert all(f.rule == "missing-parameter" and f.is_error for f in found)
    assert {len(f.related) for f in found} == {keyword_calls}


def test_cli_drift(run_cli, tmp_path):
    run = run_cli("drift", str(TREE))
    assert run.code == 1
    assert len(run.findings("missing-parameter")) == 1
    (call,) = run.findings("unaccepted-keyword")
    assert call.target.endswith("callers.flush")  # type: ignore[attr-defined]
    run = run_cli("drift", str(TREE), "--methods", "load_cpu_copy")
    assert run.code == 0
    run = run_cli("drift", str(tmp_path / "nothing"))
    assert run.code == 2 and "no Python files" in run.err


ENGINE = CORPUS / "engine_tree" / "python" / "sglang"
SRT = ENGINE / "srt"


def _by_class(results):
    out: dict[str, list[object]] = {}
    for r in results:
        if r.check == "drift:overrides":
            out.setdefault(r.target.rsplit(".", 1)[-1], []).extend(r.findings)
    return out


def test_engine_tree_resolves_absolute_imports_by_module_path_suffix(monkeypatch):
    # run the way an engine author would: from inside the package, on two of its folders
    monkeypatch.chdir(ENGINE)
    results = analyze(["srt/mem_cache", "srt/hardware_backend"])
    expected = expectations("drift", ENGINE)
    got = reported(results)
    assert got == expected, diff(expected, got)
    (f,) = _by_class(results)["NPUMHATokenToKVPool"]
    assert (f.rule, f.method, f.parameter) == ("missing-parameter", "get_cpu_copy", "mamba_indices")
    assert f.impl_location.path.endswith("srt/hardware_backend/npu/memory_pool_npu.py")
    assert f.contract_location.path.endswith("srt/mem_cache/memory_pool.py")
    assert "overrides mem_cache.memory_pool.MHATokenToKVPool" in f.message
    assert _by_class(results)["NPUGoodPool"] == []


def test_a_base_outside_the_paths_given_is_reported_never_a_silent_pass():
    results = analyze([str(SRT / "hardware_backend")])
    by_class = _by_class(results)
    (f,) = by_class["NPUMHATokenToKVPool"]
    assert (f.rule, f.method, f.parameter) == ("unresolved-base", None, None)
    assert "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool" in f.message
    assert f.impl_location is not None
    assert f.impl_location.path.endswith("memory_pool_npu.py")
    assert f.impl_location.line == 15
    # even a good override cannot be judged without its base
    assert [g.rule for g in by_class["NPUGoodPool"]] == ["unresolved-base"]


def test_an_ambiguous_module_path_suffix_resolves_nothing(tmp_path):
    for folder in ("a/srt/mem_cache", "b/srt/mem_cache"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "memory_pool.py").write_text(
            "class Base:\n    def get_cpu_copy(self, indices, mamba_indices=None): ...\n"
        )
    (tmp_path / "npu.py").write_text(
        "from eng.srt.mem_cache.memory_pool import Base\n\n\n"
        "class Narrow(Base):\n    def get_cpu_copy(self, indices): ...\n"
    )
    results = analyze([str(tmp_path)])
    (f,) = _by_class(results)["Narrow"]
    assert (f.rule, f.impl_location.line) == ("unresolved-base", 4)


def test_every_keyword_of_a_call_is_checked_and_positional_only_takes_none(tmp_path):
    (tmp_path / "pools.py").write_text(
        "class Base:\n"
        "    def load_cpu_copy(self, snapshot, indices, mamba_indices=None):\n"
        "        return indices\n"
        "\n"
        "\n"
        "class PosOnly(Base):\n"
        "    def load_cpu_copy(self, snapshot, indices, /, mamba_indices=None):\n"
        "        return indices\n"
        "\n"
        "\n"
        "def restore(pool: Base, snap, slots, state):\n"
        "    pool.load_cpu_copy(snap, indices=slots, mamba_indices=state, stream=None)\n"
        "    pool.load_cpu_copy(snapshot=snap, indices=slots)\n"
        "    pool.load_cpu_copy(snap, slots, mamba_indices=state)\n"
    )
    results = analyze([str(tmp_path / "pools.py")])
    found = {
        (f.rule, f.parameter, f.impl_location.line): sorted(r.location.line for r in f.related)
        for r in results
        for f in r.findings
    }
    assert found == {
        # positional-only: `indices=` (lines 12 and 13) and `snapshot=` (13) are TypeErrors on
        # a PosOnly; one finding per parameter, the calls that break attached
        ("parameter-kind-changed", "indices", 7): [12, 13],
        ("parameter-kind-changed", "snapshot", 7): [13],
        # the third keyword of line 12: no implementation takes it, so the call is wrong
        ("unaccepted-keyword", "stream", 12): [],
    }
    assert all(f.is_error for r in results for f in r.findings)
    (kind,) = [f for r in results for f in r.findings if f.parameter == "snapshot"]
    assert "'snapshot'" in kind.related[0].message


def test_files_of_one_name_in_two_namespace_folders_stay_two_modules(monkeypatch):
    monkeypatch.chdir(ENGINE)
    results = analyze(["srt/mem_cache", "srt/hardware_backend"])
    targets = {r.target for r in results if r.check == "drift:overrides"}
    assert "mem_cache.memory_pool.MHATokenToKVPool" in targets
    assert "hardware_backend.npu.memory_pool.NPUPagedPoolBase" in targets
    by_class = _by_class(results)
    (swa,) = by_class["SWAKVPool"]  # `from .memory_pool import ...` in mem_cache/
    assert (swa.rule, swa.parameter) == ("missing-parameter", "mamba_indices")
    assert swa.contract_location.path.endswith("srt/mem_cache/memory_pool.py")
    (sub,) = by_class["NPUPagedSubPool"]  # `from .memory_pool import ...` in npu/
    assert (sub.rule, sub.method, sub.parameter) == (
        "missing-parameter",
        "load_cpu_copy",
        "mamba_indices",
    )
    assert sub.contract_location.path.endswith("srt/hardware_backend/npu/memory_pool.py")
