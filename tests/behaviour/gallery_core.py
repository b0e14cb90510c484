"""Deliberately broken pools for the data checks: each must fail exactly its one check.

Every pool here has correct signatures (it passes discovery and the source, signature and
types levels) and a single behavioural bug of a kind that shipped in a real engine or a
third-party pool. ``GALLERY`` pairs each with the one check id that must catch it; the
gallery harness runs the whole battery on each and requires that check, and no other, to
fail. Factories are module-level functions so that a finding's reproduction can import them.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache_core import (
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    PoolSpec,
    check_slots,
    unwrap_write_loc,
)
from kvcache_plugins import dsa, mamba, mha, mla, swa
from kvcache_plugins.mla import MLATokenToKVPool

__all__ = ["GALLERY"]


def _rebuilt(factory: Any, cls: type, config: PoolConfig) -> tuple[Any, Any]:
    """The built-in pool and allocator, with the pool's class swapped for the broken one (the
    built-in factories construct their own class; the allocator keeps the same object)."""
    pool, allocator = factory(config)
    pool.__class__ = cls
    return pool, allocator


def _contiguous(indices: torch.Tensor) -> bool:
    flat = indices.reshape(-1)
    return flat.numel() > 1 and bool((flat.diff() == 1).all())


class ViewSnapshotMHA(mha.MHATokenToKVPool):
    """A run of slots is returned as slices of the live buffers: no copy, so the snapshot
    changes when the freed slots are written again (the issue 8 pool)."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        slots = self._offload_slots(indices)  # bad input is still refused
        if not _contiguous(slots):
            return super().get_cpu_copy(indices, mamba_indices)
        first, last = int(slots[0]), int(slots[-1]) + 1
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=last - first,
            parts={"k": self._k.data[:, first:last], "v": self._v.data[:, first:last]},
            meta=self._meta(),
        )

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        # torch refuses to scatter a view of the destination's own storage; this author
        # "fixed" that here, on load, instead of copying in get_cpu_copy.
        parts = {name: t.clone() for name, t in snapshot.parts.items()}
        copied = KVSnapshot(
            snapshot.pool_kind, snapshot.dtype, snapshot.token_count, parts, meta=snapshot.meta
        )
        super().load_cpu_copy(copied, indices, mamba_indices)


def view_snapshot(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(mha.create, ViewSnapshotMHA, config)


class FlippedReloadMHA(mha.MHATokenToKVPool):
    """Reloads into the new slots in reverse order (``slots.flip(0)``)."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        super().load_cpu_copy(snapshot, indices.flip(0), mamba_indices)


def flipped_reload(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(mha.create, FlippedReloadMHA, config)


class ShiftedReloadMHA(mha.MHATokenToKVPool):
    """Reloads one slot further on (``slots + 1``, wrapping so the slot stays in range)."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        slots = self._offload_slots(indices)  # the real checks first, on the real slots
        super().load_cpu_copy(snapshot, slots % (self.rows - 1) + 1, mamba_indices)


def shifted_reload(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(mha.create, ShiftedReloadMHA, config)


class IgnoresSwaLoc(swa.SWAKVPool):
    """Drops ``swa_loc`` and always translates ``loc`` itself."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        if isinstance(loc, KVWriteLoc):
            if loc.swa_loc is not None:  # still refuses a bad swa_loc, then forgets it
                check_slots(loc.swa_loc, limit=self.swa_pool.rows, allow_zero=True, name="swa_loc")
            loc = KVWriteLoc(loc.loc, full_loc=loc.full_loc)
        super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)


def ignores_swa_loc(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(swa.create, IgnoresSwaLoc, config)


class DropsMambaOnReload(mamba.HybridMambaKVPool):
    """Checks everything, then restores the attention KV and silently not the state."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        checked = self.check_cpu_copy(snapshot, indices, mamba_indices)
        self.attention_pool.load_cpu_copy(checked.attention, checked.slots)


def drops_mamba(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(mamba.create, DropsMambaOnReload, config)


class LeakyMHA(mha.MHATokenToKVPool):
    """A batched (prefill) write also lands in the next layer at the same slots, as a fused
    kernel with a wrong layer stride would; single-token (decode) writes are right."""

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
        other = (layer.layer_id - self.start_layer + 1) % self.layer_num + self.start_layer
        if other != layer.layer_id and unwrap_write_loc(loc)[0].numel() > 1:
            leak = _LayerId(other)
            super().set_kv_buffer(leak, loc, cache_k, cache_v, k_scale, v_scale)


class _LayerId:
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


def leaky_write(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(mha.create, LeakyMHA, config)


class DSAWithoutIndexerSnapshot(dsa.DSATokenToKVPool):
    """Snapshots and reloads the latent only, as if the indexer keys were not per-slot data."""

    def _offload_parts(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        return MLATokenToKVPool._offload_parts(self, slots)

    def _offload_layout(self, count: int) -> dict[str, Any]:
        return MLATokenToKVPool._offload_layout(self, count)

    def _load_parts(self, slots: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        MLATokenToKVPool._load_parts(self, slots, parts)


def dsa_without_indexer(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(dsa.create, DSAWithoutIndexerSnapshot, config)


class SortedMLAReads(mla.MLATokenToKVPool):
    """``get_mla_kv_buffer`` gathers at the sorted slots: right rows, wrong order, whenever a
    caller's slots are not ascending."""

    def get_mla_kv_buffer(
        self, layer: LayerLike, loc: torch.Tensor, dst_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().get_mla_kv_buffer(layer, torch.sort(loc).values, dst_dtype)


def sorted_mla_reads(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(mla.create, SortedMLAReads, config)


def _spec(name: str, base: str, cls: type, factory: Any) -> PoolSpec:
    builtin = {
        "mha": mha.kvcache_pool_specs,
        "mla": mla.kvcache_pool_specs,
        "dsa": dsa.kvcache_pool_specs,
        "swa": swa.kvcache_pool_specs,
        "mamba": mamba.kvcache_pool_specs,
    }[base]()[0]
    return PoolSpec(
        name=name,
        pool_class=cls,
        allocator_class=builtin.allocator_class,
        factory=factory,
        capabilities=builtin.capabilities,
        description=cls.__doc__ or "",
    )


GALLERY: list[tuple[str, PoolSpec]] = [
    ("snapshot-is-copy", _spec("gallery-view-snapshot", "mha", ViewSnapshotMHA, view_snapshot)),
    (
        "offload-roundtrip",
        _spec("gallery-flipped-reload", "mha", FlippedReloadMHA, flipped_reload),
    ),
    (
        "offload-roundtrip",
        _spec("gallery-shifted-reload", "mha", ShiftedReloadMHA, shifted_reload),
    ),
    ("swa-loc-window", _spec("gallery-ignores-swa-loc", "swa", IgnoresSwaLoc, ignores_swa_loc)),
    (
        "offload-roundtrip",
        _spec("gallery-drops-mamba-state", "mamba", DropsMambaOnReload, drops_mamba),
    ),
    ("write-isolation", _spec("gallery-leaky-write", "mha", LeakyMHA, leaky_write)),
    (
        "offload-roundtrip",
        _spec("gallery-dsa-no-indexer", "dsa", DSAWithoutIndexerSnapshot, dsa_without_indexer),
    ),
    ("write-readback", _spec("gallery-sorted-mla-reads", "mla", SortedMLAReads, sorted_mla_reads)),
]
