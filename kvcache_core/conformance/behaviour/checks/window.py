"""``swa-loc-window``: window layers write at ``swa_loc``; without it, at the translated ``loc``.

Why: engines compute the window slots once per forward pass and pass them as
``KVWriteLoc(loc, swa_loc=...)``; a pool that ignores ``swa_loc`` and translates ``loc``
itself agrees with the engine only while both translations agree, and writes the wrong
window rows when they do not (a table updated between the two). The check therefore passes a
``swa_loc`` that differs from the table's translation (the same window slots, reversed), and
separately checks that a bare ``loc`` is translated and that full layers write at ``loc``.
"""

from __future__ import annotations

from typing import Any

import torch

from ....contracts.spec import Capability
from ....contracts.writeloc import KVWriteLoc
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext, Layer
from .._state import attention_layer_ids
from ._pools import allocate, allocate_source, kv_rows
from .readback import first_mismatch

HINT = (
    "for window layers write at `loc.swa_loc` when it is given, else at "
    "translate_loc_from_full_to_swa(loc); full layers write at `loc` (its `full_loc`)"
)


def _fail(ctx: CheckContext, n: int, message: str, steps: list[str]) -> None:
    raise BehaviourFailure(
        message,
        reproduction=ctx.reproduction([allocate_source(ctx, n), *steps]),
        hint=HINT,
    )


def _rows(pool: Any, layer: int, rows: torch.Tensor) -> torch.Tensor:
    buffer: torch.Tensor = pool.get_key_buffer(layer).detach().cpu()
    return buffer[rows.cpu()]


@behaviour_check("swa-loc-window", requires=frozenset({Capability.SLIDING_WINDOW}), hint=HINT)
def swa_loc_window(ctx: CheckContext) -> None:
    """``KVWriteLoc.swa_loc`` is where window layers write; bare ``loc`` is translated."""
    pool, allocator = ctx.build()
    gen = ctx.generator(37)
    n = 2 * int(pool.page_size) + 2
    slots = allocate(ctx, allocator, n).to(pool.device)
    window = pool.translate_loc_from_full_to_swa(slots)
    swa_loc = window.flip(0)
    windows = set(tuple(pool.swa_layer_ids))
    for layer in attention_layer_ids(ctx.config):
        k, v = kv_rows(pool, layer, n, gen)
        pool.set_kv_buffer(Layer(layer), KVWriteLoc(slots, swa_loc=swa_loc), k, v)
        rows, where = (swa_loc, "swa_loc") if layer in windows else (slots, "loc")
        row = first_mismatch(_rows(pool, layer, rows), k.cpu().to(pool.get_key_buffer(layer).dtype))
        if row is not None:
            _fail(
                ctx,
                n,
                f"layer {layer} ({'window' if layer in windows else 'full'}): "
                f"set_kv_buffer(KVWriteLoc(loc, swa_loc=...)) did not write at {where}: "
                f"first wrong token {row} ({where} row {int(rows[row])})",
                [
                    "swa_loc = pool.translate_loc_from_full_to_swa(slots).flip(0)",
                    f"layer = {layer}",
                    "k = torch.randint(-16, 16, (len(slots), "
                    "*pool.get_key_buffer(layer).shape[1:])) / 2",
                    "pool.set_kv_buffer(Layer(layer), KVWriteLoc(slots, swa_loc=swa_loc), k, k)",
                    "assert torch.equal(pool.get_key_buffer(layer)["
                    + ("swa_loc" if layer in windows else "slots")
                    + "], k)",
                ],
            )
        for form, loc in (("a bare slot tensor", slots), ("KVWriteLoc(loc)", KVWriteLoc(slots))):
            k, v = kv_rows(pool, layer, n, gen)
            pool.set_kv_buffer(Layer(layer), loc, k, v)
            rows = window if layer in windows else slots
            got = _rows(pool, layer, rows)
            row = first_mismatch(got, k.cpu().to(got.dtype))
            if row is not None:
                translated = "translated " if layer in windows else ""
                _fail(
                    ctx,
                    n,
                    f"layer {layer}: set_kv_buffer with {form} did not write at the "
                    f"{translated}loc: first wrong token {row} (row {int(rows[row])})",
                    [
                        "rows = pool.translate_loc_from_full_to_swa(slots)"
                        if layer in windows
                        else "rows = slots",
                        f"layer = {layer}",
                        "k = torch.randint(-16, 16, (len(slots), "
                        "*pool.get_key_buffer(layer).shape[1:])) / 2",
                        "pool.set_kv_buffer(Layer(layer), "
                        + ("slots" if form.startswith("a bare") else "KVWriteLoc(slots)")
                        + ", k, k)",
                        "assert torch.equal(pool.get_key_buffer(layer)[rows], k)",
                    ],
                )
