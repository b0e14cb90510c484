"""MHA pool: bit-exact offload round trips, KVWriteLoc equivalence, rejection before writes."""

from __future__ import annotations

import pytest
import torch
from conftest import Layer
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache_core import (
    InvalidLayerError,
    InvalidSlotError,
    KVSnapshot,
    KVWriteLoc,
    OffloadablePool,
    ShapeMismatchError,
    SnapshotMismatchError,
    UnsupportedDtypeError,
)
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make_pool(dtype=torch.float32, size=64, page_size=1, layers=3, heads=2, dim=4, **kw):
    pool = MHATokenToKVPool(size, page_size, dtype, heads, dim, layers, "cpu", **kw)
    return pool, PagedSlotAllocator(size, page_size, pool)


def fill(pool, slots, seed=0):
    """Write distinct random K/V into every layer at ``slots``; return what was written."""
    gen = torch.Generator().manual_seed(seed)
    written = []
    for layer in range(pool.layer_num):
        k = torch.randn(len(slots), pool.head_num, pool.head_dim, generator=gen)
        v = torch.randn(len(slots), pool.head_num, pool.v_head_dim, generator=gen)
        pool.set_kv_buffer(Layer(layer), slots, k, v)
        written.append((k.to(pool.dtype), v.to(pool.dtype)))
    return written


def buffers(pool):
    return [t.clone() for i in range(pool.layer_num) for t in pool.get_kv_buffer(i)]


def assert_same_buffers(before, pool):
    after = buffers(pool)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_pool_satisfies_offloadable_protocol():
    pool, _ = make_pool()
    assert isinstance(pool, OffloadablePool)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_into_new_slots_is_bit_exact(dtype):
    pool, alloc = make_pool(dtype)
    old = alloc.alloc(10)
    written = fill(pool, old)
    others = alloc.alloc(5)
    fill(pool, others, seed=1)
    untouched = buffers(pool)

    snap = alloc.get_cpu_copy(old, mamba_indices=None)
    assert snap.token_count == 10 and snap.pool_kind == "mha" and snap.dtype == dtype
    alloc.free(old)
    new = alloc.alloc(20)[10:]  # different slots from ``old``
    assert not set(new.tolist()) & set(old.tolist())
    alloc.load_cpu_copy(snap, new, mamba_indices=None)

    for layer, (k, v) in enumerate(written):
        got_k, got_v = pool.get_kv_buffer(layer)
        assert torch.equal(got_k[new], k) and torch.equal(got_v[new], v)
        # rows of the other request are untouched
        assert torch.equal(got_k[others], untouched[2 * layer][others])


@settings(max_examples=30, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    layers=st.integers(1, 3),
    heads=st.integers(1, 3),
    dim=st.integers(1, 8),
    page_size=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_round_trip_property(dtype, layers, heads, dim, page_size, data):
    size = 32
    pool, _ = make_pool(dtype, size=size, page_size=page_size, layers=layers, heads=heads, dim=dim)
    all_slots = torch.arange(1, size + page_size)
    fill(pool, all_slots, seed=data.draw(st.integers(0, 1000)))
    chosen = data.draw(st.lists(st.integers(1, size + page_size - 1), min_size=1, unique=True))
    targets = data.draw(st.permutations([s for s in range(1, size + page_size) if s not in chosen]))
    targets = targets[: len(chosen)]
    if len(targets) < len(chosen):
        return
    src, dst = torch.tensor(chosen), torch.tensor(targets)
    expected = [(k[src].clone(), v[src].clone()) for k, v in map(pool.get_kv_buffer, range(layers))]
    keep = [s for s in range(1, size + page_size) if s not in targets]
    before = [(k[keep].clone(), v[keep].clone()) for k, v in map(pool.get_kv_buffer, range(layers))]
    pool.load_cpu_copy(pool.get_cpu_copy(src), dst)
    for layer in range(layers):
        k, v = pool.get_kv_buffer(layer)
        assert torch.equal(k[dst], expected[layer][0]) and torch.equal(v[dst], expected[layer][1])
        assert torch.equal(k[keep], before[layer][0]) and torch.equal(v[keep], before[layer][1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_writeloc_and_bare_tensor_land_identically(dtype):
    a, _ = make_pool(dtype)
    b, _ = make_pool(dtype)
    slots = torch.tensor([3, 9, 1, 17])
    k, v = torch.randn(4, 2, 4), torch.randn(4, 2, 4)
    a.set_kv_buffer(Layer(1), slots, k, v)
    b.set_kv_buffer(Layer(1), KVWriteLoc(slots, swa_loc=torch.tensor([0, 1, 2, 3])), k, v)
    assert all(torch.equal(x, y) for x, y in zip(buffers(a), buffers(b), strict=True))
    assert torch.equal(a.get_key_buffer(1)[slots], k.to(dtype))


def test_full_loc_overrides_loc():
    pool, _ = make_pool()
    k, v = torch.ones(2, 2, 4), torch.ones(2, 2, 4)
    pool.set_kv_buffer(
        Layer(0), KVWriteLoc(torch.tensor([1, 2]), full_loc=torch.tensor([5, 6])), k, v
    )
    assert pool.get_key_buffer(0)[[5, 6]].eq(1).all()
    assert pool.get_key_buffer(0)[[1, 2]].eq(0).all()


def test_scales_divide_before_storing_only_when_the_write_casts():
    """As engines apply them: a casting write is divided, one in the pool's dtype is not."""
    pool, _ = make_pool()
    k, v = torch.full((1, 2, 4), 6.0, dtype=torch.float64), torch.full((1, 2, 4), 6.0)
    pool.set_kv_buffer(Layer(0), torch.tensor([2]), k, v.double(), k_scale=2.0, v_scale=3.0)
    assert pool.get_key_buffer(0)[2].eq(3.0).all() and pool.get_value_buffer(0)[2].eq(2.0).all()
    assert k.eq(6.0).all()  # the caller's tensor is not modified in place
    pool.set_kv_buffer(Layer(0), torch.tensor([2]), v, v, k_scale=2.0, v_scale=3.0)
    assert pool.get_key_buffer(0)[2].eq(6.0).all() and pool.get_value_buffer(0)[2].eq(6.0).all()


def test_fp8_is_stored_as_uint8_and_round_trips():
    fp8 = torch.float8_e4m3fn
    pool, _ = make_pool(fp8)
    assert pool.store_dtype == torch.uint8 and pool.get_key_buffer(0).dtype == fp8
    slots = torch.tensor([4, 5, 6])
    pool.set_kv_buffer(Layer(2), slots, torch.randn(3, 2, 4), torch.randn(3, 2, 4))
    expected = pool.get_key_buffer(2)[slots].view(torch.uint8).clone()
    snap = pool.get_cpu_copy(slots)
    pool.load_cpu_copy(snap, torch.tensor([30, 31, 32]))
    assert torch.equal(pool.get_key_buffer(2)[[30, 31, 32]].view(torch.uint8), expected)


def test_integer_dtype_is_refused():
    with pytest.raises(UnsupportedDtypeError, match="floating-point"):
        make_pool(torch.int32)


def test_start_layer_maps_global_ids():
    pool, _ = make_pool(start_layer=10)
    pool.set_kv_buffer(Layer(11), torch.tensor([1]), torch.ones(1, 2, 4), torch.ones(1, 2, 4))
    assert pool.get_key_buffer(11)[1].eq(1).all()
    with pytest.raises(InvalidLayerError, match=r"layers 10\.\.12"):
        pool.get_key_buffer(0)


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked-slots"])
@pytest.mark.parametrize("layer_id", [9, 13, -1, True])
def test_a_layer_outside_the_pool_is_refused_before_writing(check, layer_id):
    """With or without the per-write slot check (its fast path included): a layer id below
    ``start_layer``, past the last layer, negative (which would index from the end) or a bool
    is refused, and no layer is written."""
    pool, _ = make_pool(start_layer=10, check_write_slots=check)
    fill_layers = [Layer(10 + i) for i in range(3)]
    for layer in fill_layers:
        pool.set_kv_buffer(layer, torch.arange(1, 65), torch.randn(64, 2, 4), torch.randn(64, 2, 4))
    before = [t.clone() for i in range(10, 13) for t in pool.get_kv_buffer(i)]
    with pytest.raises((InvalidLayerError, TypeError), match="layer"):
        pool.set_kv_buffer(
            Layer(layer_id), torch.tensor([1]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
        )
    after = [t for i in range(10, 13) for t in pool.get_kv_buffer(i)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


BAD_WRITES = [
    (torch.tensor([1, 70]), InvalidSlotError, r"loc\[1\] = 70 is out of range"),
    (torch.tensor([-1, 2]), InvalidSlotError, "negative"),
    (torch.tensor([1.0, 2.0]), InvalidSlotError, "integer dtype"),
]


@pytest.mark.parametrize(("loc", "error", "message"), BAD_WRITES)
def test_bad_write_slots_raise_before_writing(loc, error, message):
    pool, _ = make_pool()
    fill(pool, torch.arange(1, 65))
    before = buffers(pool)
    with pytest.raises(error, match=message):
        pool.set_kv_buffer(Layer(0), loc, torch.randn(2, 2, 4), torch.randn(2, 2, 4))
    assert_same_buffers(before, pool)


def test_bad_write_shapes_raise_before_writing():
    pool, _ = make_pool()
    fill(pool, torch.arange(1, 65))
    before = buffers(pool)
    slots = torch.tensor([1, 2])
    with pytest.raises(ShapeMismatchError, match=r"cache_v has shape \[2, 3, 4\]"):
        pool.set_kv_buffer(Layer(0), slots, torch.randn(2, 2, 4), torch.randn(2, 3, 4))
    with pytest.raises(ShapeMismatchError, match="floating dtype"):
        pool.set_kv_buffer(
            Layer(0), slots, torch.ones(2, 2, 4, dtype=torch.int64), torch.randn(2, 2, 4)
        )
    with pytest.raises(TypeError, match="layer_id"):
        pool.set_kv_buffer(object(), slots, torch.randn(2, 2, 4), torch.randn(2, 2, 4))
    assert_same_buffers(before, pool)
    # flattened heads are accepted (engines pass [n, H*D])
    pool.set_kv_buffer(Layer(0), slots, torch.ones(2, 8), torch.ones(2, 8))
    assert pool.get_key_buffer(0)[slots].eq(1).all()


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (torch.tensor([0, 1]), "reserved padding slot 0"),
        (torch.tensor([-2]), "negative"),
        (torch.tensor([65]), "out of range"),
        (torch.tensor([3, 3]), "more than once"),
    ],
)
def test_bad_offload_indices(indices, message):
    pool, _ = make_pool()
    with pytest.raises(InvalidSlotError, match=message):
        pool.get_cpu_copy(indices)


def test_bad_snapshots_raise_before_writing():
    pool, _ = make_pool()
    fill(pool, torch.arange(1, 65))
    snap = pool.get_cpu_copy(torch.tensor([1, 2, 3]))
    before = buffers(pool)
    target = torch.tensor([10, 11, 12])
    other_dtype, _ = make_pool(torch.float16)
    other_shape, _ = make_pool(heads=3)
    other_layers, _ = make_pool(layers=2)
    cases = [
        (snap, torch.tensor([10, 11]), "holds 3 entries but 2 indices"),
        (other_dtype.get_cpu_copy(target), target, "dtype is torch.float16"),
        (other_shape.get_cpu_copy(target), target, r"part 'k' is \[3, 3, 3, 4\]"),
        (other_layers.get_cpu_copy(target), target, "layer_num is 2; this pool has 3"),
        (KVSnapshot("mla", torch.float32, 3, {}), target, "taken from a 'mla' pool"),
        ({"k": 1}, target, "expected a KVSnapshot"),
        (snap, torch.tensor([10, 11, 0]), "reserved padding slot"),
    ]
    for bad, idx, message in cases:
        with pytest.raises((SnapshotMismatchError, InvalidSlotError), match=message):
            pool.load_cpu_copy(bad, idx)
    assert_same_buffers(before, pool)


def test_move_kv_cache_copies_rows_in_every_layer():
    pool, _ = make_pool()
    written = fill(pool, torch.tensor([1, 2]))
    pool.move_kv_cache(torch.tensor([20, 21]), torch.tensor([1, 2]))
    for layer, (k, _) in enumerate(written):
        assert torch.equal(pool.get_key_buffer(layer)[[20, 21]], k)


def test_size_in_bytes():
    pool, _ = make_pool(torch.bfloat16, size=64, layers=3, heads=2, dim=4)
    assert pool.get_kv_size_bytes() == 2 * 3 * 65 * 2 * 4 * 2
