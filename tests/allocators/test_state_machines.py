"""Every built-in allocator against a plain-Python model (see ``_model.py`` for the shared rules).

Sized to run in a few seconds each on a 2-core machine: derandomized, so a failure reproduces.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcache_core import AllocatorError, DoubleFreeError, InvalidSlotError
from kvcache_plugins._mamba_state import MambaSlotAllocator

from . import _factories as fx
from ._model import BIG, QueuedAllocatorMachine

SETTINGS = settings(derandomize=True, max_examples=30, stateful_step_count=40, deadline=None)


def _case(machine: type[RuleBasedStateMachine], examples: int = 30) -> Any:
    case = machine.TestCase
    case.settings = settings(SETTINGS, max_examples=examples)
    return case


# -- plain allocators -----------------------------------------------------------------------------
class TokenMachine(QueuedAllocatorMachine):
    def build(self, page_size: int) -> Any:
        return fx.paged(self.PAGES * page_size, page_size)


class PagedMachine(TokenMachine):
    PAGE_SIZE = 4


class MLAMachine(QueuedAllocatorMachine):
    PAGE_SIZE = 2

    def build(self, page_size: int) -> Any:
        return fx.mla(self.PAGES * page_size, page_size)


class HybridMambaMachine(QueuedAllocatorMachine):
    """The hybrid allocator's token side; its request slots have their own machine below."""

    def build(self, page_size: int) -> Any:
        return fx.hybrid(self.PAGES * page_size, page_size)


class PagedHybridMambaMachine(HybridMambaMachine):
    PAGE_SIZE = 2


TestToken = _case(TokenMachine)
TestPaged = _case(PagedMachine)
TestMLA = _case(MLAMachine, 15)
TestHybridMamba = _case(HybridMambaMachine, 15)
TestPagedHybridMamba = _case(PagedHybridMambaMachine, 15)


# -- SWA ------------------------------------------------------------------------------------------
class SWAMachine(QueuedAllocatorMachine):
    """Full side in the shared model; the window side as the set of full slots that hold a
    window slot (a full page's tokens share one window page)."""

    SWA_PAGES = BIG + 6

    def __init__(self) -> None:
        super().__init__()
        self.windowed: set[int] = set()

    def build(self, page_size: int) -> Any:
        return fx.swa_alloc(self.PAGES * page_size, self.SWA_PAGES * page_size, page_size)

    def window_pages(self) -> set[int]:
        return {s // self.P for s in self.windowed}

    def side_fits(self, pages: int, continued: list[list[int]]) -> bool:
        return pages <= self.SWA_PAGES - len(self.window_pages())

    def can_continue(self, req: list[int]) -> bool:
        return req[-1] in self.windowed  # the engine never grows a request out of the window

    def on_alloc(self, slots: list[int], continued_page: int | None = None) -> None:
        self.windowed |= set(slots)

    def on_free(self, slots: list[int]) -> None:
        pages = {s // self.P for s in slots}
        self.windowed = {s for s in self.windowed if s // self.P not in pages}

    def extra_state(self) -> Any:
        return set(self.windowed)

    def set_extra_state(self, state: Any) -> None:
        self.windowed = set(state) if state is not None else set()

    def exact_sizes(self) -> None:
        full = self.measure(self.alloc.full_available_size)
        window = self.measure(self.alloc.swa_available_size)
        assert full == self.free_pages() * self.P, "full side drifted"
        assert window == (self.SWA_PAGES - len(self.window_pages())) * self.P, "window drifted"
        assert self.measure(self.alloc.available_size) == min(full, window)

    def tables(self) -> list[torch.Tensor]:
        return [self.alloc.full_to_swa_index_mapping.clone()]

    def pending_len(self) -> int:
        return len(self.alloc.full_attn_allocator._pending)

    @rule(data=st.data())
    @precondition(lambda self: self.reqs)
    def leave_window(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.reqs))
        pages = sorted({s // self.P for s in req})
        k = data.draw(st.integers(1, max(1, len(pages) - 1)))
        gone = [s for s in req if s // self.P in pages[:k]]
        self.call(self.alloc.free_swa, torch.tensor(gone))
        self.windowed -= {s for s in self.windowed if s // self.P in pages[:k]}

    @invariant()
    def table_matches_the_model(self) -> None:
        if self.alloc is None or self.expected is not None:
            return  # a rejected call's entries come back only when the full side settles
        mapping = self.alloc.full_to_swa_index_mapping.tolist()
        assert mapping[-1] == -1
        has = {s for s, w in enumerate(mapping[:-1]) if w > 0}
        assert has == self.windowed, "window slots do not match the model"
        window = [mapping[s] for s in has]
        assert len(window) == len(set(window)), "a window slot is held twice"
        page_of: dict[int, int] = {}
        for s in has:
            assert mapping[s] % self.P == s % self.P
            assert page_of.setdefault(s // self.P, mapping[s] // self.P) == mapping[s] // self.P


class PagedSWAMachine(SWAMachine):
    PAGE_SIZE = 2


TestSWA = _case(SWAMachine, 25)
TestPagedSWA = _case(PagedSWAMachine, 25)


# -- HiSparse -------------------------------------------------------------------------------------
class HiSparseMachine(QueuedAllocatorMachine):
    """Logical side in the shared model; the device side as the set of resident logical pages
    (each owns one device page)."""

    DEVICE_PAGES = BIG + 6
    PAGES = 2 * DEVICE_PAGES  # ratio 2

    def __init__(self) -> None:
        super().__init__()
        self.resident: set[int] = set()

    def build(self, page_size: int) -> Any:
        return fx.hisparse_alloc(self.DEVICE_PAGES * page_size, page_size, ratio=2)

    def device_free(self) -> int:
        return self.DEVICE_PAGES - len(self.resident)

    def side_fits(self, pages: int, continued: list[list[int]]) -> bool:
        cold = {r[-1] // self.P for r in continued} - self.resident
        return pages + len(cold) <= self.device_free()

    def on_alloc(self, slots: list[int], continued_page: int | None = None) -> None:
        self.resident |= {s // self.P for s in slots}
        if continued_page is not None:
            self.resident.add(continued_page)

    def on_free(self, slots: list[int]) -> None:
        self.resident -= {s // self.P for s in slots}

    def extra_state(self) -> Any:
        return set(self.resident)

    def set_extra_state(self, state: Any) -> None:
        self.resident = set(state) if state is not None else set()

    def exact_sizes(self) -> None:
        logical = self.measure(self.alloc.logical_available_size)
        device = self.measure(self.alloc.device_available_size)
        assert logical == self.free_pages() * self.P, "logical side drifted"
        assert device == self.device_free() * self.P, "device side drifted"
        assert self.measure(self.alloc.available_size) == min(logical, device)

    def tables(self) -> list[torch.Tensor]:
        return [self.alloc.logical_to_device.clone()]

    def pending_len(self) -> int:
        return len(self.alloc._logical._pending)

    @rule(pages=st.integers(1, 4))
    def alloc_logical_only(self, pages: int) -> None:
        fits = pages <= self.free_pages()
        out = self.call(self.alloc.alloc_logical_only, pages * self.P)
        if out is not None and not isinstance(out, torch.Tensor):
            return  # the pending bad free surfaced; nothing allocated
        slots = self.take(out, pages * self.P)
        assert (slots is not None) == fits
        if slots:
            self.reqs.append(slots)
            assert (self.alloc.translate_loc_to_device(torch.tensor(slots)) == -1).all()

    @rule(data=st.data())
    @precondition(lambda self: self.reqs)
    def alloc_device(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.reqs))
        cold = {s // self.P for s in req} - self.resident
        out = self.call(self.alloc.alloc_device, torch.tensor(req))
        if out is not None and not isinstance(out, torch.Tensor):
            return
        if len(cold) > self.device_free():
            assert out is None
            return
        assert out is not None and (out >= 0).all()
        self.resident |= cold

    @rule(data=st.data())
    @precondition(lambda self: self.reqs)
    def free_device(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.reqs))
        self.call(self.alloc.free_device, torch.tensor(req))
        self.resident -= {s // self.P for s in req}

    @invariant()
    def table_matches_the_model(self) -> None:
        if self.alloc is None or self.expected is not None:
            return  # a rejected call's residency comes back only when the logical side settles
        table = self.alloc.logical_to_device.tolist()
        assert table[0] == 0 and table[-1] == -1
        P = self.P
        device_pages = []
        for page in range(1, self.PAGES + 1):
            row = table[page * P : (page + 1) * P]
            if page in self.resident:
                assert row[0] >= P and row[0] % P == 0, f"page {page} not resident"
                assert row == list(range(row[0], row[0] + P))
                device_pages.append(row[0] // P)
            else:
                assert row == [-1] * P, f"page {page} resident but the model says not"
        assert len(device_pages) == len(set(device_pages)), "a device page is held twice"


class PagedHiSparseMachine(HiSparseMachine):
    PAGE_SIZE = 2


TestHiSparse = _case(HiSparseMachine, 20)
TestPagedHiSparse = _case(PagedHiSparseMachine, 20)


# -- the Mamba request-slot allocator (eager checks, no queue) ----------------------------------
class MambaSlotMachine(RuleBasedStateMachine):
    """Frees are checked on the spot here: a bad one raises at once (in a group: at the end).

    Alloc groups too: ``self.group`` is the set of slots the open group reserved and has not
    handed out (None: no group open); ``alloc`` inside a group must hand out reserved slots
    while enough are left, and the free list only otherwise."""

    SIZE = 12

    def __init__(self) -> None:
        super().__init__()
        self.alloc = MambaSlotAllocator(self.SIZE)
        self.reqs: list[list[int]] = []
        self.saved: Any = None
        self.group: set[int] | None = None

    def live(self) -> set[int]:
        return {s for r in self.reqs for s in r}

    def reserved(self) -> set[int]:
        return set() if self.group is None else self.group

    def free_list(self) -> int:
        return self.SIZE - len(self.live()) - len(self.reserved())

    @rule(n=st.integers(0, 6))
    def group_begin(self, n: int) -> None:
        if self.group is not None or n > self.free_list():
            before = self.alloc.backup_state()
            with pytest.raises(AllocatorError, match="alloc_group_begin"):
                self.alloc.alloc_group_begin(n)
            after = self.alloc.backup_state()
            assert torch.equal(before[2], after[2]) and self.alloc.alloc_group_reserved() == (
                len(self.reserved())
            )
            return
        free_before = set(self.alloc.backup_state()[2].tolist())
        self.alloc.alloc_group_begin(n)
        free_after = set(self.alloc.backup_state()[2].tolist())
        assert free_after <= free_before and len(free_before - free_after) == n
        self.group = free_before - free_after
        assert self.alloc.alloc_group_reserved() == n

    @rule()
    def group_end(self) -> None:
        if self.group is None:
            with pytest.raises(AllocatorError, match="without alloc_group_begin"):
                self.alloc.alloc_group_end()
            return
        self.alloc.alloc_group_end()
        self.group = None
        assert self.alloc.alloc_group_reserved() == 0

    @initialize()
    def start(self) -> None:
        self.foreign = MambaSlotAllocator(self.SIZE).backup_state()

    @rule(n=st.integers(0, 4))
    def alloc_slots(self, n: int) -> None:
        out = self.alloc.alloc(n)
        from_group = self.group is not None and 0 < n <= len(self.group)
        if not from_group and n > self.free_list():
            assert out is None
            return
        assert out is not None and out.numel() == n
        slots = out.tolist()
        assert not set(slots) & self.live() and len(set(slots)) == n
        if from_group:
            assert self.group is not None and set(slots) <= self.group, "not from the group"
            self.group -= set(slots)
        else:
            assert not set(slots) & self.reserved(), "a reserved slot handed out past the group"
        if slots:
            self.reqs.append(slots)

    def _drop(self, reqs: list[list[int]]) -> None:
        self.reqs = [r for r in self.reqs if all(r is not g for g in reqs)]

    @rule(data=st.data(), grouped=st.booleans(), bad=st.sampled_from([None, "free", "dup"]))
    def free_slots(self, data: st.DataObject, grouped: bool, bad: str | None) -> None:
        reqs: list[list[int]] = []
        if self.reqs:
            picked = data.draw(st.lists(st.sampled_from(range(len(self.reqs))), unique=True))
            reqs = [self.reqs[i] for i in picked]
        victim = None
        if bad == "free":
            # a free slot, or one the open group reserved (not allocated either)
            free = sorted(set(range(1, self.SIZE + 1)) - self.live())
            victim = [data.draw(st.sampled_from(free))] if free else None
        elif bad == "dup":
            held = sorted(self.live() - {s for r in reqs for s in r})
            victim = [held[0], held[0]] if held else None
        if grouped:
            self.alloc.free_group_begin()
        errors: list[Exception] = []
        calls = [*reqs[:1], *([victim] if victim else []), *reqs[1:]]
        for slots in calls:
            try:
                self.alloc.free(torch.tensor(slots))
            except DoubleFreeError as exc:
                errors.append(exc)
        if grouped:
            try:
                self.alloc.free_group_end()
            except DoubleFreeError as exc:
                errors.append(exc)
        assert len(errors) == (1 if victim else 0), errors
        if victim:
            assert re.search(rf"request slot {victim[0]}\b", str(errors[0])), str(errors[0])
        self._drop(reqs)
        assert self.alloc.available_size() == self.free_list()

    @rule()
    def backup(self) -> None:
        group = None if self.group is None else set(self.group)
        self.saved = (self.alloc.backup_state(), [list(r) for r in self.reqs], group)

    @rule(data=st.data())
    def backup_inside_free_group(self, data: st.DataObject) -> None:
        """A backup taken inside an open free group saves the frees collected before it:
        restoring it later must not bring those slots back as allocated."""
        reqs: list[list[int]] = []
        if self.reqs:
            picked = data.draw(st.lists(st.sampled_from(range(len(self.reqs))), unique=True))
            reqs = [self.reqs[i] for i in picked]
        self.alloc.free_group_begin()
        for slots in reqs:
            self.alloc.free(torch.tensor(slots))
        self._drop(reqs)
        group = None if self.group is None else set(self.group)
        self.saved = (self.alloc.backup_state(), [list(r) for r in self.reqs], group)
        self.alloc.free_group_end()
        assert self.alloc.available_size() == self.free_list()

    @rule()
    @precondition(lambda self: self.saved is not None)
    def restore(self) -> None:
        self.alloc.restore_state(self.saved[0])
        self.reqs = [list(r) for r in self.saved[1]]
        self.group = None if self.saved[2] is None else set(self.saved[2])
        assert self.alloc.alloc_group_reserved() == len(self.reserved())

    @rule()
    def clear(self) -> None:
        self.alloc.clear()
        self.reqs = []
        self.group = None
        assert self.alloc.alloc_group_reserved() == 0

    @rule(which=st.sampled_from(["float", "range", "zero", "size", "foreign", "nested"]))
    def rejected_call(self, which: str) -> None:
        before = (self.alloc.available_size(), self.alloc.backup_state()[2].sort().values)
        with pytest.raises((AllocatorError, InvalidSlotError)) as info:
            if which == "float":
                self.alloc.free(torch.tensor([1.0]))
            elif which == "range":
                self.alloc.free(torch.tensor([self.SIZE + 1]))
            elif which == "zero":
                self.alloc.free(torch.tensor([0]))
            elif which == "size":
                self.alloc.alloc(-1)
            elif which == "foreign":
                self.alloc.restore_state(self.foreign)
            else:
                self.alloc.free_group_begin()
                try:
                    self.alloc.free_group_begin()
                finally:
                    self.alloc.free_group_end()
        assert str(info.value)
        after = (self.alloc.available_size(), self.alloc.backup_state()[2].sort().values)
        assert before[0] == after[0] and torch.equal(before[1], after[1])

    @invariant()
    def exact_size(self) -> None:
        assert self.alloc.available_size() == self.free_list()
        assert self.alloc.alloc_group_reserved() == len(self.reserved())


TestMambaSlots = _case(MambaSlotMachine, 60)
