"""Built-in pools with one deliberate defect each, registered as a plugin of their own.

Each is the built-in pool with a single method overridden (the factory builds the built-in pool
and re-classes it, so every other byte of behaviour is the real one). The demo must report each
as differing tokens: these are the failures retraction exists to catch.
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
from kvcache_plugins import dsa, mamba, mha, swa
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mla import MLATokenToKVPool


class MambaDropsState(mamba.HybridMambaKVPool):
    """Reload restores the attention KV but silently drops the saved Mamba state."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        checked = self.check_cpu_copy(snapshot, indices, mamba_indices)
        self.attention_pool.load_cpu_copy(checked.attention, checked.slots)


class SWAWindowAtFullSlot(swa.SWAKVPool):
    """Window layers are written at the *full* slot id instead of the token's window slot."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        full, _ = unwrap_write_loc(loc)
        super().set_kv_buffer(
            layer, KVWriteLoc(full, swa_loc=full), cache_k, cache_v, k_scale, v_scale
        )


class DSADropsIndexer(dsa.DSATokenToKVPool):
    """Reload restores the latent but not the indexer keys and scales."""

    def _load_parts(self, slots: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        MLATokenToKVPool._load_parts(self, slots, parts)


class MHARaisesOnOffload(mha.MHATokenToKVPool):
    """Retraction raises: the demo must report it for this pool and go on with the others."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        raise RuntimeError("offload is broken in this pool")


def _rebased(create: Callable[[PoolConfig], tuple[Any, Any]], cls: type) -> Callable[..., Any]:
    def factory(config: PoolConfig) -> tuple[Any, Any]:
        pool, allocator = create(config)
        pool.__class__ = cls
        return pool, allocator

    return factory


def _spec(name: str, base: Any, cls: type) -> PoolSpec:
    built_in = base.kvcache_pool_specs()[0]
    return PoolSpec(
        name=name,
        pool_class=cls,
        allocator_class=built_in.allocator_class,
        factory=_rebased(base.create, cls),
        capabilities=built_in.capabilities,
    )


def _mamba_without_slot_allocator(config: PoolConfig) -> tuple[Any, Any]:
    """A Mamba pool whose allocator does not offer ``mamba_allocator``: unservable."""
    pool, _ = mamba.create(config)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        _spec("mamba-drops-state", mamba, MambaDropsState),
        _spec("swa-window-at-full-slot", swa, SWAWindowAtFullSlot),
        _spec("dsa-drops-indexer", dsa, DSADropsIndexer),
        _spec("mha-raises", mha, MHARaisesOnOffload),
        PoolSpec(
            name="mamba-no-slots",
            pool_class=mamba.HybridMambaKVPool,
            allocator_class=PagedSlotAllocator,
            factory=_mamba_without_slot_allocator,
            capabilities=mamba.kvcache_pool_specs()[0].capabilities,
        ),
        PoolSpec(
            name="no-offload",
            pool_class=mha.MHATokenToKVPool,
            allocator_class=PagedSlotAllocator,
            factory=mha.create,
            capabilities=frozenset({Capability.PAGED}),
        ),
    ]
