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
    page_size: int

    def available_size(self) -> int: ...

    def alloc(self, need_size: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> None: ...

    def free_group_begin(self) -> None: ...

    def free_group_end(self) -> None: ...

    def backup_state(self) -> object: ...

    def restore_state(self, state: object) -> None: ...

    def clear(self) -> None: ...

    def get_kvcache(self) -> KVPool: ...

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot: ...

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None: ...


@runtime_checkable
class PagedAllocator(TokenAllocator, Protocol):
    """Allocates whole pages of ``page_size`` slots; extends and decodes requests page-aware."""

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None: ...

    def alloc_decode(
        self, seq_lens: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None: ...


@runtime_checkable
class SWAAllocator(TokenAllocator, Protocol):
    """Allocates a full slot and a window slot together and owns the full->window table.

    ``alloc`` and the paged calls return *full* slot ids and record their window slots in the
    table; ``free_swa`` releases the window slots of tokens that left the window (entries go to
    0) and ``free`` releases both sides. ``load_cpu_copy`` re-creates window slots for exactly
    the tokens the snapshot marks, then has the pool write; it raises before changing anything
    when the window side cannot supply them. ``backup_state`` covers both sides and the table.
    """

    def full_available_size(self) -> int: ...

    def swa_available_size(self) -> int: ...

    def free_swa(self, indices: torch.Tensor) -> None: ...

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class MambaSlotAllocator(Protocol):
    """Request-slot allocation for per-request recurrent state (slot 0 is padding).

    Free list ``1..size``; ``alloc`` is never partial (None when short); freeing slot 0, a free
    slot or the same slot twice raises before anything changes.
    """

    size: int

    def available_size(self) -> int: ...

    def alloc(self, need_size: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> None: ...

    def clear(self) -> None: ...
