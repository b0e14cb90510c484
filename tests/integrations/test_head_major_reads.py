"""A one-row decode step reads a head-major pool's full-attention rows in place, for every kind
that keeps them (``mha``, ``swa``'s full layers, ``mamba``'s attention layers); ``swa``'s
window layers gather their window slots (a copy) in either layout.

What ``update`` returns is spied on for every attention layer during generation: on a
head-major pool each decode step's keys and values must be views into the pool's own buffer
(their memory inside its storage), never a copy. The negative control is a row-major pool
that copies (``copy_from=0``): the same check must see copies there, so it can fail.
Correctness of either path is the differential tests' job (tokens and logits against
``DynamicCache``); here the logits of both layouts are also compared with each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from kvcache_core import discover
from kvcache_core.integrations._hf_layers import PoolAttentionLayer, PoolSlidingLayer
from kvcache_core.integrations._hf_layout import probe_layout
from kvcache_core.integrations._hf_pool_choice import pool_config
from kvcache_core.integrations.transformers import KVPoolCache

from .hf_harness import generate, identical

KINDS = {"llama": "mha", "qwen2-swa": "swa", "bamba": "mamba"}

Reads = dict[int, list[tuple[torch.Tensor, torch.Tensor]]]


def cache_on(model: Any, kind: str, *, head_major: bool, copy_from: int) -> KVPoolCache:
    layout = probe_layout(model)
    config = pool_config(layout, size=64, page_size=1, max_batch=1, device=layout.device)
    pool, allocator = discover().create(kind, replace(config, options={"head_major": head_major}))
    assert pool.head_major is head_major
    cache = KVPoolCache(layout, pool, allocator, kind)
    cache.copy_from = copy_from
    return cache


def spy_on_attention(cache: KVPoolCache) -> Reads:
    """Record what each attention layer's ``update`` returns for one-token steps."""
    reads: Reads = {}
    for layer in cache.layers:
        if type(layer) not in (PoolAttentionLayer, PoolSlidingLayer):
            continue
        original: Callable[..., tuple[torch.Tensor, torch.Tensor]] = layer.update
        got = reads.setdefault(layer.plan.index, [])

        def spy(
            key: torch.Tensor,
            value: torch.Tensor,
            *args: Any,
            _original: Callable[..., tuple[torch.Tensor, torch.Tensor]] = original,
            _got: list[tuple[torch.Tensor, torch.Tensor]] = got,
            **kwargs: Any,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            out = _original(key, value, *args, **kwargs)
            if key.shape[2] == 1:  # a decode step
                _got.append(out)
            return out

        layer.update = spy  # type: ignore[method-assign]
    return reads


def inside(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether ``view``'s memory lies inside ``buffer``'s storage (a view of it, not a copy)."""
    storage = buffer.untyped_storage()
    start, size = storage.data_ptr(), storage.nbytes()
    first = view.data_ptr()
    reach = sum((n - 1) * s for n, s in zip(view.shape, view.stride(), strict=True))
    end = first + view.element_size() * (reach + 1)
    return start <= first and end <= start + size


@pytest.mark.parametrize("name", list(KINDS))
def test_a_head_major_pool_is_read_in_place_and_a_copying_one_is_not(tiny: Any, name: str) -> None:
    model = tiny(name)
    runs = {}
    for head_major, copy_from in ((True, 0), (False, 0)):
        cache = cache_on(model, KINDS[name], head_major=head_major, copy_from=copy_from)
        reads = spy_on_attention(cache)
        out = generate(model, cache, 1, new_tokens=4)
        assert cache.rows.run_start is not None  # a one-row batch on consecutive slots
        assert reads and all(len(steps) == 3 for steps in reads.values())  # 3 decode steps
        for index, steps in reads.items():
            # A window layer of an swa pool gathers its window slots: a copy in either layout.
            in_place = head_major and not cache.layers[index].is_sliding
            key_buffer, value_buffer = cache.pool.get_kv_buffer(index)
            for key, value in steps:
                assert inside(key, key_buffer) is in_place, (name, index, head_major)
                assert inside(value, value_buffer) is in_place, (name, index, head_major)
        runs[head_major] = out
    assert identical(runs[True], runs[False])


def test_the_qwen2_swa_window_layers_sit_on_the_window_side(tiny: Any) -> None:
    """Why the window layers above are copies: on an ``swa`` pool they read window slots
    (through the full -> window table), never one run of full slots."""
    cache = cache_on(tiny("qwen2-swa"), "swa", head_major=True, copy_from=0)
    sliding = [layer for layer in cache.layers if isinstance(layer, PoolSlidingLayer)]
    assert sliding and all(layer.windowed_pool for layer in sliding)
    assert cache.pool.swa_pool.head_major and cache.pool.full_pool.head_major
