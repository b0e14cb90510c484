"""Which discovered pool serves a model's continuous batching, and the checks made before use.

Kept apart from the cache so that every refusal (a pool that cannot offload, a kind that holds
no per-head keys and values, a sliding-only model) is raised in the caller's thread, before
transformers starts its generation thread or allocates anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..contracts import Capability, PoolSpec
from ..discovery import Registry, discover
from ..errors import KVCacheError, UnknownPoolError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

#: Capabilities a pool may declare and still hold plain per-head K/V rows for every layer.
_KV_CAPABILITIES = frozenset({Capability.OFFLOAD, Capability.PAGED, Capability.SLIDING_WINDOW})


@dataclass(frozen=True)
class PoolChoice:
    """The pool a batching run uses: its registry name and spec, and the model's layer groups."""

    name: str
    spec: PoolSpec
    registry: Registry
    groups: Mapping[str, tuple[int, ...]]

    @property
    def windowed(self) -> bool:
        """Whether the pool keeps the sliding layers in its own window slots."""
        return Capability.SLIDING_WINDOW in self.spec.capabilities and bool(
            self.groups.get(SLIDING_ATTENTION)
        )


def layer_groups(
    layer_types: Sequence[str] | None, num_layers: int, sliding_window: object
) -> dict[str, tuple[int, ...]]:
    """Layer ids by attention type, as transformers' paged cache groups them.

    A config without ``layer_types`` is all sliding when it names a window and all full
    otherwise; any other layer type (linear attention, Mamba, ...) has no paged-cache group in
    transformers' continuous batching and is refused by name.
    """
    if layer_types is None:
        kind = SLIDING_ATTENTION if sliding_window is not None else FULL_ATTENTION
        return {kind: tuple(range(num_layers))}
    groups: dict[str, list[int]] = {}
    for layer_id, kind in enumerate(layer_types):
        if kind not in (FULL_ATTENTION, SLIDING_ATTENTION):
            raise KVCacheError(
                f"layer {layer_id} has type {kind!r}: continuous batching on kvcache pools serves "
                f"only {FULL_ATTENTION!r} and {SLIDING_ATTENTION!r} layers"
            )
        groups.setdefault(kind, []).append(layer_id)
    return {kind: tuple(ids) for kind, ids in groups.items()}


def _serves_attention(spec: PoolSpec) -> bool:
    return spec.capabilities <= _KV_CAPABILITIES and Capability.OFFLOAD in spec.capabilities


def choose_pool(
    groups: Mapping[str, tuple[int, ...]],
    pool: str | None,
    registry: Registry | None,
    *,
    block_size: int,
) -> PoolChoice:
    """The pool to use: ``pool`` by name, or one picked from the layer groups by capability.

    Sliding layers present: a pool declaring ``sliding-window`` (``swa`` first); otherwise an
    MHA-kind pool (``mha`` first): one that declares ``offload`` and nothing beyond ``paged``.
    Every choice must declare ``offload`` (block pressure moves requests out through it) and,
    for ``block_size > 1``, ``paged`` (pages of ``block_size`` slots).

    :raises KVCacheError: The model has only sliding layers, or no pool fits.
    :raises UnknownPoolError: ``pool`` names no accepted pool.
    """
    if FULL_ATTENTION not in groups:
        raise KVCacheError(
            "every layer of this model is a sliding-window layer: transformers budgets such a "
            "model by its window alone, while a kvcache pool keeps a full-attention slot for "
            "every token, so block pressure could not be matched; not supported yet"
        )
    reg = registry if registry is not None else discover()
    if pool is not None:
        spec = reg.spec(pool)
        _check_spec(pool, spec, block_size=block_size)
        return PoolChoice(pool, spec, reg, dict(groups))
    wants_window = bool(groups.get(SLIDING_ATTENTION))
    preferred = "swa" if wants_window else "mha"
    names = sorted(reg.names(), key=lambda n: (n != preferred, n))
    for name in names:
        spec = reg.spec(name)
        if not _serves_attention(spec):
            continue
        if wants_window != (Capability.SLIDING_WINDOW in spec.capabilities):
            continue
        if block_size > 1 and Capability.PAGED not in spec.capabilities:
            continue
        return PoolChoice(name, spec, reg, dict(groups))
    kind = "a sliding-window" if wants_window else "an MHA-kind"
    raise UnknownPoolError(
        f"no accepted pool is {kind} pool with the offload capability"
        f"{' and paged allocation' if block_size > 1 else ''}; accepted: "
        f"{', '.join(reg.names()) or 'none'}"
    )


def _check_spec(name: str, spec: PoolSpec, *, block_size: int) -> None:
    missing = []
    if Capability.OFFLOAD not in spec.capabilities:
        missing.append("offload (block pressure moves requests to the host through it)")
    if block_size > 1 and Capability.PAGED not in spec.capabilities:
        missing.append(f"paged (block_size {block_size} needs pages of that many slots)")
    if missing:
        raise KVCacheError(f"pool {name!r} lacks the capability " + "; ".join(missing))
    extra = sorted(str(c) for c in spec.capabilities - _KV_CAPABILITIES)
    if extra:
        raise KVCacheError(
            f"pool {name!r} declares {', '.join(extra)}: its layers do not hold per-head keys "
            "and values, which transformers' paged attention reads"
        )
