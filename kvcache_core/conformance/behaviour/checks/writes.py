"""Writes: bare slots and ``KVWriteLoc`` agree, getters read back what was written, and a
write changes nothing but its own rows of its own layer."""

from __future__ import annotations

import torch

from ....contracts.writeloc import KVWriteLoc
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, capture, first_difference


def _rows_for(
    pool: object, layer: int, n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V rows shaped like the layer's buffers, in the pool's dtype."""
    key = pool.get_key_buffer(layer)  # type: ignore[attr-defined]
    value = pool.get_value_buffer(layer)  # type: ignore[attr-defined]
    k = torch.randn((n, *key.shape[1:]), generator=gen).to(key.dtype)
    v = torch.randn((n, *value.shape[1:]), generator=gen).to(value.dtype)
    return k, v


@behaviour_check(
    "write-forms-agree",
    hint="unwrap `loc` with kvcache_core.unwrap_write_loc(loc) before indexing any buffer",
)
def write_forms_agree(ctx: CheckContext) -> None:
    """A write through bare slots and one through ``KVWriteLoc(slots)`` leave identical pools."""
    bare, _ = ctx.build()
    wrapped, _ = ctx.build()
    gen = ctx.generator()
    slots = torch.tensor([3, 1, 2], dtype=torch.int64)
    for layer in attention_layer_ids(ctx.config):
        k, v = _rows_for(bare, layer, slots.numel(), gen)
        bare.set_kv_buffer(Layer(layer), slots, k, v)
        wrapped.set_kv_buffer(Layer(layer), KVWriteLoc(slots), k, v)
    where = first_difference(
        capture(bare, ctx.config, ctx.capabilities), capture(wrapped, ctx.config, ctx.capabilities)
    )
    if where is not None:
        first = attention_layer_ids(ctx.config)[0]
        raise BehaviourFailure(
            f"writing through KVWriteLoc(slots) differs from writing through slots: {where}",
            reproduction=ctx.reproduction(
                [
                    "other, _ = factory(config)",
                    "slots = torch.tensor([3, 1, 2])",
                    f"layer = {first}",
                    "k = torch.randn(3, *pool.get_key_buffer(layer).shape[1:])",
                    "v = torch.randn(3, *pool.get_value_buffer(layer).shape[1:])",
                    "pool.set_kv_buffer(Layer(layer), slots, k, v)",
                    "other.set_kv_buffer(Layer(layer), KVWriteLoc(slots), k, v)",
                    "assert torch.equal(pool.get_key_buffer(layer), other.get_key_buffer(layer))",
                ]
            ),
        )
