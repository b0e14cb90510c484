"""``swa-loc-window``: window layers write at ``swa_loc``; without it, at the translated ``loc``;
and a write changes nothing but its own rows, whichever form ``loc`` takes.

Why: engines compute the window slots once per forward pass and pass them as
``KVWriteLoc(loc, swa_loc=...)``; a pool that ignores ``swa_loc`` and translates ``loc``
itself agrees with the engine only while both translations agree, and writes the wrong
window rows when they do not (a table updated between the two). The check therefore passes a
``swa_loc`` that differs from the table's translation (the same window slots, reversed).

Why every form against the whole pool state: the other data checks write through bare slots,
so a pool whose ``KVWriteLoc`` path also writes somewhere else (a window write that lands in a
full layer at ``loc`` as well, after its arguments were validated) corrupts a model's cache
while every read-back of the written rows agrees. Each of the three forms (``KVWriteLoc(loc,
swa_loc=...)``, ``KVWriteLoc(loc)`` and a bare ``loc``) is written to every attention layer,
at slot sets in every order an engine may pass, and the state before and after must differ
in exactly the written rows.
"""

from __future__ import annotations

from typing import Any

import torch

from ....contracts.spec import Capability
from ....contracts.writeloc import KVWriteLoc
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids, capture, first_difference
from ._pools import (
    allocate,
    allocate_source,
    expected_after_write,
    fill_everything,
    kv_rows,
    slot_orders,
)

HINT = (
    "for window layers write at `loc.swa_loc` when it is given, else at "
    "translate_loc_from_full_to_swa(loc); full layers write at `loc` (its `full_loc`); "
    "write nothing else"
)

#: (how the form reads in a message, its source with ``slots``/``swa_loc``, whether window
#: layers write at ``swa_loc``).
_FORMS = (
    ("KVWriteLoc(loc, swa_loc=...)", "KVWriteLoc(slots, swa_loc=swa_loc)", True),
    ("KVWriteLoc(loc)", "KVWriteLoc(slots)", False),
    ("a bare slot tensor", "slots", False),
)


def _loc(source: str, slots: torch.Tensor, swa_loc: torch.Tensor) -> Any:
    if source == "slots":
        return slots
    if source == "KVWriteLoc(slots)":
        return KVWriteLoc(slots)
    return KVWriteLoc(slots, swa_loc=swa_loc)


def _steps(
    ctx: CheckContext, n: int, chosen: torch.Tensor, layer: int, window: bool, form: str
) -> list[str]:
    at_swa = form == "KVWriteLoc(slots, swa_loc=swa_loc)"
    if not window:
        rows = "rows = slots"
    elif at_swa:
        rows = "rows = swa_loc"
    else:
        rows = "rows = pool.translate_loc_from_full_to_swa(slots)"
    return [
        allocate_source(ctx, n, "allocated"),
        f"slots = torch.tensor({chosen.tolist()})",
        "swa_loc = pool.translate_loc_from_full_to_swa(slots).flip(0)",
        f"layer, layers = {layer}, {attention_layer_ids(ctx.config)}",
        "def state():",
        "    return {(i, g): getattr(pool, g)(i).clone() for i in layers",
        "            for g in ('get_key_buffer', 'get_value_buffer')}",
        "before = state()",
        "def rows_of(getter):  # distinct values per token, exact in every float dtype",
        "    shape = (len(slots), *getattr(pool, getter)(layer).shape[1:])",
        "    return (torch.arange(torch.zeros(shape).numel()).reshape(shape) % 64 + 1) / 4",
        "k, v = rows_of('get_key_buffer'), -rows_of('get_value_buffer')",
        f"pool.set_kv_buffer(Layer(layer), {form}, k, v)",
        "after = state()",
        rows,
        "assert torch.equal(after[layer, 'get_key_buffer'][rows], k), 'K not written at rows'",
        "assert torch.equal(after[layer, 'get_value_buffer'][rows], v), 'V not written at rows'",
        "for g in ('get_key_buffer', 'get_value_buffer'):",
        "    after[layer, g][rows] = before[layer, g][rows]  # the written rows",
        "    after[layer, g][0] = before[layer, g][0]  # the padding slot",
        "for key in before:",
        "    assert torch.equal(after[key], before[key]), f'stray write in {key}'",
    ]


@behaviour_check("swa-loc-window", requires=frozenset({Capability.SLIDING_WINDOW}), hint=HINT)
def swa_loc_window(ctx: CheckContext) -> None:
    """``KVWriteLoc.swa_loc`` is where window layers write; bare ``loc`` and
    ``KVWriteLoc(loc)`` are translated; each form writes its rows and nothing else, at slot
    sets in every order an engine may pass."""
    pool, allocator = ctx.build()
    gen = ctx.generator(37)
    page = int(pool.page_size)
    n = 2 * page + 2
    slots = allocate(ctx, allocator, n)
    fill_everything(ctx, pool, gen)
    windows = set(tuple(pool.swa_layer_ids))
    for order, chosen in slot_orders(slots, page, gen):
        at = chosen.to(pool.device)
        translated = pool.translate_loc_from_full_to_swa(at)
        swa_loc = translated.flip(0)
        for layer in attention_layer_ids(ctx.config):
            window = layer in windows
            for form, source, at_swa in _FORMS:
                before = capture(pool, ctx.config, ctx.capabilities)
                k, v = kv_rows(pool, layer, chosen.numel(), gen)
                pool.set_kv_buffer(Layer(layer), _loc(source, at, swa_loc), k, v)
                after = capture(pool, ctx.config, ctx.capabilities)
                rows = (swa_loc if at_swa else translated) if window else None
                expected = expected_after_write(ctx, pool, before, layer, chosen, k, v, after, rows)
                where = first_difference(expected, after)
                if where is None:
                    continue
                kind = "window" if window else "full"
                target = ("swa_loc" if at_swa else "the translated loc") if window else "loc"
                raise BehaviourFailure(
                    f"layer {layer} ({kind}): set_kv_buffer with {form} at {order} "
                    f"{chosen.tolist()} must write exactly its rows at {target} and nothing "
                    f"else: {where}",
                    reproduction=ctx.reproduction(_steps(ctx, n, chosen, layer, window, source)),
                    hint=HINT,
                )
