"""Hand-built results covering every outcome, for the renderer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcache_core.conformance.behaviour.level import NO_SPEC
from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding the implementation files (renderers show them relative)."""
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    return root


@pytest.fixture
def contract_file(tmp_path: Path) -> Path:
    """A file outside the working directory (as the installed contract usually is)."""
    return tmp_path / "site" / "kvcache_core" / "contracts" / "pool.py"


@pytest.fixture
def results(project: Path, contract_file: Path) -> list[CheckResult]:
    impl = str(project / "pkg" / "pools.py")
    contract = str(contract_file)
    drift = "pkg.pools.DriftPool"
    return [
        CheckResult("pkg.pools.GoodPool", "types:KVPool", Outcome.PASSED, duration_s=0.25),
        CheckResult(
            "pkg.pools.GoodPool",
            "signature:KVPool",
            Outcome.PASSED,
            (
                Finding(
                    rule="annotation-mismatch",
                    message="`layer_id` is annotated `str` here but `int` in the contract",
                    target="pkg.pools.GoodPool",
                    method="get_key_buffer",
                    parameter="layer_id",
                    hint="write `layer_id: int`",
                    contract_location=Location(contract, 48),
                    impl_location=Location(impl, 12),
                ),
            ),
        ),
        CheckResult(
            drift,
            "types:OffloadablePool",
            Outcome.FAILED,
            (
                Finding(
                    rule="type-error",
                    message="`get_cpu_copy` does not match OffloadablePool: expected "
                    "`def get_cpu_copy(self, indices: Tensor, mamba_indices: Tensor | None = ...)"
                    " -> KVSnapshot`, got `def get_cpu_copy(self, indices: Tensor) -> KVSnapshot`",
                    target=drift,
                    method="get_cpu_copy",
                    parameter="mamba_indices",
                    hint="match the contract: `def get_cpu_copy(...)`",
                    contract_location=Location(contract, 71),
                    impl_location=Location(impl, 40),
                ),
                Finding(
                    rule="missing-method",
                    message="OffloadablePool requires `load_cpu_copy`; DriftPool does not define "
                    'it <&> "100%", a: b\nsecond line \x07 bell',
                    target=drift,
                    method="load_cpu_copy",
                    hint="def load_cpu_copy(...): ...",
                    contract_location=Location(contract, 75),
                    impl_location=Location(impl, None),
                ),
            ),
            duration_s=0.5,
        ),
        CheckResult(
            drift,
            "source:KVPool",
            Outcome.EXPECTED_FAILURE,
            (
                Finding(
                    rule="renamed-parameter",
                    message="`layer_id` is called `layer` here",
                    target=drift,
                    method="get_value_buffer",
                    parameter="layer_id",
                    hint="rename `layer` to `layer_id: int`",
                    contract_location=Location(contract, 50),
                    impl_location=Location(impl, 20),
                ),
            ),
            detail="known drift, tracked in #12",
        ),
        CheckResult(
            "plugin:broken",
            "load",
            Outcome.ERROR,
            (
                Finding(
                    rule="load-error",
                    message="plugin 'broken': import failed: ModuleNotFoundError: No module named "
                    "'cuda_only'",
                    target="plugin:broken",
                    hint="fix the plugin so that it imports",
                ),
            ),
            detail="import failed",
        ),
        CheckResult(
            "plugin:broken",
            "types:KVPool",
            Outcome.ERROR,
            detail="mypy could not check (exit status 2):\nsomething broke",
        ),
        CheckResult(
            "plugin:broken",
            "behaviour",
            Outcome.SKIPPED,
            detail=NO_SPEC,
            extra={"why": object(), "nested": {"values": (1, 2.5, None)}},
        ),
    ]
