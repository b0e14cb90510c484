"""``VLLMBlockPool``: vLLM's CPU KV layout read and written as a kvcache pool, without vLLM.

The layout is built here by hand from its description (per block and head: K transposed
``[head_size, block_size]``, then V ``[block_size, head_size]``), independently of the pool's
own views; tests/vllm_e2e checks the same description against vLLM's own cache kernel.
"""

from __future__ import annotations

import pytest
import torch

from kvcache_core import KVSnapshot, PoolConfig, SnapshotMismatchError, discover
from kvcache_core.conformance.runner import check
from kvcache_core.integrations.vllm import VLLMBlockPool, vllm_cpu_pool_spec
from kvcache_core.testing import check_conformance, conformance_cases

BLOCKS, HEADS, BS, D, LAYERS = 5, 2, 32, 8, 3


def raw_caches(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(BLOCKS, HEADS, BS, 2 * D, generator=g).to(dtype) for _ in range(LAYERS)]


def by_hand(cache: torch.Tensor, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ``slot``'s K and V ``[heads, D]``, read element by element from the layout."""
    block, t = divmod(slot, BS)
    k = torch.empty(HEADS, D, dtype=cache.dtype)
    v = torch.empty(HEADS, D, dtype=cache.dtype)
    for h in range(HEADS):
        flat = cache[block, h].reshape(-1)
        for d in range(D):
            k[h, d] = flat[d * BS + t]
            v[h, d] = flat[BS * D + t * D + d]
    return k, v


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "slots",
    [
        torch.arange(2 * BS, 4 * BS),
        torch.tensor([BS + 3, 4 * BS + 31, 70]),
        # a block's slots from its first one, then out of order: not a whole-block copy
        torch.cat(
            [
                torch.tensor([BS]),
                BS + 1 + torch.randperm(BS - 1, generator=torch.Generator().manual_seed(0)),
            ]
        ),
    ],
    ids=["whole-blocks", "scattered", "permuted-block"],
)
def test_snapshots_are_token_major_with_the_transpose_undone(dtype, slots):
    caches = raw_caches(dtype)
    pool = VLLMBlockPool(caches)
    snap = pool.get_cpu_copy(slots)
    assert snap.pool_kind == "mha" and snap.parts["k"].shape == (LAYERS, len(slots), HEADS, D)
    for layer, cache in enumerate(caches):
        for j, slot in enumerate(slots.tolist()):
            k, v = by_hand(cache, slot)
            assert torch.equal(bits(snap.parts["k"][layer, j]), bits(k)), (layer, slot)
            assert torch.equal(bits(snap.parts["v"][layer, j]), bits(v)), (layer, slot)


def test_writes_land_where_vllm_reads_them():
    caches = [torch.zeros(BLOCKS, HEADS, BS, 2 * D) for _ in range(LAYERS)]
    pool = VLLMBlockPool(caches)
    slots = torch.tensor([BS, 3 * BS + 7, 5 * BS - 1])
    k = torch.randn(3, HEADS, D)
    v = torch.randn(3, HEADS, D)
    pool.set_kv_buffer(type("L", (), {"layer_id": 1})(), slots, k, v)
    for j, slot in enumerate(slots.tolist()):
        got_k, got_v = by_hand(caches[1], slot)
        assert torch.equal(got_k, k[j]) and torch.equal(got_v, v[j])
    assert all(not c.any() for c in (caches[0], caches[2]))
    assert torch.equal(pool.get_key_buffer(1)[slots], k)
    assert torch.equal(pool.get_value_buffer(1)[slots], v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_snapshot_goes_into_an_mha_pool_and_back_bit_for_bit(dtype):
    pool = VLLMBlockPool(raw_caches(dtype, seed=1))
    # -0.0 and NaN payloads too: a cache stores bits, not numbers
    pool.caches[0][1, 0, 0, :4] = torch.tensor([-0.0, float("nan"), float("inf"), -1e-30])
    taken = torch.arange(BS, 3 * BS)
    snap = pool.get_cpu_copy(taken)
    registry = discover(strict=True)
    config = PoolConfig(
        size=8 * BS, layer_num=LAYERS, head_num=HEADS, head_dim=D, page_size=BS, dtype=dtype
    )
    _, allocator = registry.create("mha", config)
    into = allocator.alloc(2 * BS)
    allocator.load_cpu_copy(KVSnapshot.from_bytes(snap.to_bytes()), into, mamba_indices=None)
    back = allocator.get_cpu_copy(into, mamba_indices=None)
    other = VLLMBlockPool(
        [torch.zeros(BLOCKS, HEADS, BS, 2 * D, dtype=dtype)] * 1
        + [torch.zeros(BLOCKS, HEADS, BS, 2 * D, dtype=dtype) for _ in range(LAYERS - 1)]
    )
    other.load_cpu_copy(back, torch.arange(3 * BS, 5 * BS))
    for layer in range(LAYERS):
        assert torch.equal(bits(other.caches[layer][3:5]), bits(pool.caches[layer][1:3])), (
            f"layer {layer}: blocks differ after vllm -> mha -> vllm"
        )


def test_a_snapshot_that_does_not_fit_is_refused_before_a_byte_is_written():
    pool = VLLMBlockPool(raw_caches())
    before = [c.clone() for c in pool.caches]
    snap = pool.get_cpu_copy(torch.arange(BS, 2 * BS))
    smaller = VLLMBlockPool([torch.zeros(BLOCKS, HEADS, BS, 2 * D)] * 2)
    with pytest.raises(SnapshotMismatchError, match="layer_num"):
        smaller.load_cpu_copy(snap, torch.arange(BS, 2 * BS))
    with pytest.raises(SnapshotMismatchError, match="64 indices"):
        pool.load_cpu_copy(snap, torch.arange(2 * BS, 4 * BS))
    assert all(torch.equal(a, b) for a, b in zip(pool.caches, before, strict=True))


@pytest.mark.parametrize(
    ("caches", "message"),
    [
        ([], "at least one"),
        ([torch.zeros(4, 2, 32)], "CPU layout"),
        ([torch.zeros(4, 2, 32, 15)], "2 \\* head_size"),
        ([torch.zeros(4, 2, 32, 16), torch.zeros(4, 2, 32, 16, dtype=torch.bfloat16)], "one"),
        ([torch.zeros(4, 2, 32, 16).transpose(0, 1)], "CPU layout|contiguous"),
        ([torch.zeros(4, 2, 32, 16, dtype=torch.uint8)], "floating-point"),
    ],
)
def test_tensors_that_are_not_the_cpu_layout_are_refused(caches, message):
    with pytest.raises((ValueError, TypeError), match=message):
        VLLMBlockPool(caches)


SPEC = vllm_cpu_pool_spec()


@pytest.mark.parametrize(("spec", "check_id"), conformance_cases(SPEC))
def test_the_behaviour_battery_passes_on_the_real_layout(spec, check_id):
    check_conformance(spec, check_id)


def test_kvcache_check_passes_at_every_level(fake_site):
    """``kvcache check vllm-cpu`` with the pool installed as a plugin: source, signature,
    types (mypy against the contract) and behaviour, no finding."""
    fake_site(
        "kvcache-vllm-pool",
        entry_points={"vllm-cpu": "kvcache_core.integrations._vllm_pool"},
        modules={},
    )
    report = check(["vllm-cpu"], pyproject=False)
    assert report.exit_code == 0, report.text
    ran = {r.check.replace(":", "/").split("/")[0] for r in report.results}
    assert {"source", "signature", "types", "behaviour"} <= ran, ran
