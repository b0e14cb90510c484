"""The HiSparse allocator: logical and device ``PagedSlotAllocator``s plus the table between.

Residency is granted **by page**: a logical page is either not resident (its table entries are
-1) or owns one device page, and slot ``lp * P + o`` maps to ``dp * P + o`` for every offset
``o``. Keeping offsets and whole pages is what lets a request's partial last page keep filling on
both sides, and lets a device page be freed without leaving a second owner pointing into it.
The allocator's own truth is a host page table (no device sync to decide anything); every change
is mirrored into the token-level device table the pool and kernels read.

``alloc``, ``alloc_extend`` and ``alloc_decode`` return logical slots that are also resident (new
tokens are written through to the device), or None, consuming nothing, unless both sides fit;
``available_size`` is therefore the smaller side. The extras: ``alloc_logical_only``,
``alloc_device`` (make already-allocated logical slots resident), ``free_device``.

Freeing follows the logical side's verdict. ``free`` drops residency in the device table at once
(the pages may not be read through it any more), without reading the ids back (no host sync);
the host page table still names the device pages until the logical side, which checks its
queued calls in a batch, reports each call's verdict when it settles (``settle_held``): an
applied call's device pages are freed and its pages leave the host table, a rejected call's
device table rows are put back. So a bad free found late (at the queue bound, in a free group)
neither leaks device pages nor leaves a free logical page marked resident. A free logical page
is never resident once its free settled, which is why ``alloc`` can make its fresh pages
resident without looking them up. The holding, free groups and the backup token are
[`CompositeAllocator`][kvcache_core.CompositeAllocator]'s.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    AllocatorError,
    CompositeAllocator,
    ForwardsOffload,
    HiSparsePool,
    KVPool,
    PagedSlotAllocator,
    SettledCall,
    check_slots,
)

__all__ = ["HiSparseSlotAllocator", "empty_logical_to_device"]

_CPU = torch.device("cpu")


def empty_logical_to_device(rows: int, device: torch.device) -> torch.Tensor:
    """A table for ``rows`` logical slots with nothing resident: all -1, but padding slot 0 maps
    to device slot 0, and one trailing -1 so that translating -1 (no last slot) gives -1."""
    table = torch.full((rows + 1,), -1, dtype=torch.int64, device=device)
    table[0] = 0
    return table


class HiSparseSlotAllocator(CompositeAllocator[None], ForwardsOffload):
    """Allocates logical slots of a `HiSparsePool` and manages their device residency."""

    def __init__(self, kvcache: HiSparsePool, device: torch.device | str | None = None) -> None:
        self._kvcache = kvcache
        self.size = kvcache.size
        self.page_size = kvcache.page_size
        self.device_size = kvcache.device_size
        self.device = torch.device(device) if device is not None else kvcache.device
        self._logical = PagedSlotAllocator(self.size, self.page_size, kvcache, self.device)
        self._device = PagedSlotAllocator(self.device_size, self.page_size, kvcache, self.device)
        super().__init__(self._logical)  # its verdicts decide every free
        self._offsets = torch.arange(self.page_size, dtype=torch.int64)
        # Host truth: logical page -> device page (-1 = not resident); page 0 is padding.
        self._page_map = torch.full((self.size // self.page_size + 1,), -1, dtype=torch.int64)
        self._page_map[0] = 0
        self.logical_to_device = empty_logical_to_device(self.size + self.page_size, kvcache.device)
        kvcache.register_logical_to_device(self.logical_to_device)
        # Page size 1 with the table on the host: a free drops residency by the call's ids
        # directly (see hold); the padding row 0 is put back to 0 afterwards.
        on_host = kvcache.device.type == "cpu" and self.page_size == 1
        self._direct_table = self.logical_to_device  # the fast path serves this table only
        self._direct_rows = self.logical_to_device[:-1] if on_host else None
        self._padding_row = self.logical_to_device[:1]
        # what those rows become (index_copy_ refuses negative ids; index_fill_ would wrap them)
        self._no_device = torch.full((min(self.size + 1, 16384) if on_host else 0,), -1)

    # -- sizes -----------------------------------------------------------------------------
    def available_size(self) -> int:
        """Tokens ``alloc`` can hand out now: new tokens need a logical and a device slot."""
        return min(self._logical.available_size(), self._device.available_size())

    def logical_available_size(self) -> int:
        return self._logical.available_size()

    def device_available_size(self) -> int:
        """Free device slots, counting those of queued logical frees (settled first)."""
        self._logical.check_frees()
        return self._device.available_size()

    def get_kvcache(self) -> KVPool:
        return self._kvcache

    def translate_loc_to_device(self, loc: torch.Tensor) -> torch.Tensor:
        return self._kvcache.translate_loc_to_device(loc)

    # -- residency bookkeeping --------------------------------------------------------------
    def _slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages  # a page is a slot
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def _non_resident(self, pages: torch.Tensor) -> torch.Tensor:
        pages = torch.unique(pages)
        # Page 0 is padding; out-of-range pages are left for the logical allocator to reject.
        pages = pages[(pages > 0) & (pages < self._page_map.numel())]
        return pages[self._page_map[pages] < 0]

    def _make_resident(self, pages: torch.Tensor, live: torch.Tensor | None = None) -> None:
        """Give each logical page in ``pages`` (host, non-resident, unique) a device page.
        Callers have checked that the device side has room.

        ``live`` names the pages (host) that already hold allocated tokens: their device pages
        are filled from the logical store, every slot of the page, before anyone can read them.
        Why: a device page comes back from the free list holding rows of its previous owner,
        and reads, offload and kernels all prefer the device row of a resident slot, so a page
        granted without its content would serve those stale rows as this request's KV (a
        partial last page evicted by ``free_device`` and re-granted by the next decode is the
        common case). Fresh pages are not filled: their tokens have no content yet and get
        their rows from the write that follows, which keeps decode's hot path free of copies.
        """
        if pages.numel() == 0:
            return
        dev_pages = self._device.take_pages(pages.numel())  # host ids: nothing read back
        if dev_pages is None:  # pragma: no cover - callers check room first
            raise AllocatorError("device side ran out of pages during a checked allocation")
        self._page_map.index_copy_(0, pages, dev_pages)
        table = self.logical_to_device
        table.index_copy_(
            0, self._slots_of(pages).to(table.device), self._slots_of(dev_pages).to(table.device)
        )
        if live is None or live.numel() == 0:
            return
        filled = torch.isin(pages, live)
        if bool(filled.any()):
            self._kvcache.load_to_device(
                self._slots_of(pages[filled]).to(table.device),
                self._slots_of(dev_pages[filled]).to(table.device),
            )

    def _continued_pages(self, lasts: list[int], continuing: list[bool]) -> torch.Tensor:
        """Host page ids of the last pages that requests continue into (they hold tokens)."""
        pages = [last // self.page_size for last, c in zip(lasts, continuing, strict=True) if c]
        return torch.tensor(pages, dtype=torch.int64)

    def _device_room(self, pages: int) -> bool:
        """Whether the device side has ``pages`` free pages. Queued frees are settled only when
        it is short (the logical side first: its verdicts release device pages), as the plain
        allocator's ``alloc`` does."""
        if self._device.has_room(pages):
            return True
        self._logical.check_frees()
        return self._device.has_room(pages)

    def _last_pages_needing_device(self, lasts: list[int], partial: list[bool]) -> int:
        pages = [last // self.page_size for last, p in zip(lasts, partial, strict=True) if p]
        if not pages:
            return 0
        return int(self._non_resident(torch.tensor(pages, dtype=torch.int64)).numel())

    # -- allocation ------------------------------------------------------------------------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` logical slots (whole pages), resident; None unless both sides fit.

        Every ``alloc*`` method validates its arguments before it looks at room: a bad call
        raises its own error whether or not the device is full, rather than returning a None
        that reads as "try again later".
        """
        pages = self._logical.pages_for(need_size)
        if not self._device_room(pages):
            return None
        pages_taken = self._logical.take_pages(pages)  # host ids: nothing read back
        if pages_taken is None:
            return None
        # Fresh whole pages, each once, none resident: a free logical page never is (its
        # residency goes when its free settles, and it is handed out only after that).
        self._make_resident(pages_taken)
        slots = self._slots_of(pages_taken)
        return slots if self.device.type == "cpu" else slots.to(self.device)

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Extend each request on the logical side; new pages, and a partial last page that is
        not resident, get device pages. None (nothing consumed) unless both sides fit.

        The logical side's plan checks the call first (lengths, ``extend_num_tokens``, each
        continued ``last_loc``), so a bad call raises even when the device is full."""
        plan = self._logical.plan_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        P = self.page_size
        lasts = [start - 1 for start, _, _ in plan.requests]
        partial = [count > 0 for _, count, _ in plan.requests]
        if not self._device_room(plan.new_pages + self._last_pages_needing_device(lasts, partial)):
            return None
        slots = self._logical.take_extend(plan)
        if slots is not None:
            pages = self._non_resident(slots.to(_CPU) // P)
            self._make_resident(pages, self._continued_pages(lasts, partial))
        return slots

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One logical slot per request (``seq_lens`` include it), resident."""
        plan = self._logical.plan_decode(seq_lens, last_loc)  # a stale last_loc raises here
        lasts = plan.last_locs
        continuing = [not f for f in plan.starts_page]
        needed = plan.new_pages + self._last_pages_needing_device(lasts, continuing)
        if not self._device_room(needed):
            return None
        slots = self._logical.take_decode(plan)
        if slots is not None:
            pages = self._non_resident(slots.to(_CPU) // self.page_size)
            self._make_resident(pages, self._continued_pages(lasts, continuing))
        return slots

    def alloc_logical_only(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` logical slots with no device residency (e.g. for reloaded history)."""
        return self._logical.alloc(need_size)

    def alloc_device(self, logical: torch.Tensor) -> torch.Tensor | None:
        """Make already-allocated logical slots resident (by page) and return their device
        slots, or None (nothing consumed) if the device lacks pages.

        The new device pages are filled from the logical store (whole pages: the other slots
        of a page become resident too), so they never serve rows of a previous owner.
        ``pool.load_to_device(logical, <these slots>)`` afterwards is no longer needed; it
        copies the same rows again."""
        slots = check_slots(logical, limit=self.size + self.page_size, name="logical")
        self._require_allocated(slots.to(_CPU))
        pages = self._non_resident(slots.to(_CPU) // self.page_size)
        if not self._device_room(pages.numel()):
            return None
        self._make_resident(pages, live=pages)
        return self.logical_to_device[slots.to(self.logical_to_device.device)]

    def _require_allocated(self, slots: torch.Tensor) -> None:
        """Raise unless every slot (host) lies in a handed-out logical page, queued frees
        settled first (a page freed a moment ago is free). Why: residency given to a free page
        would survive into its next allocation, which then skips the grant and its fill."""
        if slots.numel() == 0:
            return
        self._logical.check_frees()
        held = self._logical.allocated(slots)
        if not bool(held.all()):
            slot = int(slots[~held][0])
            what = "the reserved page 0" if slot < self.page_size else "a free page"
            raise AllocatorError(
                f"logical slot {slot} lies in {what}: alloc_device makes allocated logical "
                "slots resident (allocate them with alloc_logical_only first)"
            )

    def free_device(self, logical: torch.Tensor) -> None:
        """Drop the device residency of the pages holding ``logical``; the logical slots stay
        allocated and their content stays in the logical store."""
        slots = check_slots(logical, limit=self.size + self.page_size, name="logical")
        pages = torch.unique(slots.to(_CPU) // self.page_size)
        # A page whose free is still queued is resident in the host page table until the
        # settle: dropping it here frees its device page now, and the settle then finds it
        # non-resident, whatever its verdict (a rollback must not bring residency back).
        pages = pages[(pages > 0) & (self._page_map[pages] >= 0)]
        if pages.numel() == 0:
            return
        self._device.free(self._slots_of(self._page_map[pages]).to(self.device))
        self._page_map[pages] = -1
        table = self.logical_to_device
        table[self._slots_of(pages).to(table.device)] = -1

    def free(self, indices: torch.Tensor) -> None:
        """Free logical slots (their whole pages) and the device pages those pages held.

        No host sync: nothing here reads the ids back. The device table rows of the named
        pages become -1 at once, on the table's device, so nothing reads through them any
        more; ids out of range (or in page 0) take no part in that. The host page table and
        the device pages are settled with the logical side's verdicts (see the module doc):
        an applied call's device pages are freed, a rejected call's table rows are put back.
        Range, page 0 and double frees are checked there, at the next settle, like the plain
        allocator's. Pinned by tests/allocators/test_host_syncs.py.
        """
        super().free(indices)

    def hold(self, call: torch.Tensor) -> None:
        """Drop the device-table residency of the call's pages now (the host page table keeps
        naming their device pages until the verdict)."""
        direct = self._direct_rows
        n = call.numel()
        if (
            direct is not None
            and n <= self._no_device.numel()
            and self._direct_table is self.logical_to_device
        ):
            try:  # index_copy_ refuses an id out of range, negative ones too
                direct.index_copy_(0, call, self._no_device.narrow(0, 0, n))
            except (IndexError, RuntimeError):
                self._padding_row.fill_(0)  # the general path below leaves bad ids out
            else:
                self._padding_row.fill_(0)  # slot 0 (refused at the settle) stays padding
                return
        table = self.logical_to_device
        ids = call if call.device == table.device else call.to(table.device)
        P, limit = self.page_size, self.size + self.page_size
        valid = (ids >= P) & (ids < limit)  # page 0 is padding
        if P == 1:
            rows, keep = torch.where(valid, ids, 0), valid
        else:
            pages = torch.div(torch.where(valid, ids, 0), P, rounding_mode="floor")
            rows = (pages[:, None] * P + self._offsets.to(table.device)).reshape(-1)
            keep = valid.repeat_interleave(P)
        # Drop residency of valid rows; an invalid id was sent to page 0 and writes it back.
        table[rows] = torch.where(keep, -1, table[rows])

    def _set_residency(self, pages: torch.Tensor, dev_pages: torch.Tensor | None) -> None:
        """Host page table and device token table: ``pages`` -> ``dev_pages`` (None: -1)."""
        table = self.logical_to_device
        slots = self._slots_of(pages).to(table.device)
        if dev_pages is None:
            self._page_map[pages] = -1
            table[slots] = -1
        else:
            self._page_map[pages] = dev_pages
            table[slots] = self._slots_of(dev_pages).to(table.device)

    def settle_held(self, settled: list[SettledCall[None]]) -> None:
        """The logical side's verdicts. Applied calls: their resident pages lose their device
        pages (freed) in the host page table. Rejected calls: their pages that are still held
        and still resident get their device table rows back (a later call of the batch may have
        freed the page: then that call's verdict decides; ``free_device`` may have dropped the
        residency since: then it stays dropped).

        Host syncs: one, the host copy of the batch (already made by the logical side's settle
        on an accelerator, so free there)."""
        P, limit = self.page_size, self._page_map.numel()
        host = [s.host for s in settled]
        whole = (host[0] if len(host) == 1 else torch.cat(host)).to(_CPU)
        rejected = [i for i, s in enumerate(settled) if s.rejected]
        if rejected:
            parts = whole.split_with_sizes([c.numel() for c in host])
            for i in rejected:
                pages: torch.Tensor = torch.unique(torch.div(parts[i], P, rounding_mode="floor"))
                pages = pages[(pages > 0) & (pages < limit)]
                pages = pages[self._page_map[pages] >= 0]
                pages = pages[self._logical.allocated(pages * P)]
                if pages.numel():
                    self._set_residency(pages, self._page_map[pages].clone())
            applied = [p for i, p in enumerate(parts) if not settled[i].rejected]
            if not applied:
                return
            whole = torch.cat(applied)
        # Applied ids are valid and no page is in two applied calls, so no filtering is
        # needed; a page named by several slots of one call is looked up several times, which
        # the page table and the device side (several slots of one page in one call) accept.
        # (index_select/index_fill_/masked_select, not indexing with [], which on a batch this
        # size runs on torch's thread pool, whose wake-up on a busy host costs milliseconds)
        pages = whole if P == 1 else torch.div(whole, P, rounding_mode="floor")
        dev = torch.index_select(self._page_map, 0, pages)
        self._page_map.index_fill_(0, pages, -1)
        dev = torch.masked_select(dev, dev >= 0)  # the resident ones
        if dev.numel():
            self._device.free(self._slots_of(dev).to(self.device))

    def check_frees(self) -> None:
        """Check queued frees of both sides now, raising on a bad one."""
        self._logical.check_frees()
        self._device.check_frees()

    # -- state -----------------------------------------------------------------------------
    state_tag = "hisparse-slot-allocator"

    def backup_sides(self) -> tuple[object, ...]:
        """Both sides' free lists and the host page table."""
        return (self._logical.backup_state(), self._device.backup_state(), self._page_map.clone())

    def restore_sides(self, sides: tuple[object, ...]) -> None:
        """Bring back both sides and the residency of ``sides``, and refill from the logical
        store every page that comes back resident at a device page it did not hold just before.

        Why refill: the backup holds the tables, not the device rows. A page made non-resident
        after the backup may have seen its device page reused and rewritten by another request;
        restoring the table alone would make it "resident" at a device page holding that
        request's rows, and reads, offload and kernels all prefer the device row. Granting
        residency fills a page from the store (see ``_make_resident``); restoring it is a
        grant too. Why only the pages whose device page changed, not every resident page: a
        page that kept its device page was consistent before the restore and still is
        (write-through), so refilling it would only cost a copy per resident page on every
        restore and overwrite what a kernel wrote into the device buffer in place.
        """
        logical, device, page_map = sides
        assert isinstance(page_map, torch.Tensor)
        before = self._page_map.clone()
        self._logical.restore_state(logical)  # drops queued frees (their table rows too)
        self._device.restore_state(device)
        self._page_map.copy_(page_map)
        self._rebuild_table()
        after = self._page_map
        moved = ((after >= 0) & (after != before)).nonzero().reshape(-1)
        moved = moved[moved > 0]  # page 0 is padding
        if moved.numel():
            table = self.logical_to_device
            self._kvcache.load_to_device(
                self._slots_of(moved).to(table.device),
                self._slots_of(after[moved]).to(table.device),
            )

    def clear_sides(self) -> None:
        """Free every logical and device slot but the reserved page 0; nothing stays resident."""
        self._logical.clear()
        self._device.clear()
        self._page_map.fill_(-1)
        self._page_map[0] = 0
        self._rebuild_table()

    def _rebuild_table(self) -> None:
        """Rewrite the device table from the host page table (in place: the pool holds it)."""
        table = self.logical_to_device
        table.fill_(-1)
        table[0] = 0
        pages = (self._page_map[1:] >= 0).nonzero().reshape(-1) + 1
        if pages.numel():
            slots = self._slots_of(pages).to(table.device)
            table[slots] = self._slots_of(self._page_map[pages]).to(table.device)
