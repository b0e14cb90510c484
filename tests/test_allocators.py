"""Slot allocators: invariants under hypothesis-driven request workloads, and error paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcache_core import AllocatorError, DoubleFreeError, InvalidSlotError, PagedAllocator
from kvcache_core import TokenAllocator as TokenAllocatorProtocol
from kvcache_plugins.allocators import PagedSlotAllocator, TokenSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool


def make(size=32, page_size=1):
    pool = MHATokenToKVPool(size, page_size, torch.float32, 1, 2, 1)
    return PagedSlotAllocator(size, page_size, pool)


class RequestWorkload(RuleBasedStateMachine):
    """Requests grow by extend and decode and get freed; a plain-Python model tracks the truth.

    Checked after every step: no slot is handed out twice, each request's token ``i`` sits at
    offset ``i % P`` of its page; now and then ``available_size`` equals free pages times P;
    backup/restore brings back exactly the saved state.
    """

    SIZE = 48

    def __init__(self) -> None:
        super().__init__()
        self.page_size = 1
        self.alloc: PagedSlotAllocator | None = None
        self.requests: list[list[int]] = []
        self.loose: list[list[int]] = []  # whole-page allocations made with alloc()
        self.saved = None

    @rule(page_size=st.sampled_from([1, 2, 4, 8]))
    @precondition(lambda self: self.alloc is None)
    def start(self, page_size):
        self.page_size = page_size
        self.alloc = make(self.SIZE, page_size)

    def live(self) -> list[int]:
        return [s for r in self.requests + self.loose for s in r]

    def pages_in_use(self) -> set[int]:
        return {s // self.page_size for s in self.live()}

    @rule(lens=st.lists(st.integers(1, 20), min_size=1, max_size=3))
    @precondition(lambda self: self.alloc is not None)
    def new_requests(self, lens):
        n = len(lens)
        out = self.alloc.alloc_extend(
            torch.zeros(n, dtype=torch.int64), torch.tensor(lens), torch.full((n,), -1), sum(lens)
        )
        need = sum(-(-x // self.page_size) for x in lens)
        free_pages = self.SIZE // self.page_size - len(self.pages_in_use())
        if need > free_pages:
            assert out is None
            return
        assert out is not None and out.numel() == sum(lens)
        cursor = 0
        for x in lens:
            self.requests.append(out[cursor : cursor + x].tolist())
            cursor += x

    @rule(data=st.data(), grow=st.integers(1, 9))
    @precondition(lambda self: self.alloc is not None and self.requests)
    def extend(self, data, grow):
        req = data.draw(st.sampled_from(self.requests))
        p = len(req)
        out = self.alloc.alloc_extend(
            torch.tensor([p]), torch.tensor([p + grow]), torch.tensor([req[-1]]), grow
        )
        P = self.page_size
        need = -(-(p + grow) // P) - -(-p // P)
        free_pages = self.SIZE // P - len(self.pages_in_use())
        if need > free_pages:
            assert out is None
        else:
            assert out is not None and out.numel() == grow
            req.extend(out.tolist())

    @rule(data=st.data())
    @precondition(lambda self: self.alloc is not None and self.requests)
    def decode(self, data):
        chosen = data.draw(
            st.lists(st.sampled_from(range(len(self.requests))), unique=True, min_size=1)
        )
        reqs = [self.requests[i] for i in chosen]
        out = self.alloc.alloc_decode(
            torch.tensor([len(r) + 1 for r in reqs]), torch.tensor([r[-1] for r in reqs])
        )
        need = sum(len(r) % self.page_size == 0 for r in reqs)
        free_pages = self.SIZE // self.page_size - len(self.pages_in_use())
        if need > free_pages:
            assert out is None
            return
        assert out is not None
        for r, slot in zip(reqs, out.tolist(), strict=True):
            r.append(slot)

    @rule(pages=st.integers(0, 6))
    @precondition(lambda self: self.alloc is not None)
    def alloc_pages(self, pages):
        out = self.alloc.alloc(pages * self.page_size)
        free_pages = self.SIZE // self.page_size - len(self.pages_in_use())
        if pages > free_pages:
            assert out is None
        else:
            assert out is not None and out.numel() == pages * self.page_size
            if pages:
                self.loose.append(out.tolist())

    @rule(data=st.data(), grouped=st.booleans())
    @precondition(lambda self: self.alloc is not None and (self.requests or self.loose))
    def free_some(self, data, grouped):
        pool = self.requests + self.loose
        victims = data.draw(st.lists(st.sampled_from(range(len(pool))), unique=True, min_size=1))
        chosen = [pool[i] for i in victims]
        if grouped:
            self.alloc.free_group_begin()
        for slots in chosen:
            self.alloc.free(torch.tensor(slots, dtype=torch.int64))
        if grouped:
            self.alloc.free_group_end()
        self.requests = [r for r in self.requests if all(r is not c for c in chosen)]
        self.loose = [r for r in self.loose if all(r is not c for c in chosen)]

    @rule()
    @precondition(lambda self: self.alloc is not None)
    def backup(self):
        self.saved = (
            self.alloc.backup_state(),
            [list(r) for r in self.requests],
            [list(r) for r in self.loose],
        )

    @rule()
    @precondition(lambda self: self.saved is not None)
    def restore(self):
        state, requests, loose = self.saved
        self.alloc.restore_state(state)
        self.requests, self.loose = [list(r) for r in requests], [list(r) for r in loose]

    @invariant()
    def no_slot_twice_and_pages_consistent(self):
        if self.alloc is None:
            return
        live = self.live()
        assert len(live) == len(set(live)), "a slot was handed out twice"
        assert all(0 < s < self.SIZE + self.page_size for s in live)
        P = self.page_size
        owners: dict[int, int] = {}
        for i, req in enumerate(self.requests + self.loose):
            for j, slot in enumerate(req):
                if i < len(self.requests):
                    assert slot % P == j % P, "token not at its page offset"
                assert owners.setdefault(slot // P, i) == i, "two requests share a page"

    @rule()
    @precondition(lambda self: self.alloc is not None)
    def sizes(self):
        """Exact sizes, only now and then: ``available_size`` settles queued frees, and
        settling after every step would hide the paths where they settle on their own."""
        assert self.alloc.available_size() == self.SIZE - len(self.pages_in_use()) * self.page_size


TestRequestWorkload = RequestWorkload.TestCase
TestRequestWorkload.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None, derandomize=True
)


def test_allocators_satisfy_protocols():
    alloc = make(16, 4)
    assert isinstance(alloc, PagedAllocator) and isinstance(alloc, TokenAllocatorProtocol)
    assert isinstance(TokenSlotAllocator(8, alloc.get_kvcache()), TokenAllocatorProtocol)


def test_token_allocator_hands_out_ascending_ids_and_reuses_freed_ones():
    alloc = TokenSlotAllocator(8, make(8).get_kvcache())
    assert alloc.alloc(3).tolist() == [1, 2, 3]
    assert alloc.alloc(6) is None  # never partial: 5 left
    assert alloc.available_size() == 5
    alloc.free(torch.tensor([2]))
    assert alloc.alloc(1).tolist() == [4]  # queued frees are merged only when needed...
    alloc.check_frees()
    assert alloc.alloc(1).tolist() == [2]  # ...then reused first
    assert alloc.alloc(4).tolist() == [5, 6, 7, 8]
    assert alloc.alloc(1) is None
    alloc.free(torch.empty(0, dtype=torch.int64))  # freeing nothing is fine
    alloc.free(torch.tensor([1, 3]))
    alloc.clear()
    assert alloc.available_size() == 8 and alloc.alloc(8).tolist() == list(range(1, 9))


def test_eager_checks_reject_the_bad_call_and_change_nothing():
    pool = make(8).get_kvcache()
    alloc = PagedSlotAllocator(8, 1, pool, eager_checks=True)
    slots = alloc.alloc(4)
    alloc.free(slots[:2])
    with pytest.raises(DoubleFreeError, match="slot 1 is already free"):
        alloc.free(slots[:1])
    with pytest.raises(DoubleFreeError, match="slot 0 is reserved"):
        alloc.free(torch.tensor([0]))
    with pytest.raises(DoubleFreeError, match="slot 3 is freed twice"):
        alloc.free(torch.tensor([3, 3]))
    with pytest.raises(InvalidSlotError, match=r"valid slots are 1\.\.8"):
        alloc.free(torch.tensor([9]))
    with pytest.raises(InvalidSlotError, match="integer dtype"):
        alloc.free(torch.tensor([3.0]))
    assert alloc.available_size() == 6
    paged = PagedSlotAllocator(16, 4, pool, eager_checks=True)
    paged.alloc(8)
    with pytest.raises(DoubleFreeError, match="slot 0 is reserved"):
        paged.free(torch.tensor([0, 4]))
    with pytest.raises(DoubleFreeError, match="page 3 is already free"):
        paged.free(torch.tensor([12]))
    assert paged.available_size() == 8


def test_batched_checks_apply_good_frees_and_reject_the_bad_call():
    alloc = make(8)
    a, b = alloc.alloc(2), alloc.alloc(2)
    alloc.free(a)
    alloc.free(a[:1])  # double free: queued, not yet checked
    alloc.free(b)
    with pytest.raises(DoubleFreeError, match=r"slot 1 is already free .*queued free call 2 of 3"):
        alloc.check_frees()
    assert alloc.available_size() == 8  # a and b were applied once; nothing handed out twice
    assert sorted(alloc.alloc(8).tolist()) == list(range(1, 9))


def test_a_page_freed_by_two_calls_is_a_double_free():
    paged = make(16, 4)
    slots = paged.alloc(4)
    paged.free(slots[:2])
    paged.free(slots[2:])  # same page, second call
    with pytest.raises(DoubleFreeError, match="page 1"):
        paged.available_size()
    assert paged.available_size() == 16


def test_queue_is_bounded():
    alloc = make(200)
    slots = alloc.alloc(200)
    for i in range(140):
        alloc.free(slots[i : i + 1])
    assert len(alloc._pending) < 128  # merged on its own, without any alloc


def test_paged_alloc_needs_whole_pages_and_checks_last_loc():
    alloc = make(16, 4)
    with pytest.raises(AllocatorError, match="non-negative multiple of page_size 4"):
        alloc.alloc(3)
    slots = alloc.alloc_extend(torch.tensor([0]), torch.tensor([5]), torch.tensor([-1]), 5)
    assert slots.tolist() == [4, 5, 6, 7, 8]
    # a last_loc at the wrong page offset means the caller's bookkeeping is corrupted
    with pytest.raises(AllocatorError, match="cannot be the last slot"):
        alloc.alloc_decode(torch.tensor([6]), torch.tensor([9]))
    with pytest.raises(AllocatorError, match="extend_num_tokens is 2"):
        alloc.alloc_extend(torch.tensor([5]), torch.tensor([6]), torch.tensor([8]), 2)
    assert alloc.alloc_decode(torch.tensor([6]), torch.tensor([8])).tolist() == [9]


def test_extend_that_does_not_fit_consumes_nothing():
    alloc = make(16, 4)
    before = alloc.available_size()
    assert (
        alloc.alloc_extend(torch.tensor([0, 0]), torch.tensor([9, 9]), torch.tensor([-1, -1]), 18)
        is None
    )
    assert alloc.available_size() == before


def test_free_group_releases_everything_at_the_end():
    alloc = make(8)
    a, b = alloc.alloc(2), alloc.alloc(2)
    alloc.free_group_begin()
    alloc.free(a)
    alloc.free(b)
    assert alloc.available_size() == 4  # nothing released yet
    alloc.free_group_end()
    assert alloc.available_size() == 8
    with pytest.raises(AllocatorError, match="without free_group_begin"):
        alloc.free_group_end()


def test_restore_rejects_foreign_state():
    a, b = make(8), make(8)
    with pytest.raises(AllocatorError, match="did not back up"):
        a.restore_state(b.backup_state())


class _Recorder:
    """A pool stand-in that records how offload calls reach it."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def get_cpu_copy(self, *args, **kwargs):
        self.calls.append(("get", args, kwargs))
        return "snapshot"

    def load_cpu_copy(self, *args, **kwargs):
        self.calls.append(("load", args, kwargs))


def test_offload_pass_through_forwards_every_argument_by_keyword():
    from kvcache_core import OffloadablePool

    class Pool(_Recorder):
        size = page_size = layer_num = 1
        dtype = torch.float32

        def get_key_buffer(self, layer_id): ...
        def get_value_buffer(self, layer_id): ...
        def get_kv_buffer(self, layer_id): ...
        def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None): ...
        def get_kv_size_bytes(self): ...

    pool = Pool()
    assert isinstance(pool, OffloadablePool)
    alloc = PagedSlotAllocator(4, 1, pool)
    idx, m = torch.tensor([1]), torch.tensor([7])
    assert alloc.get_cpu_copy(idx, mamba_indices=m) == "snapshot"
    alloc.load_cpu_copy("snapshot", idx, mamba_indices=m)
    assert pool.calls[0][2]["mamba_indices"] is m and pool.calls[1][2]["mamba_indices"] is m


# -- issue 7 regressions: every test below failed before its fix ---------------------------------

from tests.allocators import _factories as fx  # noqa: E402


def _swa(page_size: int = 1):
    return fx.swa_alloc(320, 320, page_size)


def _one_error(calls) -> DoubleFreeError:
    """Run ``calls`` (then ``check_frees``) and return the single DoubleFreeError they raise."""
    errors = []
    for call in calls:
        try:
            call()
        except DoubleFreeError as exc:
            errors.append(exc)
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("page_size", [1, 2])
def test_swa_free_rejected_at_the_queue_bound_still_frees_the_window_side(page_size):
    alloc = _swa(page_size)
    P = page_size
    s = alloc.alloc(130 * P)
    calls = [lambda: alloc.free(s[:1]), lambda: alloc.free(s[:1])]  # the second is a double free
    calls += [lambda i=i: alloc.free(s[i * P : (i + 1) * P]) for i in range(1, 130)]
    error = _one_error([*calls, alloc.check_frees])
    assert f"{'slot' if P == 1 else 'page'} {int(s[0]) // P} " in str(error)
    assert alloc.full_available_size() == alloc.swa_available_size() == 320
    assert (alloc.full_to_swa_index_mapping[:-1] == 0).all()


@pytest.mark.parametrize("page_size", [1, 2])
def test_hisparse_free_rejected_at_the_queue_bound_still_drops_residency(page_size):
    alloc = fx.hisparse_alloc(160 * page_size, page_size, ratio=2)
    P = page_size
    s = alloc.alloc(130 * P)
    calls = [lambda: alloc.free(s[:1]), lambda: alloc.free(s[:1])]
    calls += [lambda i=i: alloc.free(s[i * P : (i + 1) * P]) for i in range(1, 130)]
    _one_error([*calls, alloc.check_frees])
    assert alloc.logical_available_size() == 320 * P
    assert alloc.device_available_size() == 160 * P
    again = alloc.alloc_logical_only(320 * P)
    assert again is not None
    assert (alloc.translate_loc_to_device(again) == -1).all(), "handed out still resident"


GROUP_MAKERS = {
    "mha": lambda: fx.paged(16, 1),
    "mha-paged": lambda: fx.paged(16, 4),
    "mla": lambda: fx.mla(16, 1),
    "mamba": lambda: fx.hybrid(16, 1),
    "mamba-paged": lambda: fx.hybrid(16, 4),
    "swa": lambda: fx.swa_alloc(16, 16, 1),
    "swa-paged": lambda: fx.swa_alloc(16, 16, 4),
    "hisparse": lambda: fx.hisparse_alloc(8, 1),
    "hisparse-paged": lambda: fx.hisparse_alloc(16, 4),
}


def _sizes(alloc) -> dict[str, int]:
    """Every size the allocator reports (each side of a composite too)."""
    names = ["available_size", "full_available_size", "swa_available_size"]
    names += ["logical_available_size", "device_available_size"]
    return {n: getattr(alloc, n)() for n in names if hasattr(alloc, n)}


@pytest.mark.parametrize("kind", sorted(GROUP_MAKERS))
def test_a_double_free_inside_a_group_rejects_only_that_call(kind):
    alloc = GROUP_MAKERS[kind]()
    P = alloc.page_size
    before = _sizes(alloc)
    a, b = alloc.alloc(P), alloc.alloc(P)
    alloc.free_group_begin()
    alloc.free(a)
    alloc.free(a)
    alloc.free(b)
    error = _one_error([alloc.free_group_end, alloc.check_frees])
    assert f"{'slot' if P == 1 else 'page'} {int(a[0]) // P} " in str(error)
    assert _sizes(alloc) == before, "a legitimate free of the group was dropped"
    if hasattr(alloc, "full_to_swa_index_mapping"):
        assert (alloc.full_to_swa_index_mapping[:-1] == 0).all()


@pytest.mark.parametrize("kind", sorted(GROUP_MAKERS))
def test_backup_keeps_queued_frees(kind):
    alloc = GROUP_MAKERS[kind]()
    P = alloc.page_size
    total = alloc.available_size()
    a, b = alloc.alloc(2 * P), alloc.alloc(P)
    alloc.free(a)  # queued, not settled
    state = alloc.backup_state()
    alloc.free(b)
    assert alloc.alloc(total - P) is not None
    alloc.restore_state(state)
    assert alloc.available_size() == total - P
    if hasattr(alloc, "swa_available_size"):
        assert alloc.swa_available_size() == total - P
    if hasattr(alloc, "device_available_size"):
        assert alloc.device_available_size() == total - P


@pytest.mark.parametrize("restore_inside_group", [False, True])
@pytest.mark.parametrize("kind", sorted(GROUP_MAKERS))
def test_a_backup_inside_a_free_group_keeps_the_frees_called_before_it(kind, restore_inside_group):
    """Issue 7: a free called before ``backup_state`` belongs to the saved state, group or not.

    Restoring must neither lose it (the group end ran after the backup) nor free it twice (the
    group is still open when the state comes back, and ends afterwards).
    """
    alloc = GROUP_MAKERS[kind]()
    P = alloc.page_size
    total = _sizes(alloc)
    a, b = alloc.alloc(P), alloc.alloc(P)
    alloc.free_group_begin()
    alloc.free(a)
    state = alloc.backup_state()
    alloc.free(b)  # after the backup: restore undoes it
    if not restore_inside_group:
        alloc.free_group_end()
    alloc.restore_state(state)
    if restore_inside_group:
        alloc.free_group_end()
    assert _sizes(alloc) == {name: size - P for name, size in total.items()}
    again = alloc.alloc(P)  # the one page still held is b's; a's is free exactly once
    assert again is not None and alloc.alloc(total["available_size"]) is None


DECODE_MAKERS = {
    "token": lambda: fx.paged(16, 1),
    "paged": lambda: fx.paged(16, 4),
    "swa": lambda: fx.swa_alloc(16, 16, 1),
    "swa-paged": lambda: fx.swa_alloc(16, 16, 4),
    "hisparse": lambda: fx.hisparse_alloc(8, 1),
    "hisparse-paged": lambda: fx.hisparse_alloc(16, 4),
}


@pytest.mark.parametrize("settled", [False, True])
@pytest.mark.parametrize("kind", sorted(DECODE_MAKERS))
def test_alloc_decode_rejects_a_last_loc_in_a_free_page(kind, settled):
    alloc = DECODE_MAKERS[kind]()
    total = alloc.available_size()
    req = alloc.alloc_extend(torch.tensor([0]), torch.tensor([2]), torch.tensor([-1]), 2)
    alloc.free(req)  # the request's table row is now stale
    if settled:
        alloc.check_frees()
    with pytest.raises(AllocatorError, match=rf"last_loc {int(req[-1])} .*free"):
        alloc.alloc_decode(torch.tensor([3]), req[-1:])
    assert alloc.available_size() == total


# -- per-call verdicts of composites: the corner cases the state machines found ------------------


def test_swa_rejected_call_does_not_bring_back_window_slots_evicted_meanwhile():
    alloc = fx.swa_alloc(16, 8)
    a, b = alloc.alloc(2), alloc.alloc(2)
    alloc.free(torch.tensor([int(a[0]), int(a[0])]))  # rejected later: a[0] is named twice
    alloc.free_swa(a[:1])  # the prefix cache evicts a[0] from the window meanwhile
    with pytest.raises(DoubleFreeError, match=rf"slot {int(a[0])} is freed twice"):
        alloc.check_frees()
    assert alloc.translate_loc_from_full_to_swa(a).tolist()[0] == 0
    assert alloc.full_available_size() == 12 and alloc.swa_available_size() == 5
    # and a rejected call whose slot a later call of the batch frees releases it exactly once
    alloc.free(torch.tensor([int(b[0]), int(b[0])]))
    alloc.free(b)
    with pytest.raises(DoubleFreeError, match=rf"slot {int(b[0])} is freed twice"):
        alloc.check_frees()
    assert alloc.full_available_size() == 14 and alloc.swa_available_size() == 7


def test_hisparse_rejected_call_does_not_bring_back_residency_dropped_meanwhile():
    alloc = fx.hisparse_alloc(8, 1)
    a, b = alloc.alloc(2), alloc.alloc(2)
    alloc.free(torch.tensor([int(a[0]), int(a[0])]))  # rejected later
    alloc.free_device(a[:1])  # residency dropped meanwhile
    with pytest.raises(DoubleFreeError, match=rf"slot {int(a[0])} is freed twice"):
        alloc.check_frees()
    assert alloc.translate_loc_to_device(a).tolist()[0] == -1
    assert alloc.logical_available_size() == 12 and alloc.device_available_size() == 5
    alloc.free(torch.tensor([int(b[0]), int(b[0])]))
    alloc.free(b)  # frees b[0] in the same batch: its residency must not come back
    with pytest.raises(DoubleFreeError, match=rf"slot {int(b[0])} is freed twice"):
        alloc.check_frees()
    assert (alloc.translate_loc_to_device(b) == -1).all()
    assert alloc.logical_available_size() == 14 and alloc.device_available_size() == 7


def test_mamba_slot_backup_is_a_copy():
    from kvcache_plugins._mamba_state import MambaSlotAllocator

    alloc = MambaSlotAllocator(6)
    held = alloc.alloc(2)
    state = alloc.backup_state()
    more = alloc.alloc(3)
    alloc.free(more[2:])  # writes the free stack in place, where the backup's slots were
    alloc.free(held)
    alloc.restore_state(state)
    assert alloc.available_size() == 4
    assert sorted(alloc.alloc(4).tolist()) == [3, 4, 5, 6]


def test_mamba_alloc_group_hands_out_its_reservation_slot_by_slot():
    """engine-pools.md section 14: begin reserves a batch, alloc(1) hands it out, end returns
    the rest, in order, so the allocator is as a group that handed out nothing found it."""
    from kvcache_plugins._mamba_state import MambaSlotAllocator

    alloc = MambaSlotAllocator(6)
    untouched = MambaSlotAllocator(6)
    alloc.alloc_group_begin(3)
    assert alloc.available_size() == 3 and alloc.alloc_group_reserved() == 3
    assert alloc.alloc(1).tolist() == [1]  # the reservation, lowest first
    assert alloc.alloc(1).tolist() == [2]
    assert alloc.alloc(2).tolist() == [4, 5]  # more than is left reserved: the free list
    with pytest.raises(DoubleFreeError, match="request slot 3 is reserved"):
        alloc.free(torch.tensor([3]))
    alloc.alloc_group_end()
    assert alloc.available_size() == 2 and alloc.alloc_group_reserved() == 0
    assert alloc.alloc(2).tolist() == [3, 6]  # the returned slot comes out first
    alloc.clear()
    alloc.alloc_group_begin(4)
    alloc.alloc_group_end()
    assert alloc.alloc(6).tolist() == untouched.alloc(6).tolist()


def test_mamba_alloc_group_misuse_raises_and_changes_nothing():
    from kvcache_plugins._mamba_state import MambaSlotAllocator

    alloc = MambaSlotAllocator(4)
    held = alloc.alloc(2)
    with pytest.raises(AllocatorError, match="without alloc_group_begin"):
        alloc.alloc_group_end()
    with pytest.raises(AllocatorError, match=r"only 2 request slot\(s\) are free"):
        alloc.alloc_group_begin(3)
    for bad in (-1, 1.0, True, "1"):
        with pytest.raises(AllocatorError, match="num_reqs must be an int"):
            alloc.alloc_group_begin(bad)  # type: ignore[arg-type]
    assert alloc.available_size() == 2 and alloc.alloc_group_reserved() == 0
    alloc.alloc_group_begin(1)
    with pytest.raises(AllocatorError, match="alloc group is open"):
        alloc.alloc_group_begin(1)
    assert alloc.available_size() == 1 and alloc.alloc_group_reserved() == 1
    alloc.alloc_group_end()
    assert alloc.available_size() == 2 and held is not None


def test_mamba_alloc_group_backup_restore_and_clear():
    """A backup records the open group; restore brings it back (or closes it, for a backup
    taken before the begin); clear frees everything and closes the group."""
    from kvcache_plugins._mamba_state import MambaSlotAllocator

    alloc = MambaSlotAllocator(6)
    before = alloc.backup_state()
    alloc.alloc_group_begin(3)
    first = alloc.alloc(1)
    inside = alloc.backup_state()
    alloc.alloc(1)
    alloc.alloc_group_end()
    alloc.restore_state(inside)  # the group is open again, with two slots left
    assert alloc.alloc_group_reserved() == 2 and alloc.available_size() == 3
    assert alloc.alloc(1).tolist() == [2] and first.tolist() == [1]
    alloc.restore_state(before)  # before the begin: no group, everything free
    assert alloc.alloc_group_reserved() == 0 and alloc.available_size() == 6
    with pytest.raises(AllocatorError, match="without alloc_group_begin"):
        alloc.alloc_group_end()
    alloc.alloc_group_begin(2)
    alloc.alloc(1)
    alloc.clear()
    assert alloc.available_size() == 6 and alloc.alloc_group_reserved() == 0
    with pytest.raises(AllocatorError, match="without alloc_group_begin"):
        alloc.alloc_group_end()
    assert alloc.alloc(6).tolist() == [1, 2, 3, 4, 5, 6]
