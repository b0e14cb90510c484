"""An allocator that drifted from the contract (type-checked by the tests, never run)."""

from __future__ import annotations

import torch

from kvcache_core import KVPool, KVSnapshot


class ForgetfulAllocator:
    """Drops ``mamba_indices`` from both offload pass-throughs and returns the wrong pool type."""

    size: int
    page_size: int

    def available_size(self) -> int:
        raise NotImplementedError

    def alloc(self, need_size: int) -> torch.Tensor | None:
        raise NotImplementedError

    def free(self, indices: torch.Tensor) -> None:
        raise NotImplementedError

    def free_group_begin(self) -> None:
        raise NotImplementedError

    def free_group_end(self) -> None:
        raise NotImplementedError

    def backup_state(self) -> object:
        raise NotImplementedError

    def restore_state(self, state: object) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def get_kvcache(self) -> KVPool | None:
        raise NotImplementedError

    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:
        raise NotImplementedError

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor) -> None:
        raise NotImplementedError
