"""Gallery: a pool that divides by the scales on every write.

The bug: ``cache_k / k_scale`` whenever a scale is given. Engines divide only when the write
casts, and attention backends pass the layer's ``k_scale`` on every write whenever the
checkpoint has one, so this pool stores 1.5 where the engine's pool stores 3.0 for a float32
3.0 written into a float32 pool with ``k_scale=2.0``. No other check passes scales, so
``write-scales`` is the one check this pool may fail. Everything else is the built-in MHA pool.
"""

from __future__ import annotations

import torch

from kvcache_core import Capability, KVWriteLoc, LayerLike, PoolConfig, PoolSpec
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha


class AlwaysDividingPool(MHATokenToKVPool):
    """Divides by ``k_scale``/``v_scale`` even when no cast happens (out of place)."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        k = cache_k / k_scale if k_scale is not None else cache_k  # the bug: no dtype test
        v = cache_v / v_scale if v_scale is not None else cache_v
        super().set_kv_buffer(layer, loc, k, v)


def _create(config: PoolConfig) -> tuple[AlwaysDividingPool, PagedSlotAllocator]:
    """The built-in MHA pool, built by its own factory, with this class swapped in."""
    pool, allocator = create_mha(config)
    pool.__class__ = AlwaysDividingPool
    return pool, allocator


GALLERY: list[tuple[str, PoolSpec]] = [
    (
        "write-scales",
        PoolSpec(
            name="gallery-scales-always-divide",
            pool_class=AlwaysDividingPool,
            allocator_class=PagedSlotAllocator,
            factory=_create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
        ),
    )
]
