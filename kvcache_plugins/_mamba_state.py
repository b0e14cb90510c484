"""Per-request recurrent state (``MambaPool``) and the request slots it is indexed by.

A Mamba layer keeps no per-token KV: it keeps, per *request*, a few conv states (the last inputs
of its short convolutions) and one temporal (SSM) state, overwritten at every step. So this pool
is indexed by request slots ``1..size`` (slot 0 is padding, as for tokens), and its offload
copies whole request states, not token rows.

Layout: one buffer per state kind, ``[num_mamba_layers, size + 1, *state_shape]`` (conv states
first, in ``conv_state_shapes`` order, then the temporal state), so an offload is one batched
gather per buffer whatever the number of layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvcache_core import (
    AllocatorError,
    DoubleFreeError,
    FreeGroup,
    InvalidLayerError,
    InvalidSlotError,
    KVSnapshot,
    LayerRows,
    check_slots,
    expect_snapshot,
    free_calls_one_by_one,
)

__all__ = ["MambaPool", "MambaSlotAllocator"]

_CPU = torch.device("cpu")


class MambaPool:
    """Conv and temporal state for ``size`` request slots of the layers ``mamba_layer_ids``.

    Layer ids are the model's global ids: a hybrid model's Mamba layers are interleaved with
    attention layers, and the engine addresses both with the same numbering.
    """

    kind = "mamba-state"

    def __init__(
        self,
        size: int,
        mamba_layer_ids: Sequence[int],
        conv_state_shapes: Sequence[Sequence[int]],
        temporal_state_shape: Sequence[int],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        ids = tuple(sorted(int(i) for i in mamba_layer_ids))
        if size <= 0 or not ids or len(set(ids)) != len(ids) or ids[0] < 0:
            raise ValueError(
                f"a Mamba pool needs size > 0 and distinct non-negative layer ids, got "
                f"size={size}, mamba_layer_ids={list(mamba_layer_ids)}"
            )
        shapes = [tuple(int(d) for d in s) for s in (*conv_state_shapes, temporal_state_shape)]
        if any(not s or min(s) <= 0 for s in shapes):
            raise ValueError(f"state shapes must be non-empty and positive, got {shapes}")
        self.size = size
        self.dtype = dtype
        self.device = torch.device(device)
        self.mamba_layer_ids = ids
        self._local = {g: i for i, g in enumerate(ids)}
        rows = size + 1
        self._conv = [LayerRows(len(ids), rows, s, dtype, self.device) for s in shapes[:-1]]
        self._temporal = LayerRows(len(ids), rows, shapes[-1], dtype, self.device)
        self._buffers = {f"conv{i}": b for i, b in enumerate(self._conv)}
        self._buffers["temporal"] = self._temporal

    @property
    def rows(self) -> int:
        """Rows per buffer: ``size`` request slots plus the padding slot 0."""
        return self.size + 1

    def get_state_size_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def get_mamba_state(self, layer_id: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``(conv states, temporal state)`` of one layer, each ``[size + 1, *shape]`` (views)."""
        local = self._local.get(layer_id)
        if local is None:
            raise InvalidLayerError(
                f"layer {layer_id} is not a Mamba layer "
                f"(Mamba layers: {list(self.mamba_layer_ids)})"
            )
        return tuple(c.layer(local) for c in self._conv), self._temporal.layer(local)

    def check_request_slots(
        self, indices: object, *, name: str = "mamba_indices", allow_duplicates: bool = False
    ) -> torch.Tensor:
        """Request slots ``1..size`` as 1-D int64 on this pool's device (a 0-d slot is fine)."""
        return check_slots(
            indices,
            limit=self.rows,
            name=name,
            allow_duplicates=allow_duplicates,
            device=self.device,
        )

    def clear_slots(self, indices: torch.Tensor) -> None:
        """Zero the state of newly allocated request slots (a new request starts from zero)."""
        slots = self.check_request_slots(indices, name="indices", allow_duplicates=True)
        for buf in self._buffers.values():
            buf.data.index_fill_(1, slots, 0)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Fork state: ``dst[i]`` gets ``src[i]``'s state in every layer (e.g. a cached prefix)."""
        source = self.check_request_slots(src, name="src", allow_duplicates=True)
        target = self.check_request_slots(dst, name="dst")
        if source.numel() != target.numel():
            raise InvalidSlotError(f"copy_slots: {target.numel()} targets for {source.numel()}")
        for buf in self._buffers.values():
            buf.data.index_copy_(1, target, buf.data.index_select(1, source))

    # -- offload (``indices`` are request slots here) -------------------------------------------
    @staticmethod
    def _no_mamba_indices(mamba_indices: torch.Tensor | None) -> None:
        if mamba_indices is not None:
            raise InvalidSlotError(
                "a MambaPool's `indices` already are request slots: pass them as `indices` and "
                "leave `mamba_indices` None (the hybrid pool takes them as `mamba_indices`)"
            )

    def _meta(self) -> dict[str, object]:
        return {"mamba_layer_ids": self.mamba_layer_ids}

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy the state of request slots ``indices`` (one gather per buffer)."""
        self._no_mamba_indices(mamba_indices)
        slots = self.check_request_slots(indices, name="indices")
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=slots.numel(),
            parts={name: buf.gather(slots) for name, buf in self._buffers.items()},
            meta=self._meta(),
        )

    def check_snapshot(self, snapshot: object, slot_count: int) -> KVSnapshot:
        """Check that ``snapshot`` holds ``slot_count`` request states of this layout."""
        n = slot_count
        return expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts={name: buf.part_layout(n) for name, buf in self._buffers.items()},
            meta=self._meta(),
        )

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write saved states into the new request slots ``indices`` (same count and order)."""
        self._no_mamba_indices(mamba_indices)
        slots = self.check_request_slots(indices, name="indices")
        snap = self.check_snapshot(snapshot, slots.numel())
        for name, buf in self._buffers.items():
            buf.scatter(slots, snap.parts[name])


class MambaSlotAllocator(FreeGroup):
    """Request slots ``1..size`` for Mamba state: a host stack of free ids with a top pointer.

    ``alloc`` hands out the lowest ids first on a fresh allocator and is never partial; freeing
    slot 0, an id twice, or an id that is already free raises :class:`DoubleFreeError` before
    anything changes. Frees are checked on the spot (no queue): a request frees one slot, so
    there is nothing to batch. Free groups and backup/restore behave as the token allocators'
    do, so an engine can evict and roll back request slots along with token slots.
    """

    def __init__(self, size: int, device: torch.device | str = "cpu") -> None:
        if size <= 0:
            raise AllocatorError(f"size must be positive, got {size}")
        self.size = size
        self.device = torch.device(device)
        self._stack = torch.empty(size, dtype=torch.int64)
        self._is_free = torch.zeros(size + 1, dtype=torch.bool)
        self._top = 0
        self.clear()

    def available_size(self) -> int:
        return self._top

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size < 0:
            raise AllocatorError(f"need_size must be >= 0, got {need_size}")
        if need_size > self._top:
            return None
        ids = self._stack[self._top - need_size : self._top].flip(0)
        self._top -= need_size
        self._is_free[ids] = False
        return ids if self.device == _CPU else ids.to(self.device)

    def free(self, indices: torch.Tensor) -> None:
        """Release request slots; a bad call raises and changes nothing."""
        if not isinstance(indices, torch.Tensor):
            raise InvalidSlotError(f"indices must be a tensor, got {type(indices).__name__}")
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            raise InvalidSlotError(f"indices must have an integer dtype, got {indices.dtype}")
        if indices.numel() == 0:
            return
        if self._collect(indices):
            return
        ids = indices.reshape(-1).to(_CPU, torch.int64)
        low, high = int(ids.min()), int(ids.max())
        if low == 0:
            raise DoubleFreeError("request slot 0 is reserved padding and is never allocated")
        if low < 0 or high > self.size:
            raise InvalidSlotError(
                f"cannot free request slot {low if low < 0 else high}: valid are 1..{self.size}"
            )
        if torch.unique(ids).numel() != ids.numel():
            ordered = torch.sort(ids).values
            twice = int(ordered[1:][ordered[1:] == ordered[:-1]][0])
            raise DoubleFreeError(f"request slot {twice} is freed twice in one call")
        already = self._is_free[ids]
        if bool(already.any()):
            raise DoubleFreeError(f"request slot {int(ids[already][0])} is already free")
        n = ids.numel()
        self._stack[self._top : self._top + n] = ids.flip(0)
        self._top += n
        self._is_free[ids] = True

    def _free_calls(self, calls: list[torch.Tensor]) -> None:
        """End of a free group: each call checked and applied on its own; one error at the end
        for the first bad call, every good one applied."""
        free_calls_one_by_one(calls, self.free)

    def backup_state(self) -> object:
        """The free slots, copied: the stack is written in place, so a reference would not do."""
        self._flush_group()
        return ("mamba-slot-allocator", id(self), self._stack[: self._top].clone())

    def restore_state(self, state: object) -> None:
        """Bring back the free slots of ``state`` (undoing every alloc and free since)."""
        if not (
            isinstance(state, tuple)
            and len(state) == 3
            and state[:2] == ("mamba-slot-allocator", id(self))
            and isinstance(state[2], torch.Tensor)
        ):
            raise AllocatorError("restore_state got a state this allocator did not back up")
        free = state[2]
        self._forget_collected()
        self._top = free.numel()
        self._stack[: self._top] = free
        self._is_free.fill_(False)
        self._is_free[free] = True

    def clear(self) -> None:
        """Every request slot but 0 free again."""
        self._group = None
        torch.arange(self.size, 0, -1, out=self._stack)
        self._is_free.fill_(True)
        self._is_free[0] = False
        self._top = self.size
