"""Token and paged slot allocators: public API (``kvcache_core.PagedSlotAllocator``).

Why they live in ``kvcache_core``: a third-party pool needs an allocator, and writing a correct
one (double-free detection, free groups, backups, paged extends) is most of the work of a pool.
The built-in pools use these very classes, imported from ``kvcache_core`` like a third party.

Bookkeeping lives on the host in preallocated tensors: a stack of free ids with a top pointer
(O(1) amortised per id, no allocation per call) and an ``is_free`` mask that makes double frees
detectable.

Why frees are checked in batches: on CPU every torch call costs microseconds, so checking each
``free`` on the spot (range, duplicates, already free) costs several times the allocation itself,
and on an accelerator it would synchronise the device. ``free`` therefore only queues its ids;
the queue is checked and merged in one vectorised pass when the allocator next needs its free set
(an ``alloc`` that runs short, ``available_size``, ``backup_state``, ``check_frees``, an
``alloc_decode``/``alloc_extend`` that must check a ``last_loc``) or when the queue grows past a
bound (128 calls or 16384 ids). A bad free (double free, slot 0, out of range) is then rejected
as a whole with a [`DoubleFreeError`][kvcache_core.DoubleFreeError] or
[`InvalidSlotError`][kvcache_core.InvalidSlotError] naming the slot; every other queued free
is applied, so nothing is lost. ``eager_checks=True`` checks each host-side free on the spot
instead (for debugging: the error points at the call).

What a settle costs (the hot path, measured in ``benchmarks/_allocator.py``): one
``torch.cat`` of the queued calls and one of the ids handed out since the last settle, one
``index_add_`` for each (the range check is ``index_add_``'s own), and one maximum over the
marks. ``free`` itself is one copy of the ids (``clone``: the caller may reuse its tensor) and
a list append; an ``alloc`` of the size just freed pops that copy without any torch call.

The limit of checking late: the check sees the free set as it is at the settle, not as it was at
the call. Freeing an id twice while its first free is still queued is always caught; but freeing
an id that is already free and settled is caught only if no ``alloc`` handed that id out again
before the settle — after that, the late free looks like a free by the new owner. Catching that
too needs a per-call read of the free set, which is what ``eager_checks`` costs.

Every free call keeps its own verdict, wherever it came from: a free group ends by queueing each
collected call as a call of its own (concatenating them would let one double free reject the
whole group, or, with pages, hide it as two slots of one page in one call), and composite
allocators (SWA, HiSparse, yours: [`CompositeAllocator`][kvcache_core.CompositeAllocator])
learn through [`PagedSlotAllocator.on_settled`][kvcache_core.PagedSlotAllocator.on_settled]
which of their calls were applied and which were rejected, so their second side follows the
first exactly.
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..contracts import KVPool
from ..errors import (
    AllocatorError,
    DoubleFreeError,
    InvalidSlotError,
    KVCacheError,
)
from .free_group import FreeGroup
from .offload import ForwardsOffload

__all__ = [
    "DecodePlan",
    "ExtendPlan",
    "PagedSlotAllocator",
    "SettleListener",
    "TokenSlotAllocator",
]

_CPU = torch.device("cpu")
_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
#: Queued free calls that trigger a merge (bounds memory and how late an error surfaces).
_MAX_PENDING_CALLS = 128
#: Queued ids that trigger a merge. Why: torch runs an op on more than 32768 elements on its
#: intra-op thread pool, and on a busy host waking the pool's idle threads can take
#: milliseconds (a scheduler tick), hundreds of times the op itself. Keeping every bulk
#: operation of a settle below that size keeps the bookkeeping on the calling thread.
_MAX_PENDING_IDS = 16384
#: Below this many elements a torch op runs on the calling thread (torch's grain size).
_SERIAL_OP_SIZE = 32768
_TENSOR = torch.Tensor
_INT64 = torch.int64
#: Ids split at once into one-id views for ``alloc(1)`` (see ``_FreeIds.take_one``).
_SINGLES_BLOCK = 64

SettleListener = Callable[[list[torch.Tensor], list[torch.Tensor], frozenset[int]], None]
"""What [`PagedSlotAllocator.on_settled`][kvcache_core.PagedSlotAllocator.on_settled] is called
with at every settle: the queued calls (the very tensors
[`queue_free`][kvcache_core.PagedSlotAllocator.queue_free] got), their host copies (the same
tensors on a host allocator, one transfer for the whole queue otherwise) and the positions of
the rejected calls."""


class ExtendPlan(NamedTuple):
    """What an ``alloc_extend`` call will take, checked and changing nothing
    ([`PagedSlotAllocator.plan_extend`][kvcache_core.PagedSlotAllocator.plan_extend])."""

    requests: list[tuple[int, int, int]]
    """Per request: (first slot that continues its partial page, how many tokens continue it,
    how many tokens go to new pages)."""
    new_pages: int
    """Fresh pages the call takes in all."""


class DecodePlan(NamedTuple):
    """What an ``alloc_decode`` call will take, checked and changing nothing
    ([`PagedSlotAllocator.plan_decode`][kvcache_core.PagedSlotAllocator.plan_decode])."""

    last_locs: list[int]
    """Each request's ``last_loc``, as host integers."""
    starts_page: list[bool]
    """Whether each request's new token starts a fresh page (True) or continues its last one."""
    new_pages: int
    """Fresh pages the call takes in all."""


def _to_host(calls: list[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of queued calls with one device -> host transfer (one sync) for all of them.

    The pieces are views of one fresh tensor that nothing writes again, so they can be pushed
    as chunks of the free stack like any owned call."""
    if all(c.device == calls[0].device for c in calls):
        return _one_transfer(calls)
    # A composite queued host ids too (the window side gets both): one transfer for the rest.
    remote = [c for c in calls if c.device.type != "cpu"]
    if all(c.device == remote[0].device for c in remote):
        copies = iter(_one_transfer(remote))
    else:  # pragma: no cover - ids on two accelerators: not something a composite queues
        copies = iter([c.to(_CPU) for c in remote])
    return [c if c.device.type == "cpu" else next(copies) for c in calls]


def _one_transfer(calls: list[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of same-device ``calls``, as views of one copy made by one transfer."""
    whole = (calls[0] if len(calls) == 1 else torch.cat(calls)).to(_CPU)
    return list(whole.split_with_sizes([c.numel() for c in calls]))


def _host_ints(values: torch.Tensor) -> list[int]:
    """``values`` flattened into Python ints (one host read)."""
    flat = (values if values.dim() == 1 else values.reshape(-1)).tolist()
    if values.is_floating_point() or values.dtype == torch.bool:
        return [int(x) for x in flat]
    return flat


def _int64_tensor(values: list[int]) -> torch.Tensor:
    """A host int64 tensor of ``values``. Why not ``torch.tensor(values)``: that converts
    element by element, about three times slower for a decode step's few dozen ids than
    viewing a packed ``array`` (the tensor keeps the array alive)."""
    if not values:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(array("q", values), dtype=torch.int64)


class _FreeIds:
    """Free ids ``1..count`` as a stack of immutable chunks.

    Why chunks: an allocation is then a slice (a view, no copy) of the top chunk, and a batch
    of returned ids is pushed as one chunk per free call, so the steady state pops a whole chunk
    without any torch call. Chunks are never written after they are pushed, so handing out views
    is safe, and a backup is just the tuple of chunks. ``take`` hands out the lowest ids first on
    a fresh stack and the most recently returned ids first afterwards.

    ``is_free`` holds 1 for a free id and 0 for a handed-out one (slot 0 counts as free, so
    freeing it is refused). ``take`` only records what it handed out; both directions are
    applied in bulk with ``index_add_``, and a returned batch is good exactly when every one of
    its ids then reads 1: a repeated id or an id that was already free reads 2 or more.

    Single ids (``alloc(1)``, a decode step at page size 1) come from a block of the top chunk
    split into one-id views at once (``take_one``): one torch call per 64 ids instead of one
    per id, which is most of what an ``alloc(1)`` costs. The block is taken off the stack when
    it is split and whatever is left of it goes back (``_flush_singles``) before anything else
    reads or changes the stack, so order, marks and backups are exactly as without it.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.is_free = torch.ones(count + 1, dtype=torch.int32)
        # The same memory as a ctypes array: a decode step reads a few dozen marks one by one
        # faster in Python than a gather, a reduction and a read back cost in torch. Valid as
        # long as ``is_free`` lives: it is only ever written in place.
        self.marks = (ctypes.c_int32 * (count + 1)).from_address(self.is_free.data_ptr())
        self._ones = torch.ones(count + 1, dtype=torch.int32)
        # scratch for de-duplicating pages, made on first use (a token allocator never needs it)
        self._scratch: tuple[torch.Tensor, torch.Tensor] | None = None
        self._chunks: list[torch.Tensor] = []
        self._start = 0
        self._taken: list[torch.Tensor] = []
        # one-id views of ``_block`` not handed out yet, the next one last (see the class doc)
        self._singles: list[torch.Tensor] = []
        self._block: torch.Tensor | None = None
        self._block_popped = False  # whether the block was the whole rest of its chunk
        self.top = 0  # how many ids are free
        self.reset()

    def reset(self) -> None:
        self._singles = []
        self._block = None
        self._chunks = [torch.arange(1, self.count + 1, dtype=torch.int64)]
        self._start = 0  # ids before this offset in the top chunk are handed out
        self.is_free.fill_(1)
        self._taken.clear()
        self.top = self.count

    def take(self, n: int) -> torch.Tensor:
        """``n`` free ids (the caller checked ``n <= top``)."""
        if self._block is not None:
            self._flush_singles()
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        chunks = self._chunks
        chunk = chunks[-1]
        start = self._start
        if not start and chunk.numel() == n:
            # A freed batch of the same size on top (the steady state): no torch call at all.
            ids = chunks.pop()
        elif chunk.numel() - start > n:  # one view, no copy
            ids = chunk.narrow(0, start, n)
            self._start = start + n
        else:
            parts: list[torch.Tensor] = []
            need = n
            while need:
                chunk = chunks[-1]
                start = self._start
                left = chunk.numel() - start
                if left <= need:
                    parts.append(chunk.narrow(0, start, left) if start else chunk)
                    chunks.pop()
                    self._start = 0
                    need -= left
                else:
                    parts.append(chunk.narrow(0, start, need))
                    self._start = start + need
                    need = 0
            ids = parts[0] if len(parts) == 1 else torch.cat(parts)
        self.top -= n
        self._taken.append(ids)
        return ids

    def take_one(self) -> torch.Tensor:
        """One free id as a 1-element tensor (the caller checked ``top >= 1``)."""
        if not self._singles:
            self._split_block()
        self.top -= 1
        return self._singles.pop()

    def _split_block(self) -> None:
        """Split up to ``_SINGLES_BLOCK`` ids of the top chunk into one-id views."""
        self._flush_singles()
        chunks = self._chunks
        chunk = chunks[-1]
        start = self._start
        left = chunk.numel() - start
        k = min(left, _SINGLES_BLOCK)
        block = chunk if not start and k == left else chunk.narrow(0, start, k)
        if k == left:  # the whole rest of the chunk
            chunks.pop()
            self._start = 0
        else:
            self._start = start + k
        self._block_popped = k == left
        self._block = block
        singles = list(block.reshape(k, 1).unbind(0))
        singles.reverse()
        self._singles = singles

    def _flush_singles(self) -> None:
        """Record the block's handed-out ids as taken and put the rest back on the stack."""
        block = self._block
        if block is None:
            return
        self._block = None
        remaining = len(self._singles)
        consumed = block.numel() - remaining
        if consumed:
            self._taken.append(block.narrow(0, 0, consumed) if remaining else block)
        if remaining:
            self._singles = []
            if self._block_popped:  # nothing went above it since: it is the top again
                self._chunks.append(block.narrow(0, consumed, remaining))
            else:
                self._start -= remaining

    def _ones_of(self, n: int) -> torch.Tensor:
        """``n`` ones (a view of a preallocated buffer when it is long enough)."""
        if n <= self._ones.numel():
            return self._ones.narrow(0, 0, n)
        return torch.ones(n, dtype=torch.int32)

    def sync_marks(self) -> None:
        """Mark everything handed out since the last sync as not free."""
        if self._block is not None:
            self._flush_singles()
        if self._taken:
            taken = self._taken[0] if len(self._taken) == 1 else torch.cat(self._taken)
            self._taken.clear()
            self.is_free.index_add_(0, taken, self._ones_of(taken.numel()), alpha=-1)

    def _spread(self, ids: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For every position, the lowest and highest group id that names the same id."""
        if self._scratch is None:
            self._scratch = (
                torch.empty(self.count + 1, dtype=torch.int64),
                torch.empty(self.count + 1, dtype=torch.int64),
            )
        low, high = self._scratch
        low.index_fill_(0, ids, groups.numel())
        low.scatter_reduce_(0, ids, groups, reduce="amin")
        high.index_fill_(0, ids, -1)
        high.scatter_reduce_(0, ids, groups, reduce="amax")
        return torch.index_select(low, 0, ids), torch.index_select(high, 0, ids)

    def give_back(
        self,
        ids: torch.Tensor,
        groups: torch.Tensor | None,
        *,
        what: str,
        pieces: list[torch.Tensor] | None = None,
    ) -> None:
        """Return ``ids`` (host int64, 1-D, owned) after checking all of them; on error, leave
        everything as it was.

        ``groups`` says which free call each id came from when one call may legitimately name an
        id several times (slots of one page); ``None`` means every repetition is an error.
        ``pieces`` are the free calls ``ids`` was concatenated from: they are pushed as chunks
        of their own, so the next ``alloc`` of the same size pops one without any copy.
        """
        if ids.numel() == 0:
            return
        if groups is not None:
            self._raise_out_of_range(ids, what, only_if_bad=True)
            ids = self._one_per_page(ids, groups, what=what)
        self.sync_marks()
        n = ids.numel()
        is_free = self.is_free
        try:
            # The range check is index_add_'s own: it refuses any id outside 0..count.
            is_free.index_add_(0, ids, self._ones_of(n))
        except (IndexError, RuntimeError):
            # It may have applied the ids before the bad one: rebuild the marks from the stack
            # (the truth), then name the bad id.
            self._rebuild_marks()
            self._raise_out_of_range(ids, what)
        # Every id read 0 (handed out) or 1 (free) before the add, so the batch is good exactly
        # when nothing reads 2 or more now. Why the maximum of the whole mask when it is small:
        # one pass over it is cheaper than gathering the batch's marks (and a large one would
        # run on the thread pool, see _MAX_PENDING_IDS).
        if is_free.numel() < _SERIAL_OP_SIZE:
            bad = int(is_free.max()) > 1
        else:
            bad = int(torch.index_select(is_free, 0, ids).max()) > 1
        if bad:
            is_free.index_add_(0, ids, self._ones_of(n), alpha=-1)  # undo exactly
            self._raise_bad_batch(ids, what)
        self._seal_top()
        if pieces is None:
            self._chunks.append(ids)
        else:
            self._chunks.extend(pieces)
        self.top += n

    def _rebuild_marks(self) -> None:
        """``is_free`` from the stack of free ids (after a bulk update failed half-way)."""
        self._taken.clear()
        self._seal_top()
        self.is_free.zero_()
        self.is_free[0] = 1
        for chunk in self._chunks:
            self.is_free.index_fill_(0, chunk, 1)

    def _one_per_page(self, ids: torch.Tensor, groups: torch.Tensor, *, what: str) -> torch.Tensor:
        """Pages named by several slots of one free call, once each; a page that two calls
        name is a double free."""
        first, last = self._spread(ids, groups)
        if not bool(torch.equal(first, last)):
            raise DoubleFreeError(f"{what} {int(ids[first != last][0])} is freed twice")
        order = torch.arange(ids.numel(), dtype=torch.int64)
        lowest, _ = self._spread(ids, order)
        return torch.masked_select(ids, lowest == order)  # not ids[...]: see _MAX_PENDING_IDS

    def _raise_out_of_range(self, ids: torch.Tensor, what: str, only_if_bad: bool = False) -> None:
        low, high = (int(v) for v in torch.aminmax(ids))
        if low >= 0 and high <= self.count:
            if only_if_bad:
                return
            raise AssertionError("index error with in-range ids")  # pragma: no cover
        bad = low if low < 0 else high
        raise InvalidSlotError(f"cannot free {what} {bad}: valid {what}s are 1..{self.count}")

    def _raise_bad_batch(self, ids: torch.Tensor, what: str) -> None:
        """Name the first bad id of a batch (the slow path: the batch is already undone)."""
        already = torch.index_select(self.is_free, 0, ids) == 1
        if bool(already.any()):
            first = int(ids[already][0])
            if first == 0:
                raise DoubleFreeError(f"{what} 0 is reserved and is never allocated")
            raise DoubleFreeError(f"{what} {first} is already free (double free)")
        order = torch.arange(ids.numel(), dtype=torch.int64)
        lowest, _ = self._spread(ids, order)
        raise DoubleFreeError(f"{what} {int(ids[lowest != order][0])} is freed twice")

    def _seal_top(self) -> None:
        """Cut the consumed head off the top chunk before another chunk goes above it."""
        if self._block is not None:
            self._flush_singles()
        if self._start:
            top = self._chunks.pop()
            if top.numel() > self._start:
                self._chunks.append(top[self._start :])
            self._start = 0

    def snapshot(self) -> tuple[tuple[torch.Tensor, ...], int]:
        self.sync_marks()
        self._seal_top()
        return tuple(self._chunks), self.top

    def restore(self, state: tuple[tuple[torch.Tensor, ...], int]) -> None:
        chunks, top = state
        self._singles = []
        self._block = None
        self._chunks = list(chunks)
        self._start = 0
        self.top = top
        self._rebuild_marks()


class PagedSlotAllocator(FreeGroup, ForwardsOffload):
    """Hands out whole pages of ``page_size`` slots; ``page_size=1`` is a token allocator.

    Page ``p`` covers slots ``[p * P, (p + 1) * P)``; page 0 (slot 0 and its page) is reserved.

    What a composite allocator (one that owns one of these per side, built on
    [`CompositeAllocator`][kvcache_core.CompositeAllocator]) needs is public and kept:

    - plans: `pages_for`, `plan_extend`, `plan_decode` check an ``alloc*`` call without
      changing anything, so a composite rejects a bad call before either side moves;
    - room: `has_room` says whether pages are free, settling queued frees only when short;
    - pages: `take_pages` is ``alloc`` returning host page ids (no copy back from a device);
    - frees: `queue_free` queues a call the composite owns, `settle_if_due` settles at the
      queue's bound, `check_frees` settles now, `allocated` says which slots are held;
    - verdicts: `on_settled` (set it) hears each queued call's verdict at every settle;
    - `check_every_last_loc`: whether ``alloc_decode`` checks every ``last_loc``.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        kvcache: KVPool,
        device: torch.device | str | None = None,
        *,
        eager_checks: bool = False,
    ) -> None:
        if size <= 0 or page_size <= 0:
            raise AllocatorError(f"size and page_size must be positive, got {size}, {page_size}")
        if size % page_size:
            raise AllocatorError(f"size {size} is not a multiple of page_size {page_size}")
        self.size = size
        """Usable slots (slot 0 and the rest of page 0 are never handed out)."""
        self.page_size = page_size
        """Slots per page: every allocation is of whole pages."""
        self.num_pages = size // page_size
        """Usable pages, ``size // page_size``."""
        self.device = torch.device(device) if device is not None else kvcache.device
        """Where returned slot tensors live (default: the pool's device)."""
        self._kvcache = kvcache
        self._free = _FreeIds(self.num_pages)
        self._pending: list[torch.Tensor] = []
        self._pending_ids = 0  # how many ids ``_pending`` holds
        self._offsets = torch.arange(page_size, dtype=torch.int64)
        self.eager_checks = eager_checks
        """Check each host-side free on the spot instead of in the next batch (debugging)."""
        self._on_host = self.device.type == "cpu"
        self.on_settled: SettleListener | None = None
        """Set by a composite allocator that owns this one: called at every settle with the
        queued calls, their host copies and the positions of the rejected ones (see
        [`SettleListener`][kvcache_core.SettleListener]), before any error is raised, so the
        composite can release or roll back its own side of each call."""
        self.check_every_last_loc = True
        """Whether ``alloc_decode`` checks ``last_loc`` for every request with a prefix. A
        window side (SWA) turns this off: its ``last_loc`` is a translated one, 0 once the
        token left the window, and matters only when the new slot continues its page."""

    # -- bookkeeping -----------------------------------------------------------------------
    def _settle(self) -> None:
        """Check and merge every queued free in one pass (one device sync, if any, is here)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._pending_ids = 0
        calls = pending if self._on_host else _to_host(pending)
        try:
            self._give_back(calls)
        except KVCacheError:
            self._give_back_one_by_one(pending, calls)
        else:
            if self.on_settled is not None:
                self.on_settled(pending, calls, frozenset())

    def allocated(self, slots: torch.Tensor) -> torch.Tensor:
        """A bool mask: which of ``slots`` (host int64, valid slots) lie in handed-out pages;
        queued frees are not counted (call `check_frees` first to count them).

        For composites rolling back a rejected call at settle time: a later call of the same
        batch may have freed the same slots, and then they are not to be put back.
        """
        self._free.sync_marks()
        return torch.index_select(self._free.is_free, 0, slots // self.page_size) == 0

    def settle_if_due(self) -> None:
        """Settle when the queue reached its bound (or at once, with eager checks).

        A composite that queued calls with ``queue_free(..., settle_if_due=False)`` (say, a
        whole free group) calls this once afterwards."""
        pending = self._pending
        if (
            len(pending) >= _MAX_PENDING_CALLS
            or self._pending_ids >= _MAX_PENDING_IDS
            or (self.eager_checks and pending and pending[-1].device.type == "cpu")
        ):
            self._settle()

    def _give_back_one_by_one(self, pending: list[torch.Tensor], calls: list[torch.Tensor]) -> None:
        """Slow path after a bad batch: apply every good call, reject the bad ones, tell the
        owning composite which were which, then raise one error naming the first bad id."""
        failures: list[tuple[int, KVCacheError]] = []
        for number, call in enumerate(calls, start=1):
            try:
                self._give_back([call])
            except KVCacheError as exc:
                failures.append((number, exc))
        if self.on_settled is not None:
            self.on_settled(pending, calls, frozenset(number - 1 for number, _ in failures))
        number, first = failures[0]
        context = (
            f" (queued free call {number} of {len(calls)}; "
            f"{len(failures)} bad call(s) rejected, the other frees applied)"
        )
        raise type(first)(f"{first}{context}") from None

    def _give_back(self, calls: list[torch.Tensor]) -> None:
        slots = calls[0] if len(calls) == 1 else torch.cat(calls)
        if self.page_size == 1:
            self._free.give_back(slots, None, what="slot", pieces=calls)
            return
        if bool((slots == 0).any()):
            raise DoubleFreeError("slot 0 is reserved and is never allocated")
        sizes = torch.tensor([c.numel() for c in calls])
        groups = torch.repeat_interleave(torch.arange(len(calls)), sizes)
        self._free.give_back(slots // self.page_size, groups, what="page")

    def has_room(self, pages: int) -> bool:
        """Whether ``pages`` free pages exist, settling queued frees only when the stack is
        short (so a call with room reads nothing back). A composite asks each side before it
        takes from any, so that a short side leaves every side untouched."""
        if pages > self._free.top:
            self._settle()
        return pages <= self._free.top

    def _slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def _out(self, slots: torch.Tensor) -> torch.Tensor:
        return slots if self._on_host else slots.to(self.device)

    def available_size(self) -> int:
        """Free tokens: free pages times the page size."""
        self._settle()
        return self._free.top * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (whole pages), or None when they do not fit; never partial."""
        if need_size == 1 and self.page_size == 1 and self._on_host:
            # A decode step at page size 1: a one-id view split ahead, no torch call.
            free = self._free
            singles = free._singles
            if singles:
                free.top -= 1
                return singles.pop()
            if free.top:
                return free.take_one()
        page_size = self.page_size
        pages, rest = divmod(need_size, page_size)
        if rest or need_size < 0:
            self.pages_for(need_size)  # raises
        free = self._free
        if pages > free.top and not self.has_room(pages):
            return None
        ids = free.take(pages)
        if page_size != 1:
            ids = self._slots_of(ids)
        return ids if self._on_host else ids.to(self.device)

    def take_pages(self, pages: int) -> torch.Tensor | None:
        """``pages`` free page ids on the host, or None (taking nothing) when they do not fit:
        what ``alloc`` hands out before it becomes slots on the device. For composites that
        keep host tables, so that they need not copy the slots back (a host sync). The result
        is a view of the free stack: never write it."""
        if not self.has_room(pages):
            return None
        return self._free.take(pages)

    def pages_for(self, need_size: int) -> int:
        """The pages ``alloc(need_size)`` takes; raises the
        [`AllocatorError`][kvcache_core.AllocatorError] a bad ``need_size`` gets (composites
        check it before they look at room on their other side)."""
        pages, rest = divmod(need_size, self.page_size)
        if rest or need_size < 0:
            raise AllocatorError(
                f"need_size must be a non-negative multiple of page_size {self.page_size}, got "
                f"{need_size}; use alloc_extend/alloc_decode for partial pages"
            )
        return pages

    def free(self, indices: torch.Tensor) -> None:
        """Release slots (and so their whole pages). Checked in a batch; see the module doc."""
        # The common call first, with as few Python steps as possible: a plain 1-D int64 host
        # tensor, no free group open. Queue a copy (the caller may reuse ``indices``).
        if (
            type(indices) is _TENSOR
            and indices.dtype is _INT64
            and indices.is_cpu
            and self._on_host
            and self._group is None
            and indices.dim() == 1
        ):
            n = indices.numel()
            if n:  # `queue_free`, inlined: a method call here costs 5% of a cycle
                pending = self._pending
                pending.append(indices.clone())
                self._pending_ids += n
                if (
                    len(pending) >= _MAX_PENDING_CALLS
                    or self._pending_ids >= _MAX_PENDING_IDS
                    or self.eager_checks
                ):
                    self._settle()
            return
        self._free_any(indices)

    def _free_any(self, indices: torch.Tensor) -> None:
        """`free` for every other call: any integer dtype and shape, any device, and
        calls collected by an open free group."""
        dtype = getattr(indices, "dtype", None)
        if dtype not in _INDEX_DTYPES:
            if not isinstance(indices, torch.Tensor):
                raise InvalidSlotError(f"indices must be a tensor, got {type(indices).__name__}")
            raise InvalidSlotError(f"indices must have an integer dtype, got {indices.dtype}")
        if indices.numel() == 0:
            return
        if self._collect(indices):
            return
        self.queue_free(self._own(indices))

    def _own(self, indices: torch.Tensor) -> torch.Tensor:
        """A 1-D int64 copy of ``indices`` (on the host for a host allocator).

        Why a copy: callers free views (a row of a request table) that they reuse, and the
        queued call must keep the ids it was given.
        """
        if indices.dtype is not torch.int64:
            indices = indices.reshape(-1).to(torch.int64)
        elif indices.dim() == 1:
            indices = indices.clone()
        else:
            indices = indices.reshape(-1).clone()
        if self._on_host and not indices.is_cpu:
            indices = indices.cpu()  # a host allocator keeps its queue on the host
        return indices

    def queue_free(self, owned: torch.Tensor, *, settle_if_due: bool = True) -> None:
        """Queue one free call that a composite owner already checked and copied (1-D int64 on
        this allocator's device, never written again by anyone); it is checked at the settle
        like a ``free``, and its verdict comes back through `on_settled` with this very tensor.
        ``settle_if_due=False`` leaves the queue as it is even past its bound (the caller then
        calls `settle_if_due`)."""
        self._pending.append(owned)
        self._pending_ids += owned.numel()
        if settle_if_due:
            self.settle_if_due()

    def _free_calls(self, calls: list[torch.Tensor]) -> None:
        """End of a free group: each collected call is queued as a call of its own, so a bad
        one is rejected alone (with the one error of the settle) and the others are applied.
        All are queued before any settle, so an error cannot drop the group's later calls."""
        owned = [self._own(c) for c in calls if c.numel()]
        self._pending.extend(owned)
        self._pending_ids += sum(c.numel() for c in owned)
        self.settle_if_due()

    def check_frees(self) -> None:
        """Check and merge queued frees now, raising on a bad one (see the module doc)."""
        self._settle()

    def backup_state(self) -> object:
        """A state that `restore_state` brings back exactly (undoing allocs and frees).

        Queued frees are settled first, so they are part of the state; a bad one raises here,
        after the good ones were applied, and no state is returned (call again).
        """
        self._flush_group()
        self._settle()
        return ("paged-slot-allocator", id(self), self._free.snapshot())

    def restore_state(self, state: object) -> None:
        """Go back to a ``backup_state()`` of this allocator: undoes every alloc and free since.

        :raises AllocatorError: ``state`` is not a backup of this allocator.
        """
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
        self._pending_ids = 0
        self._free.restore(state[2])
        self._forget_collected()

    def clear(self) -> None:
        """Free every slot but the reserved slot 0."""
        self._pending.clear()
        self._pending_ids = 0
        self._group = None
        self._free.reset()

    def get_kvcache(self) -> KVPool:
        """The pool this allocator hands out slots of (offload calls go there)."""
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
        return self.take_extend(
            self.plan_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        )

    def take_extend(self, plan: ExtendPlan) -> torch.Tensor | None:
        """Carry out a checked [`plan_extend`][kvcache_core.PagedSlotAllocator.plan_extend]
        plan: the slots ``alloc_extend`` returns, or None (taking nothing) when the new pages do
        not fit. The plan must be fresh (nothing allocated or freed since it was made), which
        is how a composite checks a call once and then takes from each side."""
        new_pages = plan.new_pages
        if not self.has_room(new_pages):
            return None
        P = self.page_size
        pages = self._free.take(new_pages)
        out: list[torch.Tensor] = []
        cursor = 0
        for start, partial, rest in plan.requests:
            if partial:
                out.append(torch.arange(start, start + partial, dtype=torch.int64))
            if rest:
                k = -(-rest // P)
                out.append(self._slots_of(pages[cursor : cursor + k])[:rest])
                cursor += k
        result = torch.cat(out) if out else torch.empty(0, dtype=torch.int64)
        return self._out(result)

    def plan_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> ExtendPlan:
        """Check an ``alloc_extend`` call without changing anything and say what it takes
        ([`ExtendPlan`][kvcache_core.ExtendPlan]); a bad call raises
        [`AllocatorError`][kvcache_core.AllocatorError] (a stale ``last_loc`` settles queued
        frees first). Composite allocators call it to reject a bad call before either side
        moves."""
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
        plan: list[tuple[int, int, int]] = []
        continued: list[tuple[int, int]] = []  # (last_loc, tokens before) of continued pages
        new_pages = 0
        for p, s, last in zip(prefixes, seqs, lasts, strict=True):
            if s < p or p < 0:
                raise AllocatorError(f"seq_len {s} is shorter than prefix_len {p}")
            partial = min((-p) % P, s - p)
            if partial:
                continued.append((last, p))
            rest = s - p - partial
            plan.append((last + 1, partial, rest))
            new_pages += -(-rest // P)
        self._check_last_locs(continued)
        return ExtendPlan(plan, new_pages)

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One slot per request; ``seq_lens`` include the new token."""
        return self.take_decode(self.plan_decode(seq_lens, last_loc))

    def take_decode(self, plan: DecodePlan) -> torch.Tensor | None:
        """Carry out a checked [`plan_decode`][kvcache_core.PagedSlotAllocator.plan_decode]
        plan: the slots ``alloc_decode`` returns, or None (taking nothing) when the fresh pages
        do not fit. The plan must be fresh, as for
        [`take_extend`][kvcache_core.PagedSlotAllocator.take_extend]."""
        lasts, needs_page, fresh_pages = plan
        if fresh_pages > self._free.top and not self.has_room(fresh_pages):
            return None
        if not fresh_pages:
            result = [last + 1 for last in lasts]
        else:
            P = self.page_size
            pages = iter(self._free.take(fresh_pages).tolist())
            result = [
                next(pages) * P if fresh else last + 1
                for last, fresh in zip(lasts, needs_page, strict=True)
            ]
        return self._out(_int64_tensor(result))

    def plan_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> DecodePlan:
        """Check an ``alloc_decode`` call without changing anything and say what it takes
        ([`DecodePlan`][kvcache_core.DecodePlan]); a bad call raises
        [`AllocatorError`][kvcache_core.AllocatorError].

        Every request with a prefix must name a slot it holds: a ``last_loc`` in a free page
        (settled or still queued) means the caller's table is stale, and handing out the slot
        after it, or a page as if the request were fine, would corrupt another request.

        One pass over the requests in Python (a decode step is a few dozen of them, where each
        torch call costs more than the loop) and one vectorised read of the free marks.
        """
        seqs = _host_ints(seq_lens)
        lasts = _host_ints(last_loc)
        if len(seqs) != len(lasts):
            raise AllocatorError("seq_lens and last_loc must have the same length")
        if seqs and min(seqs) < 1:
            bad = next(s for s in seqs if s < 1)
            raise AllocatorError(f"seq_len must be >= 1 for decode, got {bad}")
        P = self.page_size
        needs_page = [True] * len(seqs) if P == 1 else [(s - 1) % P == 0 for s in seqs]
        # the requests whose last_loc is looked up: (last_loc, tokens before), in order
        if self.check_every_last_loc:
            checked = [(last, s - 1) for s, last in zip(seqs, lasts, strict=True) if s > 1]
        else:
            checked = [
                (last, s - 1)
                for s, last, fresh in zip(seqs, lasts, needs_page, strict=True)
                if not fresh
            ]
        self._check_last_locs(checked)
        return DecodePlan(lasts, needs_page, needs_page.count(True))

    def _check_last_locs(self, requests: list[tuple[int, int]]) -> None:
        """Each ``(last_loc, tokens before)`` must be a held slot at the offset its length says.

        Queued frees are settled first (only when there are some): a page freed a moment ago
        is as free as one freed long ago. One vectorised read covers every request.
        """
        if not requests:
            return
        P = self.page_size
        limit = self.size + P
        bad = [
            (last, before)
            for last, before in requests
            if last < P or last >= limit or last % P != (before - 1) % P
        ]
        if bad:
            last, tokens_before = bad[0]
            raise AllocatorError(
                f"last_loc {last} cannot be the last slot of a request holding "
                f"{tokens_before} tokens with page_size {P}"
            )
        pages = [last // P for last, _ in requests] if P > 1 else [last for last, _ in requests]
        if self._pending:
            self._settle()
        self._free.sync_marks()
        marks = self._free.marks
        free = [i for i, page in enumerate(pages) if marks[page]]
        if free:
            last = requests[free[0]][0]
            where = f"slot {last}" if P == 1 else f"page {last // P}"
            raise AllocatorError(
                f"last_loc {last} lies in {where}, which is free: the request's slots were "
                "freed (or never allocated) and its table is stale"
            )


class TokenSlotAllocator(PagedSlotAllocator):
    """Slot-granular allocator (page size 1): the free list starts as ``1..size``."""

    def __init__(
        self, size: int, kvcache: KVPool, device: torch.device | str | None = None
    ) -> None:
        super().__init__(size, 1, kvcache, device)
