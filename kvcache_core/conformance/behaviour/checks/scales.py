"""``write-scales``: ``k_scale``/``v_scale`` apply as engines apply them, and never in place.

Why a check of its own: attention backends pass the layer's ``k_scale`` on **every** write
whenever the checkpoint has one (an fp8 checkpoint served with a bf16 cache), and engines divide
only when the write casts (input dtype not the pool's). A pool that always divides stores 1.5
where the engine's pool stores 3.0, which no other check sees, because no other check passes
scales. The rule, per write:

- no cast (input already in the pool's dtype): stored as given, scales ignored;
- a cast: divided by the scale before the cast, except in pools whose kernels apply the scale
  on read (the ``mla`` capability), which ignore it as the engines' MLA pools do;
- either way the caller's ``cache_k``/``cache_v`` are left untouched (engines divide in place;
  this contract does not, since callers may still read their tensors).
"""

from __future__ import annotations

import torch

from ....contracts.spec import Capability
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, same_bits
from ._pools import (
    allocate,
    allocate_source,
    buffer_rows,
    is_window_layer,
    kv_rows,
    latent_width,
)
from .readback import first_mismatch

HINT = (
    "divide by k_scale/v_scale only when cache_k/cache_v's dtype differs from the pool's "
    "(then cast), out of place: `LayerRows.to_storage(values, scale)` does this; pools whose "
    "kernels apply the scale on read (MLA) ignore it"
)
_SLOTS = 3
_K_SCALE = 2.0
_V_SCALE = 4.0


def _other_dtype(dtype: torch.dtype) -> torch.dtype:
    """A floating input dtype that is not the pool's, so the write must cast."""
    return torch.float32 if dtype == torch.float64 else torch.float64


def _fail(ctx: CheckContext, message: str, steps: list[str]) -> None:
    raise BehaviourFailure(
        message,
        reproduction=ctx.reproduction([allocate_source(ctx, _SLOTS), *steps]),
        hint=HINT,
    )


@behaviour_check("write-scales", hint=HINT)
def write_scales(ctx: CheckContext) -> None:
    """Scales divide only when a write casts, never the caller's tensors."""
    pool, allocator = ctx.build()
    gen = ctx.generator()
    slots = allocate(ctx, allocator, _SLOTS)
    mla = Capability.MLA in ctx.capabilities
    rank = latent_width(pool) if mla else None
    for layer in attention_layer_ids(ctx.config):
        rows = buffer_rows(ctx, pool, layer, slots)
        held = rows >= 0
        for cast in (False, True):
            k, v = kv_rows(pool, layer, slots.numel(), gen)  # exact in every float dtype
            if cast:
                k, v = k.to(_other_dtype(k.dtype)), v.to(_other_dtype(v.dtype))
            k_before, v_before = k.clone(), v.clone()
            pool.set_kv_buffer(Layer(layer), slots.to(pool.device), k, v, _K_SCALE, _V_SCALE)
            dtype_src = f"torch.{str(k.dtype).removeprefix('torch.')}"
            steps = [
                f"layer = {layer}",
                "k = torch.randint(-16, 16, (len(slots), *pool.get_key_buffer(layer).shape[1:]))"
                f".to({dtype_src}) / 2",
                "v = torch.randint(-16, 16, (len(slots), *pool.get_value_buffer(layer).shape[1:]))"
                f".to({dtype_src}) / 2",
                "k_before = k.clone()",
                f"pool.set_kv_buffer(Layer(layer), slots, k, v, k_scale={_K_SCALE}, "
                f"v_scale={_V_SCALE})",
            ]
            if not (same_bits(k, k_before) and same_bits(v, v_before)):
                _fail(
                    ctx,
                    f"layer {layer}: set_kv_buffer with k_scale/v_scale modified the caller's "
                    f"cache_k/cache_v ({k.dtype} into a {pool.dtype} pool)",
                    [*steps, "assert torch.equal(k, k_before)"],
                )
            divide = cast and not mla
            want_k = k_before / _K_SCALE if divide else k_before
            want_v = k_before[..., :rank] if rank is not None else v_before
            if divide and rank is None:
                want_v = v_before / _V_SCALE
            key = pool.get_key_buffer(layer).detach().cpu()
            value = pool.get_value_buffer(layer).detach().cpu()
            for what, buffer, want in (("key", key, want_k), ("value", value, want_v)):
                got = buffer[rows[held]]
                expected = want.cpu().to(buffer.dtype)[held]
                if first_mismatch(got, expected) is None:
                    continue
                if not cast:
                    rule = (
                        "a write in the pool's dtype needs no cast and must store values as given"
                    )
                    expr = "k"
                elif mla:
                    rule = "an MLA pool applies the scale on read and must ignore it on write"
                    expr = "k"
                else:
                    rule = "a write that casts must divide by the scale before the cast"
                    expr = f"(k / {_K_SCALE})"
                if is_window_layer(ctx, pool, layer):
                    where = "rows = pool.translate_loc_from_full_to_swa(slots)"
                elif Capability.HISPARSE in ctx.capabilities:
                    where = "rows = pool.translate_loc_to_device(slots)"
                else:
                    where = "rows = slots"
                _fail(
                    ctx,
                    f"layer {layer} get_{what}_buffer after set_kv_buffer({k.dtype} into a "
                    f"{pool.dtype} pool, k_scale={_K_SCALE}, v_scale={_V_SCALE}): {rule}",
                    [
                        *steps,
                        where,
                        f"assert torch.equal(pool.get_key_buffer(layer)[rows], "
                        f"{expr}.to(pool.dtype))",
                    ],
                )
