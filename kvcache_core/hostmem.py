"""Host memory for CPU pools: huge-page-backed buffers and a cache of snapshot blocks.

Why: on CPU the cost of an offload is mostly the kernel faulting in fresh host pages, one 4 KiB
page at a time (docs/architecture.md, "Performance notes": a gather into fresh memory ran at
about 3.5 GB/s, into memory allocated beforehand at 9.4). Two levers, both CPU-only:

* **Huge pages.** Large buffers are anonymous ``mmap`` regions aligned to 2 MiB and advised
  ``MADV_HUGEPAGE``, so the kernel faults them in 2 MiB at a time and random-row copies miss
  the TLB less. Anonymous mappings are zero-filled, so a pool's buffers cost nothing up front
  (``torch.zeros`` writes every byte).
* **A block cache for snapshots.** A snapshot part is carved from an anonymous mapping (4 KiB
  pages: fresh huge pages were measured to stall a first offload, see ``_Cache.new``); when the
  last tensor viewing the block is gone (the part itself or any view or slice of it), the block
  goes back to a cache and the next snapshot of that size reuses it, already faulted in.

How "the last tensor is gone" is known: a block is handed out as ``torch.frombuffer`` over a
``memoryview`` slice of its ``mmap``. torch keeps a reference to that memoryview for as long as
any storage uses it (every view of the tensor shares the storage), so a ``weakref.finalize``
on the memoryview fires exactly when the last view dies, in whichever thread drops it. Only then
does the block return to the cache (under a lock). A block is never reused while any part of it
is referenced, so snapshots stay independent.

The cache holds at most `host_cache_limit` bytes (default 1 GiB, or the environment
variable ``KVCACHE_HOST_CACHE_BYTES`` read at import;
[`set_host_cache_limit`][kvcache_core.set_host_cache_limit] changes it).
A block returned while the cache is full is unmapped (its memory goes back to the OS), and so
are the oldest cached blocks when the limit is lowered.

CUDA pools do not use any of this: their snapshots are pinned ``torch.empty`` tensors, and
torch's caching host allocator already reuses pinned blocks across snapshots. Allocations
smaller than one huge page, and systems without ``mmap``/``MADV_HUGEPAGE`` (non-Linux), fall
back to ``torch.empty``/``torch.zeros``.

Fork: the lock is re-created in a forked child; blocks cached before the fork are private
copy-on-write mappings in the child and are reused there like any other.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "HUGE_PAGE",
    "host_cache_limit",
    "host_cache_stats",
    "host_empty_cpu",
    "host_zeros_cpu",
    "release_host_cache",
    "set_host_cache_limit",
]

HUGE_PAGE = 2 << 20
"""Bytes of one transparent huge page on x86-64 and arm64 with 4 KiB base pages (2 MiB);
host blocks are rounded up to a multiple of it."""

_DEFAULT_LIMIT = 1 << 30
_ENV_LIMIT = "KVCACHE_HOST_CACHE_BYTES"
#: Cached blocks are reused for requests needing at least this fraction of their size.
_MIN_FILL = 0.75


def _limit_from_env() -> int:
    raw = os.environ.get(_ENV_LIMIT, "")
    try:
        return max(0, int(raw)) if raw.strip() else _DEFAULT_LIMIT
    except ValueError:
        return _DEFAULT_LIMIT


def _advice() -> int | None:
    """``MADV_HUGEPAGE`` when this Python and OS offer it (Linux), else None."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    return advice if isinstance(advice, int) and hasattr(mmap.mmap, "madvise") else None


@dataclass(eq=False)
class _Block:
    """One anonymous mapping, ``size`` usable bytes from ``offset`` (2 MiB aligned)."""

    mm: mmap.mmap
    offset: int
    size: int


def _map(nbytes: int, huge: bool = True) -> _Block | None:
    """A new mapping of at least ``nbytes``, advised ``MADV_HUGEPAGE`` when ``huge`` (None
    when this system has no ``madvise``)."""
    advice = _advice()
    if advice is None:
        return None
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    try:
        # One extra huge page of address space (never touched) to align the start: a huge
        # page can only back a 2 MiB-aligned virtual range.
        mm = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError):
        return None
    probe = ctypes.c_char.from_buffer(mm)
    address = ctypes.addressof(probe)
    del probe  # releases the buffer export, so the mapping can be closed later
    offset = (-address) % HUGE_PAGE
    if huge:
        with contextlib.suppress(OSError):  # without the advice: correct, slower to fault in
            mm.madvise(advice, offset, size)
    return _Block(mm, offset, size)


def _unmap(block: _Block) -> None:
    with contextlib.suppress(BufferError):  # a view still exports it: the GC unmaps it later
        block.mm.close()


def _as_tensor(
    block: _Block, shape: Sequence[int], dtype: torch.dtype, numel: int
) -> tuple[torch.Tensor, memoryview]:
    nbytes = numel * dtype.itemsize
    view = memoryview(block.mm)[block.offset : block.offset + nbytes]
    flat = torch.frombuffer(view, dtype=torch.uint8)
    return flat.view(dtype).view(tuple(shape)), view


class _Cache:
    """Blocks whose tensors are all gone, by size, bounded by ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lock = threading.RLock()  # re-entrant: a finalizer may run inside a locked section
        self.free: list[_Block] = []  # oldest first
        self.cached = 0
        self.hits = 0
        self.maps = 0
        self.unmaps = 0
        self.live = 0

    def take(self, nbytes: int) -> _Block | None:
        """The smallest cached block that fits ``nbytes`` without wasting a quarter of it."""
        need = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        with self.lock:
            best: _Block | None = None
            for block in self.free:
                fits = need <= block.size and need >= _MIN_FILL * block.size
                if fits and (best is None or block.size < best.size):
                    best = block
            if best is not None:
                self.free.remove(best)
                self.cached -= best.size
                self.hits += 1
                self.live += 1
            return best

    def new(self, nbytes: int) -> _Block | None:
        # Snapshot blocks are not advised MADV_HUGEPAGE: assembling fresh huge pages stalled
        # a first offload 4-8x here (256 MiB: 310 ms instead of 40-70), while 4 KiB pages
        # fault in at the old speed; once cached, a block is faulted in either way.
        block = _map(nbytes, huge=False)
        if block is not None:
            with self.lock:
                self.maps += 1
                self.live += 1
        return block

    def give_back(self, block: _Block) -> None:
        """Called when the last tensor viewing ``block`` is gone."""
        with self.lock:
            self.live -= 1
            if block.size > self.limit:
                self.unmaps += 1
                _unmap(block)
                return
            self.free.append(block)
            self.cached += block.size
            self._trim(self.limit)

    def _trim(self, limit: int) -> None:
        while self.cached > limit and self.free:
            old = self.free.pop(0)
            self.cached -= old.size
            self.unmaps += 1
            _unmap(old)

    def reinit_after_fork(self) -> None:
        self.lock = threading.RLock()


_CACHE = _Cache(_limit_from_env())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CACHE.reinit_after_fork)


def host_empty_cpu(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor, from the block cache when it is at least 2 MiB.

    The block returns to the cache when the last tensor viewing it (views included) is gone.
    Smaller tensors, and systems without huge-page advice, get ``torch.empty``.
    """
    numel = math.prod(int(d) for d in shape)
    nbytes = numel * dtype.itemsize
    if nbytes < HUGE_PAGE:
        return torch.empty(tuple(shape), dtype=dtype)
    block = _CACHE.take(nbytes) or _CACHE.new(nbytes)
    if block is None:
        return torch.empty(tuple(shape), dtype=dtype)
    tensor, view = _as_tensor(block, shape, dtype, numel)
    finalizer = weakref.finalize(view, _CACHE.give_back, block)
    finalizer.atexit = False  # at exit, live tensors may still view the block
    return tensor


def host_zeros_cpu(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor backed by its own huge-page-advised mapping (a pool's buffer).

    Free to create (an anonymous mapping is zero-filled lazily) and unmapped when the last
    tensor viewing it is gone; never cached. Below one huge page, or without huge-page advice,
    it is ``torch.zeros``.
    """
    numel = math.prod(int(d) for d in shape)
    nbytes = numel * dtype.itemsize
    block = _map(nbytes) if nbytes >= HUGE_PAGE else None
    if block is None:
        return torch.zeros(tuple(shape), dtype=dtype)
    tensor, _ = _as_tensor(block, shape, dtype, numel)
    return tensor  # the memoryview (held by the storage) keeps the mapping alive


def host_cache_limit() -> int:
    """Bytes of dropped snapshot blocks the cache keeps for reuse."""
    return _CACHE.limit


def set_host_cache_limit(nbytes: int) -> int:
    """Keep at most ``nbytes`` of dropped snapshot blocks for reuse; return the old limit.

    Lowering it unmaps the oldest cached blocks at once (their memory returns to the OS);
    0 turns reuse off. The default is 1 GiB, or ``KVCACHE_HOST_CACHE_BYTES`` when set.

    :raises ValueError: ``nbytes`` is negative.
    """
    if nbytes < 0:
        raise ValueError(f"the host cache limit must be >= 0 bytes, got {nbytes}")
    with _CACHE.lock:
        old, _CACHE.limit = _CACHE.limit, int(nbytes)
        _CACHE._trim(_CACHE.limit)
    return old


def release_host_cache() -> int:
    """Unmap every cached block now (blocks still in use are untouched); return the bytes."""
    with _CACHE.lock:
        freed = _CACHE.cached
        _CACHE._trim(0)
    return freed


def host_cache_stats() -> dict[str, int]:
    """Counters: ``cached_bytes``, ``cached_blocks``, ``live_blocks`` (handed out, not yet
    returned), ``hits`` (reuses), ``maps`` and ``unmaps`` (new and returned mappings),
    ``limit``."""
    with _CACHE.lock:
        return {
            "cached_bytes": _CACHE.cached,
            "cached_blocks": len(_CACHE.free),
            "live_blocks": _CACHE.live,
            "hits": _CACHE.hits,
            "maps": _CACHE.maps,
            "unmaps": _CACHE.unmaps,
            "limit": _CACHE.limit,
        }
