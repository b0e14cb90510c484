"""The gallery: deliberately broken pools, each of which the battery must catch with exactly
one check, and report in a way a pool author can act on.

Why exactly one: a check that also fires on a bug it is not about makes every report noisier
and teaches authors to skim; a bug no check catches is a hole in the battery. Each
``gallery_*.py`` module next to this file defines ``GALLERY: list[tuple[str, PoolSpec]]``:
(the one check id that pool must fail, the spec of a pool broken on purpose). Add one per
check you write.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from kvcache_core import PoolSpec
from kvcache_core.conformance.behaviour import BATTERY, run_spec, select_checks
from kvcache_core.conformance.results.model import Outcome

HERE = Path(__file__).resolve().parent


def _load(path: Path) -> ModuleType:
    """Import a gallery file by path: gallery modules need not be importable as a package."""
    spec = importlib.util.spec_from_file_location(f"kvcache_gallery_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entries() -> list[tuple[str, str, PoolSpec]]:
    out: list[tuple[str, str, PoolSpec]] = []
    for path in sorted(HERE.glob("gallery_*.py")):
        gallery = getattr(_load(path), "GALLERY", None)
        assert isinstance(gallery, list) and gallery, f"{path.name} defines no GALLERY list"
        out += [(path.stem, check_id, spec) for check_id, spec in gallery]
    return out


ENTRIES = _entries()


def test_every_check_has_a_gallery_pool() -> None:
    """A check that no broken pool fails is untested: it might never fire."""
    assert sorted(set(BATTERY) - {check_id for _, check_id, _ in ENTRIES}) == []


def test_gallery_pool_names_are_unique() -> None:
    names = [spec.name for _, _, spec in ENTRIES]
    assert sorted(names) == sorted(set(names))


@pytest.mark.parametrize(
    ("module", "check_id", "spec"), ENTRIES, ids=[spec.name for _, _, spec in ENTRIES]
)
def test_broken_pool_fails_exactly_its_check(module: str, check_id: str, spec: PoolSpec) -> None:
    applicable = {c.id for c in select_checks(spec)}  # registers the battery
    assert check_id in BATTERY, f"{module}: {check_id!r} is not a registered check"
    assert check_id in applicable, (
        f"{module}: {check_id!r} does not apply to {spec.name!r}'s capabilities"
    )
    results = run_spec(spec)
    failed = {r.check.removeprefix("behaviour/"): r for r in results if r.outcome is Outcome.FAILED}
    details = {c: [str(f) for f in r.findings] for c, r in failed.items()}
    assert set(failed) == {check_id}, details
    assert all(r.outcome is Outcome.PASSED for r in results if r.check != f"behaviour/{check_id}")

    (finding,) = failed[check_id].findings
    assert finding.rule == "behaviour-failed"
    assert f"behaviour/{check_id}" in finding.message  # names the check
    assert spec.name in finding.target  # names the pool
    assert finding.hint.strip()
    assert finding.reproduction.strip()
    compile(finding.reproduction, f"<reproduction of {spec.name}>", "exec")  # it is Python
    assert repr(spec.name) in finding.reproduction  # and it builds this pool
