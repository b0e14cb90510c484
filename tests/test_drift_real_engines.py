"""``kvcache drift`` measured on real code: sglang and kvcached as released, from the index.

The sources are downloaded once per machine into a cache outside the repository
(``interop/wheels.py``); without the index the tests skip, saying why. What is held:

* sglang 0.5.23 with the default methods: every finding is in the truth set
  (``tests/data/drift_truth/sglang-0.5.23.json``: each read against the code, a verdict and a
  reason), an error finding outside it fails, and precision at error level is >= 90%;
* the historical drifts (``sglang-history.json``: 0.5.12-0.5.14, fixed in later releases) are
  still found, as errors, and nothing else is an error on those releases;
* two real bugs re-injected into 0.5.23 are caught: an NPU pool whose ``get_cpu_copy`` lost
  ``mamba_indices``, and an override that takes it but calls ``super().get_cpu_copy(indices)``;
* kvcached 0.1.5 on sglang 0.5.15 (kvcached PR #411: the allocator kernels moved to
  ``triton_ops``): the two names it takes with ``getattr`` are reported, where they went
  named; kvcached 0.1.6 on the releases it supports reports no error.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from kvcache_core.conformance.results.model import CheckResult, Finding
from kvcache_core.conformance.source.drift import analyze

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT / "tests" / "data" / "drift_truth"
FOLDERS = ("srt/mem_cache", "srt/hardware_backend")


def _wheels():
    name = "kvcache_interop_wheels"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "interop" / "wheels.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _fetch(kind: str, version: str) -> Path:
    wheels = _wheels()
    try:
        return getattr(wheels, kind)(version)
    except wheels.Unavailable as exc:
        pytest.skip(f"{kind} {version} cannot be downloaded here: {exc}")


def _findings(results: list[CheckResult]) -> list[Finding]:
    return [f for r in results for f in r.findings]


def _key(f: Finding) -> str:
    return f"{f.rule}|{f.target}|{f.method}|{f.parameter}"


def _engine_run(package: Path, monkeypatch: pytest.MonkeyPatch) -> list[Finding]:
    monkeypatch.chdir(package)
    return _findings(analyze(list(FOLDERS)))


def test_sglang_0_5_23_every_finding_is_classified_and_errors_are_precise(monkeypatch):
    package = _fetch("sglang", "0.5.23")
    truth = json.loads((TRUTH / "sglang-0.5.23.json").read_text(encoding="utf-8"))
    verdicts = {e["key"]: e for e in truth["findings"]}
    assert all(e["verdict"] in ("true", "false") and e["reason"] for e in verdicts.values())
    found = _engine_run(package, monkeypatch)
    errors = [f for f in found if f.is_error]
    unclassified = [_key(f) for f in errors if _key(f) not in verdicts]
    assert not unclassified, f"error findings the truth set does not classify: {unclassified}"
    true = [f for f in errors if verdicts[_key(f)]["verdict"] == "true"]
    precision = len(true) / len(errors) if errors else 1.0
    assert precision >= 0.9, (precision, [_key(f) for f in errors])
    # the truth set is the run: a finding that disappeared is removed from it, so it stays read
    assert {_key(f) for f in found} == set(verdicts)


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.14"])
def test_the_historical_sglang_drifts_are_still_found(version, monkeypatch):
    package = _fetch("sglang", version)
    history = json.loads((TRUTH / "sglang-history.json").read_text(encoding="utf-8"))
    expected = {
        (d["rule"], d["class"], d["method"], d["parameter"])
        for d in history["drifts"]
        if d["version"] == version
    }
    assert expected
    errors = {
        (f.rule, f.target.rsplit(".", 1)[-1], f.method, f.parameter)
        for f in _engine_run(package, monkeypatch)
        if f.is_error
    }
    assert errors == expected  # every historical drift, and no other error


def _copy_engine(package: Path, where: Path) -> Path:
    for folder in FOLDERS:
        shutil.copytree(package / folder, where / folder)
    return where


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{path.name} changed: the injection no longer applies"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_reinjected_historical_bugs_are_caught_on_0_5_23(tmp_path, monkeypatch):
    tree = _copy_engine(_fetch("sglang", "0.5.23"), tmp_path)
    npu = tree / "srt/hardware_backend/npu/memory_pool_npu.py"
    _replace(
        npu,
        "    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):\n"
        "        torch.npu.synchronize()",
        "    def get_cpu_copy(self, indices):\n        torch.npu.synchronize()",
    )
    pools = tree / "srt/mem_cache/memory_pool.py"
    pools.write_text(
        pools.read_text(encoding="utf-8") + "\n\nclass DroppingHybridPool(HybridLinearKVPool):\n"
        "    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):\n"
        "        return super().get_cpu_copy(indices)\n",
        encoding="utf-8",
    )
    errors = {
        (f.rule, f.target.rsplit(".", 1)[-1], f.method, f.parameter): f
        for f in _engine_run(tree, monkeypatch)
        if f.is_error
    }
    assert set(errors) == {
        ("missing-parameter", "NPUMHATokenToKVPool", "get_cpu_copy", "mamba_indices"),
        ("missing-parameter", "NPUMHATokenToKVPool", "get_cpu_copy", "req_pool_index"),
        ("parameter-not-forwarded", "DroppingHybridPool", "get_cpu_copy", "mamba_indices"),
        ("parameter-not-forwarded", "DroppingHybridPool", "get_cpu_copy", "req_pool_index"),
    }
    narrowed = errors[("missing-parameter", "NPUMHATokenToKVPool", "get_cpu_copy", "mamba_indices")]
    callers = {Path(r.location.path).name for r in narrowed.related}
    assert {"token.py", "paged.py"} <= callers  # the allocators that break, as related locations
    dropped = errors[
        ("parameter-not-forwarded", "DroppingHybridPool", "get_cpu_copy", "mamba_indices")
    ]
    assert dropped.hint == "write `super().get_cpu_copy(indices, mamba_indices=mamba_indices)`"
    compile(dropped.hint.removeprefix("write `").removesuffix("`"), "hint", "eval")


def _plugin_run(kvcached: str, sglang: str) -> list[Finding]:
    plugin = _fetch("kvcached", kvcached) / "integration" / "sglang"
    engine = _fetch("sglang", sglang) / "srt" / "mem_cache"
    return _findings(analyze([str(plugin), str(engine)]))


def test_kvcached_0_1_5_on_sglang_0_5_15_loses_the_allocator_kernels():
    errors = [f for f in _plugin_run("0.1.5", "0.5.15") if f.is_error]
    assert sorted((f.rule, f.parameter) for f in errors) == [
        ("missing-engine-name", "alloc_decode_kernel"),
        ("missing-engine-name", "alloc_extend_kernel"),
    ]
    for f in errors:
        assert f.impl_location is not None and f.impl_location.path.endswith("patches.py")
        assert "`sglang.srt.mem_cache.allocator` no longer defines" in f.message
        assert f.hint == f"take `{f.parameter}` from `mem_cache.triton_ops.allocator`"


@pytest.mark.parametrize("sglang", ["0.5.15", "0.5.23"])
def test_kvcached_0_1_6_reports_no_error_on_the_releases_it_supports(sglang):
    assert not [f for f in _plugin_run("0.1.6", sglang) if f.is_error]


def test_root_follows_every_method_of_the_plugin_classes_without_guessing_a_method_set():
    """``--root 'Elastic*'``: every method of kvcached's classes (defined in patch methods,
    installed over sglang's by ``alloc_mod.PagedTokenToKVPoolAllocator = ...``), constructors
    included. On 0.5.15 the paged allocator's ``alloc_extend`` lacks the ``num_new_pages=`` that
    sglang's allocators pass (the other half of PR #411), the calls that break attached; the
    fixed 0.1.6 reports no error."""
    plugin = _fetch("kvcached", "0.1.5") / "integration" / "sglang"
    engine = _fetch("sglang", "0.5.15") / "srt" / "mem_cache"
    found = _findings(analyze([str(plugin), str(engine)], root="Elastic*"))
    errors = {(f.rule, f.target.rsplit(".", 1)[-1], f.parameter) for f in found if f.is_error}
    assert errors == {
        ("missing-parameter", "ElasticPagedTokenToKVPoolAllocator", "num_new_pages"),
        ("missing-engine-name", "patches", "alloc_extend_kernel"),
        ("missing-engine-name", "patches", "alloc_decode_kernel"),
    }
    (paged,) = [f for f in found if f.parameter == "num_new_pages"]
    assert "replaces" in paged.message  # held to the class it is installed over
    assert {Path(r.location.path).name for r in paged.related} >= {"swa.py", "hisparse.py"}
    fixed = _fetch("kvcached", "0.1.6") / "integration" / "sglang"
    assert not [
        f for f in _findings(analyze([str(fixed), str(engine)], root="Elastic*")) if f.is_error
    ]


def test_kvcached_constructor_drift_of_pr_444_is_caught_against_the_engine_class(tmp_path, capsys):
    """kvcached PR #444: sglang 0.5.14/0.5.15 added keywords to ``MambaPool.__init__`` that
    kvcached's ``ElasticMambaPool`` (a class inside a patch method) lacked. No release had the
    bug, so the fix is taken back out of 0.1.6 here; the released 0.1.6 passes."""
    from kvcache_core import cli

    released = _fetch("kvcached", "0.1.6") / "integration" / "sglang"
    engine = _fetch("sglang", "0.5.15") / "srt" / "mem_cache" / "memory_pool.py"
    plugin = tmp_path / "sglang"
    shutil.copytree(released, plugin)
    patches = plugin / "patches.py"
    text = patches.read_text(encoding="utf-8")
    start = text.index("class ElasticMambaPool")
    added = (
        "speculative_eagle_topk: Optional[int] = None,",
        "enable_linear_replayssm: bool = False,",
        "linear_replayssm_cache_len: int = 16,",
        "envelope_layout: bool = False,",
    )
    for line in added:
        at = text.index(f"                    {line}\n", start)
        text = text[:at] + text[at + len(line) + 21 :]
    patches.write_text(text, encoding="utf-8")

    def errors(target: Path) -> set[tuple[str, str, str]]:
        argv = ["check", str(target), "--level", "source", "--format", "json"]
        cli.main([*argv, "--against", f"{engine}:MambaPool"])
        doc = json.loads(capsys.readouterr().out)
        return {
            (r["target"].rsplit(".", 1)[-1], f["method"], f["parameter"])
            for r in doc["results"]
            for f in r["findings"]
            if f["severity"] == "error"
        }

    assert errors(plugin) == {
        ("ElasticMambaPool", "__init__", "speculative_eagle_topk"),
        ("ElasticMambaPool", "__init__", "enable_linear_replayssm"),
        ("ElasticMambaPool", "__init__", "linear_replayssm_cache_len"),
        ("ElasticMambaPool", "__init__", "envelope_layout"),
    }
    assert errors(released) == set()
