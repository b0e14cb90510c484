"""What the types level does when it cannot simply check: bad targets, old contracts, no stubs,
a mypy that fails. None of these may look like a pass."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kvcache_core.conformance.results.model import Outcome
from kvcache_core.conformance.targets.target import ClassTarget
from kvcache_core.conformance.types import _mypy as _mypy_run
from kvcache_core.conformance.types import level as types_level

CORPUS = Path(__file__).resolve().parent.parent / "types_corpus"
OFFLOAD = ("KVPool", "OffloadablePool")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_unknown_protocol_is_an_error_without_findings(mypy_cache: Path) -> None:
    target = ClassTarget(
        "clean", "CleanPool", ("KVPool", "NoSuchPool"), path=str(CORPUS / "drifted_pools.py")
    )
    results = {r.check: r for r in types_level.run([target], cache_dir=mypy_cache)}
    assert results["types:KVPool"].outcome is Outcome.PASSED
    unknown = results["types:NoSuchPool"]
    assert unknown.outcome is Outcome.ERROR and unknown.findings == ()
    assert "NoSuchPool" in unknown.detail


def test_missing_file_and_syntax_error_are_load_errors(tmp_path: Path, mypy_cache: Path) -> None:
    _write(tmp_path, {"broken.py": "class Pool(:\n    pass\n"})
    targets = [
        ClassTarget("gone", "Pool", ("KVPool",), path=str(tmp_path / "gone.py")),
        ClassTarget("broken", "Pool", ("KVPool",), path=str(tmp_path / "broken.py")),
        ClassTarget("nowhere", "Pool", ("KVPool",), module="no_such_module_anywhere"),
    ]
    results = types_level.run(targets, contract_version=2, cache_dir=mypy_cache)
    assert [r.outcome for r in results] == [Outcome.ERROR] * 3
    assert all(r.findings and r.findings[0].rule == "load-error" for r in results)
    assert "cannot parse" in results[1].findings[0].message


def test_blocking_error_in_an_imported_module_fails_the_run(
    tmp_path: Path, mypy_cache: Path
) -> None:
    _write(
        tmp_path,
        {
            "pkg_blocking/__init__.py": "",
            "pkg_blocking/pool.py": "from .helpers import x\n\nclass Pool:\n    size: int\n",
            "pkg_blocking/helpers.py": "x = (\n",
        },
    )
    target = ClassTarget("p", "Pool", ("KVPool",), path=str(tmp_path / "pkg_blocking/pool.py"))
    (result,) = types_level.run([target], cache_dir=mypy_cache)
    assert result.outcome is Outcome.ERROR
    assert result.findings == ()  # not the target's fault as far as we know: exit code 2
    assert "mypy could not check" in result.detail
    assert "helpers.py" in result.detail


def test_same_module_name_in_two_places_runs_twice(tmp_path: Path, mypy_cache: Path) -> None:
    good = "from kvcache_core import KVPool\n\nclass Pool:\n    size: int\n"
    bad = "class Pool:\n    size: str\n"
    _write(tmp_path, {"a/samename.py": good, "b/samename.py": bad})
    targets = [
        ClassTarget("a", "Pool", ("MambaSlotAllocator",), path=str(tmp_path / "a/samename.py")),
        ClassTarget("b", "Pool", ("MambaSlotAllocator",), path=str(tmp_path / "b/samename.py")),
    ]
    a, b = types_level.run(targets, cache_dir=mypy_cache)
    assert "size" not in {f.method for f in a.findings}
    assert "size" in {f.method for f in b.findings}


def test_one_class_behind_two_targets_is_reported_for_both(mypy_cache: Path) -> None:
    path = str(CORPUS / "drifted_pools.py")
    targets = [
        ClassTarget("first", "NoMambaIndicesPool", ("OffloadablePool",), path=path),
        ClassTarget("second", "NoMambaIndicesPool", ("OffloadablePool",), path=path),
    ]
    first, second = types_level.run(targets, cache_dir=mypy_cache)
    assert (first.target, second.target) == ("first", "second")
    assert len(first.findings) == len(second.findings) == 2
    assert {f.target for f in second.findings} == {"second"}


def test_older_contract_version(mypy_cache: Path) -> None:
    path = str(CORPUS / "drifted_pools.py")
    targets = [
        ClassTarget("v1", "NoMambaIndicesPool", OFFLOAD, path=path),
        ClassTarget("v2", "CleanPool", OFFLOAD, path=path),
    ]
    results = types_level.run(targets, contract_version=1, cache_dir=mypy_cache)
    # Contract 1 had no mamba_indices: the v1 pool passes, and a v2 pool (which accepts more)
    # still satisfies it.
    assert [r.outcome for r in results] == [Outcome.PASSED] * 4


def test_no_stubs_is_an_error_for_every_check(
    monkeypatch: pytest.MonkeyPatch, mypy_cache: Path
) -> None:
    monkeypatch.setattr(types_level, "find_stubs_dir", lambda: None)
    target = ClassTarget("c", "CleanPool", OFFLOAD, path=str(CORPUS / "drifted_pools.py"))
    results = types_level.run([target], cache_dir=mypy_cache)
    assert [r.outcome for r in results] == [Outcome.ERROR, Outcome.ERROR]
    assert all(r.findings == () and "stubs" in r.detail for r in results)


def test_mypy_crash_is_an_error(monkeypatch: pytest.MonkeyPatch, mypy_cache: Path) -> None:
    def crashed(*_: object, **__: object) -> _mypy_run.MypyRun:
        return _mypy_run.MypyRun([], 2, ["mypy: error: something broke"], "Traceback ...", 0.1)

    monkeypatch.setattr(types_level, "run_mypy", crashed)
    target = ClassTarget("c", "CleanPool", OFFLOAD, path=str(CORPUS / "drifted_pools.py"))
    results = types_level.run([target], cache_dir=mypy_cache)
    assert all(r.outcome is Outcome.ERROR and "something broke" in r.detail for r in results)


def test_mypy_reads_the_stub_not_the_installed_torch(mypy_cache: Path) -> None:
    stubs = _mypy_run.find_stubs_dir()
    assert stubs is not None
    text = (
        "import torch\n"
        "a: None = torch.zeros(1)\n"  # the stub leaves undeclared names Any: no error
        "b: int = torch.Tensor()\n"  # declared: an error, so torch did resolve (not Any)
    )
    run = _mypy_run.run_mypy(
        text, module_name="_kvcache_stub_probe", search_path=[stubs], cache_dir=mypy_cache
    )
    assert [(m.line, m.code) for m in run.messages] == [(3, "assignment")], run


def test_third_party_package_with_a_base_in_another_module(
    tmp_path: Path, mypy_cache: Path
) -> None:
    site = tmp_path / "lib" / "site-packages"
    _write(
        site,
        {
            "thirdparty_pool/__init__.py": "",
            "thirdparty_pool/base.py": """\
                import numpy as np  # not visible to the types level: Any, never a finding
                import torch

                from kvcache_core import KVSnapshot


                class Base:
                    scratch: np.ndarray

                    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:
                        raise NotImplementedError

                    def load_cpu_copy(
                        self,
                        snapshot: KVSnapshot,
                        indices: torch.Tensor,
                        mamba_indices: torch.Tensor | None = None,
                    ) -> None:
                        raise NotImplementedError
                """,
            "thirdparty_pool/pool.py": """\
                from .base import Base


                class ThirdPartyPool(Base):
                    pass
                """,
        },
    )
    target = ClassTarget(
        "third", "ThirdPartyPool", ("OffloadablePool",), path=str(site / "thirdparty_pool/pool.py")
    )
    (result,) = types_level.run([target], cache_dir=mypy_cache)
    assert result.outcome is Outcome.FAILED
    found = {f.method: f for f in result.findings}
    assert found["get_cpu_copy"].parameter == "mamba_indices"
    where = found["get_cpu_copy"].impl_location
    assert where is not None and Path(where.path).name == "base.py" and where.line == 10
    missing = {"size", "page_size", "dtype", "device", "layer_num", "get_key_buffer"}
    assert missing <= set(found)  # KVPool's members, claimed through OffloadablePool
    assert "load_cpu_copy" not in found
