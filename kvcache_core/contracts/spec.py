"""What a plugin declares (``PoolSpec``) and what an engine asks for (``PoolConfig``).

Small frozen value objects, so a spec can be validated once at discovery and then shared, and
one ``PoolConfig`` can build any pool kind: kind-specific fields are simply ignored by kinds
that do not use them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from .allocator import PagedAllocator, TokenAllocator
from .pool import (
    HiSparsePool,
    IndexerKeyPool,
    KVPool,
    MambaStatePool,
    MLAPool,
    OffloadablePool,
    SlidingWindowPool,
)

__all__ = [
    "CAPABILITY_PROTOCOLS",
    "CONTRACT_VERSION",
    "Capability",
    "PoolConfig",
    "PoolFactory",
    "PoolSpec",
]

#: The contract version this kvcache release defines (see ``history``).
CONTRACT_VERSION = 2


class Capability(str, enum.Enum):
    """Optional capabilities a pool (or its allocator) may declare."""

    OFFLOAD = "offload"
    MLA = "mla"
    INDEXER = "indexer"
    SLIDING_WINDOW = "sliding-window"
    MAMBA_STATE = "mamba-state"
    HISPARSE = "hisparse"
    PAGED = "paged"

    def __str__(self) -> str:
        return self.value


#: Which Protocol the pool class (P) or the allocator class (A) must satisfy per capability.
CAPABILITY_PROTOCOLS: Mapping[Capability, tuple[str, type]] = MappingProxyType(
    {
        Capability.OFFLOAD: ("pool", OffloadablePool),
        Capability.MLA: ("pool", MLAPool),
        Capability.INDEXER: ("pool", IndexerKeyPool),
        Capability.SLIDING_WINDOW: ("pool", SlidingWindowPool),
        Capability.MAMBA_STATE: ("pool", MambaStatePool),
        Capability.HISPARSE: ("pool", HiSparsePool),
        Capability.PAGED: ("allocator", PagedAllocator),
    }
)

#: Protocols every spec is checked against regardless of its capabilities.
BASE_PROTOCOLS: Mapping[str, type] = MappingProxyType({"pool": KVPool, "allocator": TokenAllocator})


def _as_device(value: str | torch.device) -> torch.device:
    return value if isinstance(value, torch.device) else torch.device(value)


@dataclass(frozen=True)
class PoolConfig:
    """Everything an engine tells a pool factory. Common fields first, then per-kind ones.

    ``size`` counts usable token slots (slot 0 is extra). For Mamba state, ``mamba_size`` counts
    request slots. ``options`` carries third-party, plugin-specific settings.
    """

    size: int
    layer_num: int
    head_num: int = 1
    head_dim: int = 64
    page_size: int = 1
    dtype: torch.dtype = torch.bfloat16
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    v_head_dim: int | None = None
    start_layer: int = 0
    # MLA / DSA / HiSparse
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    index_head_dim: int | None = None
    hisparse_ratio: int = 2
    # SWA
    swa_layer_ids: tuple[int, ...] = ()
    swa_size: int | None = None
    swa_head_num: int | None = None
    swa_head_dim: int | None = None
    # Mamba
    mamba_layer_ids: tuple[int, ...] = ()
    mamba_size: int | None = None
    conv_state_shapes: tuple[tuple[int, ...], ...] = ()
    temporal_state_shape: tuple[int, ...] | None = None
    mamba_dtype: torch.dtype | None = None
    # Range-checking write slots reads them back, which synchronises an accelerator. None means
    # "on for CPU pools, off elsewhere"; shape and dtype checks always run.
    validate_write_slots: bool | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", _as_device(self.device))
        object.__setattr__(self, "swa_layer_ids", tuple(self.swa_layer_ids))
        object.__setattr__(self, "mamba_layer_ids", tuple(self.mamba_layer_ids))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        for name in ("size", "layer_num", "head_num", "head_dim", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"PoolConfig.{name} must be a positive int, got {value!r}")
        if self.start_layer < 0:
            raise ValueError(f"PoolConfig.start_layer must be >= 0, got {self.start_layer}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"PoolConfig.dtype must be a torch.dtype, got {self.dtype!r}")

    @property
    def checks_write_slots(self) -> bool:
        """Whether pools built from this config range-check every write's slots."""
        if self.validate_write_slots is not None:
            return self.validate_write_slots
        return self.device.type == "cpu"


#: A factory turns a config into a ready pool and its allocator.
PoolFactory = Callable[[PoolConfig], "tuple[Any, Any]"]


@dataclass(frozen=True)
class PoolSpec:
    """What a plugin declares for one pool kind it provides."""

    name: str
    pool_class: type
    allocator_class: type
    factory: PoolFactory
    capabilities: frozenset[Capability] = frozenset()
    contract_version: int = CONTRACT_VERSION
    description: str = ""
    #: The config the behaviour battery builds this pool with; None picks a small CPU config
    #: that fits the declared capabilities (see ``kvcache check --level behaviour``).
    behaviour_config: PoolConfig | None = field(default=None, compare=False)
    #: Behaviour checks this pool is known to fail, by check id, each with its reason. A check
    #: listed here that passes is reported, so the list cannot outlive the bug.
    expected_failures: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"PoolSpec.name must be a simple identifier, got {self.name!r}")
        object.__setattr__(
            self, "capabilities", frozenset(Capability(c) for c in self.capabilities)
        )
        if not callable(self.factory):
            raise TypeError(f"PoolSpec.factory of {self.name!r} is not callable")
        if self.behaviour_config is not None and not isinstance(self.behaviour_config, PoolConfig):
            raise TypeError(f"PoolSpec.behaviour_config of {self.name!r} must be a PoolConfig")
        for check_id, reason in dict(self.expected_failures).items():
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(
                    f"PoolSpec.expected_failures of {self.name!r}: check {check_id!r} needs a "
                    "reason (why it fails, and where that is tracked)"
                )
        object.__setattr__(
            self, "expected_failures", MappingProxyType(dict(self.expected_failures))
        )
