"""Continuous batching with paged allocation, retraction under memory pressure, and resume.

The shape of a real engine's scheduler, small: every step first resumes retracted requests and
admits new ones (prefill) while memory allows, then decodes one token for every running request.
Admission is optimistic (a request is admitted when its prompt fits now, not its whole future),
so a budget smaller than the running requests' growth makes decode run out of slots. Then the
most recently admitted request is *retracted*: its KV (and Mamba state) is copied to the host
with ``allocator.get_cpu_copy(slots, mamba_indices=...)`` and every slot it held is freed. It is
*resumed* later into new slots with ``allocator.load_cpu_copy(snapshot, new_slots,
mamba_indices=...)`` and continues where it stopped, with no recomputation.

Everything goes through the contract: ``alloc_extend``/``alloc_decode`` (or ``alloc`` for a
token allocator), ``free``, ``free_swa`` for tokens that left the window, the Mamba slot
allocator the mamba docs promise (``allocator.mamba_allocator``), and the HiSparse allocator's
documented residency calls (``alloc_device``/``free_device``) for device eviction.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

import torch

from kvcache_core import (
    HiSparsePool,
    KVPool,
    KVSnapshot,
    MambaSlotAllocator,
    MambaStatePool,
    PagedAllocator,
    SlidingWindowPool,
    SWAAllocator,
    TokenAllocator,
)

from .model import Step, TinyModel

__all__ = [
    "DeviceResidency",
    "EngineError",
    "Request",
    "Scheduler",
    "SchedulerStats",
    "Unsupported",
    "make_requests",
]

_EMPTY = torch.empty(0, dtype=torch.int64)


class EngineError(RuntimeError):
    """The engine cannot go on (e.g. the budget cannot hold even one request)."""


class Unsupported(EngineError):
    """The pool declares a capability but its allocator lacks the documented extras the
    engine needs to serve it (the demo skips such a pool rather than failing it)."""


@runtime_checkable
class DeviceResidency(Protocol):
    """The HiSparse allocator's residency calls (docs/pools/hisparse.md): not in the core
    contract, so the engine checks for them and skips a HiSparse pool that lacks them."""

    def logical_available_size(self) -> int: ...

    def alloc_logical_only(self, need_size: int) -> torch.Tensor | None: ...

    def alloc_device(self, logical: torch.Tensor) -> torch.Tensor | None: ...

    def free_device(self, logical: torch.Tensor) -> None: ...


@dataclass
class Request:
    """A prompt, how many tokens to generate, and where its cache lives right now."""

    rid: int
    prompt: list[int]
    max_new: int
    output: list[int] = field(default_factory=list)
    slots: torch.Tensor = field(default_factory=lambda: _EMPTY)  # one per cached position
    mamba_slot: torch.Tensor | None = None
    snapshot: KVSnapshot | None = None
    window_released: int = 0  # leading positions whose window slots were given back

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new


def make_requests(count: int, seed: int, vocab: int) -> list[Request]:
    """``count`` requests with seeded random prompts (4-12 tokens) and lengths (16-40)."""
    gen = torch.Generator().manual_seed(seed + 7919)
    out = []
    for rid in range(count):
        n = int(torch.randint(4, 13, (1,), generator=gen))
        prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
        out.append(Request(rid, prompt, int(torch.randint(16, 41, (1,), generator=gen))))
    return out


@dataclass
class SchedulerStats:
    steps: int = 0
    tokens: int = 0
    retractions: int = 0
    resumes: int = 0
    evictions: int = 0
    bytes_offloaded: int = 0
    offload_seconds: float = 0.0
    reload_seconds: float = 0.0
    peak_slots: int = 0


class Scheduler:
    """Serve requests on one pool and allocator with one model; see the module doc."""

    def __init__(
        self,
        model: TinyModel,
        pool: KVPool,
        allocator: TokenAllocator,
        *,
        max_running: int = 8,
        progress: Callable[[Scheduler], None] | None = None,
    ) -> None:
        self.model, self.pool, self.allocator = model, pool, allocator
        self.page = allocator.page_size
        self.paged = isinstance(allocator, PagedAllocator)
        self.window = isinstance(pool, SlidingWindowPool)
        if self.window and not isinstance(allocator, SWAAllocator):
            # Not skipped in silence: without free_swa no window slot is ever given back, and
            # the engine would serve until the window side runs dry.
            raise EngineError(
                "a sliding-window pool whose allocator is not an SWAAllocator (free_swa, "
                "swa_available_size, full_available_size, translate_loc_from_full_to_swa): "
                "the engine could never release a window slot"
            )
        self.mamba = getattr(allocator, "mamba_allocator", None)
        if isinstance(pool, MambaStatePool) and not isinstance(self.mamba, MambaSlotAllocator):
            raise Unsupported(
                "a mamba-state pool whose allocator has no mamba_allocator (a MambaSlotAllocator, "
                "docs/pools/mamba.md): the engine has no way to get request slots"
            )
        self.residency = allocator if isinstance(pool, HiSparsePool) else None
        if self.residency is not None and not isinstance(self.residency, DeviceResidency):
            raise Unsupported(
                "a hisparse pool whose allocator lacks logical_available_size, "
                "alloc_logical_only, alloc_device or free_device (docs/pools/hisparse.md)"
            )
        self.max_running = max_running
        self.progress = progress
        self.stats = SchedulerStats()
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.retracted: deque[Request] = deque()
        self.finished: list[Request] = []

    # -- the loop ----------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> dict[int, list[int]]:
        """Serve every request to completion; return the generated tokens by request id."""
        self.waiting.extend(requests)
        while self.waiting or self.retracted or self.running:
            self.stats.steps += 1
            prefilled = self._admit()
            if not self.running:
                head = (self.retracted or self.waiting)[0]
                raise EngineError(
                    f"request {head.rid} ({len(head.prompt) + len(head.output)} tokens) does not "
                    f"fit in an empty pool of {self.allocator.size} slots: raise the budget"
                )
            self._decode([r for r in self.running if r not in prefilled])
            self._finish()
            self._note_peak()
            if self.progress is not None:
                self.progress(self)
        return {r.rid: r.output for r in sorted(self.finished, key=lambda r: r.rid)}

    def _free_slots(self) -> int:
        """Token slots free for KV: logical ones on HiSparse (the device is managed by eviction)."""
        if self.residency is not None:
            return cast(DeviceResidency, self.residency).logical_available_size()
        return self.allocator.available_size()

    def _note_peak(self) -> None:
        used = self.allocator.size - self._free_slots()
        self.stats.peak_slots = max(self.stats.peak_slots, used)

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def _fits(self, tokens: int) -> bool:
        """Room for ``tokens`` new slots plus a decode page for each running request."""
        need = (self._pages(tokens) + len(self.running) + 1) * self.page
        if self.mamba is not None and self.mamba.available_size() < 1:
            return False
        return self._free_slots() >= need

    # -- admission: resume first, then prefill -----------------------------------------------
    def _admit(self) -> list[Request]:
        prefilled: list[Request] = []
        while self.retracted and len(self.running) < self.max_running:
            req = self.retracted[0]
            if not self._fits(req.slots.numel()) or not self._resume(req):
                return prefilled
            self.retracted.popleft()
        while self.waiting and not self.retracted and len(self.running) < self.max_running:
            req = self.waiting[0]
            if not self._fits(len(req.prompt)) or not self._prefill(req):
                break
            self.waiting.popleft()
            prefilled.append(req)
        return prefilled

    def _alloc_new(self, tokens: int) -> torch.Tensor | None:
        """Slots for a request starting from nothing; on HiSparse, evict until the device fits."""
        while (slots := self._alloc_fresh(tokens)) is None:
            if not self._device_short(self._pages(tokens) * self.page) or not self._evict(None):
                return None
        return slots

    def _alloc_fresh(self, tokens: int) -> torch.Tensor | None:
        """Page-aligned slots from position 0, as a prefill gets them."""
        if not self.paged:
            return self.allocator.alloc(tokens)
        paged = cast(PagedAllocator, self.allocator)
        one = torch.tensor([tokens], dtype=torch.int64)
        return paged.alloc_extend(torch.zeros(1, dtype=torch.int64), one, -one.new_ones(1), tokens)

    def _alloc_history(self, tokens: int) -> torch.Tensor | None:
        """Slots for a resumed request's history. On HiSparse they are logical only, as the
        docs intend for reloaded history: the model re-admits the tokens it chooses, so a long
        request resumes even when the device could not hold all of it."""
        if self.residency is None:
            return self._alloc_new(tokens)
        res = cast(DeviceResidency, self.residency)
        slots = res.alloc_logical_only(self._pages(tokens) * self.page)
        return None if slots is None else slots[:tokens]

    def _take_mamba_slot(self) -> torch.Tensor | None:
        if self.mamba is None:
            return None
        slot = cast(MambaSlotAllocator, self.mamba).alloc(1)
        if slot is None:
            raise EngineError("no Mamba slot free although one was counted")
        return slot

    def _prefill(self, req: Request) -> bool:
        slots = self._alloc_new(len(req.prompt))
        if slots is None:
            return False
        req.slots, req.mamba_slot = slots, self._take_mamba_slot()
        if req.mamba_slot is not None:
            cast(MambaStatePool, self.pool).clear_slots(req.mamba_slot)
        self.running.append(req)
        tokens = torch.tensor(req.prompt, dtype=torch.int64)
        self._forward(req, tokens, 0, slots)
        return True

    def _resume(self, req: Request) -> bool:
        """New slots (and Mamba slot), then reload the snapshot into them."""
        assert req.snapshot is not None
        slots = self._alloc_history(req.slots.numel())
        if slots is None:
            return False
        req.slots, req.mamba_slot = slots, self._take_mamba_slot()
        began = time.perf_counter()
        self.allocator.load_cpu_copy(req.snapshot, slots, mamba_indices=req.mamba_slot)
        self.stats.reload_seconds += time.perf_counter() - began
        req.snapshot = None
        self.stats.resumes += 1
        self.running.append(req)
        return True

    # -- decode, retraction ------------------------------------------------------------------
    def _decode(self, batch: list[Request]) -> None:
        while batch:
            new = self._alloc_decode(batch)
            if new is not None:
                break
            if self._device_short(len(batch) * self.page) and self._evict(keep=None):
                continue
            if len(self.running) == 1:
                req = self.running[0]
                raise EngineError(
                    f"request {req.rid} cannot grow past {req.slots.numel()} tokens in a pool "
                    f"of {self.allocator.size} slots: raise the budget"
                )
            victim = self.running[-1]  # the most recently admitted goes back to the queue
            self._retract(victim)
            if victim in batch:
                batch.remove(victim)
        else:
            return
        for req, slot in zip(batch, new.tolist(), strict=True):
            token = torch.tensor(req.output[-1:], dtype=torch.int64)
            self._forward(req, token, req.slots.numel(), torch.tensor([slot], dtype=torch.int64))

    def _alloc_decode(self, batch: list[Request]) -> torch.Tensor | None:
        if not self.paged:
            return self.allocator.alloc(len(batch))
        seq_lens = torch.tensor([r.slots.numel() + 1 for r in batch], dtype=torch.int64)
        last = torch.tensor([int(r.slots[-1]) for r in batch], dtype=torch.int64)
        return cast(PagedAllocator, self.allocator).alloc_decode(seq_lens, last)

    def _retract(self, req: Request) -> None:
        """Offload KV (and state), free every slot the request held, queue it for resume."""
        began = time.perf_counter()
        req.snapshot = self.allocator.get_cpu_copy(req.slots, mamba_indices=req.mamba_slot)
        self.stats.offload_seconds += time.perf_counter() - began
        self.stats.bytes_offloaded += req.snapshot.nbytes
        self._release(req)
        self.running.remove(req)
        self.retracted.append(req)
        self.stats.retractions += 1

    def _release(self, req: Request) -> None:
        self.allocator.free(req.slots)
        if req.mamba_slot is not None:
            cast(MambaSlotAllocator, self.mamba).free(req.mamba_slot)
            req.mamba_slot = None

    def _finish(self) -> None:
        """Release finished requests (in one free group, as engines release a batch), then
        the window slots that slid out of every running request's window."""
        done = [r for r in self.running if r.done]
        if done:
            self.allocator.free_group_begin()
            try:
                for req in done:
                    self._release(req)
                    req.slots = _EMPTY
                    self.running.remove(req)
                    self.finished.append(req)
            finally:
                self.allocator.free_group_end()
        if self.window:
            for req in self.running:
                self._release_window(req)

    def _release_window(self, req: Request) -> None:
        """Give back the window slots of whole pages no window layer will read again."""
        # The next query sits at position L and reads positions > L - W.
        dead = req.slots.numel() + 1 - self.model.shape.window
        upto = (max(dead, 0) // self.page) * self.page
        if upto > req.window_released:
            cast(SWAAllocator, self.allocator).free_swa(req.slots[req.window_released : upto])
            req.window_released = upto

    # -- the model call ----------------------------------------------------------------------
    def _forward(self, req: Request, tokens: torch.Tensor, start: int, write: torch.Tensor) -> None:
        context = torch.cat([req.slots, write]) if start else write
        req.slots = context
        step = Step(tokens, start, write, context, req.mamba_slot, self._residency_for(req))
        logits = self.model.forward(self.pool, step)
        req.output.append(int(torch.argmax(logits)))
        self.stats.tokens += 1

    # -- HiSparse residency ------------------------------------------------------------------
    def _residency_for(self, req: Request) -> Callable[[torch.Tensor], None] | None:
        if self.residency is None:
            return None
        return lambda slots: self._make_resident(req, slots)

    def _make_resident(self, req: Request, slots: torch.Tensor) -> None:
        """Re-admit the pages of ``slots`` that were evicted: device pages, then their rows.

        Residency is by page, so every slot of the request in those pages is loaded, not only
        the ones asked for (a page's other tokens would otherwise read an old device row).
        """
        pool, res = cast(HiSparsePool, self.pool), cast(DeviceResidency, self.residency)
        missing = slots[pool.translate_loc_to_device(slots) < 0]
        if missing.numel() == 0:
            return
        pages = torch.div(missing, self.page, rounding_mode="floor")
        page_of = torch.div(req.slots, self.page, rounding_mode="floor")
        whole = req.slots[torch.isin(page_of, pages)]
        chosen = torch.div(slots, self.page, rounding_mode="floor")
        while (device := res.alloc_device(whole)) is None:
            if not self._evict(keep=req) and not self._evict_own(req, chosen):
                raise EngineError("the device cannot hold one request's chosen tokens")
        pool.load_to_device(whole, device)

    def _device_short(self, tokens: int) -> bool:
        """HiSparse: the logical side has room for ``tokens``, so a refusal was the device's
        (evicting helps); otherwise only a retraction frees what is missing."""
        if self.residency is None:
            return False
        return cast(DeviceResidency, self.residency).logical_available_size() >= tokens

    def _evict_own(self, req: Request, chosen_pages: torch.Tensor) -> bool:
        """Drop the residency of ``req``'s own pages that this read does not need."""
        pool, res = cast(HiSparsePool, self.pool), cast(DeviceResidency, self.residency)
        page_of = torch.div(req.slots, self.page, rounding_mode="floor")
        spare = req.slots[
            (pool.translate_loc_to_device(req.slots) >= 0) & ~torch.isin(page_of, chosen_pages)
        ]
        if spare.numel() == 0:
            return False
        res.free_device(spare)
        self.stats.evictions += 1
        return True

    def _evict(self, keep: Request | None) -> bool:
        """Drop the device residency of the oldest other request that has any; False if none."""
        if self.residency is None:
            return False
        pool, res = cast(HiSparsePool, self.pool), cast(DeviceResidency, self.residency)
        for req in self.running:
            if req is keep or req.slots.numel() == 0:
                continue
            resident = req.slots[pool.translate_loc_to_device(req.slots) >= 0]
            if resident.numel():
                res.free_device(resident)
                self.stats.evictions += 1
                return True
        return False
