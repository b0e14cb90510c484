"""A model-based state machine shared by every queued (page-granular) allocator.

The model is plain Python: the requests the test holds (lists of slots, token ``i`` at page
offset ``i % P``) and, for composite allocators, the second side's truth (window slots,
device residency). Free pages are whatever no request holds.

Frees are queued and checked late, so a bad free surfaces at the next settle, which may be an
implicit one (an ``alloc`` running short, the 128-call queue bound, a backup, a size query).
The machine therefore settles only where an engine would: a bad free sets ``expected`` (the
id the error must name), every allocator call goes through :meth:`call`, which accepts exactly
one :class:`DoubleFreeError` naming it, and the rules that must settle check it has been seen.
Exact sizes are checked only in the ``settle`` rule and after rejected calls (a size query
settles the queue, which would hide the implicit paths).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvcache_core import AllocatorError, DoubleFreeError, InvalidSlotError, KVCacheError

#: Pages of the primary side: enough for one request of more than 128 pages, freed one call per
#: page, so the queue bound triggers.
PAGES_DEFAULT = 160  # a machine may set its own ``PAGES``
BIG = 130

_RAISED = object()


class QueuedAllocatorMachine(RuleBasedStateMachine):
    """Rules and model shared by the token, paged, hybrid-Mamba, SWA and HiSparse allocators.

    Subclasses set ``PAGE_SIZE`` and implement :meth:`build`; composites extend the model
    through the ``on_*``/``side_*`` hooks and add their own rules and table checks.
    """

    PAGE_SIZE = 1
    PAGES = PAGES_DEFAULT
    HAS_PAGED_CALLS = True
    #: Composites range-check a free at the call (they must read their table there); the
    #: plain allocators check it with the queue, like a double free.
    EAGER_RANGE_CHECK = False

    def __init__(self) -> None:
        super().__init__()
        self.P = 1
        self.alloc: Any = None
        self.reqs: list[list[int]] = []
        self.expected: str | None = None  # regex the pending DoubleFreeError must match
        self.saved: Any = None
        self.foreign_state: object = None
        # Pages freed by calls still queued. Only these are double-freed on purpose: an id
        # that is free *and settled* may be handed out again before the bad call is checked,
        # and then the late check cannot tell it from a free by its new owner (a documented
        # limit of batched checks; ``eager_checks`` catches it at the call).
        self.recent: set[int] = set()
        self.grouped: set[int] = set()

    # -- subclass interface -----------------------------------------------------------------
    def build(self, page_size: int) -> Any:
        raise NotImplementedError

    def side_fits(self, pages: int, continued: list[list[int]]) -> bool:
        """Whether the second side has room for ``pages`` new pages plus whatever continuing
        the last pages of ``continued`` requests needs (composites)."""
        return True

    def extra_state(self) -> Any:
        return None

    def set_extra_state(self, state: Any) -> None:
        pass

    def on_alloc(self, slots: list[int], continued_page: int | None = None) -> None:
        pass

    def on_free(self, slots: list[int]) -> None:
        pass

    def exact_sizes(self) -> None:
        """Compare every size the allocator reports with the model (settles the queue)."""
        assert self.measure(self.alloc.available_size) == self.free_pages() * self.P

    def tables(self) -> list[torch.Tensor]:
        """Copies of the translation tables, to compare around a rejected call."""
        return []

    def pending_len(self) -> int:
        """Free calls queued on the side that checks them (white box: to know which ids are
        still queued)."""
        return len(self.alloc._pending)

    # -- model ------------------------------------------------------------------------------
    def live(self) -> set[int]:
        return {s for r in self.reqs for s in r}

    def used_pages(self) -> set[int]:
        return {s // self.P for r in self.reqs for s in r}

    def free_pages(self) -> int:
        return self.PAGES - len(self.used_pages())

    def fits(self, pages: int, continued: list[list[int]] | None = None) -> bool:
        return pages <= self.free_pages() and self.side_fits(pages, continued or [])

    def name_of(self, slot: int) -> str:
        """How an error names the id of ``slot``: by slot at page size 1, else by page."""
        return f"slot {slot}" if self.P == 1 else f"page {slot // self.P}"

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an allocator call; a DoubleFreeError must be the one pending bad free's."""
        try:
            return fn(*args)
        except (DoubleFreeError, InvalidSlotError) as exc:
            assert self.expected is not None, f"unexpected error: {exc}"
            assert re.search(self.expected, str(exc)), (self.expected, str(exc))
            self.expected = None
            return _RAISED
        finally:
            if not self.pending_len():
                self.recent.clear()

    def measure(self, fn: Callable[[], int]) -> int:
        """A size query (it settles): if it reports the pending bad free, ask again."""
        size = self.call(fn)
        if size is _RAISED:
            size = fn()
        assert isinstance(size, int)
        return size

    def settled(self) -> None:
        assert self.expected is None, f"the bad free ({self.expected}) was never reported"

    def take(self, out: Any, count: int) -> list[int] | None:
        """Check a successful allocation (exact count, never a live slot) and return it."""
        if out is None or out is _RAISED:
            return None
        slots = [int(x) for x in out.tolist()]
        assert len(slots) == count, "partial allocation"
        assert len(set(slots)) == len(slots), "one slot handed out twice in one call"
        assert not set(slots) & self.live(), "a slot handed out twice"
        assert all(0 < s < self.PAGES * self.P + self.P for s in slots)
        return slots

    # -- rules ------------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        self.P = self.PAGE_SIZE
        self.alloc = self.build(self.P)
        self.foreign_state = self.build(self.P).backup_state()

    @rule(pages=st.integers(0, 6))
    def alloc_pages(self, pages: int) -> None:
        fits = self.fits(pages)
        out = self.call(self.alloc.alloc, pages * self.P)
        if out is _RAISED:
            return
        slots = self.take(out, pages * self.P)
        if slots is None:
            assert not fits, "alloc returned None although the pages were free"
            return
        assert fits, "alloc succeeded without room"
        if slots:
            self.reqs.append(slots)
            self.on_alloc(slots)

    @rule(data=st.data(), grow=st.integers(1, 9), fresh=st.booleans())
    @precondition(lambda self: self.HAS_PAGED_CALLS)
    def extend(self, data: st.DataObject, grow: int, fresh: bool) -> None:
        P = self.P
        if fresh or not self.reqs:
            req: list[int] = []
            prefix, last = 0, -1
        else:
            req = data.draw(st.sampled_from(self.reqs))
            if not self.can_continue(req):
                return
            prefix, last = len(req), req[-1]
        need = -(-(prefix + grow) // P) - -(-prefix // P)
        fits = self.fits(need, [req] if prefix % P else [])
        out = self.call(
            self.alloc.alloc_extend,
            torch.tensor([prefix]),
            torch.tensor([prefix + grow]),
            torch.tensor([last]),
            grow,
        )
        if out is _RAISED:
            return
        slots = self.take(out, grow)
        if slots is None:
            assert not fits
            return
        assert fits
        assert all(s % P == (prefix + i) % P for i, s in enumerate(slots)), "page offsets"
        if prefix % P:
            assert slots[0] == last + 1, "the partial page was not continued"
        self.on_alloc(slots, continued_page=last // P if prefix % P else None)
        if req:
            req.extend(slots)
        else:
            self.reqs.append(slots)

    @rule(data=st.data())
    @precondition(lambda self: self.HAS_PAGED_CALLS and self.reqs)
    def decode(self, data: st.DataObject) -> None:
        chosen = data.draw(
            st.lists(st.sampled_from(range(len(self.reqs))), unique=True, min_size=1, max_size=3)
        )
        reqs = [self.reqs[i] for i in chosen if self.can_continue(self.reqs[i])]
        if not reqs:
            return
        need = sum(len(r) % self.P == 0 for r in reqs)
        fits = self.fits(need, [r for r in reqs if len(r) % self.P])
        out = self.call(
            self.alloc.alloc_decode,
            torch.tensor([len(r) + 1 for r in reqs]),
            torch.tensor([r[-1] for r in reqs]),
        )
        if out is _RAISED:
            return
        slots = self.take(out, len(reqs))
        if slots is None:
            assert not fits
            return
        assert fits
        for r, s in zip(reqs, slots, strict=True):
            assert s % self.P == len(r) % self.P
            cont = len(r) % self.P != 0
            if cont:
                assert s == r[-1] + 1
            self.on_alloc([s], continued_page=r[-1] // self.P if cont else None)
            r.append(s)

    def can_continue(self, req: list[int]) -> bool:
        return True

    def _free_call(self, slots: list[int], *, grouped: bool = False) -> None:
        """One free call of ``slots`` (held by the model); applied whatever the call raises."""
        self.call(self.alloc.free, torch.tensor(slots, dtype=torch.int64))
        pages = {s // self.P for s in slots}
        if grouped:
            self.grouped |= pages
        elif self.pending_len():
            self.recent |= pages

    def _end_group(self) -> None:
        self.call(self.alloc.free_group_end)
        if self.pending_len():
            self.recent |= self.grouped
        self.grouped = set()

    def _drop(self, reqs: list[list[int]]) -> None:
        for r in reqs:
            self.on_free(r)
        self.reqs = [r for r in self.reqs if all(r is not g for g in reqs)]

    @rule(data=st.data(), mode=st.sampled_from(["one", "singly", "group"]))
    @precondition(lambda self: self.reqs)
    def free_requests(self, data: st.DataObject, mode: str) -> None:
        picked = data.draw(
            st.lists(st.sampled_from(range(len(self.reqs))), unique=True, min_size=1, max_size=3)
        )
        reqs = [self.reqs[i] for i in picked]
        if mode == "group":
            self.alloc.free_group_begin()
        for r in reqs:
            if mode == "singly":
                for page in sorted({s // self.P for s in r}):
                    self._free_call([s for s in r if s // self.P == page])
            else:
                self._free_call(r, grouped=mode == "group")
        if mode == "group":
            self._end_group()
        self._drop(reqs)

    @rule()
    @precondition(lambda self: self.fits(BIG))
    def free_past_the_queue_bound(self) -> None:
        """A request of more than 128 pages freed one call per page, nothing settled between:
        the queue bound settles on its own (and reports a pending bad free there)."""
        out = self.call(self.alloc.alloc, BIG * self.P)
        if out is _RAISED:
            return
        slots = self.take(out, BIG * self.P)
        assert slots is not None
        self.on_alloc(slots)
        self.reqs.append(slots)
        for i in range(BIG):
            self._free_call(slots[i * self.P : (i + 1) * self.P])
        self._drop([slots])

    @rule(
        data=st.data(),
        in_group=st.booleans(),
        kind=st.sampled_from(["queued", "same group", "twice in one call", "out of range"]),
    )
    @precondition(lambda self: self.expected is None)
    def double_free(self, data: st.DataObject, in_group: bool, kind: str) -> None:
        """A bad free, alone or inside a group between good frees: exactly one error must name
        it (at the next settle) and every other free must be applied.

        Targets: a page whose free is still queued; a page freed earlier in the same group;
        (page size 1) one live id twice in one call, which is rejected as a whole.
        """
        P = self.P
        if not self.reqs and not self.recent:
            return
        if (kind == "twice in one call" and P > 1) or (
            kind == "out of range" and self.EAGER_RANGE_CHECK
        ):
            kind = "queued"
        if kind == "queued" and not self.recent:
            first = data.draw(st.sampled_from(self.reqs))
            self._free_call(first)  # a good free, still queued unless it hit the bound
            self._drop([first])
            if not self.recent:
                return
        in_group = in_group or kind == "same group"
        good: list[list[int]] = []
        if in_group and self.reqs:
            picked = data.draw(
                st.lists(st.sampled_from(range(len(self.reqs))), unique=True, max_size=2)
            )
            good = [self.reqs[i] for i in picked]
        if kind == "same group":
            if not good:
                return
            slot = data.draw(st.sampled_from(good[0]))
            bad = [slot]
        elif kind == "out of range":
            slot = (self.PAGES + 1) * P + data.draw(st.integers(0, 3))
            bad = [slot]
        elif kind == "twice in one call":
            held = [r for r in self.reqs if all(r is not g for g in good)]
            if not held:
                return
            slot = data.draw(st.sampled_from(held))[0]
            bad = [slot, slot]  # rejected as a whole: the request keeps its slot
        else:
            slot = data.draw(st.sampled_from(sorted(self.recent))) * P
            slot += data.draw(st.integers(0, P - 1))
            bad = [slot]
            good = [r for r in good if slot not in r]
        self.expected = rf"\b{self.name_of(slot)}\b"
        if kind == "out of range":
            self.expected = rf"cannot free {self.name_of(slot)}: valid"
        if in_group:
            self.alloc.free_group_begin()
            for r in good[:1]:
                self._free_call(r, grouped=True)
        self.call(self.alloc.free, torch.tensor(bad, dtype=torch.int64))
        if in_group:
            for r in good[1:]:
                self._free_call(r, grouped=True)
            self._end_group()
        self._drop(good)

    @rule(how=st.sampled_from(["sizes", "check_frees", "backup", "alloc_short"]))
    def settle(self, how: str) -> None:
        """Settle the queue one way or another; any pending bad free must be reported now."""
        if how == "check_frees":
            self.call(self.alloc.check_frees)
        elif how == "backup":
            state = self.call(self.alloc.backup_state)
            if state is _RAISED:  # a bad free surfaced; the good ones are applied: try again
                state = self.alloc.backup_state()
            self.saved = (state, [list(r) for r in self.reqs], self.extra_state())
        elif how == "alloc_short":
            assert self.call(self.alloc.alloc, (self.PAGES + 1) * self.P) in (None, _RAISED)
        self.exact_sizes()
        self.settled()
        self.exact_sizes()

    def teardown(self) -> None:
        """Every run ends settled: a pending bad free must be reported, sizes must be exact."""
        if self.alloc is not None:
            self.exact_sizes()
            self.settled()

    @rule()
    @precondition(lambda self: self.saved is not None)
    def restore(self) -> None:
        """Undo everything since the backup, queued frees (a pending bad one too) included."""
        state, reqs, extra = self.saved
        self.alloc.restore_state(state)
        self.reqs = [list(r) for r in reqs]
        self.set_extra_state(extra)
        self.expected = None
        self.recent.clear()

    @rule()
    def clear(self) -> None:
        self.alloc.clear()
        self.reqs = []
        self.set_extra_state(None)
        self.expected = None
        self.recent.clear()

    @rule(data=st.data())
    @precondition(lambda self: self.expected is None)
    def rejected_call(self, data: st.DataObject) -> None:
        """A call the allocator must reject changes nothing: sizes, free set, tables."""
        before_tables = self.tables()
        queued = sorted(self.recent)  # pages whose free is still queued
        if not (queued and self.HAS_PAGED_CALLS and data.draw(st.booleans())):
            queued = []
            self.exact_sizes()  # settles; the model is the "before"
        P = self.P
        used = self.used_pages()
        free_page = next((p for p in range(1, self.PAGES + 1) if p not in used), None)
        calls: dict[str, tuple[type[KVCacheError], str, Callable[[], Any]]] = {
            "float free": (
                InvalidSlotError,
                "integer dtype",
                lambda: self.alloc.free(torch.tensor([1.0])),
            ),
            "negative alloc": (AllocatorError, "page_size", lambda: self.alloc.alloc(-P)),
            "foreign restore": (
                AllocatorError,
                "did not back up",
                lambda: self.alloc.restore_state(self.foreign_state),
            ),
            "group end without begin": (
                AllocatorError,
                "without free_group_begin",
                self.alloc.free_group_end,
            ),
        }
        if self.EAGER_RANGE_CHECK:
            beyond = (self.PAGES + 1) * P + 2
            calls["free out of range"] = (
                InvalidSlotError,
                rf"\b{beyond}\b.*out of range",
                lambda: self.alloc.free(torch.tensor([2, beyond])),
            )
            calls["free slot 0"] = (
                KVCacheError,
                r"\b0\b.*(reserved|padding)",
                lambda: self.alloc.free(torch.tensor([0])),
            )
        if P > 1:
            calls["partial-page alloc"] = (
                AllocatorError,
                "multiple of page_size",
                lambda: self.alloc.alloc(P + 1),
            )
        if self.HAS_PAGED_CALLS:
            calls["extend lengths"] = (
                AllocatorError,
                "same length",
                lambda: self.alloc.alloc_extend(
                    torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([-1]), 2
                ),
            )
            calls["extend count"] = (
                AllocatorError,
                "extend_num_tokens",
                lambda: self.alloc.alloc_extend(
                    torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 2
                ),
            )
            if free_page is not None:
                # the last slot of a 2-token request, in a free page: a stale table
                stale = free_page * P + (1 % P)
                calls["decode stale last_loc"] = (
                    AllocatorError,
                    rf"last_loc {stale} .*free",
                    lambda: self.alloc.alloc_decode(torch.tensor([3]), torch.tensor([stale])),
                )
        if queued:  # the page was freed a moment ago: as stale as one freed long ago
            late = queued[0] * P + (1 % P)
            calls = {
                "decode queued-free last_loc": (
                    AllocatorError,
                    rf"last_loc {late} .*free",
                    lambda: self.alloc.alloc_decode(torch.tensor([3]), torch.tensor([late])),
                )
            }
        name = data.draw(st.sampled_from(sorted(calls)))
        error, message, fn = calls[name]
        try:
            fn()
        except error as exc:
            assert re.search(message, str(exc)), (name, str(exc))
        else:
            raise AssertionError(f"{name}: not rejected")
        after_tables = self.tables()
        assert all(torch.equal(a, b) for a, b in zip(before_tables, after_tables, strict=True))
        self.exact_sizes()
        # a nested begin is rejected and keeps the open group
        self.alloc.free_group_begin()
        try:
            self.alloc.free_group_begin()
        except AllocatorError as exc:
            assert "twice" in str(exc)
        else:
            raise AssertionError("nested free_group_begin accepted")
        self.alloc.free_group_end()
        self.exact_sizes()
