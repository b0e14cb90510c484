"""SWA pool and allocator: window translation, bit-exact reloads that re-create window slots,
rejection before any write, and allocator invariants under hypothesis."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcache_core import (
    AllocatorError,
    Capability,
    DoubleFreeError,
    InvalidLayerError,
    InvalidSlotError,
    KVSnapshot,
    KVWriteLoc,
    OffloadablePool,
    PagedAllocator,
    PoolConfig,
    ShapeMismatchError,
    SlidingWindowPool,
    SnapshotMismatchError,
    SWAAllocator,
    discover,
)
from kvcache_plugins import swa
from kvcache_plugins.mha import MHATokenToKVPool

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MODES = ["bare", "writeloc", "swa_loc"]


@dataclass(frozen=True)
class Layer:
    layer_id: int


def make(
    dtype=torch.float32,
    size=32,
    swa_size=16,
    page_size=1,
    layer_num=4,
    swa_ids=(1, 3),
    start_layer=0,
    heads=2,
    dim=4,
    swa_heads=None,
    swa_dim=None,
):
    return swa.create(
        PoolConfig(
            size=size,
            layer_num=layer_num,
            head_num=heads,
            head_dim=dim,
            page_size=page_size,
            dtype=dtype,
            start_layer=start_layer,
            swa_layer_ids=swa_ids,
            swa_size=swa_size,
            swa_head_num=swa_heads,
            swa_head_dim=swa_dim,
        )
    )


def layer_ids(pool):
    return range(pool.start_layer, pool.start_layer + pool.layer_num)


def fill(pool, slots, gen, mode="bare"):
    """Write random K/V at ``slots`` into every layer, through ``mode``'s kind of location."""
    slots = torch.as_tensor(slots)
    if mode == "bare":
        loc = slots
    elif mode == "writeloc":
        loc = KVWriteLoc(slots)
    else:
        loc = KVWriteLoc(slots, swa_loc=pool.translate_loc_from_full_to_swa(slots))
    for layer in layer_ids(pool):
        k_buf, v_buf = pool.get_kv_buffer(layer)
        k = torch.randn(len(slots), *k_buf.shape[1:], generator=gen)
        v = torch.randn(len(slots), *v_buf.shape[1:], generator=gen)
        pool.set_kv_buffer(Layer(layer), loc, k, v)


def buffers(pool):
    return [t.clone() for layer in layer_ids(pool) for t in pool.get_kv_buffer(layer)]


def same_bits(a, b):
    """Byte-for-byte equality (``torch.equal`` alone would call -0.0 and 0.0 equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


def rows(pool, layer, slots):
    """The (K, V) rows a layer holds for full slots ``slots`` (window layers: translated)."""
    if pool.is_swa_layer(layer):
        slots = pool.translate_loc_from_full_to_swa(slots)
    k, v = pool.get_kv_buffer(layer)
    return k[slots].clone(), v[slots].clone()


def assert_untouched_except(pool, before, full_rows, window_rows):
    """Every buffer equals ``before`` except the given rows (full slots / window slots)."""
    for i, layer in enumerate(layer_ids(pool)):
        skip = window_rows if pool.is_swa_layer(layer) else full_rows
        for j, now in enumerate(pool.get_kv_buffer(layer)):
            keep = torch.ones(now.shape[0], dtype=torch.bool)
            keep[torch.as_tensor(skip, dtype=torch.int64)] = False
            assert same_bits(now[keep], before[2 * i + j][keep]), f"layer {layer} changed"


# -- plugin face -------------------------------------------------------------------------------
def test_discover_builds_an_swa_pool_with_its_allocator():
    registry = discover()
    spec = registry.spec("swa")
    assert spec.capabilities == {Capability.OFFLOAD, Capability.SLIDING_WINDOW, Capability.PAGED}
    cfg = PoolConfig(size=16, layer_num=3, swa_layer_ids=(1,), swa_size=8, page_size=2)
    pool, alloc = registry.create("swa", cfg)
    assert isinstance(pool, SlidingWindowPool) and isinstance(pool, OffloadablePool)
    assert isinstance(alloc, SWAAllocator) and isinstance(alloc, PagedAllocator)
    assert alloc.get_kvcache() is pool
    assert pool.swa_layer_ids == (1,) and pool.full_layer_ids == (0, 2)
    assert alloc.size == 8 and alloc.full_available_size() == 16
    assert alloc.swa_available_size() == 8 and alloc.available_size() == 8


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="at least one window layer and one full"):
        make(layer_num=2, swa_ids=(0, 1))
    with pytest.raises(ValueError, match="at least one window layer"):
        make(swa_ids=())
    with pytest.raises(ValueError, match=r"distinct layer ids in 0\.\.3"):
        make(swa_ids=(4,))


def test_layer_map_and_window_geometry():
    pool, _ = make(swa_size=8, start_layer=10, swa_ids=(11, 13), swa_heads=3, swa_dim=5)
    assert pool.get_key_buffer(11).shape == (9, 3, 5)  # window: swa_size + P rows
    assert pool.get_value_buffer(12).shape == (33, 2, 4)  # full: size + P rows
    with pytest.raises(InvalidLayerError, match=r"layers 10\.\.13"):
        pool.get_key_buffer(0)
    expected = 2 * 2 * 33 * 2 * 4 * 4 + 2 * 2 * 9 * 3 * 5 * 4
    assert pool.get_kv_size_bytes() == expected


# -- writes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_window_writes_land_at_the_same_rows_through_every_location_form(dtype):
    results = []
    for mode in MODES:
        pool, alloc = make(dtype)
        slots = alloc.alloc(5)
        fill(pool, slots, torch.Generator().manual_seed(7), mode)
        results.append(buffers(pool))
    for other in results[1:]:
        assert all(same_bits(a, b) for a, b in zip(results[0], other, strict=True))
    pool, alloc = make(dtype)
    slots = alloc.alloc(3)
    k = torch.randn(3, 2, 4)
    pool.set_kv_buffer(Layer(1), slots, k, k)
    window = alloc.translate_loc_from_full_to_swa(slots)
    assert same_bits(pool.get_key_buffer(1)[window], k.to(dtype))
    assert not pool.get_key_buffer(0).any()  # a full layer was not written


def test_explicit_swa_loc_wins_and_full_loc_serves_full_layers():
    pool, alloc = make()
    slots = alloc.alloc(2)
    k = torch.ones(2, 2, 4)
    pool.set_kv_buffer(Layer(1), KVWriteLoc(slots, swa_loc=torch.tensor([7, 8])), k, k)
    assert pool.get_key_buffer(1)[[7, 8]].eq(1).all()
    assert not pool.get_key_buffer(1)[alloc.translate_loc_from_full_to_swa(slots)].any()
    pool.set_kv_buffer(Layer(0), KVWriteLoc(slots, full_loc=torch.tensor([20, 21])), k, k)
    assert pool.get_key_buffer(0)[[20, 21]].eq(1).all() and not pool.get_key_buffer(0)[slots].any()


def test_tokens_out_of_the_window_write_to_the_padding_slot():
    pool, alloc = make()
    slots = alloc.alloc(3)
    alloc.free_swa(slots[:1])
    pool.set_kv_buffer(Layer(1), slots, torch.ones(3, 2, 4), torch.ones(3, 2, 4))
    assert pool.get_key_buffer(1)[0].eq(1).all()  # padding slot absorbed the evicted token
    assert alloc.translate_loc_from_full_to_swa(slots)[0] == 0


def test_unregistered_mapping_is_a_clear_error():
    from kvcache_plugins.swa import SWAKVPool

    pool = SWAKVPool(8, 4, 1, torch.float32, 1, 2, 2, (1,))
    with pytest.raises(AllocatorError, match="no full->window mapping registered"):
        pool.set_kv_buffer(Layer(1), torch.tensor([1]), torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    with pytest.raises(ValueError, match="10 entries"):
        pool.register_mapping(torch.zeros(5, dtype=torch.int64))


BAD_WRITES = [
    (1, torch.tensor([1, 40]), (2, 2, 4), InvalidSlotError, r"loc\[1\] = 40 is out of range"),
    (1, torch.tensor([-1, 2]), (2, 2, 4), InvalidSlotError, "negative"),
    (0, torch.tensor([-1, 2]), (2, 2, 4), InvalidSlotError, "negative"),
    (
        1,
        KVWriteLoc(torch.tensor([1, 2]), swa_loc=torch.tensor([1, 17])),
        (2, 2, 4),
        InvalidSlotError,
        "out of range",
    ),
    (1, torch.tensor([1.0, 2.0]), (2, 2, 4), InvalidSlotError, "integer dtype"),
    (1, torch.tensor([1, 2]), (2, 3, 4), ShapeMismatchError, r"cache_k has shape \[2, 3, 4\]"),
    (
        0,
        torch.tensor([1, 2]),
        (3, 2, 4),
        ShapeMismatchError,
        r"expects \[2, 2, 4\] \(2 rows for 2 slots\)",
    ),
    (9, torch.tensor([1, 2]), (2, 2, 4), InvalidLayerError, "layer 9"),
]


@pytest.mark.parametrize(("layer", "loc", "shape", "error", "message"), BAD_WRITES)
def test_bad_writes_raise_before_writing(layer, loc, shape, error, message):
    pool, alloc = make()
    fill(pool, alloc.alloc(16), torch.Generator().manual_seed(1))
    before = buffers(pool)
    with pytest.raises(error, match=message):
        pool.set_kv_buffer(Layer(layer), loc, torch.randn(*shape), torch.randn(*shape))
    with pytest.raises(ShapeMismatchError, match="floating dtype"):
        ints = torch.ones(2, 2, 4, dtype=torch.int32)
        pool.set_kv_buffer(Layer(1), torch.tensor([1, 2]), ints, ints)
    assert all(same_bits(a, b) for a, b in zip(before, buffers(pool), strict=True))


# -- offload round trips -----------------------------------------------------------------------
LAYOUTS = [(2, (1,), 0), (4, (0, 2), 0), (3, (4, 5), 3)]  # (layer_num, swa ids, start_layer)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    page_size=st.sampled_from([1, 2]),
    layout=st.sampled_from(LAYOUTS),
    heads=st.integers(1, 2),
    swa_heads=st.one_of(st.none(), st.integers(1, 3)),
    swa_dim=st.one_of(st.none(), st.integers(1, 6)),
    mode=st.sampled_from(MODES),
    data=st.data(),
)
def test_round_trip_recreates_exactly_the_masked_window_slots(
    dtype, page_size, layout, heads, swa_heads, swa_dim, mode, data
):
    layer_num, swa_ids, start = layout
    P = page_size
    pool, alloc = make(dtype, 64, 32, P, layer_num, swa_ids, start, heads, 3, swa_heads, swa_dim)
    req_pages = data.draw(st.integers(2, 6), label="request pages")
    req = alloc.alloc(req_pages * P)
    other = alloc.alloc(2 * P)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    fill(pool, req, gen, mode)
    fill(pool, other, gen, mode)
    pages = st.integers(0, req_pages - 1)
    # tokens that left the window lose their window slot (whole pages when paged)
    for p in data.draw(st.lists(pages, unique=True), label="evicted pages"):
        alloc.free_swa(req[p * P : p * P + 1])
    chosen = data.draw(st.lists(pages, min_size=1, unique=True), label="offloaded pages")
    idx = torch.cat([req[p * P : (p + 1) * P] for p in chosen])
    mask = alloc.translate_loc_from_full_to_swa(idx) > 0
    saved = {
        layer: rows(pool, layer, idx[mask] if pool.is_swa_layer(layer) else idx)
        for layer in layer_ids(pool)
    }

    snap = alloc.get_cpu_copy(idx, mamba_indices=None)
    assert snap.pool_kind == "swa" and snap.token_count == idx.numel()
    assert torch.equal(snap.parts["swa_mask"], mask)
    alloc.free(req)
    alloc.check_frees()  # settled now (alloc settles only when short), so that
    alloc.alloc(req_pages * P)  # a filler takes them and the reload lands on other slots
    new = alloc.alloc(idx.numel())
    assert new is not None and not set(new.tolist()) & set(idx.tolist())
    before = buffers(pool)
    swa_free = alloc.swa_available_size()
    alloc.load_cpu_copy(snap, new, mamba_indices=None)

    window = alloc.translate_loc_from_full_to_swa(new)
    assert torch.equal(window > 0, mask)  # exactly the masked tokens have window slots
    assert alloc.swa_available_size() == swa_free + int((~mask).sum())
    for layer in layer_ids(pool):
        got = rows(pool, layer, new[mask] if pool.is_swa_layer(layer) else new)
        assert all(same_bits(g, s) for g, s in zip(got, saved[layer], strict=True))
    assert_untouched_except(pool, before, new, window[mask])


@pytest.mark.parametrize("dtype", DTYPES)
def test_pool_level_reload_writes_masked_rows_and_leaves_the_mapping(dtype):
    pool, alloc = make(dtype)
    req = alloc.alloc(6)
    fill(pool, req, torch.Generator().manual_seed(3))
    alloc.free_swa(req[:2])
    snap = pool.get_cpu_copy(req)
    saved = {layer: rows(pool, layer, req[2:]) for layer in pool.swa_layer_ids}
    saved_full = rows(pool, 0, req)
    new = alloc.alloc(6)  # every new token got a window slot from alloc
    mapping_before = alloc.full_to_swa_index_mapping.clone()
    before = buffers(pool)
    pool.load_cpu_copy(snap, new)
    assert torch.equal(
        alloc.full_to_swa_index_mapping, mapping_before
    )  # the pool allocates nothing
    window = alloc.translate_loc_from_full_to_swa(new)
    for layer, expected in saved.items():
        assert all(
            same_bits(g, s) for g, s in zip(rows(pool, layer, new[2:]), expected, strict=True)
        )
    assert all(same_bits(g, s) for g, s in zip(rows(pool, 0, new), saved_full, strict=True))
    # the two unmasked tokens keep their (unwritten) window slots
    assert_untouched_except(pool, before, new, window[2:])


def test_pool_level_reload_without_window_slots_fails_before_writing():
    pool, alloc = make()
    req = alloc.alloc(4)
    fill(pool, req, torch.Generator().manual_seed(4))
    snap = pool.get_cpu_copy(req)
    new = alloc.alloc(4)
    alloc.free_swa(new[1:2])
    before = buffers(pool)
    with pytest.raises(AllocatorError, match="1 of the 4 tokens saved with a window slot"):
        pool.load_cpu_copy(snap, new)
    assert all(same_bits(a, b) for a, b in zip(before, buffers(pool), strict=True))


def test_allocator_reload_with_too_few_window_slots_changes_nothing():
    pool, alloc = make(size=32, swa_size=8)
    req = alloc.alloc(6)
    fill(pool, req, torch.Generator().manual_seed(5))
    alloc.free_swa(req[:2])  # 4 tokens still in the window
    snap = alloc.get_cpu_copy(req)
    alloc.free(req)
    new = alloc.alloc(6)
    alloc.free_swa(new)  # the engine lost the window slots (e.g. evicted them)...
    hog = alloc.alloc(6)  # ...and another request took most of the window: 2 left
    assert hog is not None and alloc.swa_available_size() == 2
    mapping, before = alloc.full_to_swa_index_mapping.clone(), buffers(pool)
    sizes = (alloc.full_available_size(), alloc.swa_available_size())
    with pytest.raises(AllocatorError, match="needs 4 window slots but only 2"):
        alloc.load_cpu_copy(snap, new)
    assert torch.equal(alloc.full_to_swa_index_mapping, mapping)
    assert (alloc.full_available_size(), alloc.swa_available_size()) == sizes
    assert all(same_bits(a, b) for a, b in zip(before, buffers(pool), strict=True))
    alloc.free(hog)
    alloc.load_cpu_copy(snap, new)  # with room again, the same call succeeds
    assert (alloc.translate_loc_from_full_to_swa(new) > 0).tolist() == [False] * 2 + [True] * 4


def test_allocator_reload_reuses_freed_window_slots_of_unmasked_tokens():
    _, alloc = make(size=32, swa_size=8)
    req = alloc.alloc(8)
    alloc.free_swa(req[:4])
    snap = alloc.get_cpu_copy(req)
    alloc.free(req)
    new = alloc.alloc(8)  # all 8 window slots go to the new tokens
    assert alloc.swa_available_size() == 0
    alloc.load_cpu_copy(snap, new)  # 4 given back, 4 kept: no shortage
    assert alloc.swa_available_size() == 4


def test_offload_indices_are_checked():
    _, alloc = make()
    alloc.alloc(8)
    for bad, message in [
        (torch.tensor([0, 1]), "reserved padding slot 0"),
        (torch.tensor([-2]), "negative"),
        (torch.tensor([33]), "out of range"),
        (torch.tensor([3, 3]), "more than once"),
    ]:
        with pytest.raises(InvalidSlotError, match=message):
            alloc.get_cpu_copy(bad)


def test_bad_snapshots_raise_before_writing_or_allocating():
    pool, alloc = make()
    req = alloc.alloc(3)
    fill(pool, req, torch.Generator().manual_seed(6))
    alloc.free_swa(req[:1])
    snap = alloc.get_cpu_copy(req)
    new = alloc.alloc(3)
    mha = MHATokenToKVPool(32, 1, torch.float32, 2, 4, 2)
    other_ids, other_alloc = make(swa_ids=(1, 2))
    other_geometry, geometry_alloc = make(swa_heads=1)
    other_dtype, dtype_alloc = make(torch.float16)
    forged_mask = KVSnapshot(
        "swa",
        torch.float32,
        3,
        {"swa_mask": torch.ones(3, dtype=torch.bool)},
        dict(snap.children),
        dict(snap.meta),
    )
    cases = [
        (snap, new[:2], "holds 3 entries but 2 indices"),
        (mha.get_cpu_copy(torch.tensor([1, 2, 3])), new, "taken from a 'mha' pool"),
        (other_ids.get_cpu_copy(other_alloc.alloc(3)), new, r"swa_layer_ids is \(1, 2\)"),
        (other_geometry.get_cpu_copy(geometry_alloc.alloc(3)), new, r"part 'k' is \[2, 3, 1, 4\]"),
        (other_dtype.get_cpu_copy(dtype_alloc.alloc(3)), new, "dtype is torch.float16"),
        (forged_mask, new, "holds 2 entries but 3 indices"),
        (snap, torch.tensor([new[0], new[1], 0]), "reserved padding slot"),
        ("not a snapshot", new, "expected a KVSnapshot"),
    ]
    mapping, before = alloc.full_to_swa_index_mapping.clone(), buffers(pool)
    for bad, idx, message in cases:
        for loader in (pool, alloc):
            with pytest.raises((SnapshotMismatchError, InvalidSlotError), match=message):
                loader.load_cpu_copy(bad, idx)
            assert torch.equal(alloc.full_to_swa_index_mapping, mapping)
    assert all(same_bits(a, b) for a, b in zip(before, buffers(pool), strict=True))


def test_mamba_indices_are_ignored_by_the_window_pool():
    pool, alloc = make()
    req = alloc.alloc(2)
    fill(pool, req, torch.Generator().manual_seed(8))
    with_state = alloc.get_cpu_copy(req, mamba_indices=torch.tensor([1]))
    assert set(with_state.children) == {"full", "swa"}  # no state part: the engine keeps it
    new = alloc.alloc(2)
    alloc.load_cpu_copy(with_state, new, mamba_indices=torch.tensor([2]))
    assert same_bits(rows(pool, 0, new)[0], rows(pool, 0, req)[0])


def test_move_kv_cache_moves_full_rows_and_translated_window_rows():
    pool, alloc = make()
    src = alloc.alloc(2)
    fill(pool, src, torch.Generator().manual_seed(9))
    tgt = alloc.alloc(2)
    pool.move_kv_cache(tgt, src)
    for layer in layer_ids(pool):
        assert all(
            same_bits(a, b)
            for a, b in zip(rows(pool, layer, tgt), rows(pool, layer, src), strict=True)
        )


def test_move_kv_cache_from_a_token_that_left_the_window_keeps_the_targets_window_row():
    """kvcache's choice (docs/pools/swa.md): a source without a window slot moves no window row.

    sglang translates both sides and copies, so the source's 0 copies the padding row into the
    target's window row; here the target keeps its own window row, and its full rows move.
    """
    pool, alloc = make()
    src = alloc.alloc(2)
    tgt = alloc.alloc(2)
    gen = torch.Generator().manual_seed(10)
    fill(pool, src, gen)
    fill(pool, tgt, gen)
    alloc.free_swa(src[:1])  # the first source token leaves the window
    window_before = [t.clone() for t in rows(pool, 1, tgt)]
    pool.move_kv_cache(tgt, src)
    window_after = rows(pool, 1, tgt)
    for before, after in zip(window_before, window_after, strict=True):
        assert same_bits(after[0], before[0])  # kept, not the padding row
    assert all(
        same_bits(a[1:], b) for a, b in zip(window_after, rows(pool, 1, src[1:]), strict=True)
    )
    assert all(same_bits(a, b) for a, b in zip(rows(pool, 0, tgt), rows(pool, 0, src), strict=True))


# -- allocator ---------------------------------------------------------------------------------
def test_translation_keeps_minus_one_and_clear_resets_everything():
    _, alloc = make()
    slots = alloc.alloc(3)
    assert alloc.translate_loc_from_full_to_swa(torch.tensor([-1])).tolist() == [-1]
    assert (alloc.translate_loc_from_full_to_swa(slots) > 0).all()
    alloc.clear()
    assert alloc.full_available_size() == 32 and alloc.swa_available_size() == 16
    assert not alloc.full_to_swa_index_mapping[:-1].any()
    assert alloc.full_to_swa_index_mapping[-1] == -1


def test_free_errors_and_free_groups():
    _, alloc = make()
    slots = alloc.alloc(4)
    window = alloc.translate_loc_from_full_to_swa(slots).clone()
    # Bad values surface at the next settle (free reads nothing back); the call is refused as
    # a whole and the held slot named with them keeps its window slot.
    alloc.free(torch.tensor([0, slots[0]]))
    with pytest.raises(DoubleFreeError, match="slot 0 is reserved"):
        alloc.check_frees()
    alloc.free(torch.tensor([slots[0], 99]))
    with pytest.raises(InvalidSlotError, match="cannot free slot 99"):
        alloc.check_frees()
    assert torch.equal(alloc.translate_loc_from_full_to_swa(slots), window)
    assert alloc.swa_available_size() == 12 and alloc.full_available_size() == 28
    with pytest.raises(InvalidSlotError, match="integer dtype"):
        alloc.free(torch.tensor([1.0]))  # dtype and rank are still checked at the call
    with pytest.raises(AllocatorError, match="multiple of page_size"):
        make(page_size=2)[1].alloc(3)
    alloc.free_group_begin()
    alloc.free(slots[:2])
    alloc.free(slots[2:])
    assert alloc.swa_available_size() == 12  # nothing released inside the group
    alloc.free_group_end()
    assert alloc.available_size() == 16 and alloc.full_available_size() == 32
    alloc.free(slots[:1])
    with pytest.raises(DoubleFreeError):
        alloc.available_size()  # the queued double free surfaces when the free set is needed


def test_paged_extend_and_decode_keep_window_offsets_aligned():
    _, alloc = make(size=32, swa_size=8, page_size=4)
    out = alloc.alloc_extend(torch.tensor([0]), torch.tensor([6]), torch.tensor([-1]), 6)
    window = alloc.translate_loc_from_full_to_swa(out)
    assert torch.equal(out % 4, window % 4) and (window > 0).all()
    more = alloc.alloc_decode(torch.tensor([7]), out[-1:])
    assert more.tolist() == [out[-1] + 1]
    assert alloc.translate_loc_from_full_to_swa(more).tolist() == [window[-1] + 1]
    # the window has one page left: a request needing two pages gets nothing from either side
    sizes = (alloc.full_available_size(), alloc.swa_available_size())
    assert alloc.alloc_extend(torch.tensor([0]), torch.tensor([5]), torch.tensor([-1]), 5) is None
    assert (alloc.full_available_size(), alloc.swa_available_size()) == sizes
    alloc.free_swa(out[:1])  # evicting one token frees its whole window page
    assert alloc.swa_available_size() == sizes[1] + 4
    assert (alloc.translate_loc_from_full_to_swa(out[:4]) == 0).all()


class SWAWorkload(RuleBasedStateMachine):
    """Requests are allocated, lose window slots, grow by decode, get freed, backed up and
    restored; a plain-Python model says which full slots are live and which have a window."""

    FULL, SWA = 24, 12

    def __init__(self) -> None:
        super().__init__()
        self.alloc = None
        self.P = 1
        self.requests: list[list[int]] = []
        self.windowed: set[int] = set()
        self.saved = None

    @initialize(page_size=st.sampled_from([1, 2]))
    def start(self, page_size):
        self.P = page_size
        self.alloc = make(size=self.FULL, swa_size=self.SWA, page_size=page_size)[1]

    def live_pages(self):
        return {s // self.P for r in self.requests for s in r}

    def window_pages(self):
        return {s // self.P for s in self.windowed}

    def sizes(self):
        return self.alloc.full_available_size(), self.alloc.swa_available_size()

    @rule(pages=st.integers(0, 4))
    def alloc_pages(self, pages):
        before = self.sizes()
        out = self.alloc.alloc(pages * self.P)
        fits = pages <= min(
            self.FULL // self.P - len(self.live_pages()),
            self.SWA // self.P - len(self.window_pages()),
        )
        if not fits:
            assert out is None and self.sizes() == before  # never partial
            return
        assert out is not None and out.numel() == pages * self.P
        if pages:
            self.requests.append(out.tolist())
            self.windowed |= set(out.tolist())

    @rule(data=st.data())
    @precondition(lambda self: self.requests)
    def decode(self, data):
        req = data.draw(st.sampled_from([r for r in self.requests]))
        if req[-1] not in self.windowed:
            return
        fresh = len(req) % self.P == 0
        before = self.sizes()
        out = self.alloc.alloc_decode(torch.tensor([len(req) + 1]), torch.tensor([req[-1]]))
        full_left = self.FULL // self.P - len(self.live_pages())
        swa_left = self.SWA // self.P - len(self.window_pages())
        if fresh and min(full_left, swa_left) < 1:
            assert out is None and self.sizes() == before
            return
        assert out is not None
        req.append(int(out[0]))
        self.windowed.add(int(out[0]))

    @rule(data=st.data(), grow=st.integers(1, 5))
    @precondition(lambda self: self.requests)
    def extend(self, data, grow):
        req = data.draw(st.sampled_from(self.requests))
        if req[-1] not in self.windowed:
            return
        n = len(req)
        need = -(-(n + grow) // self.P) - -(-n // self.P)
        before = self.sizes()
        out = self.alloc.alloc_extend(
            torch.tensor([n]), torch.tensor([n + grow]), torch.tensor([req[-1]]), grow
        )
        full_left = self.FULL // self.P - len(self.live_pages())
        swa_left = self.SWA // self.P - len(self.window_pages())
        if need > min(full_left, swa_left):
            assert out is None and self.sizes() == before
            return
        assert out is not None and out.numel() == grow
        req.extend(out.tolist())
        self.windowed |= set(out.tolist())

    @rule(data=st.data())
    @precondition(lambda self: self.requests)
    def leave_window(self, data):
        req = data.draw(st.sampled_from(self.requests))
        pages = sorted({s // self.P for s in req})
        k = data.draw(st.integers(1, max(1, len(pages) - 1)))
        gone = [s for s in req if s // self.P in pages[:k]]
        self.alloc.free_swa(torch.tensor(gone))
        self.windowed -= {s for s in self.windowed if s // self.P in pages[:k]}

    @rule(data=st.data())
    @precondition(lambda self: self.requests)
    def free_request(self, data):
        req = data.draw(st.sampled_from(self.requests))
        self.alloc.free(torch.tensor(req))
        self.requests = [r for r in self.requests if r is not req]
        self.windowed -= set(req)

    @rule()
    def backup(self):
        self.saved = (
            self.alloc.backup_state(),
            [list(r) for r in self.requests],
            set(self.windowed),
        )

    @rule()
    @precondition(lambda self: self.saved is not None)
    def restore(self):
        state, requests, windowed = self.saved
        self.alloc.restore_state(state)
        self.requests, self.windowed = [list(r) for r in requests], set(windowed)

    @invariant()
    def matches_the_model(self):
        live = [s for r in self.requests for s in r]
        assert len(live) == len(set(live)), "a full slot was handed out twice"
        mapping = self.alloc.full_to_swa_index_mapping
        assert int(mapping[-1]) == -1
        has = {s for s in range(1, self.FULL + self.P) if mapping[s] > 0}
        assert has == self.windowed, "window slots do not match the model"
        window = [int(mapping[s]) for s in sorted(has)]
        assert len(window) == len(set(window)), "a window slot was handed out twice"
        assert all(int(mapping[s]) % self.P == s % self.P for s in has)
        window_page_of: dict[int, int] = {}
        for s in has:  # one full page's tokens share one window page
            page = int(mapping[s]) // self.P
            assert window_page_of.setdefault(s // self.P, page) == page, "page split"
        assert self.alloc.full_available_size() == self.FULL - len(self.live_pages()) * self.P
        used_window_pages = {w // self.P for w in window}
        assert len(used_window_pages) == len(self.window_pages())
        assert self.alloc.swa_available_size() == self.SWA - len(used_window_pages) * self.P


TestSWAWorkload = SWAWorkload.TestCase
TestSWAWorkload.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)


def _all_bytes(pool):
    return [t.clone() for t in buffers(pool)]


@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("path", ["pool", "allocator"])
@pytest.mark.parametrize("corruption", ["duplicate", "out of range", "free slot"])
def test_a_refused_window_side_leaves_the_reload_unapplied(page_size, path, corruption):
    """Issue 7: every part of a composite reload is checked before the first byte (or slot)
    changes; a refused window side leaves the full rows, the table and both free lists as
    they were."""
    P = page_size
    pool, alloc = make(size=16, swa_size=16, page_size=P, layer_num=2, swa_ids=(1,))
    req = alloc.alloc(2 * P)
    fill(pool, req, torch.Generator().manual_seed(11))
    snap = alloc.get_cpu_copy(req)
    new = alloc.alloc(2 * P)
    table = alloc.full_to_swa_index_mapping
    if corruption == "duplicate":
        table[new[-1]] = table[new[0]]
    elif corruption == "out of range":
        table[new[-1]] = 10_000
    else:
        # the last page's window page goes back to the free list, but the first page is
        # (wrongly) recorded as holding it: reloading hands that page out a second time
        last_window = table[new[-P:]].clone()
        alloc.free_swa(new[-P:])
        table[new[:P]] = last_window
    bytes_before, table_before = _all_bytes(pool), table.clone()
    sizes = (alloc.full_available_size(), alloc.swa_available_size())
    target = pool if path == "pool" else alloc
    with pytest.raises((InvalidSlotError, AllocatorError)):
        target.load_cpu_copy(snap, new)
    assert all(same_bits(a, b) for a, b in zip(bytes_before, _all_bytes(pool), strict=True))
    assert torch.equal(table, table_before)
    assert (alloc.full_available_size(), alloc.swa_available_size()) == sizes


@pytest.mark.parametrize("page_size", [1, 2, 4])
@pytest.mark.parametrize("evicted_pages", [0, 1, 2])
@pytest.mark.parametrize("how", ["alloc_extend", "alloc", "window lost"])
def test_reloaded_requests_keep_decoding_and_extending(page_size, evicted_pages, how):
    """Issue 7: after a paged reload, window offsets inside a page must match the full ones,
    or the next decode's translated last_loc is refused. Decode and extend several steps after
    the reload, writing every step, and compare every buffer byte (not rows read back through
    the table, which cannot tell a misplaced offset from a right one)."""
    from ._whole_buffers import SWAHarness, assert_same_buffers

    P = page_size
    h = SWAHarness(P)
    alloc, gen = h.alloc, torch.Generator().manual_seed(2)
    n = 3 * P + 1 if P > 1 else 5
    first = alloc.alloc(P)  # shifts the request off the first pages, on both sides
    req = alloc.alloc_extend(torch.tensor([0]), torch.tensor([n]), torch.tensor([-1]), n)
    alloc.free_swa(first)
    h.write(req, "swa_loc", gen)
    pages = list(dict.fromkeys((req // P).tolist()))
    if evicted_pages:
        gone = set(pages[:evicted_pages])
        alloc.free_swa(req[torch.tensor([s // P in gone for s in req.tolist()])])
    rows = h.token_rows(req)
    snap = alloc.get_cpu_copy(req)
    alloc.free(req)
    if how == "alloc":
        new = alloc.alloc(-(-n // P) * P)[:n]
    else:
        new = alloc.alloc_extend(torch.tensor([0]), torch.tensor([n]), torch.tensor([-1]), n)
        if how == "window lost":
            alloc.free_swa(new[:1])  # the new request's first page lost its window page
    alloc.load_cpu_copy(snap, new)
    h.put_token_rows(new, rows)
    assert_same_buffers(h.buffers(), h.expected)
    slots = new.tolist()
    for step in range(2 * P + 1):
        out = alloc.alloc_decode(torch.tensor([len(slots) + 1]), torch.tensor(slots[-1:]))
        assert out is not None, step
        slots.append(int(out[0]))
        h.write(out, ("bare", "writeloc", "swa_loc")[step % 3], gen)
        assert_same_buffers(h.buffers(), h.expected)
    more = alloc.alloc_extend(
        torch.tensor([len(slots)]),
        torch.tensor([len(slots) + P + 1]),
        torch.tensor(slots[-1:]),
        P + 1,
    )
    assert more is not None
    h.write(more, "writeloc", gen)
    assert_same_buffers(h.buffers(), h.expected)
    table = alloc.full_to_swa_index_mapping
    held = torch.tensor(slots + more.tolist())
    held = held[table[held] > 0]
    assert torch.equal(table[held] % P, held % P)  # offsets kept inside every page


@pytest.mark.parametrize("page_size", [2, 4])
@pytest.mark.parametrize("bad", ["offset moved", "page split", "window page shared"])
def test_window_pairs_recorded_by_hand_keep_offsets_or_are_refused(page_size, bad):
    """Issue 7: a reload that manages window slots itself (``set_full_to_swa_mapping``, then
    ``pool.load_cpu_copy``) must keep each token's offset inside its page: a pair recorded at
    another offset made the next decode refuse its translated ``last_loc``. Refused before
    the table changes; pairs that keep the layout load, decode and extend."""
    P = page_size
    pool, alloc = make(size=32, swa_size=16, page_size=P, layer_num=2, swa_ids=(1,))
    req = alloc.alloc_extend(torch.tensor([0]), torch.tensor([P + 1]), torch.tensor([-1]), P + 1)
    fill(pool, req, torch.Generator().manual_seed(9))
    alloc.free_swa(req[:1])  # the first page left the window: only the last token is masked
    snap = alloc.get_cpu_copy(req)
    alloc.free(req)
    new = alloc.full_attn_allocator.alloc_extend(
        torch.tensor([0]), torch.tensor([P + 1]), torch.tensor([-1]), P + 1
    )
    window = alloc.swa_attn_allocator.alloc(2 * P)
    other = alloc.alloc(P)  # another request, holding a window page of its own
    table = alloc.full_to_swa_index_mapping
    bad_pairs = {
        "offset moved": (new[-1:], window[1:2]),
        # two tokens of one full page, offsets kept, in two window pages
        "page split": (new[P - 2 : P], torch.stack([window[P - 2], window[2 * P - 1]])),
        "window page shared": (new[-1:], table[other[:1]]),
    }[bad]
    before = table.clone()
    with pytest.raises(AllocatorError):
        alloc.set_full_to_swa_mapping(*bad_pairs)
    assert torch.equal(table, before)
    alloc.set_full_to_swa_mapping(new[-1:], window[:1])  # offset 0 -> offset 0
    alloc.swa_attn_allocator.free(window[P:])
    pool.load_cpu_copy(snap, new)
    slots = new.tolist()
    for _ in range(P + 1):
        out = alloc.alloc_decode(torch.tensor([len(slots) + 1]), torch.tensor(slots[-1:]))
        assert out is not None
        slots.append(int(out[0]))
    more = alloc.alloc_extend(
        torch.tensor([len(slots)]), torch.tensor([len(slots) + 2]), torch.tensor(slots[-1:]), 2
    )
    assert more is not None
    held = torch.tensor(slots + more.tolist())
    held = held[table[held] > 0]
    assert torch.equal(table[held] % P, held % P)
