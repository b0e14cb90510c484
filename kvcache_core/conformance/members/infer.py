"""Which contract Protocols a class claims, inferred from the methods it defines.

Used for targets that declare nothing (a path, or ``module:Class`` without ``--against``). The
rule mirrors how engines decide what a pool can do: they probe with ``hasattr``. So a class that
*defines* ``get_cpu_copy`` claims offload, even if that method only raises
``NotImplementedError`` (which is exactly the drift the not-implemented rule reports). Classes
that cannot be served are never inferred: Protocols themselves, and abstract classes (an ``ABC``
base, ``ABCMeta``, or an ``@abstractmethod``).

``OffloadablePool`` extends ``KVPool``, so it is only inferred for a class that has a KV buffer
method too; a state sub-component with offload methods is not inferred to be a pool.

A class that subclasses a contract Protocol explicitly claims it, whatever it defines.

Allocators are told from pools by ``alloc``: an allocator also has ``get_cpu_copy``, and must be
checked as a ``TokenAllocator``, not as an ``OffloadablePool``.
"""

from __future__ import annotations

from .methods import PROTOCOL_ORDER
from .sources import ClassSource, SourceIndex

__all__ = ["declared_protocols", "defined_methods", "infer_protocols"]

_CONTRACTS = "kvcache_core.contracts"

_ALLOCATOR_HINTS = frozenset(
    {
        "get_kvcache",
        "get_cpu_copy",
        "load_cpu_copy",
        "free_group_begin",
        "free_group_end",
        "backup_state",
        "restore_state",
    }
)

#: (Protocol, methods whose presence claims it), pools only, in report order.
_POOL_CLAIMS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "KVPool",
        frozenset(
            {
                "get_key_buffer",
                "get_value_buffer",
                "get_kv_buffer",
                "set_kv_buffer",
                "get_kv_size_bytes",
            }
        ),
    ),
    ("OffloadablePool", frozenset({"get_cpu_copy", "load_cpu_copy"})),
    ("MLAPool", frozenset({"set_mla_kv_buffer", "get_mla_kv_buffer"})),
    ("IndexerKeyPool", frozenset({"set_index_k_scale_buffer", "get_index_k_scale_buffer"})),
    ("SlidingWindowPool", frozenset({"register_mapping", "translate_loc_from_full_to_swa"})),
    (
        "HiSparsePool",
        frozenset({"register_logical_to_device", "translate_loc_to_device", "load_to_device"}),
    ),
    ("MambaStatePool", frozenset({"get_mamba_state", "clear_slots", "copy_slots"})),
)


def defined_methods(index: SourceIndex, cls: ClassSource) -> set[str]:
    """Method names ``cls`` has along its MRO, Protocol stubs excluded."""
    names: set[str] = set()
    for klass in index.mro(cls):
        if isinstance(klass, ClassSource) and not klass.is_protocol:
            names.update(klass.methods)
    return names


def declared_protocols(index: SourceIndex, cls: ClassSource) -> list[str]:
    """Contract Protocols ``cls`` subclasses explicitly (a declaration, whatever it defines)."""
    return [
        k.name
        for k in index.mro(cls)[1:]
        if isinstance(k, ClassSource)
        and k.is_protocol
        and k.module.name.startswith(_CONTRACTS)
        and k.name in PROTOCOL_ORDER
    ]


def infer_protocols(index: SourceIndex, cls: ClassSource) -> tuple[str, ...]:
    """The Protocols ``cls`` claims; empty for classes that are not pools or allocators."""
    if cls.is_protocol or cls.is_abstract:
        return ()
    declared = declared_protocols(index, cls)
    inferred = _inferred(index, cls)
    return tuple(dict.fromkeys([*inferred, *declared]))


def _inferred(index: SourceIndex, cls: ClassSource) -> tuple[str, ...]:
    has = defined_methods(index, cls)
    if "alloc" in has:
        if not has & _ALLOCATOR_HINTS:
            return ("MambaSlotAllocator",)
        claimed = ["TokenAllocator"]
        if has & {"alloc_extend", "alloc_decode"}:
            claimed.append("PagedAllocator")
        if has & {"free_swa", "swa_available_size", "full_available_size"}:
            claimed.append("SWAAllocator")
        return tuple(claimed)
    claimed = [name for name, methods in _POOL_CLAIMS if has & methods]
    if "OffloadablePool" in claimed and "KVPool" not in claimed:
        # Offload methods on a class with no KV buffer (a Mamba state sub-pool): a component,
        # not a pool an engine is handed. Its offload is checked through its composite, or
        # explicitly with --against OffloadablePool.
        claimed.remove("OffloadablePool")
    return tuple(claimed)
