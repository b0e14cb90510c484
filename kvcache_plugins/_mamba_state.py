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
        self.load_checked(self.check_snapshot(snapshot, slots.numel()), slots)

    def load_checked(self, snapshot: KVSnapshot, slots: torch.Tensor) -> None:
        """Write states that ``check_snapshot`` returned into request slots that
        ``check_request_slots`` returned; nothing is checked again (the hybrid pool checks a
        whole reload once, before its first write)."""
        for name, buf in self._buffers.items():
            buf.scatter(slots, snapshot.parts[name])


class MambaSlotAllocator(FreeGroup):
    """Request slots ``1..size`` for Mamba state: a host stack of free ids with a top pointer.

    ``alloc`` hands out the lowest ids first on a fresh allocator and is never partial; freeing
    slot 0, an id twice, or an id that is already free raises `DoubleFreeError` before
    anything changes. Frees are checked on the spot (no queue): a request frees one slot, so
    there is nothing to batch. Free groups and backup/restore behave as the token allocators'
    do, so an engine can evict and roll back request slots along with token slots.

    **Alloc groups.** ``alloc_group_begin(num_reqs)`` reserves ``num_reqs`` slots for a batch
    of new requests; ``alloc(n)`` then hands them out in order (lowest ids first on a fresh
    allocator) while the reservation has ``n`` left, and ``alloc_group_end()`` puts the rest
    back on the free list, in their order, so a group that handed out nothing leaves the
    allocator as it found it. Why reserve: a scheduler admits a batch once, then allocates
    per request; the reservation makes each of those ``alloc(1)`` calls succeed whatever runs
    in between. Choices, each so that a mistake is seen where it is made:

    - reserving more than ``available_size()`` raises `AllocatorError` (nothing
      reserved, no group opened) rather than returning None: the begin has no result an engine
      would look at, and a silent shortfall would surface later as one ``alloc(1)`` failing in
      the middle of the batch;
    - a begin inside an open group, an end without a begin, or a ``num_reqs`` that is not an
      int >= 0 raise `AllocatorError` and change nothing;
    - while a group is open, ``available_size()`` counts the free list only (the reserved
      slots are spoken for; `alloc_group_reserved` counts them), an ``alloc(n)`` that the
      reservation cannot cover takes from the free list as outside a group (the reservation
      is a floor for the batch, not a cap), and freeing a reserved slot that was not handed
      out is a `DoubleFreeError` (it is not allocated);
    - ``backup_state`` records the open group and what is left of its reservation, and
      ``restore_state`` brings that back exactly (a backup taken before the begin closes the
      group again); ``clear()`` frees every slot and closes the group.
    """

    def __init__(self, size: int, device: torch.device | str = "cpu") -> None:
        if size <= 0:
            raise AllocatorError(f"size must be positive, got {size}")
        self.size = size
        self.device = torch.device(device)
        self._stack = torch.empty(size, dtype=torch.int64)
        self._is_free = torch.zeros(size + 1, dtype=torch.bool)
        self._is_reserved = torch.zeros(size + 1, dtype=torch.bool)
        #: The open alloc group's slots not handed out yet (host, in hand-out order), or None.
        self._reserved: torch.Tensor | None = None
        self._top = 0
        self.clear()

    def available_size(self) -> int:
        """Free request slots, not counting those an open alloc group reserved."""
        return self._top

    def alloc_group_reserved(self) -> int:
        """Slots the open alloc group reserved and has not handed out yet (0 without a group)."""
        return 0 if self._reserved is None else self._reserved.numel()

    def _pop(self, n: int) -> torch.Tensor:
        """The next ``n`` free ids off the stack (the caller checked ``n <= top``)."""
        ids = self._stack[self._top - n : self._top].flip(0)
        self._top -= n
        return ids

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size < 0:
            raise AllocatorError(f"need_size must be >= 0, got {need_size}")
        reserved = self._reserved
        if reserved is not None and need_size and need_size <= reserved.numel():
            ids = reserved[:need_size]
            self._reserved = reserved[need_size:]
            self._is_reserved[ids] = False
        elif need_size > self._top:
            return None
        else:
            ids = self._pop(need_size)
        self._is_free[ids] = False
        return ids if self.device == _CPU else ids.to(self.device)

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Reserve ``num_reqs`` slots that the following ``alloc`` calls hand out (see the
        class doc); raises `AllocatorError` when fewer are free or a group is open."""
        if not isinstance(num_reqs, int) or isinstance(num_reqs, bool) or num_reqs < 0:
            raise AllocatorError(f"num_reqs must be an int >= 0, got {num_reqs!r}")
        if self._reserved is not None:
            raise AllocatorError(
                "alloc_group_begin called while an alloc group is open "
                f"({self._reserved.numel()} slot(s) still reserved); call alloc_group_end first"
            )
        if num_reqs > self._top:
            raise AllocatorError(
                f"alloc_group_begin({num_reqs}): only {self._top} request slot(s) are free; "
                "nothing was reserved"
            )
        ids = self._pop(num_reqs).clone()  # owned: the stack is written in place
        self._is_free[ids] = False
        self._is_reserved[ids] = True
        self._reserved = ids

    def alloc_group_end(self) -> None:
        """Close the open alloc group and put its slots not handed out back on the free list
        (the next ``alloc`` hands them out first, in the same order)."""
        reserved = self._reserved
        if reserved is None:
            raise AllocatorError("alloc_group_end called without alloc_group_begin")
        self._reserved = None
        n = reserved.numel()
        if n:
            self._stack[self._top : self._top + n] = reserved.flip(0)
            self._top += n
            self._is_reserved[reserved] = False
            self._is_free[reserved] = True

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
        self._free_now(indices)

    def _free_now(self, indices: torch.Tensor) -> None:
        """Check and apply one free call, never collecting it: the group's own flush and end
        come here, so a flush inside an open group (``backup_state``) really frees."""
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
        reserved = self._is_reserved[ids]
        if bool(reserved.any()):
            raise DoubleFreeError(
                f"request slot {int(ids[reserved][0])} is reserved by the open alloc group and "
                "was not handed out: it is not allocated"
            )
        n = ids.numel()
        self._stack[self._top : self._top + n] = ids.flip(0)
        self._top += n
        self._is_free[ids] = True

    def _free_calls(self, calls: list[torch.Tensor]) -> None:
        """End of a free group: each call checked and applied on its own; one error at the end
        for the first bad call, every good one applied."""
        free_calls_one_by_one(calls, self._free_now)

    def backup_state(self) -> object:
        """The free slots, copied (the stack is written in place, so a reference would not
        do), and the open alloc group's reservation (None: no group open)."""
        self._flush_group()
        reserved = None if self._reserved is None else self._reserved.clone()
        return ("mamba-slot-allocator", id(self), self._stack[: self._top].clone(), reserved)

    def restore_state(self, state: object) -> None:
        """Bring back the free slots and the alloc group of ``state`` (undoing every alloc,
        free, begin and end since)."""
        if not (
            isinstance(state, tuple)
            and len(state) == 4
            and state[:2] == ("mamba-slot-allocator", id(self))
            and isinstance(state[2], torch.Tensor)
            and (state[3] is None or isinstance(state[3], torch.Tensor))
        ):
            raise AllocatorError("restore_state got a state this allocator did not back up")
        free, reserved = state[2], state[3]
        self._forget_collected()
        self._top = free.numel()
        self._stack[: self._top] = free
        self._is_free.fill_(False)
        self._is_free[free] = True
        self._is_reserved.fill_(False)
        self._reserved = None if reserved is None else reserved.clone()
        if reserved is not None:
            self._is_reserved[reserved] = True

    def clear(self) -> None:
        """Every request slot but 0 free again; an open alloc group is closed."""
        self._group = None
        self._reserved = None
        self._is_reserved.fill_(False)
        torch.arange(self.size, 0, -1, out=self._stack)
        self._is_free.fill_(True)
        self._is_free[0] = False
        self._top = self.size
