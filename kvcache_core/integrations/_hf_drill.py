"""A retraction drill for ``generate``: retract a row between forward passes, overwrite every
free slot of the pool, resume the row. How the demo (and the tests) prove that a resume reads
only what ``load_cpu_copy`` wrote: a resume that read a freed slot would read garbage."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import torch
from transformers import LogitsProcessor

from ._hf_layout import LayerKind

if TYPE_CHECKING:
    from .transformers import KVPoolCache

__all__ = ["GARBAGE", "RetractionDrill", "poison_free_slots"]

#: What free slots are overwritten with: finite (so a masked read stays harmless), far from
#: any value a tiny model computes.
GARBAGE = 1.0e3


def _free_rows(buffer: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    free = torch.ones(buffer.shape[0], dtype=torch.bool, device=buffer.device)
    free[held.to(buffer.device)] = False
    return free


def poison_free_slots(cache: KVPoolCache, value: float = GARBAGE) -> None:
    """Write ``value`` into every token slot (and request slot) that no live row of ``cache``
    holds, in every buffer of its pool, slot 0 included."""
    pool, rows = cache.pool, cache.rows
    live = [r for r in range(rows.batch) if rows.live[r]]
    held = rows.table[live, : rows.length].reshape(-1)
    for plan in cache.layout.layers:
        if plan.kind is LayerKind.MAMBA:
            conv, temporal = pool.get_mamba_state(plan.index)
            keep = rows.request_slots[live] if rows.request_slots is not None else held[:0]
            for buffer in (*conv, temporal):
                buffer[_free_rows(buffer, keep)] = value
            continue
        slots = held
        if plan.kind is LayerKind.SLIDING and hasattr(pool, "translate_loc_from_full_to_swa"):
            window = pool.translate_loc_from_full_to_swa(held)
            slots = window[window > 0]
        for buffer in pool.get_kv_buffer(plan.index):
            buffer[_free_rows(buffer, slots)] = value


class RetractionDrill(LogitsProcessor):
    """A logits processor that, after each forward pass numbered in ``steps`` (from 1),
    retracts ``row`` of ``cache``, poisons every free slot and resumes the row; the scores pass
    through unchanged."""

    def __init__(self, cache: KVPoolCache, steps: Collection[int], row: int = -1) -> None:
        self.cache = cache
        self.steps = frozenset(steps)
        self.row = row
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls in self.steps:
            cache = self.cache
            row = self.row % cache.rows.batch
            handle = cache.retract(row)
            poison_free_slots(cache)
            cache.resume(row, handle)
        return scores
