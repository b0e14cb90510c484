"""``get_kv_size_bytes()`` is the bytes the pool really holds for its tokens.

What "really holds" means (docs/contract.md says the same): the storage of every per-token-slot
buffer the pool allocates. That is every distinct storage behind ``get_key_buffer`` /
``get_value_buffer`` of every attention layer, the indexer keys and scales (``indexer``), and
any private per-token store (HiSparse's logical latent store). Not counted: Mamba request state
(a hybrid pool shares it with the engine's request-to-token pool; ``MambaPool`` reports it as
``get_state_size_bytes()``), slot tables and allocator bookkeeping.

How it is checked without knowing the pool's layout: a lower bound from what the contract lets a
caller reach (getter storages, deduplicated by storage pointer, since views of one storage,
such as an MLA value inside its key row or all layers in one tensor, are held once; plus the
indexer's per-token bytes times the rows; a getter result whose storage the pool does not hold
is a copy, which the contract allows for a quantised pool's dequantised buffer, and counts as
half a byte per value, the least any quantised store keeps), and an upper bound from every
tensor storage reachable from the pool object, minus the Mamba state. An engine sizes its
memory budget with this number: under-counting over-commits the device, over-counting wastes
it.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch

from ....contracts.spec import Capability
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext
from .._state import attention_layer_ids

__all__ = ["reachable_storages"]

_HINT = (
    "return an int: the bytes of every per-token buffer (K and V of every layer, indexer keys "
    "and scales, any private per-token store), each storage once; not Mamba state or tables"
)

_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def reachable_storages(root: object, *, depth: int = 8) -> dict[int, int]:
    """``{storage pointer: bytes}`` of every tensor reachable from ``root``'s attributes,
    containers included (each storage once)."""
    found: dict[int, int] = {}
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack:
        obj, level = stack.pop()
        if id(obj) in seen or level > depth or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
            continue
        if isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
            continue
        children: list[object] = []
        if isinstance(obj, Mapping):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            for slot in getattr(type(obj), "__slots__", ()):
                if isinstance(slot, str) and hasattr(obj, slot):
                    children.append(getattr(obj, slot))
        stack.extend((child, level + 1) for child in children)
    return found


def _lower_bound_source(ctx: CheckContext) -> list[str]:
    """Source computing ``held`` (bytes the contract's getters reach) into the namespace."""
    layers = attention_layer_ids(ctx.config)
    lines = [
        "from kvcache_core.conformance.behaviour.checks.size import reachable_storages",
        "pool_holds = reachable_storages(pool)",
        "storages, copies = {}, 0",
        f"for layer_id in {layers}:",
        "    for buf in pool.get_kv_buffer(layer_id):",
        "        storage = buf.untyped_storage()",
        "        if storage.data_ptr() in pool_holds:",
        "            storages[storage.data_ptr()] = storage.nbytes()",
        "        else:  # a copy (a quantised pool's dequantised buffer): >= 4 bits a value",
        "            copies += buf.numel() // 2",
        "held = sum(storages.values()) + copies",
    ]
    if Capability.INDEXER in ctx.capabilities:
        lines += [
            "# the indexer getter returns copies: its bytes per token times the rows",
            f"for layer_id in {layers}:",
            "    keys, scales = pool.get_index_k_scale_buffer(layer_id, torch.tensor([1]))",
            "    per_token = keys[0].numel() * keys.element_size()",
            "    per_token += scales[0].numel() * scales.element_size()",
            "    held += per_token * (pool.size + pool.page_size)",
        ]
    return lines


@behaviour_check("kv-size-bytes", hint=_HINT)
def kv_size_bytes(ctx: CheckContext) -> None:
    """``get_kv_size_bytes()`` is an int between the bytes the getters reach and the bytes
    the pool object holds (Mamba state excluded)."""
    pool, _ = ctx.build()
    steps = ["reported = pool.get_kv_size_bytes()"]
    ns: dict[str, Any] = {"torch": torch, "pool": pool}
    exec(compile(steps[0], "<kv-size-bytes>", "exec"), ns)
    reported = ns["reported"]
    if not isinstance(reported, int) or isinstance(reported, bool):
        steps.append("assert type(reported) is int, type(reported)")
        raise BehaviourFailure(
            f"get_kv_size_bytes() returned {type(reported).__name__} {reported!r}, not an int",
            reproduction=ctx.reproduction(steps),
        )
    lower = _lower_bound_source(ctx)
    exec(compile("\n".join(lower), "<kv-size-bytes lower bound>", "exec"), ns)
    held = int(ns["held"])
    if reported < held:
        steps += lower
        steps.append(
            "assert reported >= held, f'get_kv_size_bytes() is {reported}; "
            "the getters alone reach {held} bytes'"
        )
        raise BehaviourFailure(
            f"get_kv_size_bytes() is {reported} but the buffers it must count hold at least "
            f"{held} bytes ({len(ns['storages'])} distinct K/V storage(s) of layers "
            f"{attention_layer_ids(ctx.config)}"
            + (", plus indexer keys and scales" if Capability.INDEXER in ctx.capabilities else "")
            + f"): under-counted by {held - reported}",
            reproduction=ctx.reproduction(steps),
        )
    storages = reachable_storages(pool)
    excluded = 0
    if Capability.MAMBA_STATE in ctx.capabilities:
        for layer in ctx.config.mamba_layer_ids:
            conv, temporal = pool.get_mamba_state(layer)
            for t in (*conv, temporal):
                ptr = t.untyped_storage().data_ptr()
                if ptr in storages:
                    excluded += storages.pop(ptr)
    ceiling = sum(storages.values())
    if reported > ceiling:
        steps += [
            "from kvcache_core.conformance.behaviour.checks.size import reachable_storages",
            "ceiling = sum(reachable_storages(pool).values())",
            "assert reported <= ceiling, f'get_kv_size_bytes() is {reported}; "
            "every tensor the pool holds is {ceiling} bytes'",
        ]
        extra = f" ({excluded} bytes of Mamba state left out)" if excluded else ""
        raise BehaviourFailure(
            f"get_kv_size_bytes() is {reported} but every tensor storage the pool holds "
            f"adds up to {ceiling} bytes{extra}: over-counted by {reported - ceiling}",
            reproduction=ctx.reproduction(steps),
        )
