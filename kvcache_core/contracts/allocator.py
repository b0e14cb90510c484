"""Allocator contracts: who hands out slots, and how retraction reaches the pool through them.

An allocator's ``get_cpu_copy``/``load_cpu_copy`` must have the pool's exact signature and
forward every argument: an allocator that accepted ``mamba_indices`` and dropped it silently lost
recurrent state on resume in a real engine.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .pool import KVPool
from .snapshot import KVSnapshot

__all__ = [
    "MambaSlotAllocator",
    "PagedAllocator",
    "SWAAllocator",
    "TokenAllocator",
]


@runtime_checkable
class TokenAllocator(Protocol):
    """Hands out token slots (page size 1) and frees them. ``alloc`` is never partial."""

    size: int
    """Usable slots this allocator hands out (the pool's ``size``)."""
    page_size: int
    """Slots per page; 1 for a token allocator."""

    def available_size(self) -> int:
        """Free slots: the free pages times ``page_size``, exactly (queued frees settled)."""
        ...

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` free slots, or None when short: never a partial allocation, so the
        scheduler can retract and retry without leaking what a partial call took."""
        ...

    def free(self, indices: torch.Tensor) -> None:
        """Return slots. A slot already free, or slot 0, raises
        [`DoubleFreeError`][kvcache_core.DoubleFreeError] naming it; the other frees apply."""
        ...

    def free_group_begin(self) -> None:
        """Start collecting frees, to release them together at ``free_group_end``."""
        ...

    def free_group_end(self) -> None:
        """Release the frees collected since ``free_group_begin``."""
        ...

    def backup_state(self) -> object:
        """An opaque copy of the free list, every earlier free included (open groups too)."""
        ...

    def restore_state(self, state: object) -> None:
        """Go back to a ``backup_state()``: undoes exactly what came after it."""
        ...

    def clear(self) -> None:
        """Free every slot (slot 0 stays reserved)."""
        ...

    def get_kvcache(self) -> KVPool:
        """The pool this allocator hands out slots of."""
        ...

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """The pool's ``get_cpu_copy``, with its exact signature, forwarding every argument."""
        ...

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """The pool's ``load_cpu_copy``, with its exact signature, forwarding every argument."""
        ...


@runtime_checkable
class PagedAllocator(TokenAllocator, Protocol):
    """Allocates whole pages of ``page_size`` slots; extends and decodes requests page-aware."""

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots for ``extend_num_tokens`` new tokens of a batch of requests (prefill).

        Each request grows from ``prefix_lens`` to ``seq_lens`` tokens and continues the page of
        its ``last_loc`` before taking new pages, so a request's tokens stay page-contiguous.
        None when short, taking nothing; a ``last_loc`` in a free page raises a
        [`KVCacheError`][kvcache_core.KVCacheError].
        """
        ...

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One slot per request for a decode step, after ``last_loc``; as ``alloc_extend``."""
        ...


@runtime_checkable
class SWAAllocator(TokenAllocator, Protocol):
    """Allocates a full slot and a window slot together and owns the full->window table.

    ``alloc`` and the paged calls return *full* slot ids and record their window slots in the
    table; ``free_swa`` releases the window slots of tokens that left the window (entries go to
    0) and ``free`` releases both sides. ``load_cpu_copy`` re-creates window slots for exactly
    the tokens the snapshot marks, then has the pool write; it raises before changing anything
    when the window side cannot supply them. ``backup_state`` covers both sides and the table.
    """

    def full_available_size(self) -> int:
        """Free slots on the full-attention side."""
        ...

    def swa_available_size(self) -> int:
        """Free slots on the window side."""
        ...

    def free_swa(self, indices: torch.Tensor) -> None:
        """Release the window slots of full slots ``indices`` (tokens that left the window)."""
        ...

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The window slots of full slots ``kv_indices`` (0 where a token has none)."""
        ...


@runtime_checkable
class MambaSlotAllocator(Protocol):
    """Request-slot allocation for per-request recurrent state (slot 0 is padding).

    Free list ``1..size``; ``alloc`` is never partial (None when short); freeing slot 0, a free
    slot or the same slot twice raises before anything changes.
    """

    size: int
    """Request slots, ``1..size`` (slot 0 is padding)."""

    def available_size(self) -> int:
        """Free request slots."""
        ...

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` request slots, or None when short (never partial)."""
        ...

    def free(self, indices: torch.Tensor) -> None:
        """Return request slots; slot 0, a free slot or a repeat raises before any change."""
        ...

    def clear(self) -> None:
        """Free every request slot."""
        ...
