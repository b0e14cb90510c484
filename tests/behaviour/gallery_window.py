"""Broken sliding-window pools, each failing exactly one behaviour check.

Two of them are the pools a new user wrote from the docs, which passed every check before the
battery built its own slot orders and compared window writes against the whole pool state:
a reload that maps window rows through the *sorted* new slots, and a window-layer write
through ``KVWriteLoc(loc, swa_loc)`` that also writes full layer 0 at ``loc`` after
validating its arguments. The third mishandles only ``KVWriteLoc(loc)`` (no ``swa_loc``) on
window layers, at slots that are not ascending: only the window check's ``KVWriteLoc(loc)``
form at a non-ascending slot set reaches it. Factories are module-level functions so that a
finding's reproduction can import them.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache_core import KVSnapshot, KVWriteLoc, LayerLike, PoolConfig, PoolSpec, check_slots
from kvcache_core.errors import AllocatorError
from kvcache_plugins import swa
from kvcache_plugins._layers import layer_id_of
from kvcache_plugins._swa_pool import _SubLayer

__all__ = ["GALLERY"]


class SortedWindowReload(swa.SWAKVPool):
    """Reloads window rows at the window slots of the *sorted* new slots: right rows for an
    ascending reload, the wrong tokens' rows for any other order."""

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        checked = self.check_cpu_copy(snapshot, indices)
        ordered = torch.sort(checked.slots).values
        target = self._mapping()[ordered][checked.mask]
        if bool((target <= 0).any()):
            raise AllocatorError("a saved window row has no window slot at its new index")
        target = check_slots(target, limit=self.swa_pool.rows, allow_duplicates=False)
        self.full_pool.load_cpu_copy(checked.full, checked.slots)
        self.swa_pool.load_cpu_copy(checked.swa, target)


class WindowWriteAlsoFull(swa.SWAKVPool):
    """A window-layer write through ``KVWriteLoc(loc, swa_loc)`` also lands in full layer 0 at
    ``loc`` (an index table copied from the full path), after validation passed."""

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
        _, _, window = self._resolve(layer_id_of(layer))
        if window and isinstance(loc, KVWriteLoc) and loc.swa_loc is not None:
            self.full_pool.set_kv_buffer(_SubLayer(0), loc.loc, cache_k, cache_v)


class UnsortedLocOnlyWrapped(swa.SWAKVPool):
    """Window layers given ``KVWriteLoc(loc)`` without ``swa_loc`` (and every token holding a
    window slot) translate the sorted ``loc``: rows land on the wrong tokens unless ``loc`` is
    ascending. Bare ``loc`` and an explicit ``swa_loc`` are right."""

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        _, _, window = self._resolve(layer_id_of(layer))
        if window and isinstance(loc, KVWriteLoc) and loc.swa_loc is None:
            swa_loc = self.translate_loc_from_full_to_swa(torch.sort(loc.loc).values)
            if bool((swa_loc > 0).all()):
                loc = KVWriteLoc(loc.loc, swa_loc=swa_loc)
        super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)


def _rebuilt(cls: type, config: PoolConfig) -> tuple[Any, Any]:
    pool, allocator = swa.create(config)
    pool.__class__ = cls
    return pool, allocator


def sorted_window_reload(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(SortedWindowReload, config)


def window_write_also_full(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(WindowWriteAlsoFull, config)


def unsorted_loc_only_wrapped(config: PoolConfig) -> tuple[Any, Any]:
    return _rebuilt(UnsortedLocOnlyWrapped, config)


def _spec(name: str, cls: type, factory: Any) -> PoolSpec:
    (builtin,) = swa.kvcache_pool_specs()
    return PoolSpec(
        name=name,
        pool_class=cls,
        allocator_class=builtin.allocator_class,
        factory=factory,
        capabilities=builtin.capabilities,
        description=cls.__doc__ or "",
    )


GALLERY: list[tuple[str, PoolSpec]] = [
    (
        "offload-roundtrip",
        _spec("gallery-swa-sorted-reload", SortedWindowReload, sorted_window_reload),
    ),
    (
        "swa-loc-window",
        _spec("gallery-swa-write-also-full", WindowWriteAlsoFull, window_write_also_full),
    ),
    (
        "swa-loc-window",
        _spec("gallery-swa-wrapped-loc-sorted", UnsortedLocOnlyWrapped, unsorted_loc_only_wrapped),
    ),
]
