"""DSA-like subclasses in another file than their base, imported three different ways.

``DSALikePool`` overrides offload without ``mamba_indices`` (the drift); ``DSAGrandchild`` in
``dsa_grandchild`` inherits that override, so its finding points here.
"""

from __future__ import annotations

import torch

from drift_corpus import dsa_base as base_mod
from drift_corpus.dsa_base import DSABasePool as _Base
from kvcache_core import KVSnapshot

from .dsa_base import DSABasePool


class DSALikePool(DSABasePool):
    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect: missing-parameter DSALikePool.get_cpu_copy; missing-parameter DSAGrandchild.get_cpu_copy
        latent = super().get_cpu_copy(indices)
        pages = self.index_k[:, indices]
        return KVSnapshot("dsa", self.dtype, indices.numel(), {"index_k": pages}, {"kv": latent})


class DSALikePoolFixed(base_mod.DSABasePool):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        latent = super().get_cpu_copy(indices, mamba_indices=mamba_indices)
        pages = self.index_k[:, indices]
        return KVSnapshot("dsa", self.dtype, indices.numel(), {"index_k": pages}, {"kv": latent})


class DSAInheritsAll(_Base):
    """Overrides nothing: everything, found through an aliased import, is correct."""
