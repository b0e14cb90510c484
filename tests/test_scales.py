"""Scales as engines apply them, in every pool that takes them (issue 12, item 1).

Engines divide ``cache_k``/``cache_v`` by ``k_scale``/``v_scale`` only when the write casts;
attention backends pass the layer's scale on every write, so a write already in the pool's
dtype must be stored as given. The caller's tensors stay untouched (engines divide in place;
kvcache promises not to). MLA-family pools ignore the scales either way (their kernels apply
them on read).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from behaviour._support import example_spec

from kvcache_core import KVWriteLoc, LayerRows, discover
from kvcache_core.conformance.behaviour._context import Layer, default_config

REGISTRY = discover()
#: pool -> (a layer that holds K/V, whether the pool divides when a write casts)
POOLS = {
    "mha": (0, True),
    "swa": (1, True),  # the window layer: the scale reaches the window sub-pool too
    "mamba": (0, True),  # the hybrid's attention layer
    "mla": (0, False),
    "dsa": (0, False),
    "hisparse": (0, False),
}


def _spec(name: str):
    return example_spec() if name == "example" else REGISTRY.spec(name)


def _build(name: str):
    spec = _spec(name)
    pool, allocator = spec.factory(default_config(spec))
    if name == "mha" or name == "example":
        slots = torch.tensor([1, 2, 3])
    else:
        slots = allocator.alloc_extend(torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 3)
    return pool, allocator, slots


def _rows(pool, name: str, layer: int, slots: torch.Tensor) -> torch.Tensor:
    if name == "swa":
        return pool.translate_loc_from_full_to_swa(slots)
    if name == "hisparse":
        return pool.translate_loc_to_device(slots)
    return slots


def _kv(pool, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.full((3, *pool.get_key_buffer(layer).shape[1:]), 3.0, dtype=dtype)
    v = torch.full((3, *pool.get_value_buffer(layer).shape[1:]), 3.0, dtype=dtype)
    return k, v


@pytest.mark.parametrize("name", [*POOLS, "example"])
@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "writeloc"])
def test_write_without_cast_stores_values_as_given(name: str, wrapped: bool) -> None:
    """float32 3.0 into a float32 pool with k_scale=2.0 stores 3.0 (sglang does; we stored 1.5)."""
    pool, _, slots = _build(name)
    layer = POOLS.get(name, (0, True))[0]
    k, v = _kv(pool, layer, pool.dtype)
    loc = KVWriteLoc(slots) if wrapped else slots
    pool.set_kv_buffer(Layer(layer), loc, k, v, k_scale=2.0, v_scale=4.0)
    rows = _rows(pool, name, layer, slots)
    assert torch.equal(pool.get_key_buffer(layer)[rows], k)
    assert torch.equal(pool.get_value_buffer(layer)[rows], v)


@pytest.mark.parametrize("name", [*POOLS, "example"])
def test_write_that_casts_divides_or_ignores_and_never_in_place(name: str) -> None:
    pool, _, slots = _build(name)
    layer, divides = POOLS.get(name, (0, True))
    k, v = _kv(pool, layer, torch.float64)
    pool.set_kv_buffer(Layer(layer), slots, k, v, k_scale=2.0, v_scale=4.0)
    assert bool((k == 3.0).all()) and bool((v == 3.0).all())  # the caller's tensors untouched
    rows = _rows(pool, name, layer, slots)
    key, value = pool.get_key_buffer(layer)[rows], pool.get_value_buffer(layer)[rows]
    if divides:
        assert bool((key == 1.5).all()) and bool((value == 0.75).all())
    else:  # MLA family: the value is the latent's first columns, scales ignored
        assert bool((key == 3.0).all()) and bool((value == 3.0).all())


def test_swa_full_layer_follows_the_rule_too() -> None:
    pool, _, slots = _build("swa")
    k, v = _kv(pool, 0, pool.dtype)
    pool.set_kv_buffer(Layer(0), slots, k, v, k_scale=2.0, v_scale=2.0)
    assert torch.equal(pool.get_key_buffer(0)[slots], k)


def test_layer_rows_to_storage_divides_only_when_casting() -> None:
    rows = LayerRows(1, 4, (2,), torch.float32, torch.device("cpu"))
    same = torch.full((1, 2), 3.0)
    assert torch.equal(rows.to_storage(same, 2.0), same)
    wider = torch.full((1, 2), 3.0, dtype=torch.float64)
    got = rows.to_storage(wider, 2.0)
    assert got.dtype == torch.float32 and bool((got == 1.5).all())
    assert bool((wider == 3.0).all())


def test_bf16_pool_divides_a_float32_write_as_an_fp8_checkpoint_engine_does() -> None:
    """An fp8 checkpoint over a bf16 cache: a float32 write casts, so it is divided."""
    spec = REGISTRY.spec("mha")
    pool, _ = spec.factory(dataclasses.replace(default_config(spec), dtype=torch.bfloat16))
    slots = torch.tensor([1, 2])
    k = torch.full((2, *pool.get_key_buffer(0).shape[1:]), 3.0)
    pool.set_kv_buffer(Layer(0), slots, k, k.clone(), k_scale=2.0, v_scale=2.0)
    assert bool((pool.get_key_buffer(0)[slots] == 1.5).all())
    k16 = k.to(torch.bfloat16)
    pool.set_kv_buffer(Layer(0), slots, k16, k16, k_scale=2.0, v_scale=2.0)
    assert bool((pool.get_key_buffer(0)[slots] == 3.0).all())
