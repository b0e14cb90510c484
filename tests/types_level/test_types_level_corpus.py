"""The types level on drifted classes: every conflicting member, with both locations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvcache_core.conformance.results.model import CheckResult, Finding, Outcome
from kvcache_core.conformance.targets.target import ClassTarget
from kvcache_core.conformance.types import level as types_level

CORPUS = Path(__file__).resolve().parent.parent / "types_corpus"
POOLS = CORPUS / "drifted_pools.py"
ALLOCATORS = CORPUS / "drifted_allocators.py"
UNRESOLVABLE = CORPUS / "unresolvable.py"
OFFLOAD = ("KVPool", "OffloadablePool")
CONTRACT_POOL = Path(types_level.__file__).resolve().parents[2] / "contracts" / "pool.py"


def _pool(name: str, protocols: tuple[str, ...] = OFFLOAD, path: Path = POOLS) -> ClassTarget:
    return ClassTarget(name=f"corpus:{name}", class_name=name, protocols=protocols, path=str(path))


TARGETS = [
    _pool("ManyConflictsPool"),
    _pool("RenamedParameterPool"),
    _pool("WrongReturnPool"),
    _pool("NoMambaIndicesPool"),
    _pool("InheritsDriftPool"),
    _pool("CleanPool"),
    _pool("NoSuchClass"),
    _pool("ForgetfulAllocator", ("TokenAllocator",), ALLOCATORS),
    _pool("PoolOnUnknownBase", OFFLOAD, UNRESOLVABLE),
    _pool("AliasedAway", OFFLOAD, UNRESOLVABLE),
]


@pytest.fixture(scope="module")
def results(mypy_cache: Path) -> dict[tuple[str, str], CheckResult]:
    """One mypy run over the whole corpus, as the runner makes it."""
    found = types_level.run(TARGETS, contract_version=2, cache_dir=mypy_cache)
    return {(r.target, r.check): r for r in found}


def _def_line(path: Path, cls: str, member: str) -> int:
    """Line of ``def member`` (or ``member:``) inside ``class cls`` of ``path``."""
    lines = path.read_text().splitlines()
    start = next(i for i, t in enumerate(lines) if t.startswith(f"class {cls}"))
    pattern = re.compile(rf"^\s+(def {member}\(|{member}:)")
    return next(i for i in range(start, len(lines)) if pattern.match(lines[i])) + 1


def _contract_line(member: str) -> int:
    lines = CONTRACT_POOL.read_text().splitlines()
    pattern = re.compile(rf"^\s+(def {member}\(|{member}:)")
    return next(i for i, t in enumerate(lines) if pattern.match(t)) + 1


def _by_method(result: CheckResult) -> dict[str | None, Finding]:
    return {f.method: f for f in result.findings}


def test_one_result_per_target_and_protocol(results: dict[tuple[str, str], CheckResult]) -> None:
    expected = {(t.name, f"types:{p}") for t in TARGETS for p in t.protocols}
    assert set(results) == expected


def test_every_conflicting_member_is_listed(results: dict[tuple[str, str], CheckResult]) -> None:
    result = results[("corpus:ManyConflictsPool", "types:KVPool")]
    assert result.outcome is Outcome.FAILED
    found = _by_method(result)
    # mypy's own message would stop after two of these.
    assert set(found) == {
        "size",
        "get_key_buffer",
        "get_kv_buffer",
        "set_kv_buffer",
        "get_kv_size_bytes",
    }
    assert all(f.rule == "type-error" for f in found.values())
    assert found["get_key_buffer"].parameter == "layer_id"
    assert found["set_kv_buffer"].parameter == "v_scale"
    kv = found["get_kv_buffer"].message
    assert "expected `def get_kv_buffer(self, layer_id: int) -> tuple[Tensor, Tensor]`" in kv
    assert "got `def get_kv_buffer(self, layer_id: int) -> list[Tensor]`" in kv
    assert "expected `int`, got `str`" in found["size"].message
    assert "does not define `get_kv_size_bytes`" in found["get_kv_size_bytes"].message


def test_findings_carry_both_locations(results: dict[tuple[str, str], CheckResult]) -> None:
    found = _by_method(results[("corpus:ManyConflictsPool", "types:KVPool")])
    for member in ("size", "get_key_buffer", "get_kv_buffer", "set_kv_buffer"):
        finding = found[member]
        assert finding.impl_location is not None and finding.contract_location is not None
        assert Path(finding.impl_location.path) == POOLS
        assert finding.impl_location.line == _def_line(POOLS, "ManyConflictsPool", member)
        assert Path(finding.contract_location.path) == CONTRACT_POOL
        assert finding.contract_location.line == _contract_line(member)
        assert f"`{member}" in finding.hint or f"def {member}(" in finding.hint
    missing = found["get_kv_size_bytes"]  # no def to point at: the class statement
    assert missing.impl_location is not None
    class_line = POOLS.read_text().splitlines().index("class ManyConflictsPool:") + 1
    assert missing.impl_location.line == class_line
    assert "def get_kv_size_bytes(self) -> int" in missing.hint


def test_renamed_positional_parameter(results: dict[tuple[str, str], CheckResult]) -> None:
    # mypy ignores positional names when matching a class against a Protocol; the level's
    # bound-method check does not, because `indices=` by keyword breaks.
    assert results[("corpus:RenamedParameterPool", "types:KVPool")].outcome is Outcome.PASSED
    result = results[("corpus:RenamedParameterPool", "types:OffloadablePool")]
    (finding,) = result.findings
    assert (finding.method, finding.parameter) == ("get_cpu_copy", "indices")
    assert "parameter names differ" in finding.message
    assert "idx: torch.Tensor" in finding.message
    assert "indices: Tensor" in finding.message
    assert "under another name" in finding.message


def test_wrong_return_type(results: dict[tuple[str, str], CheckResult]) -> None:
    (finding,) = results[("corpus:WrongReturnPool", "types:OffloadablePool")].findings
    assert finding.method == "get_cpu_copy"
    assert finding.parameter is None
    assert "-> KVSnapshot`" in finding.message
    assert "-> dict[str, Tensor]`" in finding.message
    assert "matches contract 1" not in finding.message


def test_missing_mamba_indices_names_the_old_contract(
    results: dict[tuple[str, str], CheckResult],
) -> None:
    result = results[("corpus:NoMambaIndicesPool", "types:OffloadablePool")]
    found = _by_method(result)
    assert set(found) == {"get_cpu_copy", "load_cpu_copy"}
    for finding in found.values():
        assert finding.parameter == "mamba_indices"
        assert "matches contract 1" in finding.message
        assert "mamba_indices: Tensor | None = ..." in finding.message


def test_inherited_drift_points_at_the_base_class(
    results: dict[tuple[str, str], CheckResult],
) -> None:
    found = _by_method(results[("corpus:InheritsDriftPool", "types:OffloadablePool")])
    assert found["get_cpu_copy"].impl_location is not None
    assert found["get_cpu_copy"].impl_location.line == _def_line(
        POOLS, "NoMambaIndicesPool", "get_cpu_copy"
    )


def test_clean_pool_passes(results: dict[tuple[str, str], CheckResult]) -> None:
    for check in ("types:KVPool", "types:OffloadablePool"):
        result = results[("corpus:CleanPool", check)]
        assert result.outcome is Outcome.PASSED
        assert result.findings == ()
        assert isinstance(result.extra["mypy_seconds"], float)


def test_allocator_drift(results: dict[tuple[str, str], CheckResult]) -> None:
    found = _by_method(results[("corpus:ForgetfulAllocator", "types:TokenAllocator")])
    assert set(found) == {"get_kvcache", "get_cpu_copy", "load_cpu_copy"}
    assert "KVPool | None" in found["get_kvcache"].message
    assert found["load_cpu_copy"].parameter == "mamba_indices"


def test_missing_class_is_a_load_error(results: dict[tuple[str, str], CheckResult]) -> None:
    result = results[("corpus:NoSuchClass", "types:KVPool")]
    assert result.outcome is Outcome.ERROR
    (finding,) = result.findings
    assert finding.rule == "load-error"
    assert "NoSuchClass" in finding.message


def test_class_mypy_sees_as_any_is_an_error_not_a_pass(
    results: dict[tuple[str, str], CheckResult],
) -> None:
    result = results[("corpus:AliasedAway", "types:OffloadablePool")]
    assert result.outcome is Outcome.ERROR
    assert "as Any" in result.findings[0].message


def test_unresolved_base_is_a_warning(results: dict[tuple[str, str], CheckResult]) -> None:
    result = results[("corpus:PoolOnUnknownBase", "types:KVPool")]
    assert result.outcome is Outcome.PASSED
    (finding,) = result.findings
    assert finding.rule == "unresolved-base"
    assert not finding.is_error
