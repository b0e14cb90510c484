"""One class per remaining signature rule; each overrides one method of a correct pool."""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot, KVWriteLoc, LayerLike, unwrap_write_loc

from ._reference import ReferencePool


class KindChangedPool(ReferencePool):
    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor, /, mamba_indices: torch.Tensor | None = None) -> None:  # expect: parameter-kind-changed KindChangedPool.load_cpu_copy
        super().load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)


class OrderChangedPool(ReferencePool):
    def load_cpu_copy(self, indices: torch.Tensor, snapshot: KVSnapshot, mamba_indices: torch.Tensor | None = None) -> None:  # expect: parameter-order-changed OrderChangedPool.load_cpu_copy
        super().load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)


class BecameRequiredPool(ReferencePool):
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None) -> KVSnapshot:  # expect: became-required BecameRequiredPool.get_cpu_copy
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)


class DefaultChangedPool(ReferencePool):
    def set_kv_buffer(self, layer: LayerLike, loc: KVWriteLoc | torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, k_scale: float | None = 1.0, v_scale: float | None = None) -> None:  # expect: default-changed DefaultChangedPool.set_kv_buffer
        slots, _ = unwrap_write_loc(loc)
        self.k[layer.layer_id][slots] = cache_k / (k_scale or 1.0)


class ExtraRequiredPool(ReferencePool):
    def get_cpu_copy(self, indices: torch.Tensor, stream: object, mamba_indices: torch.Tensor | None = None) -> KVSnapshot:  # expect: extra-required-parameter ExtraRequiredPool.get_cpu_copy; parameter-order-changed ExtraRequiredPool.get_cpu_copy
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)


class AnnotationPool(ReferencePool):
    def get_cpu_copy(self, indices: list[int], mamba_indices: torch.Tensor | None = None) -> KVSnapshot:  # expect: annotation-mismatch AnnotationPool.get_cpu_copy
        return super().get_cpu_copy(torch.tensor(indices), mamba_indices=mamba_indices)


class ReturnPool(ReferencePool):
    def get_kv_size_bytes(self) -> float:  # expect: return-mismatch ReturnPool.get_kv_size_bytes
        return float(super().get_kv_size_bytes())


class DecoratedPool(ReferencePool):
    """Decorated: both levels must point at the ``def`` line, not at the decorator."""

    @torch.no_grad()
    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect: missing-parameter DecoratedPool.get_cpu_copy
        return super().get_cpu_copy(indices)


class MissingPieces:  # expect: missing-method MissingPieces.load_cpu_copy; expect[source]: missing-attribute MissingPieces
    """Written from scratch: no ``load_cpu_copy``, and ``layer_num`` is never set."""

    def __init__(self) -> None:
        self.size = 4
        self.page_size = 1
        self.dtype = torch.float32
        self.device = torch.device("cpu")
        self.buf = torch.zeros(2, 5, 4)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.buf[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.buf[layer_id]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.buf[layer_id], self.buf[layer_id]

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        slots, _ = unwrap_write_loc(loc)
        self.buf[layer.layer_id][slots] = cache_k

    def get_kv_size_bytes(self) -> int:
        return self.buf.numel() * 4

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return KVSnapshot("pieces", self.dtype, indices.numel(), {"k": self.buf[:, indices]})


class SignatureDriftsFixed(ReferencePool):
    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        super().load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)

    def get_kv_size_bytes(self) -> int:
        return super().get_kv_size_bytes()
