"""The source level: never imports, resolves bases across files and packages."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcache_core.conformance import source as source_level
from kvcache_core.conformance.members.sources import ClassSource, ExternalBase, SourceIndex
from kvcache_core.conformance.results.model import Outcome
from kvcache_core.conformance.targets.resolve import resolve_targets
from kvcache_core.conformance.targets.target import ClassTarget

from ._corpus import CORPUS

GOOD_OFFLOAD = """
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None):
        return self.pool.get_cpu_copy(indices, mamba_indices=mamba_indices)
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def check(paths: list[str], against: tuple[str, ...] | None = None):
    index = SourceIndex()
    targets, errors = resolve_targets(paths, against=against, index=index)
    return errors + source_level.run(targets, index=index)


def findings(results, cls: str | None = None):
    return [
        (f.rule, f.target.rsplit(".", 1)[-1], f.method, f.parameter)
        for r in results
        for f in r.findings
        if cls is None or f.target.endswith("." + cls)
    ]


def test_source_level_never_imports_the_target(tmp_path, monkeypatch):
    marker = tmp_path / "imported.txt"
    monkeypatch.setenv("KVCACHE_SIDE_EFFECT_FILE", str(marker))
    before = set(sys.modules)
    results = check([str(CORPUS / "import_side_effect.py"), str(CORPUS / "source_only")])
    assert not marker.exists()
    assert not {m for m in set(sys.modules) - before if m.startswith("drift_corpus")}
    assert any(r.target.endswith("SideEffectPool") for r in results)


def test_the_side_effect_fixture_really_has_one(tmp_path):
    """Proof that the test above could fail: importing the module does write the file."""
    marker = tmp_path / "imported.txt"
    code = "import drift_corpus.import_side_effect"
    env = {"KVCACHE_SIDE_EFFECT_FILE": str(marker), "PYTHONPATH": str(CORPUS.parent)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert marker.read_text() == "imported\n"


def test_gpu_only_module_is_checked_without_its_imports(tmp_path):
    results = check([str(CORPUS / "source_only" / "gpu_pool.py")])
    assert ("missing-parameter", "GPUPool", "get_cpu_copy", "mamba_indices") in findings(results)
    unresolved = [f for r in results for f in r.findings if f.rule == "unresolved-base"]
    assert unresolved and "vendor_gpu.pools.VendorBase" in unresolved[0].message


def test_relative_absolute_aliased_and_star_imports_resolve(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "from .base import *\n",
            "pkg/core/base.py": """
                import torch
                class Base:
                    def get_cpu_copy(self, indices: torch.Tensor) -> object:
                        return indices
            """,
            "pkg/impl.py": """
                import pkg.core as core_mod
                from . import core
                from .core import Base as Renamed
                from pkg.core.base import Base
                Alias = Base
                class ViaStar(core.Base): pass
                class ViaAlias(Renamed): pass
                class ViaAssign(Alias): pass
                class ViaDotted(core_mod.Base): pass
                class Direct(Base): pass
            """,
        },
    )
    results = check([str(tmp_path / "pkg" / "impl.py")], against=("OffloadablePool",))
    for cls in ("ViaStar", "ViaAlias", "ViaAssign", "ViaDotted", "Direct"):
        got = findings(results, cls)
        assert ("missing-parameter", cls, "get_cpu_copy", "mamba_indices") in got, cls
        drifted = next(
            f
            for r in results
            for f in r.findings
            if f.target.endswith(cls) and f.rule == "missing-parameter"
        )
        assert drifted.impl_location is not None
        assert drifted.impl_location.path.endswith("pkg/core/base.py"), cls


def test_import_bound_name_wins_over_fallback_assignment(tmp_path):
    write(
        tmp_path,
        {
            "lib/__init__.py": "",
            "lib/base.py": """
                class Base:
                    def get_kv_size_bytes(self) -> int:
                        return 0
            """,
            "lib/pool.py": """
                try:
                    from lib.base import Base
                except ImportError:
                    Base = object
                class Pool(Base): pass
            """,
        },
    )
    index = SourceIndex()
    module = index.load_file(str(tmp_path / "lib" / "pool.py"))
    mro = index.mro(module.classes["Pool"])
    assert isinstance(mro[1], ClassSource) and mro[1].name == "Base"


def test_unknown_and_known_external_bases(tmp_path):
    write(
        tmp_path,
        {
            "m.py": """
                import abc, typing
                import torch
                from not_installed_anywhere import Mystery
                class A(torch.nn.Module, typing.Generic[typing.TypeVar("T")]): pass
                class B(Mystery): pass
                class C(abc.ABC): pass
            """
        },
    )
    index = SourceIndex()
    module = index.load_file(str(tmp_path / "m.py"))
    assert all(isinstance(k, ExternalBase) and k.known for k in index.mro(module.classes["A"])[1:])
    assert index.unknown_bases(module.classes["B"]) == [
        ExternalBase("not_installed_anywhere.Mystery", known=False)
    ]
    assert module.classes["C"].is_abstract


def test_inheritance_cycle_and_diamond_do_not_hang(tmp_path):
    write(
        tmp_path,
        {
            "cyc.py": """
                class A(B): pass
                class B(A): pass
                class Root:
                    def get_kv_size_bytes(self) -> int: return 1
                class L(Root): pass
                class R(Root):
                    def get_kv_size_bytes(self) -> int: return 2
                class D(L, R): pass
            """
        },
    )
    index = SourceIndex()
    module = index.load_file(str(tmp_path / "cyc.py"))
    index.mro(module.classes["A"])
    owner, _ = index.find_method(module.classes["D"], "get_kv_size_bytes")  # type: ignore[misc]
    assert owner.name == "R"  # C3: D, L, R, Root


def test_syntax_error_is_a_load_error_result(tmp_path):
    write(tmp_path, {"bad.py": "class Pool(:\n    pass\n", "good.py": "x = 1\n"})
    results = check([str(tmp_path)])
    assert len(results) == 1
    (result,) = results
    assert result.outcome is Outcome.ERROR
    assert result.findings[0].rule == "load-error"
    assert result.findings[0].impl_location.line == 1


def test_missing_class_is_a_load_error(tmp_path):
    write(tmp_path, {"m.py": "x = 1\n"})
    target = ClassTarget("m.Nope", "Nope", ("KVPool",), path=str(tmp_path / "m.py"))
    (result,) = source_level.run([target])
    assert result.outcome is Outcome.ERROR and "no top-level class 'Nope'" in result.detail


def test_attributes_count_class_level_self_and_setattr(tmp_path):
    write(
        tmp_path,
        {
            "p.py": """
                import torch
                class Base:
                    size = 4
                class Pool(Base):
                    page_size: int = 1
                    def __init__(self):
                        self.dtype, self.device = torch.float32, torch.device("cpu")
                        setattr(self, "layer_num", 2)
                    def get_kv_size_bytes(self) -> int:
                        return 0
            """
        },
    )
    results = check([str(tmp_path / "p.py")], against=("KVPool",))
    assert not [f for f in findings(results, "Pool") if f[0] == "missing-attribute"]


@pytest.mark.parametrize("version, expected", [(2, 1), (1, 0)])
def test_contract_version_selects_history(tmp_path, version, expected):
    write(
        tmp_path,
        {
            "v1.py": """
                import torch
                class OldPool:
                    def get_cpu_copy(self, indices: torch.Tensor) -> "KVSnapshot": ...
                    def load_cpu_copy(
                        self, snapshot: "KVSnapshot", indices: torch.Tensor
                    ) -> None: ...
            """
        },
    )
    index = SourceIndex()
    targets, _ = resolve_targets([str(tmp_path)], against=("OffloadablePool",), index=index)
    results = source_level.run(targets, index=index, contract_version=version)
    missing = [
        f
        for r in results
        for f in r.findings
        if f.rule == "missing-parameter" and f.method == "get_cpu_copy"
    ]
    assert len(missing) == expected


@pytest.mark.parametrize(
    "contract, impl",
    [
        ("LayerLike", "Any"),
        ("LayerLike", "typing.Any"),
        ("LayerLike", "object"),
        ("LayerLike", "LayerLike | None"),
        ("LayerLike", "Union[LayerLike, int]"),
        ("KVWriteLoc | torch.Tensor", "torch.Tensor | KVWriteLoc | None"),
        ("float | None", "Optional[float]"),
        ("float | None", "float | int | None"),
        ("torch.Tensor", "Tensor | list[int]"),
        # known on both sides, and wider: decided, and fine
        ("torch.Tensor", "object"),
        ("KVWriteLoc | torch.Tensor", "object"),
        ("int | None", "float | None"),
        ("float | None", "Any"),
        # undecidable from text (what is MyLayer?): no finding, the types level asks mypy
        ("LayerLike", "MyLayer"),
        ("torch.Tensor", "MyTensor"),
    ],
)
def test_a_wider_or_undecidable_parameter_annotation_is_no_finding(contract, impl):
    from kvcache_core.conformance.members.annotations import parameter_conflicts

    assert parameter_conflicts(contract, impl) is False


@pytest.mark.parametrize(
    "contract, impl",
    [
        ("float | None", "float"),  # drops None
        ("float | None", "int | None"),  # narrower number
        ("KVWriteLoc | torch.Tensor", "torch.Tensor"),  # drops the record
        ("torch.Tensor", "list[int]"),  # unrelated
        ("torch.Tensor | None", "torch.Tensor"),
    ],
)
def test_a_narrower_or_unrelated_parameter_annotation_conflicts(contract, impl):
    from kvcache_core.conformance.members.annotations import parameter_conflicts

    assert parameter_conflicts(contract, impl) is True


@pytest.mark.parametrize(
    "contract, impl, conflicts",
    [
        ("int", "bool", False),  # narrower return: fine
        ("int", "Any", False),
        ("KVSnapshot", "MySnapshot", False),  # undecidable
        ("tuple[torch.Tensor, torch.Tensor]", "Tuple[Tensor, Tensor]", False),
        ("int", "float", True),  # wider return
        ("int", "object", True),
        ("int", "int | None", True),
        ("None", "bool", True),
    ],
)
def test_return_annotations_may_only_narrow(contract, impl, conflicts):
    from kvcache_core.conformance.members.annotations import return_conflicts

    assert return_conflicts(contract, impl) is conflicts
