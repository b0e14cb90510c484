"""kv-size-bytes: an int between what the getters reach and what the pool holds."""

from __future__ import annotations

import pytest

from kvcache_core import PoolConfig, PoolSpec
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha

from ._support import all_good_specs, exec_reproduction, run_one
from .gallery_inputs import GALLERY

GOOD = all_good_specs()


@pytest.mark.parametrize("spec", GOOD, ids=[s.name for s in GOOD])
def test_good_pools_report_their_bytes(spec: PoolSpec) -> None:
    result = run_one(spec, "kv-size-bytes")
    assert result.outcome.value == "passed", result.findings


def test_undercount_names_the_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dict((s.name, s) for _, s in GALLERY)["gallery-size-undercount"]
    (finding,) = run_one(spec, "kv-size-bytes").findings
    assert "is 2304 but the buffers it must count hold at least 4608" in finding.message
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError)
    assert "the getters alone reach 4608 bytes" in str(shown)


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (lambda pool: float(pool._k.nbytes + pool._v.nbytes), "returned float"),
        (lambda pool: 8 * (pool._k.nbytes + pool._v.nbytes), "over-counted by"),
    ],
)
def test_float_and_overcount(report: object, expected: str) -> None:
    class Pool(MHATokenToKVPool):
        def get_kv_size_bytes(self) -> int:
            return report(self)  # type: ignore[operator,no-any-return]

    def factory(config: PoolConfig) -> tuple[Pool, object]:
        pool, allocator = create_mha(config)
        pool.__class__ = Pool
        return pool, allocator  # type: ignore[return-value]

    spec = PoolSpec("size-probe", Pool, object, factory)
    (finding,) = run_one(spec, "kv-size-bytes").findings
    assert expected in finding.message
