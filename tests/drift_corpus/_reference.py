"""A correct contract-2 pool and allocator that the drifted classes override one method of."""

from __future__ import annotations

import torch

from kvcache_core import KVPool, KVSnapshot, KVWriteLoc, LayerLike, unwrap_write_loc


class ReferencePool:
    def __init__(self, size: int = 8, layer_num: int = 2) -> None:
        self.size = size
        self.page_size = 1
        self.dtype = torch.float32
        self.device = torch.device("cpu")
        self.layer_num = layer_num
        self.k = torch.zeros(layer_num, size + 1, 4)
        self.v = torch.zeros(layer_num, size + 1, 4)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v[layer_id]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer_id], self.v[layer_id]

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
        self.k[layer.layer_id][slots] = cache_k
        self.v[layer.layer_id][slots] = cache_v

    def get_kv_size_bytes(self) -> int:
        return self.k.numel() * 8

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return KVSnapshot("ref", self.dtype, indices.numel(), {"k": self.k[:, indices]})

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self.k[:, indices] = snapshot.parts["k"]


class ReferenceAllocator:
    def __init__(self, pool: ReferencePool) -> None:
        self.size = pool.size
        self.page_size = 1
        self._kvcache = pool
        self._free = list(range(1, pool.size + 1))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > len(self._free):
            return None
        out, self._free = self._free[:need_size], self._free[need_size:]
        return torch.tensor(out)

    def free(self, indices: torch.Tensor) -> None:
        self._free.extend(indices.tolist())

    def free_group_begin(self) -> None:
        pass

    def free_group_end(self) -> None:
        pass

    def backup_state(self) -> object:
        return list(self._free)

    def restore_state(self, state: object) -> None:
        assert isinstance(state, list)
        self._free = list(state)

    def clear(self) -> None:
        self._free = list(range(1, self.size + 1))

    def get_kvcache(self) -> KVPool:
        return self._kvcache

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._kvcache.load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
