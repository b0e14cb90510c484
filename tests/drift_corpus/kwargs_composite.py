"""A composite pool that takes ``**kwargs`` and never hands them to its sub-pools.

``mamba_indices`` vanishes into ``**kwargs``: the signature looks compatible to a caller, and
the hybrid sub-pool never sees the request slots it needed.
"""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot

from ._reference import ReferencePool


class KwargsCompositePool(ReferencePool):
    def __init__(self) -> None:
        super().__init__()
        self.attn = ReferencePool()
        self.state = ReferencePool()

    def get_cpu_copy(self, indices: torch.Tensor, **kwargs: object) -> KVSnapshot:  # expect: kwargs-hides-parameter KwargsCompositePool.get_cpu_copy
        attn = self.attn.get_cpu_copy(indices)  # expect: parameter-not-forwarded KwargsCompositePool.get_cpu_copy
        state = self.state.get_cpu_copy(indices)
        return KVSnapshot("hybrid", self.dtype, indices.numel(), {}, {"attn": attn, "state": state})

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor, **kwargs: object) -> None:  # expect: kwargs-hides-parameter KwargsCompositePool.load_cpu_copy
        attn, state = snapshot.children["attn"], snapshot.children["state"]
        assert attn is not None and state is not None
        self.attn.load_cpu_copy(attn, indices)  # expect: parameter-not-forwarded KwargsCompositePool.load_cpu_copy
        self.state.load_cpu_copy(state, indices)


class KwargsCompositePoolFixed(ReferencePool):
    def __init__(self) -> None:
        super().__init__()
        self.attn = ReferencePool()
        self.state = ReferencePool()

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        attn = self.attn.get_cpu_copy(indices, mamba_indices=mamba_indices)
        state = self.state.get_cpu_copy(indices, mamba_indices=mamba_indices)
        return KVSnapshot("hybrid", self.dtype, indices.numel(), {}, {"attn": attn, "state": state})

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        attn, state = snapshot.children["attn"], snapshot.children["state"]
        assert attn is not None and state is not None
        self.attn.load_cpu_copy(attn, indices, mamba_indices=mamba_indices)
        self.state.load_cpu_copy(state, indices, mamba_indices=mamba_indices)


class DeliberateDropPool(ReferencePool):
    """Drops ``mamba_indices`` on purpose, and says so where the checker sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.full = ReferencePool()

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        del mamba_indices  # no recurrent state here: the engine saves it itself
        return self.full.get_cpu_copy(indices)
