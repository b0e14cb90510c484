"""Hybrid attention + Mamba pool: layer routing, bit-exact reloads of KV and recurrent state,
the ``mamba_indices=None`` rule, rejection before any write, and request-slot allocation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcache_core import (
    AllocatorError,
    Capability,
    DoubleFreeError,
    InvalidLayerError,
    InvalidSlotError,
    KVSnapshot,
    KVWriteLoc,
    MambaStatePool,
    OffloadablePool,
    PagedAllocator,
    PoolConfig,
    SnapshotMismatchError,
    discover,
)
from kvcache_core import MambaSlotAllocator as MambaSlotAllocatorProtocol
from kvcache_plugins import mamba
from kvcache_plugins.mamba import MambaPool, MambaSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@dataclass(frozen=True)
class Layer:
    layer_id: int


def make(
    dtype=torch.float32,
    mamba_dtype=torch.float32,
    size=32,
    page_size=1,
    layer_num=4,
    mamba_ids=(1, 2),
    start_layer=0,
    mamba_size=8,
    conv=((3, 4),),
    temporal=(2, 4, 3),
    heads=2,
    dim=4,
):
    return mamba.create(
        PoolConfig(
            size=size,
            layer_num=layer_num,
            head_num=heads,
            head_dim=dim,
            page_size=page_size,
            dtype=dtype,
            start_layer=start_layer,
            mamba_layer_ids=mamba_ids,
            mamba_size=mamba_size,
            conv_state_shapes=conv,
            temporal_state_shape=temporal,
            mamba_dtype=mamba_dtype,
        )
    )


def same_bits(a, b):
    """Byte-for-byte equality (``torch.equal`` alone would call -0.0 and 0.0 equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


def fill_kv(pool, slots, gen, loc=None):
    for layer in pool.attention_layer_ids:
        k_buf, v_buf = pool.get_kv_buffer(layer)
        k = torch.randn(len(slots), *k_buf.shape[1:], generator=gen)
        v = torch.randn(len(slots), *v_buf.shape[1:], generator=gen)
        pool.set_kv_buffer(Layer(layer), slots if loc is None else loc, k, v)


def fill_state(pool, requests, gen):
    for layer in pool.mamba_layer_ids:
        convs, temporal = pool.get_mamba_state(layer)
        for t in (*convs, temporal):
            t[requests] = torch.randn(len(requests), *t.shape[1:], generator=gen).to(t.dtype)


def kv_rows(pool, slots):
    return [
        t[slots].clone() for layer in pool.attention_layer_ids for t in pool.get_kv_buffer(layer)
    ]


def state_rows(pool, requests):
    out = []
    for layer in pool.mamba_layer_ids:
        convs, temporal = pool.get_mamba_state(layer)
        out += [t[requests].clone() for t in (*convs, temporal)]
    return out


def everything(pool):
    return kv_rows(pool, slice(None)) + state_rows(pool, slice(None))


def all_same(a, b):
    return all(same_bits(x, y) for x, y in zip(a, b, strict=True))


def assert_untouched_except(pool, before, slots, requests):
    """Every KV row but ``slots`` and every state row but ``requests`` equals ``before``."""
    after = everything(pool)
    n_kv = 2 * len(pool.attention_layer_ids)
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        keep = torch.ones(new.shape[0], dtype=torch.bool)
        keep[slots if i < n_kv else requests] = False
        assert same_bits(old[keep], new[keep]), f"buffer {i} changed outside the loaded rows"


# -- plugin face and layer routing -------------------------------------------------------------
def test_discover_builds_the_hybrid_pool_and_both_allocators():
    registry = discover()
    assert registry.spec("mamba").capabilities == {
        Capability.OFFLOAD,
        Capability.MAMBA_STATE,
        Capability.PAGED,
    }
    cfg = PoolConfig(
        size=16,
        layer_num=3,
        mamba_layer_ids=(0,),
        mamba_size=4,
        conv_state_shapes=((2, 3), (4,)),
        temporal_state_shape=(2, 2),
    )
    pool, alloc = registry.create("mamba", cfg)
    assert isinstance(pool, MambaStatePool) and isinstance(pool, OffloadablePool)
    assert isinstance(alloc, PagedAllocator) and alloc.get_kvcache() is pool
    assert isinstance(alloc.mamba_allocator, MambaSlotAllocatorProtocol)
    assert alloc.mamba_allocator.available_size() == 4
    assert pool.attention_layer_ids == (1, 2) and pool.mamba_layer_ids == (0,)
    convs, temporal = pool.get_mamba_state(0)
    assert [tuple(c.shape) for c in convs] == [(5, 2, 3), (5, 4)]
    assert temporal.shape == (5, 2, 2) and temporal.dtype == torch.float32  # the default
    assert pool.get_kv_size_bytes() == pool.attention_pool.get_kv_size_bytes()


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="mamba_layer_ids and mamba_size"):
        mamba.create(PoolConfig(size=8, layer_num=2, temporal_state_shape=(2,)))
    with pytest.raises(ValueError, match="temporal_state_shape"):
        mamba.create(PoolConfig(size=8, layer_num=2, mamba_layer_ids=(1,), mamba_size=2))
    with pytest.raises(ValueError, match="at least one attention layer"):
        make(layer_num=2, mamba_ids=(0, 1))
    with pytest.raises(ValueError, match=r"must lie in 0\.\.3"):
        make(mamba_ids=(7,))


def test_layers_route_to_the_pool_that_holds_them():
    pool, alloc = make(start_layer=10, mamba_ids=(11, 12))
    slots = alloc.alloc(2)
    k = torch.ones(2, 2, 4)
    pool.set_kv_buffer(Layer(13), slots, k, k)
    assert pool.get_key_buffer(13)[slots].eq(1).all() and not pool.get_key_buffer(10).any()
    assert pool.attention_pool.get_key_buffer(1)[slots].eq(1).all()  # global 13 -> local 1
    with pytest.raises(InvalidLayerError, match="layer 11 is a Mamba layer"):
        pool.set_kv_buffer(Layer(11), slots, k, k)
    with pytest.raises(InvalidLayerError, match="layer 11 is a Mamba layer"):
        pool.get_value_buffer(11)
    with pytest.raises(InvalidLayerError, match="layer 10 is not a Mamba layer"):
        pool.get_mamba_state(10)
    with pytest.raises(InvalidLayerError, match=r"layers 10\.\.13"):
        pool.get_kv_buffer(3)


def test_write_locations_are_forwarded_unchanged():
    a, alloc = make()
    b, _ = make()
    slots = alloc.alloc(3)
    record = KVWriteLoc(slots, swa_loc=torch.tensor([5, 6, 7]))  # no window here: ignored
    fill_kv(a, slots, torch.Generator().manual_seed(1))
    fill_kv(b, slots, torch.Generator().manual_seed(1), loc=record)
    assert all_same(everything(a), everything(b))


def test_clear_and_copy_slots_act_on_every_mamba_layer():
    pool, alloc = make()
    req = alloc.mamba_allocator.alloc(3)
    fill_state(pool, req, torch.Generator().manual_seed(2))
    pool.copy_slots(req[:1], req[2:])  # fork request 0's state into request 2
    assert all_same(state_rows(pool, req[2:]), state_rows(pool, req[:1]))
    pool.clear_slots(req[:2])
    assert all(not t.any() for t in state_rows(pool, req[:2]))
    assert any(t.any() for t in state_rows(pool, req[2:]))
    before = everything(pool)
    with pytest.raises(InvalidSlotError, match="reserved padding slot 0"):
        pool.clear_slots(torch.tensor([1, 0]))
    with pytest.raises(InvalidSlotError, match="dst names slot 3 more than once"):
        pool.copy_slots(torch.tensor([1, 2]), torch.tensor([3, 3]))
    with pytest.raises(InvalidSlotError, match="1 targets for 2"):
        pool.copy_slots(torch.tensor([1, 2]), torch.tensor([3]))
    with pytest.raises(InvalidSlotError, match="out of range"):
        pool.copy_slots(torch.tensor([9]), torch.tensor([3]))
    assert all_same(before, everything(pool))


# -- offload round trips -----------------------------------------------------------------------
LAYOUTS = [(2, (0,), 0), (4, (1, 2), 0), (3, (5, 6), 4)]  # (layer_num, mamba ids, start_layer)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    mamba_dtype=st.sampled_from(DTYPES),
    page_size=st.sampled_from([1, 2]),
    layout=st.sampled_from(LAYOUTS),
    conv=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple), max_size=2),
    temporal=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    writeloc=st.booleans(),
    data=st.data(),
)
def test_round_trip_restores_kv_and_state_bit_exactly(
    dtype, mamba_dtype, page_size, layout, conv, temporal, writeloc, data
):
    layer_num, mamba_ids, start = layout
    P = page_size
    pool, alloc = make(
        dtype, mamba_dtype, 32, P, layer_num, mamba_ids, start, 8, tuple(conv), temporal
    )
    requests = alloc.mamba_allocator
    pages = data.draw(st.integers(1, 4), label="request pages")
    tokens, other = alloc.alloc(pages * P), alloc.alloc(P)
    reqs = requests.alloc(data.draw(st.integers(1, 3), label="requests"))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    for slots in (tokens, other):
        fill_kv(pool, slots, gen, loc=KVWriteLoc(slots) if writeloc else None)
    fill_state(pool, torch.arange(1, 9), gen)
    chosen = data.draw(st.lists(st.integers(0, pages - 1), min_size=1, unique=True))
    idx = torch.cat([tokens[p * P : (p + 1) * P] for p in chosen])
    mreq = torch.tensor(data.draw(st.permutations(reqs.tolist()), label="request order"))
    saved_kv, saved_state = kv_rows(pool, idx), state_rows(pool, mreq)

    snap = alloc.get_cpu_copy(idx, mamba_indices=mreq)
    assert snap.meta["mamba_state"] is True and snap.children["mamba"].token_count == len(mreq)
    alloc.free(tokens)
    requests.free(reqs)
    alloc.alloc(pages * P), requests.alloc(len(reqs))  # fillers: the reload lands elsewhere
    new, new_req = alloc.alloc(idx.numel()), requests.alloc(len(mreq))
    assert not set(new.tolist()) & set(idx.tolist())
    assert not set(new_req.tolist()) & set(mreq.tolist())
    before = everything(pool)
    alloc.load_cpu_copy(snap, new, mamba_indices=new_req)

    assert all_same(kv_rows(pool, new), saved_kv)
    assert all_same(state_rows(pool, new_req), saved_state)
    assert_untouched_except(pool, before, new, new_req)


def test_a_zero_d_request_slot_works_as_the_engine_passes_it():
    pool, alloc = make()
    slot = alloc.mamba_allocator.alloc(1)[0]  # a 0-d int64 tensor, as engines keep it
    fill_state(pool, slot.reshape(1), torch.Generator().manual_seed(3))
    tokens = alloc.alloc(2)
    saved = state_rows(pool, slot.reshape(1))
    snap = alloc.get_cpu_copy(tokens, mamba_indices=slot)
    new_slot = alloc.mamba_allocator.alloc(1)[0]
    alloc.load_cpu_copy(snap, alloc.alloc(2), mamba_indices=new_slot)
    assert all_same(state_rows(pool, new_slot.reshape(1)), saved)


# -- mamba_indices=None --------------------------------------------------------------------------
def test_offload_without_mamba_indices_carries_no_state_and_says_so():
    pool, alloc = make()
    tokens, req = alloc.alloc(4), alloc.mamba_allocator.alloc(2)
    fill_kv(pool, tokens, torch.Generator().manual_seed(4))
    fill_state(pool, req, torch.Generator().manual_seed(5))
    saved_kv = kv_rows(pool, tokens)
    snap = alloc.get_cpu_copy(tokens)
    assert snap.meta["mamba_state"] is False and snap.children["mamba"] is None
    assert snap.nbytes == snap.children["attention"].nbytes
    new = alloc.alloc(4)
    before = everything(pool)
    with pytest.raises(SnapshotMismatchError, match="carries no Mamba state"):
        alloc.load_cpu_copy(snap, new, mamba_indices=req)
    assert all_same(before, everything(pool))
    alloc.load_cpu_copy(snap, new, mamba_indices=None)  # KV only; the engine restores state
    assert all_same(kv_rows(pool, new), saved_kv)
    assert_untouched_except(pool, before, new, torch.empty(0, dtype=torch.long))


def test_a_stateful_snapshot_needs_mamba_indices_to_load():
    pool, alloc = make()
    tokens, req = alloc.alloc(4), alloc.mamba_allocator.alloc(2)
    fill_kv(pool, tokens, torch.Generator().manual_seed(6))
    snap = alloc.get_cpu_copy(tokens, mamba_indices=req)
    new = alloc.alloc(4)
    before = everything(pool)
    with pytest.raises(SnapshotMismatchError, match="Mamba state of 2 request slot"):
        alloc.load_cpu_copy(snap, new)
    forged = KVSnapshot(
        "mamba", snap.dtype, 4, {}, dict(snap.children), {**snap.meta, "mamba_state": False}
    )
    with pytest.raises(SnapshotMismatchError, match="disagrees with its present 'mamba' child"):
        alloc.load_cpu_copy(forged, new, mamba_indices=req)
    assert all_same(before, everything(pool))


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mamba_indices", "message"),
    [
        (torch.tensor([0]), "mamba_indices\\[0\\] = 0 is the reserved padding slot 0"),
        (torch.tensor([9]), "out of range"),
        (torch.tensor([-1]), "negative"),
        (torch.tensor([2, 2]), "more than once"),
        (torch.tensor([1.0]), "integer dtype"),
    ],
)
def test_bad_request_slots_are_refused_on_offload_and_load(mamba_indices, message):
    pool, alloc = make()
    tokens = alloc.alloc(2)
    with pytest.raises(InvalidSlotError, match=message):
        alloc.get_cpu_copy(tokens, mamba_indices=mamba_indices)
    snap = alloc.get_cpu_copy(tokens, mamba_indices=torch.tensor([1, 2][: mamba_indices.numel()]))
    before = everything(pool)
    with pytest.raises(InvalidSlotError, match=message):
        alloc.load_cpu_copy(snap, alloc.alloc(2), mamba_indices=mamba_indices)
    assert all_same(before, everything(pool))


def test_bad_snapshots_raise_before_writing():
    pool, alloc = make()
    tokens, req = alloc.alloc(3), alloc.mamba_allocator.alloc(2)
    fill_kv(pool, tokens, torch.Generator().manual_seed(7))
    fill_state(pool, req, torch.Generator().manual_seed(8))
    snap = alloc.get_cpu_copy(tokens, mamba_indices=req)
    new, new_req = alloc.alloc(3), alloc.mamba_allocator.alloc(2)

    def foreign(**kw):
        other, other_alloc = make(**kw)
        return other.get_cpu_copy(other_alloc.alloc(3), mamba_indices=torch.tensor([1, 2]))

    mha = MHATokenToKVPool(32, 1, torch.float32, 2, 4, 2)
    cases = [
        (snap, new[:2], new_req, "holds 3 entries but 2 indices"),
        (snap, new, new_req[:1], "holds 2 entries but 1 indices"),
        (mha.get_cpu_copy(torch.tensor([1, 2, 3])), new, new_req, "taken from a 'mha' pool"),
        (foreign(mamba_ids=(1, 3)), new, new_req, r"mamba_layer_ids is \(1, 3\)"),
        (foreign(temporal=(2, 4, 4)), new, new_req, r"part 'temporal' is \[2, 2, 2, 4, 4\]"),
        (foreign(conv=((3, 4), (2,))), new, new_req, "parts \\['conv0', 'conv1', 'temporal'\\]"),
        (foreign(mamba_dtype=torch.bfloat16), new, new_req, "dtype is torch.bfloat16"),
        (foreign(heads=1), new, new_req, r"part 'k' is \[2, 3, 1, 4\]"),
        (foreign(dtype=torch.float16), new, new_req, "dtype is torch.float16"),
        (snap, torch.tensor([new[0], new[1], 0]), new_req, "reserved padding slot"),
        (snap, torch.tensor([new[0], new[1], 99]), new_req, "out of range"),
        ({"attention": 1}, new, new_req, "expected a KVSnapshot"),
    ]
    before = everything(pool)
    for bad, idx, mreq, message in cases:
        for loader in (pool, alloc):
            with pytest.raises((SnapshotMismatchError, InvalidSlotError), match=message):
                loader.load_cpu_copy(bad, idx, mamba_indices=mreq)
    assert all_same(before, everything(pool))


# -- the state pool on its own -----------------------------------------------------------------
def test_state_pool_takes_request_slots_as_indices():
    state = MambaPool(4, (0, 3), [(2,)], (3,), torch.bfloat16)
    state.get_mamba_state(3)[1][2] = torch.arange(3.0)
    snap = state.get_cpu_copy(torch.tensor([2]))
    state.load_cpu_copy(snap, torch.tensor([4]))
    assert state.get_mamba_state(3)[1][4].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(InvalidSlotError, match="already are request slots"):
        state.get_cpu_copy(torch.tensor([2]), mamba_indices=torch.tensor([2]))
    with pytest.raises(InvalidSlotError, match="already are request slots"):
        state.load_cpu_copy(snap, torch.tensor([3]), mamba_indices=torch.tensor([3]))
    assert not state.get_mamba_state(3)[1][3].any()
    assert state.get_state_size_bytes() == 2 * 5 * (2 + 3) * 2


# -- request-slot allocator --------------------------------------------------------------------
def test_request_slot_allocator_basics_and_errors():
    alloc = MambaSlotAllocator(4)
    assert isinstance(alloc, MambaSlotAllocatorProtocol)
    assert alloc.alloc(3).tolist() == [1, 2, 3]
    assert alloc.alloc(2) is None and alloc.available_size() == 1  # never partial
    cases = [
        (torch.tensor([0]), DoubleFreeError, "slot 0 is reserved"),
        (torch.tensor([4]), DoubleFreeError, "request slot 4 is already free"),
        (torch.tensor([2, 2]), DoubleFreeError, "twice in one call"),
        (torch.tensor([5]), InvalidSlotError, "valid are 1..4"),
        (torch.tensor([1.0]), InvalidSlotError, "integer dtype"),
        ([1], InvalidSlotError, "must be a tensor"),
    ]
    for bad, error, message in cases:
        with pytest.raises(error, match=message):
            alloc.free(bad)
    assert alloc.available_size() == 1  # the bad frees changed nothing
    with pytest.raises(AllocatorError, match=">= 0"):
        alloc.alloc(-1)
    alloc.free(torch.tensor(2))  # a 0-d slot, as engines keep it per request
    assert alloc.alloc(1).tolist() == [2]
    alloc.clear()
    assert alloc.available_size() == 4 and alloc.alloc(4).tolist() == [1, 2, 3, 4]


class RequestSlots(RuleBasedStateMachine):
    """Random alloc/free (good and bad) against a set model of the held request slots."""

    SIZE = 10

    def __init__(self) -> None:
        super().__init__()
        self.alloc = MambaSlotAllocator(self.SIZE)
        self.held: set[int] = set()

    @rule(n=st.integers(0, 5))
    def take(self, n):
        out = self.alloc.alloc(n)
        if n > self.SIZE - len(self.held):
            assert out is None
            return
        got = out.tolist()
        assert len(got) == n and not set(got) & self.held and all(1 <= s <= self.SIZE for s in got)
        self.held |= set(got)

    @rule(data=st.data())
    @precondition(lambda self: self.held)
    def give_back(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        self.alloc.free(torch.tensor(chosen))
        self.held -= set(chosen)

    @rule(data=st.data())
    def bad_free(self, data):
        free = sorted(set(range(1, self.SIZE + 1)) - self.held)
        bad = data.draw(st.sampled_from([[0], *([[f] for f in free] or [[0]])]))
        with pytest.raises(DoubleFreeError):
            self.alloc.free(torch.tensor(bad))

    @rule()
    def clear(self):
        self.alloc.clear()
        self.held = set()

    @invariant()
    def sizes_are_exact(self):
        assert self.alloc.available_size() == self.SIZE - len(self.held)


TestRequestSlots = RequestSlots.TestCase
TestRequestSlots.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
