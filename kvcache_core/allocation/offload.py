"""Offload pass-through, for every allocator (built-in or third-party) that does not add to it.

The contract requires an allocator's ``get_cpu_copy``/``load_cpu_copy`` to have the pool's exact
signature and to forward every argument: an allocator that accepted ``mamba_indices`` and dropped
it lost recurrent state on resume in a real engine. Written once, by keyword.
"""

from __future__ import annotations

import torch

from ..contracts import KVPool, KVSnapshot, OffloadablePool

__all__ = ["ForwardsOffload"]


class ForwardsOffload:
    """Mixin: offload calls go to ``get_kvcache()``, which must support offload."""

    def get_kvcache(self) -> KVPool:
        """The pool offload calls go to; the allocator using this mixin provides it."""
        raise NotImplementedError  # provided by the allocator using this mixin

    def _offloadable(self) -> OffloadablePool:
        pool = self.get_kvcache()
        if not isinstance(pool, OffloadablePool):
            raise TypeError(f"{type(pool).__name__} does not support offload")
        return pool

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """The pool's ``get_cpu_copy``, every argument forwarded by keyword.

        :raises TypeError: The pool does not support offload.
        """
        return self._offloadable().get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """The pool's ``load_cpu_copy``, every argument forwarded by keyword.

        :raises TypeError: The pool does not support offload.
        """
        self._offloadable().load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
