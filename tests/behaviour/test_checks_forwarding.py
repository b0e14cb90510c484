"""allocator-forwards-offload: found by what the pool receives, not by reading code."""

from __future__ import annotations

import pytest
import torch

from kvcache_core import KVSnapshot, PoolConfig, PoolSpec
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha

from ._support import all_good_specs, exec_reproduction, run_one
from .gallery_inputs import GALLERY

GOOD = [s for s in all_good_specs() if "offload" in {str(c) for c in s.capabilities}]


@pytest.mark.parametrize("spec", GOOD, ids=[s.name for s in GOOD])
def test_good_allocators_forward_everything(spec: PoolSpec) -> None:
    result = run_one(spec, "allocator-forwards-offload")
    assert result.outcome.value == "passed", result.findings


def test_dropped_mamba_indices_on_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dict((s.name, s) for _, s in GALLERY)["gallery-drops-mamba-on-reload"]
    (finding,) = run_one(spec, "allocator-forwards-offload").findings
    assert "load_cpu_copy(snapshot, dst, mamba_indices=new_state_slots)" in finding.message
    assert "mamba_indices=nothing (left to its default)" in finding.message
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError)
    assert "mamba_indices was not forwarded" in str(shown)


class _PassesNone(PagedSlotAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._offloadable().get_cpu_copy(indices, mamba_indices=None)


class _Swaps(PagedSlotAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        if mamba_indices is None:
            return self._offloadable().get_cpu_copy(indices)
        return self._offloadable().get_cpu_copy(mamba_indices, mamba_indices=indices)


@pytest.mark.parametrize(
    ("allocator_class", "expected"),
    [
        (_PassesNone, "passed the pool mamba_indices=None, but was given mamba_indices=tensor"),
        (_Swaps, "passed the pool indices=tensor [1], but was given indices=tensor [4, 5, 6, 7]"),
    ],
)
def test_none_and_swapped_arguments(allocator_class: type, expected: str) -> None:
    def factory(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
        pool, _ = create_mha(config)
        return pool, allocator_class(config.size, config.page_size, pool)

    base = next(s for s in GOOD if s.name == "mha")
    spec = PoolSpec(
        "forwarding-probe", MHATokenToKVPool, allocator_class, factory, base.capabilities
    )
    (finding,) = run_one(spec, "allocator-forwards-offload").findings
    assert expected in finding.message
