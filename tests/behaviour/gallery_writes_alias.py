"""Gallery: writes through an alias of ``loc``.

The bug: ``slots = loc`` reads like an unwrap and is not one. The source and signature levels
look for ``buf[loc]`` before any unwrapping and cannot follow the alias, so only running the
pool shows that a ``KVWriteLoc`` never reaches the buffers the way bare slots do. Everything
else (input checks, offload) is the built-in MHA pool's, so ``write-forms-agree`` is the one
check this pool may fail.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    PoolSpec,
    check_rows,
    check_slots,
    unwrap_write_loc,
)
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha


class AliasedLocPool(MHATokenToKVPool):
    """Validates the unwrapped slots, then writes through ``slots = loc``."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        key, value = self.get_kv_buffer(layer.layer_id)
        full, _ = unwrap_write_loc(loc)
        n = check_slots(full, limit=self.rows, name="loc", allow_zero=True).numel()
        k = check_rows(cache_k, name="cache_k", rows=n, row_shape=tuple(key.shape[1:]))
        v = check_rows(cache_v, name="cache_v", rows=n, row_shape=tuple(value.shape[1:]))
        slots = loc  # the bug: an alias of `loc` is still a KVWriteLoc when one was passed
        key[slots] = self._k.to_storage(k, k_scale)
        value[slots] = self._v.to_storage(v, v_scale)


def _create(config: PoolConfig) -> tuple[AliasedLocPool, PagedSlotAllocator]:
    """The built-in MHA pool, built by its own factory, with this class swapped in."""
    pool, allocator = create_mha(config)
    pool.__class__ = AliasedLocPool
    return pool, allocator


GALLERY: list[tuple[str, PoolSpec]] = [
    (
        "write-forms-agree",
        PoolSpec(
            name="gallery-writes-alias",
            pool_class=AliasedLocPool,
            allocator_class=PagedSlotAllocator,
            factory=_create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
        ),
    )
]
