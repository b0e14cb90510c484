"""Imports GPU-only packages at the top, so importing this module fails here.

The source level still reads it: ``GPUPool`` inherits from the correct reference pool in
another package of the tree; ``VendorPool`` from a base whose package is not installed.
"""

from __future__ import annotations

import sgl_kernel  # GPU-only; not installed on the checker's machine
import torch
import triton.language as tl

from drift_corpus._reference import ReferencePool
from kvcache_core import KVSnapshot

try:
    from vendor_gpu.pools import VendorBase
except ImportError:  # the pattern plugins use to stay importable without the GPU package
    VendorBase = object


class GPUPool(ReferencePool):
    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect[source]: missing-parameter GPUPool.get_cpu_copy
        sgl_kernel.sync(tl.constexpr(0))
        return super().get_cpu_copy(indices)


class VendorPool(VendorBase):  # expect[source]: unresolved-base VendorPool
    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        self.write(layer, loc, cache_k, cache_v)

    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect[source]: missing-parameter VendorPool.get_cpu_copy
        return self.snapshot(indices)
