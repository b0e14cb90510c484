"""``write-isolation``: a write changes its own rows of its own layer, and nothing else.

Why the whole state: a pool that writes the right rows *and* a stray one (another layer, a
neighbouring slot, the other half of a fused buffer) passes every read-back. So the state is
captured before and after one write, the rows the write owns are set to what was written in
the "before" copy, and the two must then be bit-identical. Buffers are filled with random
values first, so a stray write of any value shows. The padding row 0 of the written layer may
change: pools send tokens without a window (or device) slot there.
"""

from __future__ import annotations

import torch

from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, capture, first_difference
from ._pools import allocate, allocate_source, expected_after_write, fill_everything, kv_rows

HINT = (
    "index only the written layer's buffers, at exactly the (translated) slots of `loc`; "
    "never write through a view shared with another layer"
)


@behaviour_check("write-isolation", hint=HINT)
def write_isolation(ctx: CheckContext) -> None:
    """A write to one layer at some slots changes no other layer and no other slot."""
    pool, allocator = ctx.build()
    gen = ctx.generator(23)
    n = 2 * int(pool.page_size) + 3
    slots = allocate(ctx, allocator, n)
    fill_everything(ctx, pool, gen)
    chosen = slots[torch.randperm(n, generator=gen)[:4]]
    for layer in attention_layer_ids(ctx.config):
        before = capture(pool, ctx.config, ctx.capabilities)
        k, v = kv_rows(pool, layer, chosen.numel(), gen)
        pool.set_kv_buffer(Layer(layer), chosen.to(pool.device), k, v)
        after = capture(pool, ctx.config, ctx.capabilities)
        where = first_difference(
            expected_after_write(ctx, pool, before, layer, chosen, k, v, after), after
        )
        if where is None:
            continue
        raise BehaviourFailure(
            f"set_kv_buffer on layer {layer} at slots {chosen.tolist()} changed what it must "
            f"not (or not what it wrote): {where}",
            reproduction=ctx.reproduction(
                [
                    allocate_source(ctx, n, "allocated"),
                    f"slots = torch.tensor({chosen.tolist()})",
                    f"layer = {layer}",
                    f"others = {[i for i in attention_layer_ids(ctx.config) if i != layer]}",
                    "before = {i: pool.get_key_buffer(i).clone() for i in others}",
                    "shape = (len(slots), *pool.get_key_buffer(layer).shape[1:])",
                    "vshape = (len(slots), *pool.get_value_buffer(layer).shape[1:])",
                    "pool.set_kv_buffer(Layer(layer), slots, torch.ones(shape), "
                    "torch.ones(vshape))",
                    "for i in others:",
                    "    assert torch.equal(pool.get_key_buffer(i), before[i]), i",
                ]
            ),
        )
