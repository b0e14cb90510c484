"""Pools with one deliberate defect each (and one honest third-party pool), as a plugin.

Each defective pool is a built-in one with a single method overridden, so every other byte of
behaviour is the real one: the differential tests must see each defect as differing logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvcache_core import (
    Capability,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    PoolSpec,
    hookimpl,
    unwrap_write_loc,
)
from kvcache_plugins import mamba, mha, swa
from kvcache_plugins.allocators import PagedSlotAllocator


class MHASkipsLoad(mha.MHATokenToKVPool):
    """``load_cpu_copy`` checks the snapshot and writes nothing: a resume reads stale slots."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self.check_snapshot(snapshot, indices.numel())


class MambaDropsState(mamba.HybridMambaKVPool):
    """Offload and reload carry the attention KV but silently drop the Mamba state."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return super().get_cpu_copy(indices, None)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        super().load_cpu_copy(snapshot, indices, None)


class SWAWindowLeaks(swa.SWAKVPool):
    """Window-layer writes also land in the first full layer's rows at the same full slots."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)
        if layer.layer_id in self.swa_layer_ids:
            full, _ = unwrap_write_loc(loc)
            key, value = self.full_pool.get_kv_buffer(0)
            key[full] = cache_k.to(key.dtype)
            value[full] = cache_v.to(value.dtype)


def _rebased(create: Callable[[PoolConfig], tuple[Any, Any]], cls: type) -> Callable[..., Any]:
    def factory(config: PoolConfig) -> tuple[Any, Any]:
        pool, allocator = create(config)
        pool.__class__ = cls
        return pool, allocator

    return factory


def _ignores_dtype(config: PoolConfig) -> tuple[Any, Any]:
    """A factory that builds its pool in float64 whatever the config says."""
    pool = mha.MHATokenToKVPool(
        config.size,
        config.page_size,
        torch.float64,
        config.head_num,
        config.head_dim,
        config.layer_num,
        v_head_dim=config.v_head_dim,
    )
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def _spec(
    name: str, factory: Callable[..., Any], pool: type, allocator: type, caps: set[Capability]
) -> PoolSpec:
    return PoolSpec(
        name=name,
        pool_class=pool,
        allocator_class=allocator,
        factory=factory,
        capabilities=frozenset(caps),
        description=f"test pool {name}",
    )


OFFLOAD_PAGED = {Capability.OFFLOAD, Capability.PAGED}


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    swa_caps = {*OFFLOAD_PAGED, Capability.SLIDING_WINDOW}
    mamba_caps = {*OFFLOAD_PAGED, Capability.MAMBA_STATE}
    return [
        _spec(
            "mha-skips-load",
            _rebased(mha.create, MHASkipsLoad),
            MHASkipsLoad,
            PagedSlotAllocator,
            OFFLOAD_PAGED,
        ),
        _spec(
            "mamba-drops-state",
            _rebased(mamba.create, MambaDropsState),
            MambaDropsState,
            mamba.HybridMambaAllocator,
            mamba_caps,
        ),
        _spec(
            "swa-window-leaks",
            _rebased(swa.create, SWAWindowLeaks),
            SWAWindowLeaks,
            swa.SWASlotAllocator,
            swa_caps,
        ),
        # An honest third-party pool that declares offload only (no paging).
        _spec(
            "acme-unpaged",
            mha.create,
            mha.MHATokenToKVPool,
            PagedSlotAllocator,
            {Capability.OFFLOAD},
        ),
        _spec(
            "acme-float64", _ignores_dtype, mha.MHATokenToKVPool, PagedSlotAllocator, OFFLOAD_PAGED
        ),
    ]
