"""Which pool slots hold each position of each batch row, and how rows get and give them back.

transformers' caches are batch-shaped: every row of a left-padded batch has the same number of
positions. So one ``[batch, capacity]`` table of token slots serves every attention layer, one
allocation per forward pass covers all rows (``alloc`` for ``page_size == 1``;
``alloc_extend``/``alloc_decode`` otherwise, so each row's tokens stay page-contiguous), and a
retracted row simply has no slots until it is resumed.

``run_start`` records whether a batch of one row holds one run of consecutive slots (what a
fresh allocator hands out): reads can then slice the pool's buffer instead of gathering the
row's slots.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import KVCacheError

__all__ = ["OutOfSlotsError", "RowRetractedError", "RowSlots"]


class OutOfSlotsError(KVCacheError, ValueError):
    """The pool has too few free slots for a forward pass or a resume (both counts named)."""


class RowRetractedError(KVCacheError, ValueError):
    """A forward pass reached a row that was retracted and not resumed."""


class RowSlots:
    """The slot table of one batch: positions ``0..length`` of each row, and request slots.

    :param allocator: The pool's token allocator (paged when ``page_size > 1``).
    :param requests: The allocator of Mamba request slots, or None without Mamba layers.
    """

    def __init__(self, allocator: Any, page_size: int, requests: Any | None) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.requests = requests
        self.device: torch.device = allocator.get_kvcache().device
        self.batch = 0
        self.length = 0
        self.table = torch.zeros((0, 0), dtype=torch.int64, device=self.device)
        self.request_slots: torch.Tensor | None = None
        self.live: list[bool] = []
        #: First slot of the single row's run of consecutive slots; None when reads gather.
        self.run_start: int | None = None
        #: The slots of the latest ``extend`` (row-major, flattened) and how many per row.
        self.last_loc = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.last_count = 0
        #: What window layers write at for ``last_loc``: the same tensor, unless the cache keeps
        #: a window side and set a ``KVWriteLoc(last_loc, window slots)`` after the extend.
        self.last_window_loc: Any = self.last_loc
        #: Bumped whenever the table's contents change, so that per-pass lookups can be reused.
        self.version = 0

    # -- binding and growth ---------------------------------------------------------------
    @property
    def all_live(self) -> bool:
        """Whether no row is retracted."""
        return all(self.live)

    @property
    def bound(self) -> bool:
        """Whether a batch has been seen (the first forward pass binds its rows)."""
        return self.batch > 0

    def bind(self, batch: int) -> None:
        """Take ``batch`` rows: request slots for Mamba state, an empty token table."""
        if self.requests is not None:
            slots = self.requests.alloc(batch)
            if slots is None:
                raise OutOfSlotsError(
                    f"a batch of {batch} rows needs {batch} Mamba request slots; "
                    f"{self.requests.available_size()} are free (raise max_batch)"
                )
            self.request_slots = slots.to(self.device, torch.int64).reshape(-1)
        self.batch = batch
        self.live = [True] * batch
        self.table = torch.zeros((batch, 64), dtype=torch.int64, device=self.device)

    def _grow(self, need: int) -> None:
        if need <= self.table.shape[1]:
            return
        wider = torch.zeros(
            (self.batch, max(need, 2 * self.table.shape[1])), dtype=torch.int64, device=self.device
        )
        wider[:, : self.length] = self.table[:, : self.length]
        self.table = wider

    def check_live(self) -> None:
        """Refuse a forward pass while a row is retracted."""
        dead = [row for row, live in enumerate(self.live) if not live]
        if dead:
            raise RowRetractedError(
                f"rows {dead} are retracted: resume them (cache.resume(row, handle)) before the "
                "next forward pass; retract and resume are legal only between forward passes"
            )

    def _take(self, rows: int, prefix: int, count: int) -> torch.Tensor:
        """Slots for ``count`` new positions of ``rows`` rows holding ``prefix`` each, row-major."""
        need = rows * count
        alloc = self.allocator
        if self.page_size == 1:
            slots = alloc.alloc(need)
        else:
            dev = self.device
            prefixes = torch.full((rows,), prefix, dtype=torch.int64, device=dev)
            if prefix:
                last = self.table[:, prefix - 1].clone()
            else:
                last = torch.full((rows,), -1, dtype=torch.int64, device=dev)
            if count == 1 and prefix:
                slots = alloc.alloc_decode(prefixes + 1, last)
            else:
                slots = alloc.alloc_extend(prefixes, prefixes + count, last, need)
        if slots is None:
            raise self._short(rows, count)
        got: torch.Tensor = slots.to(self.device, torch.int64)
        return got.reshape(rows, count)

    def extend(self, count: int) -> None:
        """Allocate ``count`` new positions for every row (one forward pass's tokens)."""
        if count == 1 and self.page_size == 1 and self.length and all(self.live):
            self._decode_step()
            return
        self.check_live()
        start = self.length
        slots = self._take(self.batch, start, count)
        self._grow(start + count)
        self.table[:, start : start + count] = slots
        self.length = start + count
        self.last_loc = self.last_window_loc = slots.reshape(-1)
        self.last_count = count
        self.version += 1
        self.run_start = self._run_after(slots, start)

    def _short(self, rows: int, count: int) -> OutOfSlotsError:
        """The error of a forward pass whose ``rows`` x ``count`` new positions did not fit."""
        alloc = self.allocator
        return OutOfSlotsError(
            f"{rows} row(s) x {count} new token(s) need {rows * count} token slots (page size "
            f"{self.page_size}); the pool has {alloc.available_size()} free of {alloc.size}"
        )

    def _decode_step(self) -> None:
        """``extend(1)`` at page size 1 after a prefill: one slot per row, fewest torch calls.

        Every decode step of every generation comes through here once, so this is ``extend``
        without what a one-token step never needs (no table reshapes, no run comparison against
        a range, the slot value read once); what it records is exactly what ``extend`` records.
        """
        batch, start = self.batch, self.length
        slots = self.allocator.alloc(batch)
        if slots is None:
            raise self._short(batch, 1)
        if slots.dtype is not torch.int64 or slots.dim() != 1 or slots.device != self.device:
            slots = slots.to(self.device, torch.int64).reshape(-1)
        if start >= self.table.shape[1]:
            self._grow(start + 1)
        self.table[:, start] = slots
        self.length = start + 1
        self.last_loc = self.last_window_loc = slots
        self.last_count = 1
        self.version += 1
        run = self.run_start
        if run is not None and (batch != 1 or int(slots.item()) != run + start):
            self.run_start = None

    def _run_after(self, slots: torch.Tensor, start: int) -> int | None:
        """The single row's first slot if it still holds one run of consecutive slots."""
        if self.batch != 1:
            return None
        first = int(slots[0, 0])
        count = slots.shape[1]
        if start and (self.run_start is None or first != self.run_start + start):
            return None
        if count > 1 and not torch.equal(
            slots[0], torch.arange(first, first + count, device=slots.device)
        ):
            return None
        return first - start

    # -- per-row slot changes (retraction) --------------------------------------------------
    def row_slots(self, row: int) -> torch.Tensor:
        """The token slots of ``row``'s positions (a copy)."""
        return self.table[row, : self.length].clone()

    def take_row(self, row: int) -> torch.Tensor:
        """New slots for every position of ``row`` (which holds none); not yet recorded."""
        if self.page_size == 1:
            slots = self.allocator.alloc(self.length)
        else:
            dev = self.device
            none = torch.zeros(1, dtype=torch.int64, device=dev)
            slots = self.allocator.alloc_extend(none, none + self.length, none - 1, self.length)
        if slots is None:
            raise OutOfSlotsError(
                f"resuming row {row} needs {self.length} token slots (page size "
                f"{self.page_size}); the pool has {self.allocator.available_size()} free"
            )
        got: torch.Tensor = slots.to(self.device, torch.int64)
        return got.reshape(-1)

    def place_row(self, row: int, slots: torch.Tensor) -> None:
        """Record ``slots`` as ``row``'s positions and mark it live."""
        self.table[row, : self.length] = slots
        self.last_count = 0  # the table changed: layers slice it again
        self.version += 1
        self.live[row] = True
        self.run_start = self._run_after(self.table[:, : self.length], 0) if self.length else None

    def release(self) -> None:
        """Give every live row's slots (and request slots) back; the table is empty after."""
        live = [row for row, alive in enumerate(self.live) if alive]
        if self.length and live:
            self.allocator.free(self.table[live, : self.length].reshape(-1))
        if self.requests is not None and self.request_slots is not None and live:
            self.requests.free(self.request_slots[live])
        self.batch = 0
        self.length = 0
        self.live = []
        self.request_slots = None
        self.run_start = None
        self.last_count = 0
        self.version += 1
        self.table = torch.zeros((0, 0), dtype=torch.int64, device=self.device)
