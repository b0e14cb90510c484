"""Deliberately broken pools, each failing exactly one behaviour check: the bad-input,
allocator, forwarding and size checks must each catch the bug they exist for, and nothing else
may trip over it.

Each pool subclasses a built-in and breaks one thing the way real pools have: a write that
validates V only after storing K, a reload that loads K before checking the snapshot, an
allocator that hands a slot out twice, an allocator that drops ``mamba_indices`` on reload, an
offload that lets a raw ``IndexError`` escape, a size that forgets V. Also a pluggy plugin
(``kvcache_pool_specs``), so ``discover(plugins=[this module])``
can build them by name, which is how a finding's reproduction builds its pool.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    PoolSpec,
    check_rows,
    hookimpl,
    unwrap_write_loc,
)
from kvcache_plugins._layers import layer_id_of, write_slots
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool
from kvcache_plugins.mha import create as create_mha

__all__ = ["GALLERY", "kvcache_pool_specs"]


class HalfWritePool(MHATokenToKVPool):
    """Stores K, then checks V: a bad V raises after K is already overwritten."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        local = self._local(layer_id_of(layer))
        full, _ = unwrap_write_loc(loc)
        slots = write_slots(full, limit=self.rows, check_values=True, device=self.device)
        n = slots.numel()
        k = check_rows(cache_k, name="cache_k", rows=n, row_shape=self._k.row_shape)
        self._k.write(local, slots, self._k.to_storage(k, k_scale))
        v = check_rows(cache_v, name="cache_v", rows=n, row_shape=self._v.row_shape)
        self._v.write(local, slots, self._v.to_storage(v, v_scale))


class RawIndexErrorPool(MHATokenToKVPool):
    """Gathers out-of-range offload indices without checking them: torch's IndexError escapes."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        if indices.numel() and int(indices.max()) >= self.rows:
            self._k.data[:, indices]  # raises IndexError: index out of bounds
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)


class HalfReloadPool(MHATokenToKVPool):
    """Loads K as soon as the snapshot's K part has the right shape, then checks the snapshot:
    a snapshot of another kind (or dtype, or with a bad V) raises after K is overwritten."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        slots = self._offload_slots(indices)
        k = snapshot.parts.get("k") if isinstance(snapshot, KVSnapshot) else None
        if k is not None and k.shape == self._k.part_layout(slots.numel())[0]:
            self._k.data.index_copy_(1, slots, k.to(self._k.data.dtype))  # before any check
        snapshot = self.check_snapshot(snapshot, slots.numel())
        self._v.scatter(slots, snapshot.parts["v"])


class UndercountPool(MHATokenToKVPool):
    """Reports the K buffers only, as if V were free."""

    def get_kv_size_bytes(self) -> int:
        return self._k.nbytes


class TwiceAllocator(PagedSlotAllocator):
    """Remembers the first page it was given back and hands it out again with every alloc."""

    _recycled: int | None = None

    def free(self, indices: torch.Tensor) -> None:
        super().free(indices)
        first = int(indices.reshape(-1)[0]) if indices.numel() else 0
        if self._recycled is None and first > 0:
            self._recycled = first - first % self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        out = super().alloc(need_size)
        if out is not None and out.numel() and self._recycled is not None:
            out = out.clone()
            page = self._recycled
            out[: self.page_size] = torch.arange(page, page + self.page_size)
        return out


class DropsMambaOnReload(PagedSlotAllocator):
    """Accepts ``mamba_indices`` on reload and does not pass it on (the pool's default wins)."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._offloadable().load_cpu_copy(snapshot, indices)


def _mha(config: PoolConfig, pool_class: type[MHATokenToKVPool]) -> MHATokenToKVPool:
    """The built-in MHA pool, built by its own factory, with ``pool_class`` swapped in."""
    pool, _ = create_mha(config)
    pool.__class__ = pool_class
    return pool


def _spec(name: str, pool_class: type, allocator_class: type, factory: object) -> PoolSpec:
    return PoolSpec(
        name=name,
        pool_class=pool_class,
        allocator_class=allocator_class,
        factory=factory,  # type: ignore[arg-type]
        capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),  # those of mha
        description="deliberately broken (behaviour gallery)",
    )


def _half_write(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
    pool = _mha(config, HalfWritePool)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def _half_reload(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
    pool = _mha(config, HalfReloadPool)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def _raw_index_error(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
    pool = _mha(config, RawIndexErrorPool)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def _undercount(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
    pool = _mha(config, UndercountPool)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


def _twice(config: PoolConfig) -> tuple[MHATokenToKVPool, TwiceAllocator]:
    pool = _mha(config, MHATokenToKVPool)
    return pool, TwiceAllocator(config.size, config.page_size, pool)


def _drops_mamba(config: PoolConfig) -> tuple[MHATokenToKVPool, DropsMambaOnReload]:
    pool = _mha(config, MHATokenToKVPool)
    return pool, DropsMambaOnReload(config.size, config.page_size, pool)


#: (the one check each pool must fail, its spec).
GALLERY: list[tuple[str, PoolSpec]] = [
    (
        "bad-write-rejected",
        _spec("gallery-half-write", HalfWritePool, PagedSlotAllocator, _half_write),
    ),
    (
        "bad-offload-rejected",
        _spec("gallery-raw-index-error", RawIndexErrorPool, PagedSlotAllocator, _raw_index_error),
    ),
    (
        "bad-reload-rejected",
        _spec("gallery-half-reload", HalfReloadPool, PagedSlotAllocator, _half_reload),
    ),
    (
        "kv-size-bytes",
        _spec("gallery-size-undercount", UndercountPool, PagedSlotAllocator, _undercount),
    ),
    (
        "allocator-state-machine",
        _spec("gallery-slot-handed-out-twice", MHATokenToKVPool, TwiceAllocator, _twice),
    ),
    (
        "allocator-forwards-offload",
        _spec("gallery-drops-mamba-on-reload", MHATokenToKVPool, DropsMambaOnReload, _drops_mamba),
    ),
]


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [spec for _, spec in GALLERY]
