"""Broken pools that keep the battery's own comparisons honest: each fails exactly one check,
and only while that check keeps the strength it has. Weaken the check (compare row 0 of a
write no more, write or compare only the first layer, drop the whole-pages offload pattern, stop
comparing the allocator after a refused call, compare by value instead of by bits, accept an
``InvalidSlotError`` for a double free) and its pool here passes, which the gallery test
reports: who checks the checker.

Factories are module-level functions so that a finding's reproduction can import them.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache_core import (
    DoubleFreeError,
    InvalidSlotError,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    PoolSpec,
    unwrap_write_loc,
)
from kvcache_plugins import mha, mla
from kvcache_plugins.allocators import PagedSlotAllocator

__all__ = ["GALLERY"]


class _LayerId:
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


class FirstRowFromPadding(mla.MLATokenToKVPool):
    """``get_mla_kv_buffer`` reads the first requested token from the padding slot 0 (a
    gather kernel that skips its leading index): only row 0 of a read is wrong."""

    def get_mla_kv_buffer(
        self, layer: LayerLike, loc: torch.Tensor, dst_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shifted = loc.clone()
        if shifted.numel():
            shifted.reshape(-1)[0] = 0
        return super().get_mla_kv_buffer(layer, shifted, dst_dtype)


class FirstLayerLeaksForward(mha.MHATokenToKVPool):
    """A write to the first layer also lands in the last layer (a fused kernel whose layer
    stride is taken from the last layer): only the last layer's buffers show it."""

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
        last = self.start_layer + self.layer_num - 1
        batched = unwrap_write_loc(loc)[0].numel() > 1
        if layer.layer_id == self.start_layer and last != self.start_layer and batched:
            super().set_kv_buffer(_LayerId(last), loc, cache_k, cache_v, k_scale, v_scale)


class LastLayerLeaksBack(mha.MHATokenToKVPool):
    """A write to the last layer also lands in the first layer: only a check that writes
    every layer (not just the first) and compares every layer sees it."""

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
        last = self.start_layer + self.layer_num - 1
        batched = unwrap_write_loc(loc)[0].numel() > 1
        if layer.layer_id == last and last != self.start_layer and batched:
            first = _LayerId(self.start_layer)
            super().set_kv_buffer(first, loc, cache_k, cache_v, k_scale, v_scale)


class WholePagesReversed(mha.MHATokenToKVPool):
    """A fast path for offloading whole pages (page-aligned, consecutive, two or more) that
    copies the pages in reverse order: every other slot set is copied right."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        flat = indices.reshape(-1)
        page, n = self.page_size, flat.numel()
        whole = (
            page > 1
            and n >= 2 * page
            and n % page == 0
            and int(flat[0]) % page == 0
            and bool((flat.diff() == 1).all())
        )
        if whole:
            indices = flat.reshape(-1, page).flip(0).reshape(-1)
        return super().get_cpu_copy(indices, mamba_indices)


class NegativeZeroFlushed(mha.MHATokenToKVPool):
    """Adds ``0.0`` to what it stores ("to make a contiguous copy"): ``-0.0`` becomes
    ``+0.0``, which compares equal by value and differs in bits."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        if cache_k.is_floating_point() and cache_v.is_floating_point():
            cache_k, cache_v = cache_k + 0.0, cache_v + 0.0
        super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)


class StagingPageLeak(PagedSlotAllocator):
    """Reserves a staging page for every reload through the allocator and returns it only when
    the pool accepts the snapshot: a refused reload leaks a page (the pool is untouched)."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        staging = self.alloc(self.page_size)
        self._offloadable().load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
        if staging is not None:
            self.free(staging)


class DoubleFreeAsInvalidSlot(PagedSlotAllocator):
    """Reports a double free as ``InvalidSlotError`` (the slot "is not allocated"), so an
    engine catching ``DoubleFreeError`` misses it."""

    def _translate(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except DoubleFreeError as exc:
            raise InvalidSlotError(str(exc)) from None

    def free(self, indices: torch.Tensor) -> None:
        self._translate(super().free, indices)

    def free_group_end(self) -> None:
        self._translate(super().free_group_end)

    def available_size(self) -> int:
        size: int = self._translate(super().available_size)
        return size


def first_row_from_padding(config: PoolConfig) -> tuple[Any, Any]:
    pool, allocator = mla.create(config)
    pool.__class__ = FirstRowFromPadding
    return pool, allocator


def _mha(cls: type, config: PoolConfig, allocator: type = PagedSlotAllocator) -> Any:
    pool, _ = mha.create(config)
    pool.__class__ = cls
    return pool, allocator(config.size, config.page_size, pool)


def first_layer_leaks_forward(config: PoolConfig) -> tuple[Any, Any]:
    return _mha(FirstLayerLeaksForward, config)


def last_layer_leaks_back(config: PoolConfig) -> tuple[Any, Any]:
    return _mha(LastLayerLeaksBack, config)


def whole_pages_reversed(config: PoolConfig) -> tuple[Any, Any]:
    return _mha(WholePagesReversed, config)


def negative_zero_flushed(config: PoolConfig) -> tuple[Any, Any]:
    return _mha(NegativeZeroFlushed, config)


def staging_page_leak(config: PoolConfig) -> tuple[Any, Any]:
    return _mha(mha.MHATokenToKVPool, config, StagingPageLeak)


def double_free_as_invalid_slot(config: PoolConfig) -> tuple[Any, Any]:
    return _mha(mha.MHATokenToKVPool, config, DoubleFreeAsInvalidSlot)


def _spec(name: str, base: Any, pool: type, allocator: type | None, factory: Any) -> PoolSpec:
    (builtin,) = base.kvcache_pool_specs()
    return PoolSpec(
        name=name,
        pool_class=pool,
        allocator_class=allocator or builtin.allocator_class,
        factory=factory,
        capabilities=builtin.capabilities,
        description=(allocator or pool).__doc__ or "",
    )


GALLERY: list[tuple[str, PoolSpec]] = [
    (
        "write-readback",
        _spec(
            "gallery-first-row-from-padding", mla, FirstRowFromPadding, None, first_row_from_padding
        ),
    ),
    (
        "write-isolation",
        _spec(
            "gallery-first-layer-leaks-forward",
            mha,
            FirstLayerLeaksForward,
            PagedSlotAllocator,
            first_layer_leaks_forward,
        ),
    ),
    (
        "write-isolation",
        _spec(
            "gallery-last-layer-leaks-back",
            mha,
            LastLayerLeaksBack,
            PagedSlotAllocator,
            last_layer_leaks_back,
        ),
    ),
    (
        "offload-roundtrip",
        _spec(
            "gallery-whole-pages-reversed",
            mha,
            WholePagesReversed,
            PagedSlotAllocator,
            whole_pages_reversed,
        ),
    ),
    (
        "write-readback",
        _spec(
            "gallery-negative-zero-flushed",
            mha,
            NegativeZeroFlushed,
            PagedSlotAllocator,
            negative_zero_flushed,
        ),
    ),
    (
        "bad-reload-rejected",
        _spec(
            "gallery-staging-page-leak",
            mha,
            mha.MHATokenToKVPool,
            StagingPageLeak,
            staging_page_leak,
        ),
    ),
    (
        "allocator-state-machine",
        _spec(
            "gallery-double-free-as-invalid-slot",
            mha,
            mha.MHATokenToKVPool,
            DoubleFreeAsInvalidSlot,
            double_free_as_invalid_slot,
        ),
    ),
]
