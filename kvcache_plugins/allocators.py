"""Token and paged slot allocators.

Bookkeeping lives on the host in preallocated tensors: a stack of free ids with a top pointer
(O(1) amortised per id, no allocation per call) and a ``is_free`` mask that makes double frees
detectable in O(n) for n freed ids. ``free`` never synchronises an accelerator: ids that arrive on
a GPU are queued and validated the next time the allocator must know its free set (``alloc``,
``available_size``, ``backup_state``), while host ids are validated on the spot.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    AllocatorError,
    DoubleFreeError,
    InvalidSlotError,
    KVPool,
    KVSnapshot,
    OffloadablePool,
)

__all__ = ["PagedSlotAllocator", "TokenSlotAllocator"]

_CPU = torch.device("cpu")


class _FreeIds:
    """Free ids ``1..count`` as a stack; ``take`` returns the lowest ids first on a fresh stack."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.stack = torch.empty(count, dtype=torch.int64)
        self.is_free = torch.zeros(count + 1, dtype=torch.bool)
        self._first = torch.empty(count + 1, dtype=torch.int64)  # scratch for de-duplication
        self.top = 0
        self.reset()

    def reset(self) -> None:
        torch.arange(self.count, 0, -1, out=self.stack)
        self.is_free.fill_(True)
        self.is_free[0] = False
        self.top = self.count

    def take(self, n: int) -> torch.Tensor:
        ids = self.stack[self.top - n : self.top].flip(0)
        self.top -= n
        self.is_free[ids] = False
        return ids

    def first_occurrences(self, ids: torch.Tensor) -> torch.Tensor:
        """Mask of the first occurrence of every id in ``ids`` (O(len(ids)))."""
        order = torch.arange(ids.numel(), dtype=torch.int64)
        self._first.index_fill_(0, ids, ids.numel())
        self._first.scatter_reduce_(0, ids, order, reduce="amin")
        return self._first[ids] == order

    def give_back(self, ids: torch.Tensor, *, what: str, dedupe: bool) -> None:
        """Return ``ids`` (host int64, 1-D) to the stack after checking every one of them."""
        if ids.numel() == 0:
            return
        low, high = int(ids.min()), int(ids.max())
        if low < 1 or high > self.count:
            bad = low if low < 1 else high
            if bad == 0:
                raise DoubleFreeError(f"{what} 0 is reserved and is never allocated")
            raise InvalidSlotError(f"cannot free {what} {bad}: valid {what}s are 1..{self.count}")
        first = self.first_occurrences(ids)
        if dedupe:
            ids = ids[first]
        elif not bool(first.all()):
            dup = int(ids[~first][0])
            raise DoubleFreeError(f"{what} {dup} is freed twice in one call")
        already = self.is_free[ids]
        if bool(already.any()):
            raise DoubleFreeError(f"{what} {int(ids[already][0])} is already free (double free)")
        n = ids.numel()
        self.stack[self.top : self.top + n] = ids.flip(0)
        self.top += n
        self.is_free[ids] = True

    def snapshot(self) -> tuple[torch.Tensor, int]:
        return self.stack[: self.top].clone(), self.top

    def restore(self, state: tuple[torch.Tensor, int]) -> None:
        stack, top = state
        self.stack[:top] = stack
        self.top = top
        self.is_free.fill_(False)
        self.is_free[stack] = True


class PagedSlotAllocator:
    """Hands out whole pages of ``page_size`` slots; ``page_size=1`` is a token allocator.

    Page ``p`` covers slots ``[p * P, (p + 1) * P)``; page 0 (slot 0 and its page) is reserved.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        kvcache: KVPool,
        device: torch.device | str | None = None,
    ) -> None:
        if size <= 0 or page_size <= 0:
            raise AllocatorError(f"size and page_size must be positive, got {size}, {page_size}")
        if size % page_size:
            raise AllocatorError(f"size {size} is not a multiple of page_size {page_size}")
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.device = torch.device(device) if device is not None else kvcache.device
        self._kvcache = kvcache
        self._free = _FreeIds(self.num_pages)
        self._pending: list[torch.Tensor] = []
        self._group: list[torch.Tensor] | None = None
        self._offsets = torch.arange(page_size, dtype=torch.int64)

    # -- bookkeeping -----------------------------------------------------------------------
    def _settle(self) -> None:
        """Validate and return the frees that arrived on an accelerator (one sync, here)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._give_back(torch.cat([p.to(_CPU) for p in pending]))

    def _give_back(self, slots: torch.Tensor) -> None:
        if self.page_size == 1:
            self._free.give_back(slots, what="slot", dedupe=False)
        else:
            if bool((slots == 0).any()):
                raise DoubleFreeError("slot 0 is reserved and is never allocated")
            self._free.give_back(slots // self.page_size, what="page", dedupe=True)

    def _slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def _out(self, slots: torch.Tensor) -> torch.Tensor:
        return slots if self.device == _CPU else slots.to(self.device)

    def available_size(self) -> int:
        """Free tokens: free pages times the page size."""
        self._settle()
        return self._free.top * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (whole pages), or None when they do not fit; never partial."""
        if need_size < 0:
            raise AllocatorError(f"need_size must be >= 0, got {need_size}")
        if need_size % self.page_size:
            raise AllocatorError(
                f"need_size {need_size} is not a multiple of page_size {self.page_size}; "
                "use alloc_extend/alloc_decode for partial pages"
            )
        self._settle()
        pages = need_size // self.page_size
        if pages > self._free.top:
            return None
        return self._out(self._slots_of(self._free.take(pages)))

    def free(self, indices: torch.Tensor) -> None:
        """Release slots (their whole pages). Host ids are checked now, device ids lazily."""
        if not isinstance(indices, torch.Tensor):
            raise InvalidSlotError(f"indices must be a tensor, got {type(indices).__name__}")
        if indices.numel() == 0:
            return
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            raise InvalidSlotError(f"indices must have an integer dtype, got {indices.dtype}")
        if self._group is not None:
            self._group.append(indices)
        elif indices.device.type == "cpu":
            self._give_back(indices.reshape(-1).to(torch.int64))
        else:
            self._pending.append(indices.reshape(-1).to(torch.int64))

    def free_group_begin(self) -> None:
        """Collect frees until :meth:`free_group_end`, which releases them in one call."""
        if self._group is not None:
            raise AllocatorError("free_group_begin called twice without free_group_end")
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group is None:
            raise AllocatorError("free_group_end called without free_group_begin")
        if group:
            self.free(torch.cat([g.reshape(-1).to(_CPU, torch.int64) for g in group]))

    def backup_state(self) -> object:
        """A state that :meth:`restore_state` brings back exactly (undoing allocs and frees)."""
        self._settle()
        return ("paged-slot-allocator", id(self), self._free.snapshot())

    def restore_state(self, state: object) -> None:
        if not (
            isinstance(state, tuple)
            and len(state) == 3
            and state[:2]
            == (
                "paged-slot-allocator",
                id(self),
            )
        ):
            raise AllocatorError("restore_state got a state this allocator did not back up")
        self._pending.clear()
        self._free.restore(state[2])

    def clear(self) -> None:
        """Free every slot but the reserved slot 0."""
        self._pending.clear()
        self._group = None
        self._free.reset()

    def get_kvcache(self) -> KVPool:
        return self._kvcache

    # -- paged allocation ------------------------------------------------------------------
    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots for extending each request from ``prefix_len`` to ``seq_len`` tokens.

        Each request first fills the rest of its partial page (from ``last_loc + 1``), then takes
        whole new pages. Returns the concatenated slots, or None (consuming nothing) when the new
        pages do not fit.
        """
        prefixes = [int(x) for x in prefix_lens.reshape(-1).tolist()]
        seqs = [int(x) for x in seq_lens.reshape(-1).tolist()]
        lasts = [int(x) for x in last_loc.reshape(-1).tolist()]
        if not len(prefixes) == len(seqs) == len(lasts):
            raise AllocatorError("prefix_lens, seq_lens and last_loc must have the same length")
        total = sum(s - p for p, s in zip(prefixes, seqs, strict=True))
        if total != extend_num_tokens:
            raise AllocatorError(
                f"extend_num_tokens is {extend_num_tokens} "
                f"but seq_lens - prefix_lens sum to {total}"
            )
        P = self.page_size
        plan: list[tuple[int, int, int]] = []  # (first partial slot, partial count, new tokens)
        new_pages = 0
        for p, s, last in zip(prefixes, seqs, lasts, strict=True):
            if s < p or p < 0:
                raise AllocatorError(f"seq_len {s} is shorter than prefix_len {p}")
            partial = min((-p) % P, s - p)
            if partial:
                self._check_last_loc(last, p)
            rest = s - p - partial
            plan.append((last + 1, partial, rest))
            new_pages += -(-rest // P)
        self._settle()
        if new_pages > self._free.top:
            return None
        pages = self._free.take(new_pages)
        out: list[torch.Tensor] = []
        cursor = 0
        for start, partial, rest in plan:
            if partial:
                out.append(torch.arange(start, start + partial, dtype=torch.int64))
            if rest:
                k = -(-rest // P)
                out.append(self._slots_of(pages[cursor : cursor + k])[:rest])
                cursor += k
        result = torch.cat(out) if out else torch.empty(0, dtype=torch.int64)
        return self._out(result)

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One slot per request; ``seq_lens`` include the new token."""
        seqs = [int(x) for x in seq_lens.reshape(-1).tolist()]
        lasts = [int(x) for x in last_loc.reshape(-1).tolist()]
        if len(seqs) != len(lasts):
            raise AllocatorError("seq_lens and last_loc must have the same length")
        P = self.page_size
        needs_page = [(s - 1) % P == 0 for s in seqs]
        for s, last, fresh in zip(seqs, lasts, needs_page, strict=True):
            if s < 1:
                raise AllocatorError(f"seq_len must be >= 1 for decode, got {s}")
            if not fresh:
                self._check_last_loc(last, s - 1)
        self._settle()
        if sum(needs_page) > self._free.top:
            return None
        pages = self._free.take(sum(needs_page)).tolist()
        result = [
            pages.pop(0) * P if fresh else last + 1
            for last, fresh in zip(lasts, needs_page, strict=True)
        ]
        return self._out(torch.tensor(result, dtype=torch.int64))

    def _check_last_loc(self, last: int, tokens_before: int) -> None:
        """A request's last slot must sit where its length says, or the pool is corrupted."""
        P = self.page_size
        if last < P or last >= self.size + P or last % P != (tokens_before - 1) % P:
            raise AllocatorError(
                f"last_loc {last} cannot be the last slot of a request holding "
                f"{tokens_before} tokens with page_size {P}"
            )
        if bool(self._free.is_free[last // P]):
            raise AllocatorError(f"last_loc {last} lies in page {last // P}, which is free")

    # -- offload pass-through (every argument forwarded, by keyword) ------------------------
    def _offloadable(self) -> OffloadablePool:
        pool = self._kvcache
        if not isinstance(pool, OffloadablePool):
            raise TypeError(f"{type(pool).__name__} does not support offload")
        return pool

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._offloadable().get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._offloadable().load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)


class TokenSlotAllocator(PagedSlotAllocator):
    """Slot-granular allocator (page size 1): the free list starts as ``1..size``."""

    def __init__(
        self, size: int, kvcache: KVPool, device: torch.device | str | None = None
    ) -> None:
        super().__init__(size, 1, kvcache, device)
