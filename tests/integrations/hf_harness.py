"""Differential harness: generate with transformers' ``DynamicCache`` and with a ``KVPoolCache``
that retracts a row in the middle of generation, with every free slot of the pool overwritten
by garbage before each resume, and compare tokens and logits bit for bit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

from kvcache_core.integrations._hf_drill import poison_free_slots
from kvcache_core.integrations.transformers import KVPoolCache

#: Row 0 fills the prompt; row 1 is left-padded (pad id 0) by three tokens.
PROMPTS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [0, 0, 0, 9, 10, 11, 12, 13, 14, 15]])
NEW_TOKENS = 10


@dataclass
class Retractor(LogitsProcessor):  # type: ignore[misc]
    """Between forward passes ``steps`` (1-based), retract ``row``, poison, resume it.

    While the row is out, its old slots are taken by a hold allocation so the resume gets
    other slots; ``moved`` records whether every resume landed on slots it did not hold before.
    """

    cache: KVPoolCache
    steps: frozenset[int]
    row: int
    calls: int = 0
    moved: list[bool] = field(default_factory=list)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls in self.steps:
            cache = self.cache
            handle = cache.retract(self.row)
            held = _hold(cache.allocator, handle.old_slots, cache.page_size)
            requests = cache.rows.requests
            old_request = handle.old_request_slot
            held_request = None if old_request is None else _hold(requests, old_request, 1)
            poison_free_slots(cache)
            cache.resume(self.row, handle)
            new = set(cache.row_slots(self.row).tolist())
            moved = not new & set(handle.old_slots.tolist())
            if old_request is not None:
                moved = moved and cache.rows.request_slots[self.row] != old_request[0]
            self.moved.append(bool(moved))
            cache.allocator.free(held)
            if held_request is not None:
                requests.free(held_request)
        return scores


def _hold(allocator: Any, old: torch.Tensor, page: int) -> torch.Tensor:
    """Take the pages of ``old`` (just freed) so that the resume must land elsewhere: take
    everything free, give back every page but those."""
    everything = allocator.alloc(allocator.available_size())
    assert everything is not None
    mine = torch.isin(everything // page, old // page)
    allocator.free(everything[~mine])
    return everything[mine]


def generate(
    model: Any,
    cache: Any,
    batch: int,
    *,
    processors: list[Any] | None = None,
    sample: bool = False,
    new_tokens: int = NEW_TOKENS,
) -> Any:
    """``model.generate`` on the first ``batch`` prompts, returning sequences and logits."""
    ids = PROMPTS[:batch]
    if sample:
        torch.manual_seed(1234)
    return model.generate(
        ids,
        attention_mask=(ids != 0).long(),
        cache=cache,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=sample,
        top_k=0 if sample else None,
        output_logits=True,
        return_dict_in_generate=True,
        logits_processor=LogitsProcessorList(processors or []),
    )


def reference(model: Any, batch: int, *, sample: bool = False) -> Any:
    """The same generation on transformers' own ``DynamicCache``."""
    return generate(model, DynamicCache(config=model.config), batch, sample=sample)


def identical(a: Any, b: Any) -> bool:
    """Tokens and every step's logits bit-identical."""
    return torch.equal(a.sequences, b.sequences) and all(
        torch.equal(x, y) for x, y in zip(a.logits, b.logits, strict=True)
    )
