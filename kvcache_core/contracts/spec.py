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

from .allocator import PagedAllocator, SWAAllocator, TokenAllocator
from .history import CONTRACT_VERSION
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
    "CAPABILITY_COMPANION_PROTOCOLS",
    "CAPABILITY_PROTOCOLS",
    "CONTRACT_VERSION",
    "Capability",
    "PoolConfig",
    "PoolFactory",
    "PoolSpec",
    "declared_protocols",
]


class Capability(str, enum.Enum):
    """Optional capabilities a pool (or its allocator) may declare.

    Each one names a Protocol that discovery and the checker then hold the class to, on top of
    [`KVPool`][kvcache_core.KVPool] and [`TokenAllocator`][kvcache_core.TokenAllocator]:
    ``offload`` -> [`OffloadablePool`][kvcache_core.OffloadablePool],
    ``mla`` -> [`MLAPool`][kvcache_core.MLAPool],
    ``indexer`` -> [`IndexerKeyPool`][kvcache_core.IndexerKeyPool],
    ``sliding-window`` -> [`SlidingWindowPool`][kvcache_core.SlidingWindowPool],
    ``mamba-state`` -> [`MambaStatePool`][kvcache_core.MambaStatePool],
    ``hisparse`` -> [`HiSparsePool`][kvcache_core.HiSparsePool], and ``paged`` ->
    [`PagedAllocator`][kvcache_core.PagedAllocator] (on the allocator). Declaring a capability
    is what lets an engine rely on it without probing the object. A ``str`` enum, so specs and
    configuration files may spell a capability by its value.
    """

    OFFLOAD = "offload"
    """Copies slots to the host and back: [`OffloadablePool`][kvcache_core.OffloadablePool]."""
    MLA = "mla"
    """Latent reads and writes: [`MLAPool`][kvcache_core.MLAPool]."""
    INDEXER = "indexer"
    """DSA indexer keys and scales: [`IndexerKeyPool`][kvcache_core.IndexerKeyPool]."""
    SLIDING_WINDOW = "sliding-window"
    """Window layers with their own slots: [`SlidingWindowPool`][kvcache_core.SlidingWindowPool]."""
    MAMBA_STATE = "mamba-state"
    """Per-request recurrent state: [`MambaStatePool`][kvcache_core.MambaStatePool]."""
    HISPARSE = "hisparse"
    """A device-resident subset of logical slots: [`HiSparsePool`][kvcache_core.HiSparsePool]."""
    PAGED = "paged"
    """The allocator is page-aware: [`PagedAllocator`][kvcache_core.PagedAllocator]."""

    def __str__(self) -> str:
        """The value (``"paged"``), as specs and configuration files spell it."""
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

#: What a capability also requires of the spec's *other* class: a sliding window is released
#: through the allocator (``free_swa``, and the full->window table lives there), so
#: ``sliding-window`` holds the allocator to [`SWAAllocator`][kvcache_core.SWAAllocator] as
#: well as the pool to [`SlidingWindowPool`][kvcache_core.SlidingWindowPool]. Without it a pool
#: whose allocator lacks ``free_swa`` would be accepted and an engine would never release a
#: window slot.
CAPABILITY_COMPANION_PROTOCOLS: Mapping[Capability, tuple[str, type]] = MappingProxyType(
    {Capability.SLIDING_WINDOW: ("allocator", SWAAllocator)}
)


def declared_protocols(capabilities: frozenset[Capability]) -> dict[str, list[type]]:
    """``{"pool": [...], "allocator": [...]}``: every Protocol a spec declaring
    ``capabilities`` must satisfy, by the role of the class that must satisfy it (the base
    Protocols first, then each capability's, in sorted capability order, its companion after
    it). Discovery, ``kvcache check`` and the engine all read this one answer."""
    out: dict[str, list[type]] = {role: [proto] for role, proto in BASE_PROTOCOLS.items()}
    for capability in sorted(capabilities):
        for entry in (
            CAPABILITY_PROTOCOLS[capability],
            CAPABILITY_COMPANION_PROTOCOLS.get(capability),
        ):
            if entry is not None and entry[1] not in out[entry[0]]:
                out[entry[0]].append(entry[1])
    return out


#: Protocols every spec is checked against regardless of its capabilities.
BASE_PROTOCOLS: Mapping[str, type] = MappingProxyType({"pool": KVPool, "allocator": TokenAllocator})


def _as_device(value: str | torch.device) -> torch.device:
    return value if isinstance(value, torch.device) else torch.device(value)


@dataclass(frozen=True)
class PoolConfig:
    """Everything an engine tells a pool factory. Common fields first, then per-kind ones.

    One frozen record for every pool kind, so an engine builds any pool the same way: fields a
    kind does not use are ignored by it. The constructor validates what every kind needs.

    :param size: Usable token slots (buffers get ``size + page_size`` rows: slot 0 is padding).
    :param layer_num: Layers this pool holds, starting at ``start_layer``.
    :param head_num: KV heads per token.
    :param head_dim: Key head size.
    :param page_size: Slots per page; allocators hand out whole pages.
    :param dtype: Compute dtype; fp8 dtypes are stored as uint8
        (see [`storage_dtype`][kvcache_core.storage_dtype]).
    :param device: Where the buffers live; a string such as ``"cuda:0"`` is converted.
    :param v_head_dim: Value head size, when it differs from ``head_dim``.
    :param start_layer: Global id of the first layer (pipeline stages hold a slice).
    :param kv_lora_rank: MLA/DSA/HiSparse: latent ("nope") width.
    :param qk_rope_head_dim: MLA/DSA/HiSparse: rope width.
    :param index_head_dim: DSA: indexer key width.
    :param hisparse_ratio: HiSparse: logical slots per device slot.
    :param swa_layer_ids: SWA: global ids of the sliding-window layers.
    :param swa_size: SWA: window-side slots.
    :param swa_head_num: SWA: window layers' KV heads, when they differ.
    :param swa_head_dim: SWA: window layers' head size, when it differs.
    :param mamba_layer_ids: Mamba: global ids of the recurrent layers.
    :param mamba_size: Mamba: request slots (not token slots).
    :param conv_state_shapes: Mamba: per-request shape of each conv state.
    :param temporal_state_shape: Mamba: per-request shape of the temporal state.
    :param mamba_dtype: Mamba: state dtype (default ``dtype``).
    :param validate_write_slots: Range-check every write's slots. Doing so reads them back,
        which synchronises an accelerator, so None means on for CPU pools, off elsewhere; shape
        and dtype checks always run.
    :param options: Third-party, plugin-specific settings (frozen on construction).
    :raises ValueError: A common size field is not a positive int, or ``start_layer`` < 0.
    :raises TypeError: ``dtype`` is not a ``torch.dtype``.
    """

    size: int
    """Usable token slots (buffers get ``size + page_size`` rows: slot 0 is padding)."""
    layer_num: int
    """Layers this pool holds, starting at ``start_layer``."""
    head_num: int = 1
    """KV heads per token."""
    head_dim: int = 64
    """Key head size."""
    page_size: int = 1
    """Slots per page; allocators hand out whole pages."""
    dtype: torch.dtype = torch.bfloat16
    """Compute dtype; fp8 dtypes are stored as uint8 (see
    [`storage_dtype`][kvcache_core.storage_dtype]).
    """
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the buffers live; a string such as ``"cuda:0"`` is converted."""
    v_head_dim: int | None = None
    """Value head size, when it differs from ``head_dim``."""
    start_layer: int = 0
    """Global id of the first layer (pipeline stages hold a slice)."""
    # MLA / DSA / HiSparse
    kv_lora_rank: int | None = None
    """MLA/DSA/HiSparse: latent ("nope") width."""
    qk_rope_head_dim: int | None = None
    """MLA/DSA/HiSparse: rope width."""
    index_head_dim: int | None = None
    """DSA: indexer key width."""
    hisparse_ratio: int = 2
    """HiSparse: logical slots per device slot."""
    # SWA
    swa_layer_ids: tuple[int, ...] = ()
    """SWA: global ids of the sliding-window layers."""
    swa_size: int | None = None
    """SWA: window-side slots."""
    swa_head_num: int | None = None
    """SWA: window layers' KV heads, when they differ."""
    swa_head_dim: int | None = None
    """SWA: window layers' head size, when it differs."""
    # Mamba
    mamba_layer_ids: tuple[int, ...] = ()
    """Mamba: global ids of the recurrent layers."""
    mamba_size: int | None = None
    """Mamba: request slots (not token slots)."""
    conv_state_shapes: tuple[tuple[int, ...], ...] = ()
    """Mamba: per-request shape of each conv state."""
    temporal_state_shape: tuple[int, ...] | None = None
    """Mamba: per-request shape of the temporal state."""
    mamba_dtype: torch.dtype | None = None
    """Mamba: state dtype (default ``dtype``)."""
    validate_write_slots: bool | None = None
    """Range-check every write's slots. Doing so reads them back, which synchronises an accelerator,
    so None means on for CPU pools, off elsewhere; shape and dtype checks always run.
    """
    options: Mapping[str, Any] = field(default_factory=dict)
    """Third-party, plugin-specific settings (frozen on construction)."""

    def __post_init__(self) -> None:
        """Normalise (device strings, tuples, a frozen ``options``) and validate the common
        fields; see the class's raises."""
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
    """What a plugin declares for one pool kind it provides: returned by its
    ``kvcache_pool_specs()`` hook (see [`hookimpl`][kvcache_core.hookimpl]).

    The spec names the classes rather than only a factory so that discovery and the checker
    can validate signatures *before* anything is built, and an engine never meets a pool whose
    offload or write methods drifted.

    :param name: The pool's name in the registry (letters, digits, ``-`` and ``_``).
    :param pool_class: The pool class, checked against [`KVPool`][kvcache_core.KVPool] and the
        Protocols of ``capabilities``.
    :param allocator_class: The allocator class, checked against
        [`TokenAllocator`][kvcache_core.TokenAllocator] (and ``PagedAllocator`` with ``paged``).
    :param factory: Builds ``(pool, allocator)`` from a [`PoolConfig`][kvcache_core.PoolConfig].
    :param capabilities: [`Capability`][kvcache_core.Capability] values (or their strings).
    :param contract_version: The contract the classes were written against.
    :param description: One line for ``kvcache list``.
    :param behaviour_config: The config the behaviour battery builds this pool with.
    :param expected_failures: Behaviour checks this pool is known to fail, with reasons.
    :raises ValueError: A bad ``name``, or an expected failure without a reason.
    :raises TypeError: ``factory`` is not callable or ``behaviour_config`` is not a config.
    """

    name: str
    """The pool's name in the registry (letters, digits, ``-`` and ``_``)."""
    pool_class: type
    """The pool class, checked against [`KVPool`][kvcache_core.KVPool] and the Protocols of
    ``capabilities``.
    """
    allocator_class: type
    """The allocator class, checked against [`TokenAllocator`][kvcache_core.TokenAllocator] (and
    ``PagedAllocator`` with ``paged``).
    """
    factory: PoolFactory
    """Builds ``(pool, allocator)`` from a [`PoolConfig`][kvcache_core.PoolConfig]."""
    capabilities: frozenset[Capability] = frozenset()
    """[`Capability`][kvcache_core.Capability] values (or their strings)."""
    contract_version: int = CONTRACT_VERSION
    """The contract the classes were written against."""
    description: str = ""
    """One line for ``kvcache list``."""
    behaviour_config: PoolConfig | None = field(default=None, compare=False)
    """The config the behaviour battery builds this pool with; None picks a small CPU config
    that fits the declared capabilities (see ``kvcache check --level behaviour``)."""
    expected_failures: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Behaviour checks this pool is known to fail, by check id, each with its reason. A check
    listed here that passes is reported, so the list cannot outlive the bug."""

    def __post_init__(self) -> None:
        """Validate the name, the factory, the behaviour config and every expected failure's
        reason; normalise capabilities to [`Capability`][kvcache_core.Capability] values."""
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
