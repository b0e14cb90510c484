"""Section 2 of ``make bench``: allocator cycles per second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _report import interleaved, median_of

# ----------------------------------------------------------------------------- 2. allocator


class NaiveFreeList:
    """The baseline: a tensor of free slots, sliced on alloc, concatenated on every free."""

    def __init__(self, size: int) -> None:
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64)

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.free_slots.numel():
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, indices: torch.Tensor) -> None:
        self.free_slots = torch.cat((self.free_slots, indices))


def bench_allocator(quick: bool, repeat: int) -> None:
    from kvcache_core import PagedSlotAllocator
    from kvcache_plugins.mha import MHATokenToKVPool

    size, cycles, chunk = 65536, (2000 if quick else 20000), 256
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 1, 1)
    print(f"== allocator: alloc({chunk}) + free({chunk}), {size} slots, {cycles} cycles")
    makers: dict[str, Callable[[], Any]] = {
        "kvcache": lambda: PagedSlotAllocator(size, 1, pool),
        "kvcache eager": lambda: PagedSlotAllocator(size, 1, pool, eager_checks=True),
        "naive cat": lambda: NaiveFreeList(size),
    }

    def run(make: Callable[[], Any]) -> Callable[[], None]:
        def cycle() -> None:
            allocator = make()
            for _ in range(cycles):
                allocator.free(allocator.alloc(chunk))

        return cycle

    times = median_of(interleaved({name: run(make) for name, make in makers.items()}, repeat))
    base = cycles / times["naive cat"]
    for name in makers:
        rate = cycles / times[name]
        print(f"  {name:<14} {rate / 1e3:8.1f}k cycles/s   ratio {rate / base:5.2f}x")
