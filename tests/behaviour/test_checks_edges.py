"""Edges of the battery met on real code: a pool naming its offload parameters its own way and
an allocator forwarding positionally (no false positive), every malformed call reported (not
just the first), page size above 1 without the ``paged`` capability (tested, not a crash in
checker code), and an allocation of fewer slots than asked (a finding)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvcache_core import (
    Capability,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    PoolSpec,
    unwrap_write_loc,
)
from kvcache_core.conformance.behaviour import default_config, run_spec
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha

from ._support import builtin_specs, exec_reproduction, failed, run_one

MHA_CAPS = frozenset({Capability.OFFLOAD, Capability.PAGED})


def _spec(name: str, pool: type, allocator: type, factory: Any, **kw: Any) -> PoolSpec:
    return PoolSpec(name, pool, allocator, factory, kw.pop("capabilities", MHA_CAPS), **kw)


# -- forwarding: the pool's own parameter names, positional forwarding -------------------------


class OwnNamesPool(MHATokenToKVPool):
    """sglang's spelling: ``free_index`` for the slots (the checker's signature level reports
    the rename; the forwarding check must not misread it as a dropped argument)."""

    def get_cpu_copy(  # type: ignore[override]
        self, free_index: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return super().get_cpu_copy(free_index, mamba_indices)

    def load_cpu_copy(  # type: ignore[override]
        self,
        kv_cache_cpu: KVSnapshot,
        free_index: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        super().load_cpu_copy(kv_cache_cpu, free_index, mamba_indices)


class PositionalAllocator(PagedSlotAllocator):
    """Forwards every argument positionally, as sglang's allocators do."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._offloadable().get_cpu_copy(indices, mamba_indices)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._offloadable().load_cpu_copy(snapshot, indices, mamba_indices)


class PositionalDropsState(PositionalAllocator):
    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._offloadable().load_cpu_copy(snapshot, indices)


def own_names_positional(config: PoolConfig) -> tuple[Any, Any]:
    pool, _ = create_mha(config)
    pool.__class__ = OwnNamesPool
    return pool, PositionalAllocator(config.size, config.page_size, pool)


def own_names_drops_state(config: PoolConfig) -> tuple[Any, Any]:
    pool, _ = create_mha(config)
    pool.__class__ = OwnNamesPool
    return pool, PositionalDropsState(config.size, config.page_size, pool)


def test_positional_forwarding_to_own_parameter_names_is_not_a_finding() -> None:
    spec = _spec("own-names", OwnNamesPool, PositionalAllocator, own_names_positional)
    result = run_one(spec, "allocator-forwards-offload")
    assert result.outcome.value == "passed", result.findings


def test_a_dropped_argument_is_still_found_through_own_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = _spec("own-names-drops", OwnNamesPool, PositionalDropsState, own_names_drops_state)
    (finding,) = run_one(spec, "allocator-forwards-offload").findings
    assert "mamba_indices=nothing (left to its default)" in finding.message
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError) and "mamba_indices was not forwarded" in str(shown)


# -- bad input: every failing case is reported ------------------------------------------------


class _Layer:
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


class TwoBadWrites(MHATokenToKVPool):
    """Writes the in-range rows of a write before refusing its out-of-range slot (a partial
    write), and reads layer -1 as the last layer (Python indexing) instead of refusing it."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        if layer.layer_id == -1:
            layer = _Layer(self.start_layer + self.layer_num - 1)
        full, _ = unwrap_write_loc(loc)
        if full.dtype == torch.int64 and full.numel() == cache_k.shape[0]:
            ok = (full >= 0) & (full < self.rows)
            if not bool(ok.all()):
                super().set_kv_buffer(layer, full[ok], cache_k[ok], cache_v[ok])
        super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)


def two_bad_writes(config: PoolConfig) -> tuple[Any, Any]:
    pool, _ = create_mha(config)
    pool.__class__ = TwoBadWrites
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def test_bad_write_reports_every_case_that_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec("two-bad-writes", TwoBadWrites, PagedSlotAllocator, two_bad_writes)
    (finding,) = run_one(spec, "bad-write-rejected").findings
    message = finding.message
    assert "with an out-of-range slot was refused but changed the pool first" in message
    assert "with a negative slot was refused but changed the pool first" in message
    assert "with unknown layer -1 was accepted" in message  # a later case, reported too
    assert message.count("the call:") >= 4  # each layer's out-of-range and negative cases
    shown = exec_reproduction(finding.reproduction, monkeypatch)
    assert isinstance(shown, AssertionError)
    assert "unknown layer -1: the bad call was accepted" in str(shown)
    assert "an out-of-range slot: the refused call changed the pool" in str(shown)


# -- page size above 1 without the paged capability -------------------------------------------


def test_page_size_above_one_without_paged_runs_the_whole_battery() -> None:
    """A token allocator (alloc only) at page size 4: the battery allocates whole pages and
    every built-in passes every check, none crashes inside checker code."""
    for base in builtin_specs():
        if base.name not in ("mha", "swa"):
            continue
        config = dataclasses.replace(default_config(base), page_size=4)
        spec = dataclasses.replace(
            base, capabilities=base.capabilities - {Capability.PAGED}, behaviour_config=config
        )
        assert failed(run_spec(spec)) == set(), base.name


# -- an allocation of fewer slots than asked --------------------------------------------------


class ShortPageAllocator(PagedSlotAllocator):
    """``alloc(n)`` of a count that is not whole pages returns an empty tensor (sglang's paged
    allocator at ``alloc(3)`` with page size 4) instead of refusing or allocating."""

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size:
            return torch.empty(0, dtype=torch.int64)
        return super().alloc(need_size)


def short_page(config: PoolConfig) -> tuple[Any, Any]:
    pool, _ = create_mha(config)
    return pool, ShortPageAllocator(config.size, config.page_size, pool)


def test_an_allocation_of_fewer_slots_is_a_finding() -> None:
    spec = _spec("short-page", MHATokenToKVPool, ShortPageAllocator, short_page)
    (finding,) = run_one(spec, "allocator-state-machine").findings
    assert "returned 0 slot(s), expected" in finding.message


def test_a_short_allocation_inside_a_check_is_named_not_a_crash() -> None:
    """Without ``paged`` at page size 4 every check allocates through ``alloc``; an allocator
    returning fewer slots is reported as that, with a reproduction, not an IndexError."""
    mha = next(s for s in builtin_specs() if s.name == "mha")
    config = dataclasses.replace(default_config(mha), page_size=4)

    class Short(ShortPageAllocator):
        def alloc(self, need_size: int) -> torch.Tensor | None:
            out = super().alloc(need_size)
            return out[:-1] if out is not None and out.numel() else out

    def factory(config: PoolConfig) -> tuple[Any, Any]:
        pool, _ = create_mha(config)
        return pool, Short(config.size, config.page_size, pool)

    spec = _spec(
        "short-alloc",
        MHATokenToKVPool,
        Short,
        factory,
        capabilities=frozenset({Capability.OFFLOAD}),
        behaviour_config=config,
    )
    (finding,) = run_one(spec, "write-isolation").findings
    assert "allocator.alloc(12) returned 11 slot(s), not 12" in finding.message
    assert "assert out is not None and len(out) == 12" in finding.reproduction
