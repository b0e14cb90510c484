"""The sliding-window (SWA) pool: a full MHA pool plus a smaller window MHA pool.

Full-attention layers keep every token, so they live in a pool of ``size`` slots. Window layers
only ever read the last W tokens, so they live in a pool of ``swa_size`` slots and a token's
window slot is released as soon as it leaves the window. Which window slot a full slot has is
written in the ``full_to_swa`` table, which the allocator owns (it is the one handing window
slots out) and registers here; 0 means "no window slot" and the trailing -1 keeps a ``last_loc``
of -1 at -1 when translated.

Composition rather than a new buffer layout: both halves are `MHATokenToKVPool`, so a
window layer is exactly an MHA layer with its own slot space (and optionally its own head
geometry), and offload reuses MHA's batched gathers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kvcache_core import (
    AllocatorError,
    InvalidLayerError,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    SnapshotMismatchError,
    check_slots,
    expect_snapshot,
)

from ._layers import LocTypeError, layer_id_of, write_slots
from .mha import MHATokenToKVPool

__all__ = ["CheckedSWASnapshot", "SWAKVPool"]

_CHILDREN = ("full", "swa")


@dataclass(frozen=True)
class _SubLayer:
    """The layer a sub-pool sees: its own local id (sub-pools start at layer 0)."""

    layer_id: int


class CheckedSWASnapshot(NamedTuple):
    """A snapshot checked against its new indices: what loading it needs, nothing written yet."""

    slots: torch.Tensor  # the new full slots, int64 on the pool's device
    mask: torch.Tensor  # bool per slot, on the pool's device: the token had a window slot
    full: KVSnapshot
    swa: KVSnapshot
    snapshot: object  # what was checked, as given: a trusted load must name these very objects
    indices: object


class SWAKVPool:
    """Full-attention layers in a ``size``-slot pool, window layers in a ``swa_size``-slot pool.

    ``size``/``page_size``/``dtype``/``device``/``layer_num`` describe the pool as the engine
    sees it: ``size`` counts full slots (the ids an allocator returns) and ``layer_num`` counts
    every layer, full and window. ``head_major`` keeps both sides' rows head-major in memory
    (as ``MHATokenToKVPool`` does): the buffers, writes and snapshots are the same, and a
    snapshot loads into a pool of the other layout.
    """

    kind = "swa"

    def __init__(
        self,
        size: int,
        swa_size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        swa_layer_ids: tuple[int, ...],
        device: torch.device | str = "cpu",
        *,
        v_head_dim: int | None = None,
        swa_head_num: int | None = None,
        swa_head_dim: int | None = None,
        swa_v_head_dim: int | None = None,
        start_layer: int = 0,
        check_write_slots: bool | None = None,
        head_major: bool = False,
    ) -> None:
        ids = tuple(int(i) for i in swa_layer_ids)
        every = range(start_layer, start_layer + layer_num)
        outside = [i for i in ids if i not in every]
        if outside or len(set(ids)) != len(ids):
            raise ValueError(
                f"swa_layer_ids {list(ids)} must be distinct layer ids in "
                f"{start_layer}..{start_layer + layer_num - 1}"
            )
        full_ids = tuple(i for i in every if i not in ids)
        if not ids or not full_ids:
            # An all-full model is an MHA pool; an all-window model has no full slot space to
            # map from. Both are refused rather than silently served by a half-empty pool.
            raise ValueError(
                "an SWA pool needs at least one window layer and one full-attention layer "
                f"(swa_layer_ids={list(ids)}, layers {start_layer}..{start_layer + layer_num - 1})"
            )
        self.size = size
        self.swa_size = swa_size
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.swa_layer_ids = tuple(sorted(ids))
        self.full_layer_ids = full_ids
        self.head_major = head_major
        self.full_pool = MHATokenToKVPool(
            size,
            page_size,
            dtype,
            head_num,
            head_dim,
            len(full_ids),
            self.device,
            v_head_dim=v_head_dim,
            check_write_slots=check_write_slots,
            head_major=head_major,
        )
        window_dim = swa_head_dim if swa_head_dim is not None else head_dim
        self.swa_pool = MHATokenToKVPool(
            swa_size,
            page_size,
            dtype,
            swa_head_num if swa_head_num is not None else head_num,
            window_dim,
            len(ids),
            self.device,
            v_head_dim=swa_v_head_dim,
            check_write_slots=check_write_slots,
            head_major=head_major,
        )
        self.check_write_slots = self.full_pool.check_write_slots
        self._trusted: CheckedSWASnapshot | None = None  # see trusting()
        # global layer id -> (local id in its sub-pool, is a window layer)
        self._layers: dict[int, tuple[int, bool]] = {g: (i, False) for i, g in enumerate(full_ids)}
        self._layers.update({g: (i, True) for i, g in enumerate(self.swa_layer_ids)})
        self.full_to_swa_index_mapping: torch.Tensor | None = None

    # -- layers and buffers -----------------------------------------------------------------
    def _resolve(self, layer_id: int) -> tuple[MHATokenToKVPool, int, bool]:
        found = self._layers.get(layer_id)
        if found is None:
            raise InvalidLayerError(
                f"layer {layer_id} is not in this pool (it holds layers "
                f"{self.start_layer}..{self.start_layer + self.layer_num - 1})"
            )
        local, window = found
        return (self.swa_pool if window else self.full_pool), local, window

    def is_swa_layer(self, layer_id: int) -> bool:
        """Whether ``layer_id`` (global) is a sliding-window layer."""
        return self._resolve(layer_id)[2]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local, _ = self._resolve(layer_id)
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local, _ = self._resolve(layer_id)
        return pool.get_value_buffer(local)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool, local, _ = self._resolve(layer_id)
        return pool.get_kv_buffer(local)

    def get_kv_size_bytes(self) -> int:
        return self.full_pool.get_kv_size_bytes() + self.swa_pool.get_kv_size_bytes()

    # -- the full -> window table -------------------------------------------------------------
    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Adopt the allocator's table (shared, not copied: the allocator keeps updating it)."""
        table = full_to_swa_index_mapping
        want = self.size + self.page_size + 1
        if (
            not isinstance(table, torch.Tensor)
            or table.dtype != torch.int64
            or tuple(table.shape) != (want,)
        ):
            raise ValueError(
                f"full_to_swa_index_mapping must be a 1-D int64 tensor of {want} entries "
                f"(size + page_size + 1), got {getattr(table, 'shape', table)!r}"
            )
        if table.device != self.device:
            raise ValueError(f"the mapping is on {table.device}; this pool is on {self.device}")
        self.full_to_swa_index_mapping = table

    def _mapping(self) -> torch.Tensor:
        if self.full_to_swa_index_mapping is None:
            raise AllocatorError(
                "no full->window mapping registered: build the pool with its SWA allocator "
                "(kvcache_plugins.swa.create) or call register_mapping first"
            )
        return self.full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Window slots of full slots ``kv_indices`` (0: none; -1 stays -1). Not checked: hot."""
        mapping = self._mapping()
        return mapping[kv_indices.to(mapping.device)]

    # -- writes -------------------------------------------------------------------------------
    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Full layers write at ``loc`` (``full_loc`` if given); window layers at ``swa_loc``.

        Without ``swa_loc`` a window layer translates ``loc`` through the mapping; a token with
        no window slot then writes to the padding slot 0, which nothing reads.
        """
        pool, local, window = self._resolve(layer_id_of(layer))
        if not window:
            pool.set_kv_buffer(_SubLayer(local), loc, cache_k, cache_v, k_scale, v_scale)
            return
        if isinstance(loc, KVWriteLoc):
            base, swa_loc = loc.loc, loc.swa_loc
        elif isinstance(loc, torch.Tensor):
            base, swa_loc = loc, None
        else:
            raise LocTypeError(
                f"loc must be a torch.Tensor of slot indices or a KVWriteLoc, "
                f"got {type(loc).__name__}"
            )
        if swa_loc is None:
            full = write_slots(
                base,
                limit=self.full_pool.rows,
                check_values=self.check_write_slots,
                device=self.device,
            )
            swa_loc = self._mapping()[full]
        pool.set_kv_buffer(_SubLayer(local), swa_loc, cache_k, cache_v, k_scale, v_scale)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy full rows ``src_loc`` to ``tgt_loc``, and window rows where both have one."""
        self.full_pool.move_kv_cache(tgt_loc, src_loc)
        mapping = self._mapping()
        src = mapping[src_loc.to(self.device).reshape(-1).long()]
        tgt = mapping[tgt_loc.to(self.device).reshape(-1).long()]
        both = (src > 0) & (tgt > 0)
        if bool(both.any()):
            self.swa_pool.move_kv_cache(tgt[both], src[both])

    # -- offload ------------------------------------------------------------------------------
    def _meta(self) -> dict[str, object]:
        return {
            "layer_num": self.layer_num,
            "start_layer": self.start_layer,
            "swa_layer_ids": self.swa_layer_ids,
        }

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy full rows at ``indices``, and window rows of the tokens that have a window slot.

        Snapshot: part ``swa_mask`` (bool, one per index: had a window slot), child ``full`` (an
        MHA snapshot of every index) and child ``swa`` (an MHA snapshot of the masked tokens'
        window rows, in index order; 0 tokens when none is masked). ``mamba_indices`` is
        ignored: this pool holds no recurrent state, so an engine serving an SWA + Mamba model
        saves that state itself.
        """
        del mamba_indices  # no recurrent state in this pool: the engine keeps it
        slots = check_slots(
            indices, limit=self.full_pool.rows, allow_duplicates=False, device=self.device
        )
        window = self._mapping()[slots]
        mask = window > 0
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=slots.numel(),
            parts={"swa_mask": mask.cpu()},
            children={
                "full": self.full_pool.get_cpu_copy(slots),
                "swa": self.swa_pool.get_cpu_copy(window[mask]),
            },
            meta=self._meta(),
        )

    def check_cpu_copy(self, snapshot: object, indices: torch.Tensor) -> CheckedSWASnapshot:
        """Check a snapshot and its new ``indices`` without writing anything.

        Everything but the presence of window slots is checked here, so the SWA allocator can
        run this, then give the masked tokens window slots, then load.
        """
        slots = check_slots(
            indices, limit=self.full_pool.rows, allow_duplicates=False, device=self.device
        )
        n = slots.numel()
        snap = expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts={"swa_mask": ((n,), torch.bool)},
            meta=self._meta(),
        )
        if set(snap.children) != set(_CHILDREN):
            raise SnapshotMismatchError(
                f"snapshot has children {sorted(snap.children)}; an SWA snapshot has "
                f"{list(_CHILDREN)}"
            )
        mask = snap.parts["swa_mask"].to(self.device)
        full = self.full_pool.check_snapshot(snap.children["full"], n)
        swa = self.swa_pool.check_snapshot(snap.children["swa"], int(mask.sum()))
        return CheckedSWASnapshot(slots, mask, full, swa, snapshot, indices)

    @contextmanager
    def trusting(self, checked: CheckedSWASnapshot) -> Iterator[None]:
        """Within the block, ``load_cpu_copy`` of the very snapshot and indices that ``checked``
        was made from writes them without checking them again.

        Why: the SWA allocator checks a reload once (``check_cpu_copy``), gives the masked
        tokens their window slots, then calls ``load_cpu_copy`` with the arguments it was given
        (the contract: an allocator forwards offload calls as they are). The trust lasts for
        the block only, and any other snapshot or indices are checked as usual."""
        self._trusted = checked
        try:
            yield
        finally:
            self._trusted = None

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write the full rows at ``indices`` and the saved window rows at their window slots.

        Every masked token must already have a window slot in the mapping; this pool does not
        hand out slots. Load through the SWA allocator's ``load_cpu_copy``, which re-creates
        exactly the masked tokens' window slots first. A masked token without a window slot
        raises `AllocatorError` before any write (dropping its saved rows silently would
        leave the window attending to garbage). Unmasked tokens' window slots, if they have
        any, are left as they are. ``mamba_indices`` is ignored (see `get_cpu_copy`).
        """
        del mamba_indices  # no recurrent state in this pool (see get_cpu_copy)
        trusted = self._trusted
        if trusted is not None and trusted.snapshot is snapshot and trusted.indices is indices:
            self.load_checked(trusted)  # the allocator checked these very arguments
        else:
            self.load_checked(self.check_cpu_copy(snapshot, indices))

    def load_checked(self, checked: CheckedSWASnapshot) -> None:
        """Write a snapshot that `check_cpu_copy` accepted, without checking it again:
        the SWA allocator checks a reload once, gives the masked tokens window slots, then
        loads through this. What is checked here is what the allocator's step may change: every
        masked token has a window slot, and no two share one."""
        target = self._mapping()[checked.slots][checked.mask]
        missing = target <= 0
        if bool(missing.any()):
            raise AllocatorError(
                f"{int(missing.sum())} of the {target.numel()} tokens saved with a window slot "
                "have no window slot at their new index; load through the SWA allocator "
                "(it re-creates them) or allocate window slots first"
            )
        # A corrupted mapping (two full slots sharing a window slot) must not scatter twice.
        target = check_slots(
            target,
            limit=self.swa_pool.rows,
            name="window slots",
            allow_duplicates=False,
            device=self.device,
        )
        self.full_pool.load_checked(checked.full, checked.slots)
        self.swa_pool.load_checked(checked.swa, target)
