"""Which discovered pool serves a transformers model, decided by capabilities, never by name.

One module for both ways transformers runs on kvcache pools, because both ask the same
question of the same registry: which accepted pool holds what this model's layers cache, and
can move a request to the host and back?

* ``model.generate`` on a [`KVPoolCache`][kvcache_core.integrations.transformers.KVPoolCache]:
  the model's probed layer kinds (see ``_hf_layout``) say what a pool must be able to do
  (``required_capabilities``): full attention only needs offload (retraction); sliding + full
  needs ``sliding-window``; an MLA latent needs ``mla``; Mamba hybrids need ``mamba-state``;
  ``page_size > 1`` also needs ``paged``. A pool named by the caller is held to those
  capabilities; without a name, the accepted pool with the fewest capabilities beyond them
  (and none that change the buffer layout the integration reads) is chosen
  (``choose_pool_for_layout``), and ``pool_config`` builds its config.
* Continuous batching (``generate_batch``): transformers' paged cache groups layers by
  ``layer_types`` (``layer_groups``); its paged attention reads plain per-head keys and
  values, so the pool may declare nothing beyond ``offload``, ``paged`` and
  ``sliding-window`` (``choose_batching_pool``). Every refusal is raised in the caller's
  thread, before transformers starts its generation thread or allocates anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from ..contracts.spec import Capability, PoolConfig, PoolSpec
from ..discovery import Registry, discover
from ..errors import KVCacheError, UnknownPoolError
from ._hf_layout import LayerKind, ModelLayout, UnsupportedLayerError

__all__ = [
    "FULL_ATTENTION",
    "SLIDING_ATTENTION",
    "MissingCapabilityError",
    "PoolChoice",
    "PoolNeeds",
    "choose_batching_pool",
    "choose_pool_for_layout",
    "layer_groups",
    "pool_config",
    "required_capabilities",
]

#: Capabilities that change what a pool's buffers mean, so that reading them as plain per-slot
#: rows would be wrong (HiSparse keeps only a device-resident subset) or that serve a layer
#: kind the model does not have. A default choice avoids pools declaring any the model does
#: not need; a named pool is refused only for ``hisparse``.
_LAYOUT_CAPABILITIES = frozenset(
    {
        Capability.MLA,
        Capability.INDEXER,
        Capability.SLIDING_WINDOW,
        Capability.MAMBA_STATE,
        Capability.HISPARSE,
    }
)


class MissingCapabilityError(KVCacheError, ValueError):
    """The chosen (or named) pool lacks a capability the model's layers need."""


# -- model.generate on a KVPoolCache -------------------------------------------------------


@dataclass(frozen=True)
class PoolNeeds:
    """The pool kind a model needs: its capabilities and why (for error messages)."""

    needs: frozenset[Capability]
    why: dict[Capability, str]


def required_capabilities(layout: ModelLayout, page_size: int) -> PoolNeeds:
    """What a pool must declare to serve ``layout`` (see the module docstring).

    :raises UnsupportedLayerError: The combination of layer kinds maps to no pool kind.
    """
    kinds = layout.kinds
    why: dict[Capability, str] = {Capability.OFFLOAD: "retraction offloads rows to the host"}
    if page_size > 1:
        why[Capability.PAGED] = f"page_size={page_size} allocates with alloc_extend/alloc_decode"
    if kinds <= {LayerKind.FULL} or kinds == {LayerKind.SLIDING}:
        pass  # an MHA-kind pool (a sliding-only model keeps every token there)
    elif kinds == {LayerKind.FULL, LayerKind.SLIDING}:
        ids = [p.index for p in layout.of_kind(LayerKind.SLIDING)]
        why[Capability.SLIDING_WINDOW] = f"layers {ids} are sliding-window layers"
    elif kinds == {LayerKind.MLA}:
        why[Capability.MLA] = "every layer caches an MLA latent"
    elif kinds == {LayerKind.FULL, LayerKind.MAMBA}:
        ids = [p.index for p in layout.of_kind(LayerKind.MAMBA)]
        why[Capability.MAMBA_STATE] = f"layers {ids} keep Mamba state"
    elif kinds == {LayerKind.MAMBA}:
        raise UnsupportedLayerError(
            "every layer that caches keeps Mamba / linear-attention state and none attention "
            "KV: no pool kind serves a recurrent-only model here (the mamba pool pairs request "
            "state with attention KV)"
        )
    else:
        names = ", ".join(sorted(k.value for k in kinds))
        raise UnsupportedLayerError(
            f"no pool kind serves a model mixing {names} layers (supported: full attention, "
            "full + sliding-window, MLA latent only, full attention + Mamba)"
        )
    return PoolNeeds(frozenset(why), why)


def choose_pool_for_layout(registry: Registry, name: str | None, choice: PoolNeeds) -> str:
    """The accepted pool to build: ``name`` checked against ``choice``, or the best match.

    :raises UnknownPoolError: ``name`` is not an accepted pool.
    :raises MissingCapabilityError: The named pool lacks a needed capability, is a HiSparse
        pool, or no accepted pool declares what the model needs.
    """
    if name is not None:
        spec = registry.spec(name)
        _check_named(spec, choice)
        return name
    candidates: list[tuple[int, str]] = []
    for pool_name in registry.names():
        caps = registry.spec(pool_name).capabilities
        if choice.needs <= caps and not (caps - choice.needs) & _LAYOUT_CAPABILITIES:
            candidates.append((len(caps - choice.needs), pool_name))
    if not candidates:
        wanted = ", ".join(sorted(c.value for c in choice.needs))
        raise MissingCapabilityError(
            f"no accepted pool declares the capabilities this model needs ({wanted}); accepted: "
            f"{', '.join(registry.names()) or 'none'}"
        )
    return min(candidates)[1]


def _check_named(spec: PoolSpec, choice: PoolNeeds) -> None:
    missing = sorted(choice.needs - spec.capabilities, key=lambda c: c.value)
    if missing:
        reasons = "; ".join(f"{c.value} ({choice.why[c]})" for c in missing)
        raise MissingCapabilityError(
            f"pool {spec.name!r} lacks capabilities the model needs: {reasons}"
        )
    if Capability.HISPARSE in spec.capabilities:
        raise MissingCapabilityError(
            f"pool {spec.name!r} is a HiSparse pool: its buffers hold only a device-resident "
            "subset of the slots, which transformers' attention cannot read as it is"
        )


def _one(values: set[tuple[int, ...]], what: str) -> tuple[int, ...]:
    if len(values) != 1:
        raise UnsupportedLayerError(
            f"layers differ in {what} ({sorted(values)}); a pool stores one geometry per side"
        )
    return next(iter(values))


def pool_config(
    layout: ModelLayout,
    *,
    size: int,
    page_size: int,
    max_batch: int,
    device: torch.device,
) -> PoolConfig:
    """The [`PoolConfig`][kvcache_core.PoolConfig] every pool kind the layout maps to reads.

    One config for every kind (kinds ignore the fields they do not use): the layer geometry,
    ``swa_layer_ids`` and the window side's geometry, the MLA widths, the Mamba layers with
    ``max_batch`` request slots and their state shapes.
    """
    full = layout.of_kind(LayerKind.FULL)
    sliding = layout.of_kind(LayerKind.SLIDING)
    mla = layout.of_kind(LayerKind.MLA)
    mamba = layout.of_kind(LayerKind.MAMBA)
    config = PoolConfig(
        size=size,
        layer_num=len(layout.layers),
        page_size=page_size,
        dtype=layout.dtype,
        device=device,
        # The integration hands the pool only slots its own allocator returned; range-checking
        # them again on every write would read them back each layer-step.
        validate_write_slots=False,
        # Pools that can keep rows head-major (``mha``, ``swa`` on both sides, ``mamba``'s
        # attention layers) do: attention then reads a row's run of slots in place, each head
        # contiguous, with no copy per step. ``mla``, ``dsa`` and ``hisparse`` ignore the
        # option (a one-head latent is contiguous per head already; see
        # docs/integrations/transformers.md, "How attention reads the pool").
        options={"head_major": True},
    )
    if mla:
        rank, rope = _one({(p.head_dim, p.v_head_dim) for p in mla}, "latent widths")
        config = replace(
            config, head_num=1, head_dim=rank + rope, kv_lora_rank=rank, qk_rope_head_dim=rope
        )
    else:
        main = full or sliding
        heads, dim, v_dim = _one({(p.heads, p.head_dim, p.v_head_dim) for p in main}, "geometry")
        config = replace(config, head_num=heads, head_dim=dim, v_head_dim=v_dim)
    if full and sliding:
        window = _one({(p.heads, p.head_dim, p.v_head_dim) for p in sliding}, "window geometry")
        if window != (config.head_num, config.head_dim, config.v_head_dim):
            raise UnsupportedLayerError(
                f"window layers cache {window} (heads, key dim, value dim) but full layers "
                f"{(config.head_num, config.head_dim, config.v_head_dim)}; the sliding-window "
                "pool here needs one geometry"
            )
        config = replace(config, swa_layer_ids=tuple(p.index for p in sliding), swa_size=size)
    if mamba:
        conv = _one({p.conv_shape for p in mamba}, "conv state shape")
        state = _one({p.state_shape for p in mamba}, "recurrent state shape")
        config = replace(
            config,
            mamba_layer_ids=tuple(p.index for p in mamba),
            mamba_size=max_batch,
            # A layer without a conv state (a plain recurrence) keeps none in the pool. The
            # pool always keeps a temporal state: a layer without one (a short convolution)
            # gets a one-element placeholder per request, never written.
            conv_state_shapes=(conv,) if conv else (),
            temporal_state_shape=state if state else (1,),
            mamba_dtype=layout.state_dtype,
        )
    return config


# -- continuous batching ---------------------------------------------------------------------

#: transformers' ``layer_types`` name (and paged-cache group) of full-attention layers.
FULL_ATTENTION = "full_attention"
#: transformers' ``layer_types`` name (and paged-cache group) of sliding-window layers.
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


def choose_batching_pool(
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
