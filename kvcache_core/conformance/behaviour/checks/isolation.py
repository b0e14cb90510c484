"""``write-isolation``: a write changes its own rows of its own layer, and nothing else.

Why the whole state: a pool that writes the right rows *and* a stray one (another layer, a
neighbouring slot, the other half of a fused buffer, the next token of an indexer page) passes
every read-back. So the state is captured before and after one write, the rows the write owns
are set to what was written in the "before" copy, and the two must then be bit-identical.
Buffers are filled with random values first, so a stray write of any value shows. The padding
row 0 of the written layer may change: pools send tokens without a window (or device) slot
there. Every write path is covered: ``set_kv_buffer``, and with the capabilities
``set_mla_kv_buffer`` and ``set_index_k_scale_buffer``.
"""

from __future__ import annotations

from typing import Any

import torch

from ....contracts.spec import Capability
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, capture, first_difference
from ._pools import (
    allocate,
    allocate_source,
    expected_after_write,
    fill_everything,
    index_rows,
    is_window_layer,
    kv_rows,
    slot_orders,
)

HINT = (
    "index only the written layer's buffers, at exactly the (translated) slots of `loc`; "
    "never write through a view shared with another layer"
)


def _fail(
    ctx: CheckContext,
    pool: Any,
    n: int,
    chosen: torch.Tensor,
    layer: int,
    what: str,
    where: str,
    write: list[str],
) -> None:
    layers = attention_layer_ids(ctx.config)
    if is_window_layer(ctx, pool, layer):
        rows = "rows = pool.translate_loc_from_full_to_swa(slots)"
    elif Capability.HISPARSE in ctx.capabilities:
        rows = "rows = pool.translate_loc_to_device(slots)"
    else:
        rows = "rows = slots"
    raise BehaviourFailure(
        f"{what} on layer {layer} at slots {chosen.tolist()} changed what it must not (or not "
        f"what it wrote): {where}",
        reproduction=ctx.reproduction(
            [
                allocate_source(ctx, n, "allocated"),
                f"slots = torch.tensor({chosen.tolist()})",
                f"layer, layers = {layer}, {layers}",
                "def state():",
                "    return {(i, g): getattr(pool, g)(i).clone() for i in layers",
                "            for g in ('get_key_buffer', 'get_value_buffer')}",
                "before = state()",
                *write,
                "after = state()",
                rows,
                "for g in ('get_key_buffer', 'get_value_buffer'):",
                "    after[layer, g][rows] = before[layer, g][rows]  # the written rows",
                "    after[layer, g][0] = before[layer, g][0]  # the padding slot",
                "for key in before:",
                "    assert torch.equal(after[key], before[key]), key",
            ]
        ),
    )


@behaviour_check("write-isolation", hint=HINT)
def write_isolation(ctx: CheckContext) -> None:
    """A write to one layer at some slots changes no other layer and no other slot, for slot
    sets in every order an engine may pass (ascending and descending runs, shuffled slots, a
    single slot, whole pages)."""
    pool, allocator = ctx.build()
    gen = ctx.generator(23)
    n = 2 * int(pool.page_size) + 3
    slots = allocate(ctx, allocator, n)
    fill_everything(ctx, pool, gen)
    for _, chosen in slot_orders(slots, int(pool.page_size), gen):
        _isolated_writes(ctx, pool, n, chosen, gen)


def _isolated_writes(
    ctx: CheckContext, pool: Any, n: int, chosen: torch.Tensor, gen: torch.Generator
) -> None:
    """Every write path, on every attention layer, at ``chosen``: only its own rows change."""
    at = chosen.to(pool.device)
    for layer in attention_layer_ids(ctx.config):
        before = capture(pool, ctx.config, ctx.capabilities)
        k, v = kv_rows(pool, layer, chosen.numel(), gen)
        pool.set_kv_buffer(Layer(layer), at, k, v)
        after = capture(pool, ctx.config, ctx.capabilities)
        where = first_difference(
            expected_after_write(ctx, pool, before, layer, chosen, k, v, after), after
        )
        if where is not None:
            _fail(
                ctx,
                pool,
                n,
                chosen,
                layer,
                "set_kv_buffer",
                where,
                [
                    "shape = (len(slots), *pool.get_key_buffer(layer).shape[1:])",
                    "vshape = (len(slots), *pool.get_value_buffer(layer).shape[1:])",
                    "k, v = torch.ones(shape), torch.ones(vshape)",
                    "pool.set_kv_buffer(Layer(layer), slots, k, v)",
                ],
            )
        if Capability.MLA in ctx.capabilities:
            before = after
            rank, rope = int(pool.kv_lora_rank), int(pool.qk_rope_head_dim)
            latent, _ = kv_rows(pool, layer, chosen.numel(), gen)
            pool.set_mla_kv_buffer(Layer(layer), at, latent[..., :rank], latent[..., rank:])
            after = capture(pool, ctx.config, ctx.capabilities)
            where = first_difference(
                expected_after_write(ctx, pool, before, layer, chosen, latent, latent, after),
                after,
            )
            if where is not None:
                _fail(
                    ctx,
                    pool,
                    n,
                    chosen,
                    layer,
                    "set_mla_kv_buffer",
                    where,
                    [
                        f"nope, rope = torch.ones(len(slots), 1, {rank}), "
                        f"torch.ones(len(slots), 1, {rope})",
                        "pool.set_mla_kv_buffer(Layer(layer), slots, nope, rope)",
                    ],
                )
        if Capability.INDEXER in ctx.capabilities:
            before = after
            keys, scales = index_rows(pool, chosen.numel(), gen)
            pool.set_index_k_scale_buffer(layer, at, keys, scales)
            after = capture(pool, ctx.config, ctx.capabilities)
            expected = {name: t.clone() for name, t in before.items()}
            index_k = expected[f"layer {layer} index_k"]
            index_k[chosen] = keys.to(index_k.dtype)
            scale = expected[f"layer {layer} index_k_scale"]
            scale[chosen] = scales.reshape(-1, *scale.shape[1:]).to(scale.dtype)
            where = first_difference(expected, after)
            if where is not None:
                raise BehaviourFailure(
                    f"set_index_k_scale_buffer on layer {layer} at slots {chosen.tolist()} "
                    f"changed what it must not (or not what it wrote): {where}",
                    reproduction=ctx.reproduction(
                        [
                            allocate_source(ctx, n, "allocated"),
                            f"slots = torch.tensor({chosen.tolist()})",
                            f"layer, layers = {layer}, {attention_layer_ids(ctx.config)}",
                            "every = torch.arange(pool.size + pool.page_size)",
                            "before = {i: pool.get_index_k_scale_buffer(i, every) for i in layers}",
                            "keys = torch.ones(len(slots), pool.index_head_dim)"
                            ".to(pool.index_dtype)",
                            "pool.set_index_k_scale_buffer(layer, slots, keys, "
                            "torch.ones(len(slots)))",
                            "for i in layers:",
                            "    k, s = pool.get_index_k_scale_buffer(i, every)",
                            "    if i == layer:",
                            "        k[slots], s[slots] = before[i][0][slots], before[i][1][slots]",
                            "    assert torch.equal(k.view(torch.uint8), "
                            "before[i][0].view(torch.uint8)), i",
                            "    assert torch.equal(s, before[i][1]), i",
                        ]
                    ),
                )
