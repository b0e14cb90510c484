"""The SWA allocator: a full slot and a window slot per token, and the table between them.

It composes two `PagedSlotAllocator`s (full side, window side) and owns the
``full_to_swa`` table, which it registers with the pool. It always returns *full* slot ids;
``mapping[full]`` is the token's window slot, 0 once the token left the window (``free_swa``).

Reload is the allocator's job, not the pool's: only the allocator can hand out window slots, and
after ``alloc(n)`` every new token has one, although only the tokens that had one at offload
time (the snapshot's mask) should. ``load_cpu_copy`` therefore makes the mapping match the mask
exactly (gives masked tokens without a window slot one, takes it from unmasked tokens) and only
then lets the pool write. A shortage of window slots raises before anything changes.

Freeing follows the full side's verdict. ``free`` clears the table entries at once (nothing may
write through them any more) but keeps the window slots aside with the call, without reading
the ids back (no host sync: ids out of range or 0 just take no part); the full side checks its
queued calls in a batch (range, slot 0, double frees), and when it settles it reports each
call's verdict (``settle_held``, which reads what the whole batch holds in one copy): an
applied call's window slots are freed, a rejected call's entries are put back. So a bad free
found late (at the queue bound, in a free group) never leaves a window slot without an owner,
and a rejected call changes nothing on either side. The holding, free groups and the backup
token are [`CompositeAllocator`][kvcache_core.CompositeAllocator]'s.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    AllocatorError,
    CompositeAllocator,
    KVPool,
    KVSnapshot,
    PagedSlotAllocator,
    SettledCall,
    check_slots,
)

from ._swa_pool import SWAKVPool

__all__ = ["SWASlotAllocator"]

_CPU = torch.device("cpu")
#: What a queued free call holds until its verdict: the table rows it cleared and, row by row,
#: the window slot each held (0: none).
_Held = tuple[torch.Tensor, torch.Tensor]


def _host_pairs(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Host copies of same-length tensor pairs, with one device -> host transfer for all."""
    sizes = [a.numel() for a, _ in pairs]
    whole = torch.cat([torch.stack(pair) for pair in pairs], dim=1).to(_CPU)
    return [(part[0], part[1]) for part in whole.split_with_sizes(sizes, dim=1)]


def _host_read(table: torch.Tensor, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """``table[r]`` on the host for every host ``r``, with one transfer for all of them."""
    sizes = [r.numel() for r in rows]
    if not rows:
        return []
    whole = table[torch.cat(rows).to(table.device)].to(_CPU)
    return list(whole.split_with_sizes(sizes))


class SWASlotAllocator(CompositeAllocator[_Held]):
    """Allocates full and window slots together; both sides are paged by ``page_size``.

    ``size`` and ``available_size()`` are the smaller side's (what a request can count on);
    `full_available_size` and `swa_available_size` report each side.
    """

    def __init__(
        self,
        size: int,
        swa_size: int,
        page_size: int,
        kvcache: SWAKVPool,
        device: torch.device | str | None = None,
    ) -> None:
        self.page_size = page_size
        self.device = torch.device(device) if device is not None else kvcache.device
        self.full_size = size
        self.swa_size = swa_size
        self.size = min(size, swa_size)
        self._kvcache = kvcache
        self.full_attn_allocator = PagedSlotAllocator(
            size, page_size, kvcache.full_pool, self.device
        )
        self.swa_attn_allocator = PagedSlotAllocator(
            swa_size, page_size, kvcache.swa_pool, self.device
        )
        super().__init__(self.full_attn_allocator)  # its verdicts decide every free
        # The window side's last_loc is translated (0 once the token left the window): only a
        # continued page needs it; the full side checks the real one.
        self.swa_attn_allocator.check_every_last_loc = False
        # Lives with the pool's buffers: window layers translate through it on every write.
        self.full_to_swa_index_mapping = torch.zeros(
            size + page_size + 1, dtype=torch.int64, device=kvcache.device
        )
        self.full_to_swa_index_mapping[-1] = -1
        kvcache.register_mapping(self.full_to_swa_index_mapping)
        self.free_call_device = kvcache.device  # free calls are read against the table
        # Page size 1 with the table on the host: a free reads and clears the table by the
        # call's ids directly (two torch calls; see hold), as long as this is the table.
        self._direct_table = self.full_to_swa_index_mapping
        self._direct_rows: torch.Tensor | None = (
            self.full_to_swa_index_mapping[:-1]
            if page_size == 1 and kvcache.device.type == "cpu"
            else None
        )

    # -- sizes --------------------------------------------------------------------------------
    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        """Free window slots, counting those of queued full-side frees (settled first)."""
        self.full_attn_allocator.check_frees()
        return self.swa_attn_allocator.available_size()

    def check_frees(self) -> None:
        """Check queued frees of both sides now, raising on a bad one."""
        self.full_attn_allocator.check_frees()
        self.swa_attn_allocator.check_frees()

    # -- the table ----------------------------------------------------------------------------
    def _record(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        mapping = self.full_to_swa_index_mapping
        device = mapping.device
        full = full if full.device == device else full.to(device)
        mapping.index_copy_(0, full, swa if swa.device == device else swa.to(device))

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Window slots of full slots (0: none; -1, an absent ``last_loc``, stays -1)."""
        mapping = self.full_to_swa_index_mapping
        return mapping[kv_indices.to(mapping.device)]

    def set_full_to_swa_mapping(
        self, full_indices: torch.Tensor, swa_indices: torch.Tensor
    ) -> None:
        """Record pairs whose window slots were obtained elsewhere (e.g. a cache loading back).

        Paged, every pair must keep its offset inside the page (``full % P == swa % P``) and
        a full page must map into one window page (counting the pairs already recorded for
        its other slots) that no other full page uses. Why refuse rather than record: the
        paged calls continue a request's last page on both sides from ``last_loc + 1``, so a
        pair recorded at another offset, or a page split over two window pages, makes the
        next ``alloc_decode``/``alloc_extend`` refuse the translated ``last_loc`` (or hand out
        a window slot another token holds). Everything is checked before the table changes.
        """
        mapping = self.full_to_swa_index_mapping
        full = check_slots(
            full_indices,
            limit=self.full_size + self.page_size,
            name="full_indices",
            allow_duplicates=False,
            device=mapping.device,
        )
        swa = check_slots(
            swa_indices,
            limit=self.swa_size + self.page_size,
            name="swa_indices",
            allow_duplicates=False,
            device=mapping.device,
        )
        if full.numel() != swa.numel():
            raise AllocatorError(f"{full.numel()} full slots for {swa.numel()} window slots")
        if self.page_size > 1 and full.numel():
            self._check_paged_pairs(full, swa)
        self._record(full, swa)

    def _check_paged_pairs(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        """Offsets kept, one window page per full page, no window page shared (see above)."""
        mapping, P = self.full_to_swa_index_mapping, self.page_size
        moved = (full % P) != (swa % P)
        if bool(moved.any()):
            i = int(moved.nonzero()[0, 0])
            raise AllocatorError(
                f"full slot {int(full[i])} (offset {int(full[i]) % P}) cannot map to window "
                f"slot {int(swa[i])} (offset {int(swa[i]) % P}): with page_size {P} a token "
                "keeps its offset inside the page on both sides"
            )
        pages, inv = torch.unique(torch.div(full, P, rounding_mode="floor"), return_inverse=True)
        rows = pages[:, None] * P + torch.arange(P, device=full.device)
        before = mapping[rows]
        kept = before > 0
        kept[inv, full % P] = False  # entries these pairs overwrite do not count
        big = self.swa_size + P
        window = torch.div(swa, P, rounding_mode="floor")
        low = torch.where(kept, before // P, big).amin(1)
        high = torch.where(kept, before // P, -1).amax(1)
        low = low.scatter_reduce(0, inv, window, "amin")
        high = high.scatter_reduce(0, inv, window, "amax")
        if bool((low != high).any()):
            page = int(pages[(low != high).nonzero()[0, 0]])
            raise AllocatorError(
                f"full page {page} would map into more than one window page "
                "(a full page's tokens share one window page)"
            )
        others = mapping[:-1].clone()
        others[rows.reshape(-1)] = 0
        shared = (others > 0) & torch.isin(torch.div(others, P, rounding_mode="floor"), low)
        if bool(shared.any()):
            slot = int(shared.nonzero()[0, 0])
            raise AllocatorError(
                f"window page {int(others[slot]) // P} already belongs to full slot {slot}'s page"
            )

    # -- allocation ---------------------------------------------------------------------------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` full slots, each with a window slot; None (taking nothing) if short."""
        if need_size < 0 or need_size % self.page_size:
            raise AllocatorError(
                f"need_size must be a non-negative multiple of page_size {self.page_size}, "
                f"got {need_size}"
            )
        if not self._room(need_size // self.page_size):
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        if full is None or swa is None:  # pragma: no cover - excluded by the size check
            raise AllocatorError("allocator sizes changed during alloc")
        self._record(full, swa)
        return full

    def _translate_last(self, last_loc: torch.Tensor) -> torch.Tensor:
        last = last_loc.reshape(-1).to(torch.int64)
        rows = self.full_size + self.page_size
        if last.numel() and bool(((last < -1) | (last >= rows)).any()):
            raise AllocatorError(f"last_loc values must be -1 or a slot in [1, {rows})")
        return self.translate_loc_from_full_to_swa(last)

    def _room(self, pages: int) -> bool:
        """Whether both sides have ``pages`` free pages. Queued frees are settled only when a
        side is short, as the plain allocator's ``alloc`` does (the full side first: its
        verdicts release window slots), so an alloc with room reads nothing back."""
        full, window = self.full_attn_allocator, self.swa_attn_allocator
        if not full.has_room(pages):
            return False
        if window.has_room(pages):
            return True
        full.check_frees()
        return window.has_room(pages)

    def _undo_new_pages(
        self, side: PagedSlotAllocator, out: torch.Tensor, last_loc: torch.Tensor
    ) -> None:
        """Give back the pages a paged call took fresh (not those continuing a last page)."""
        pages = torch.div(out, self.page_size, rounding_mode="floor")
        continued = last_loc[last_loc >= 0].to(out.device) // self.page_size
        fresh = out[~torch.isin(pages, continued)]
        if fresh.numel():
            side.free(fresh)

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Extend each request on both sides (window ``last_loc`` is translated).

        Both sides need the same ``ceil(seq/P) - ceil(prefix/P)`` new pages; if either is short
        nothing is taken and None is returned.
        """
        swa_last = self._translate_last(last_loc)
        # The real last_loc is checked before either side moves (a stale one raises here).
        plan = self.full_attn_allocator.plan_extend(
            prefix_lens, seq_lens, last_loc, extend_num_tokens
        )
        if not self._room(plan.new_pages):
            return None
        # The window side first: its last_loc (a translated one) is the likelier to be invalid.
        swa = self.swa_attn_allocator.alloc_extend(
            prefix_lens, seq_lens, swa_last, extend_num_tokens
        )
        if swa is None:
            return None
        try:
            full = self.full_attn_allocator.take_extend(plan)
        except Exception:
            self._undo_new_pages(self.swa_attn_allocator, swa, swa_last)
            raise
        if full is None:
            self._undo_new_pages(self.swa_attn_allocator, swa, swa_last)
            return None
        self._record(full, swa)
        return full

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One full and one window slot per request; None (taking nothing) if either is short."""
        swa_last = self._translate_last(last_loc)
        # The real last_loc is checked before either side moves (a stale one raises here).
        plan = self.full_attn_allocator.plan_decode(seq_lens, last_loc)
        if not self._room(plan.new_pages):
            return None
        swa = self.swa_attn_allocator.alloc_decode(seq_lens, swa_last)
        if swa is None:
            return None
        try:
            full = self.full_attn_allocator.take_decode(plan)
        except Exception:
            self._undo_new_pages(self.swa_attn_allocator, swa, swa_last)
            raise
        if full is None:
            self._undo_new_pages(self.swa_attn_allocator, swa, swa_last)
            return None
        self._record(full, swa)
        return full

    # -- freeing ------------------------------------------------------------------------------
    def free_swa(self, indices: torch.Tensor) -> None:
        """Release the window slots of tokens that left the window; their full slots stay.

        Paged: the whole pages of ``indices`` lose their window slots (a window page is only
        ever shared by the tokens of one full page). Mapping entries become 0.
        """
        mapping = self.full_to_swa_index_mapping
        slots = check_slots(indices, limit=self.full_size + self.page_size, device=mapping.device)
        if slots.numel() == 0:
            return
        P = self.page_size
        if P > 1:
            pages = torch.unique(torch.div(slots, P, rounding_mode="floor"))
            slots = (pages[:, None] * P + torch.arange(P, device=slots.device)).reshape(-1)
        self._evict_held(slots)
        window = mapping[slots]
        held = window > 0
        if bool(held.any()):
            self.swa_attn_allocator.free(window[held])
            mapping[slots[held]] = 0

    def _evict_held(self, slots: torch.Tensor) -> None:
        """Window slots that queued free calls hold for ``slots`` go now: whatever the full
        side's verdict, these tokens were just evicted, so a rollback must not bring them back."""
        for call, (rows, window) in self.held_calls():
            gone = torch.isin(rows, slots) & (window > 0)
            if bool(gone.any()):
                # unique: a call may name a slot twice (it is then rejected) and, paged, the
                # slots of one page, which all read the page's window slots
                self.swa_attn_allocator.free(torch.unique(window[gone]))
                self.replace_held(call, (rows, torch.where(gone, 0, window)))

    def free(self, indices: torch.Tensor) -> None:
        """Release full slots and, with them, any window slots they still hold.

        No host sync: nothing here reads the ids back. The table entries of the call's tokens
        (whole pages when paged) are cleared at once on the table's device, and the window
        slots they held are kept aside with the call, all by plain tensor ops; ids out of range
        (or slot 0) take no part in that and are left to the full side, which checks every
        queued call in a batch (range, slot 0, double frees) and reports each call's verdict
        (see the module doc). So a bad call raises at the next settle, like a double free of the
        plain allocator, and changes nothing on either side. Pinned by
        tests/allocators/test_host_syncs.py.
        """
        super().free(indices)

    def hold(self, call: torch.Tensor) -> _Held:
        """Clear the call's table entries now and keep the window slots they held."""
        direct = self._direct_rows
        if direct is not None and self._direct_table is self.full_to_swa_index_mapping:
            try:  # index_select refuses an id out of range (negative ones too)
                window = torch.index_select(direct, 0, call)
            except (IndexError, RuntimeError):
                pass  # the general path below leaves bad ids out
            else:
                # slot 0 (refused at the settle) reads and writes the table's row 0, always 0
                direct.index_fill_(0, call, 0)
                return call, window
        mapping = self.full_to_swa_index_mapping
        rows, valid = self._rows_of(call)
        before = mapping[rows]
        # Clear the valid rows; an invalid id was sent to row 0 (always 0) and writes it back.
        mapping[rows] = torch.where(valid, 0, before)
        return rows, torch.where(valid, before, 0)  # what the call holds (0: nothing)

    def _rows_of(self, call: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The table rows a free call clears (whole pages when paged: a window page belongs to
        one full page) and which of them are valid, without reading the ids: an id out of range
        or 0 becomes row 0 with ``valid`` False, and a page named by several ids appears
        several times."""
        P = self.page_size
        valid = (call > 0) & (call < self.full_size + P)
        safe = torch.where(valid, call, 0)
        if P == 1:
            return safe, valid
        offsets = torch.arange(P, device=call.device)
        rows = (torch.div(safe, P, rounding_mode="floor")[:, None] * P + offsets).reshape(-1)
        return rows, valid.repeat_interleave(P)

    def settle_held(self, settled: list[SettledCall[_Held]]) -> None:
        """The full side's verdicts: free the window slots of applied calls; put back the table
        entries of rejected ones, where the full slot is still held and nothing was recorded
        there since (a later call of the batch may have freed it: then its window slot goes).

        Host syncs: one read of what every call of the batch holds, plus, only when a call was
        rejected, one read of the table at the rejected calls' rows."""
        if not any(s.rejected for s in settled):  # the common batch: release every window slot
            windows = [s.held[1] for s in settled]
            window = (windows[0] if len(windows) == 1 else torch.cat(windows)).to(_CPU)
            freed = torch.masked_select(window, window > 0)
            if freed.numel():
                self.swa_attn_allocator.free(freed)
            return
        mapping = self.full_to_swa_index_mapping
        held = _host_pairs([s.held for s in settled])
        release: list[torch.Tensor] = []
        back_rows: list[torch.Tensor] = []
        back_window: list[torch.Tensor] = []
        bad = [i for i, s in enumerate(settled) if s.rejected]
        now = _host_read(mapping, [held[i][0] for i in bad]) if bad else []
        for i, (rows, window) in enumerate(held):
            if settled[i].rejected:
                current = now[bad.index(i)]
                alive = self.full_attn_allocator.allocated(rows)
                back = (window > 0) & alive & (current == 0)
                back_rows.append(rows[back])
                back_window.append(window[back])
                # a rejected call may name a slot twice (that is why it was rejected)
                window = torch.unique(window[~back])
            release.append(torch.masked_select(window, window > 0))
        if back_rows:
            rows, window = torch.cat(back_rows), torch.cat(back_window)
            if rows.numel():
                mapping[rows.to(mapping.device)] = window.to(mapping.device)
        freed = torch.cat(release)
        if freed.numel():
            self.swa_attn_allocator.free(freed)

    # -- state --------------------------------------------------------------------------------
    state_tag = "swa-slot-allocator"

    def backup_sides(self) -> tuple[object, ...]:
        """Both free lists and the table: restore undoes every alloc, free and free_swa since.

        The full side settles first (its verdicts free window slots), then the window side.
        """
        return (
            self.full_attn_allocator.backup_state(),
            self.swa_attn_allocator.backup_state(),
            self.full_to_swa_index_mapping.clone(),
        )

    def restore_sides(self, sides: tuple[object, ...]) -> None:
        """Both free lists (queued frees dropped) and the table, as backed up."""
        full, window, table = sides
        assert isinstance(table, torch.Tensor)
        self.full_attn_allocator.restore_state(full)
        self.swa_attn_allocator.restore_state(window)
        self.full_to_swa_index_mapping.copy_(table)

    def clear_sides(self) -> None:
        """Free every slot on both sides; the table goes back to all 0 and the trailing -1."""
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping.zero_()
        self.full_to_swa_index_mapping[-1] = -1

    def get_kvcache(self) -> KVPool:
        return self._kvcache

    # -- offload ------------------------------------------------------------------------------
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Reload into new full slots ``indices`` (from ``alloc``), re-creating window slots.

        Afterwards exactly the tokens the snapshot's mask marks have a window slot: masked
        tokens without one get one, unmasked tokens that got one from ``alloc`` give it back.
        Checked before anything changes: the snapshot (as the pool checks it) and the window
        capacity (`AllocatorError` when the window side cannot cover the masked tokens).
        """
        checked = self._kvcache.check_cpu_copy(snapshot, indices)
        # All or nothing: matching the window slots takes and releases window pages before the
        # pool checks the window targets it is given. If the pool still refuses them (a table
        # corrupted so that a kept window slot is also a free one, and so handed out twice),
        # the window side and the table go back to how they were; the pool wrote no byte.
        # Queued frees settle first (settling may release window slots): the rollback then
        # restores a settled state and can never undo a free that was already applied.
        self.swa_available_size()
        state = self.swa_attn_allocator.backup_state()
        table = self.full_to_swa_index_mapping.clone()
        try:
            self._match_window_slots(checked.slots, checked.mask)
            with self._kvcache.trusting(checked):  # checked once, above: not again
                self._kvcache.load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
        except BaseException:
            self.swa_attn_allocator.restore_state(state)
            self.full_to_swa_index_mapping.copy_(table)
            raise

    def _match_window_slots(self, slots: torch.Tensor, mask: torch.Tensor) -> None:
        """Make ``mapping[slots] > 0`` equal ``mask``, page by page; all-or-nothing."""
        mapping = self.full_to_swa_index_mapping
        if slots.numel() == 0:
            return
        dev, P = mapping.device, self.page_size
        slots, mask = slots.to(dev), mask.to(dev)
        pages, inv = torch.unique(torch.div(slots, P, rounding_mode="floor"), return_inverse=True)
        col = slots % P
        before = mapping[pages[:, None] * P + torch.arange(P, device=dev)]  # [pages, P]
        held = before > 0
        has_page = held.any(1)
        window_page = torch.where(held, before // P, -1).amax(1)
        lowest = torch.where(held, before // P, window_page[:, None]).amin(1)
        if bool((lowest != window_page).any()):
            raise AllocatorError("a full page's tokens map to different window pages")
        current = before[inv, col]
        after = before.clone()
        after[inv, col] = torch.where(mask, current, 0)
        needs_slot = mask & (current <= 0)
        needs_page = torch.zeros_like(has_page)
        needs_page[inv[needs_slot]] = True
        fresh = needs_page & ~has_page
        release = has_page & ~needs_page & ~(after > 0).any(1)
        short = int(fresh.sum()) * P - self.swa_available_size() - int(release.sum()) * P
        if short > 0:
            raise AllocatorError(
                f"reloading needs {int(fresh.sum()) * P} window slots but only "
                f"{self.swa_available_size() + int(release.sum()) * P} can be freed up; "
                "nothing was changed (free window slots with free_swa, or retry later)"
            )
        if bool(release.any()):
            self.swa_attn_allocator.free(window_page[release] * P)
        if bool(fresh.any()):
            got = self.swa_attn_allocator.alloc(int(fresh.sum()) * P)
            if got is None:  # pragma: no cover - excluded by the capacity check
                raise AllocatorError("window allocator refused a checked allocation")
            window_page[fresh] = got.to(dev).reshape(-1, P)[:, 0] // P
        mapping[slots] = torch.where(
            mask, torch.where(current > 0, current, window_page[inv] * P + col), 0
        )
