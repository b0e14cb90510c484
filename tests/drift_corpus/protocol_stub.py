"""Subclasses the Protocol explicitly and forgets a method: it inherits only the stub ``...``.

``isinstance`` and ``hasattr`` are both satisfied, and ``load_cpu_copy`` returns None without
loading anything.
"""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot, OffloadablePool

from ._reference import ReferencePool


class ExplicitProtocolPool(ReferencePool, OffloadablePool):
    """Subclassing the Protocol is fine when every method is really implemented."""

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> None:
        super().load_cpu_copy(snapshot, indices, mamba_indices)


class OnlyStub(OffloadablePool):  # expect: missing-method OnlyStub.get_key_buffer; missing-method OnlyStub.get_value_buffer; missing-method OnlyStub.get_kv_buffer; missing-method OnlyStub.set_kv_buffer; missing-method OnlyStub.get_kv_size_bytes; missing-method OnlyStub.load_cpu_copy; expect[source]: missing-attribute OnlyStub
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return KVSnapshot("stub", torch.float32, indices.numel(), {})
