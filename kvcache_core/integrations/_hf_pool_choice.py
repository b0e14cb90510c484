"""Which discovered pool serves a model, decided by capabilities, and the config to build it.

The model's layer kinds (see ``_hf_layout``) say what a pool must be able to do: full attention
only needs offload (retraction); sliding + full needs ``sliding-window``; an MLA latent needs
``mla``; Mamba hybrids need ``mamba-state``; ``page_size > 1`` also needs ``paged``. A pool
named by the caller is held to those capabilities; without a name, the accepted pool with the
fewest capabilities beyond them (and none that change the buffer layout the integration reads)
is chosen, so a third-party pool is picked on what it declares, never on its name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..contracts.spec import Capability, PoolConfig, PoolSpec
from ..discovery import Registry
from ..errors import KVCacheError
from ._hf_layout import LayerKind, ModelLayout, UnsupportedLayerError

__all__ = ["MissingCapabilityError", "PoolChoice", "choose_pool", "pool_config"]

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


@dataclass(frozen=True)
class PoolChoice:
    """The pool kind a model needs: its capabilities and why (for error messages)."""

    needs: frozenset[Capability]
    why: dict[Capability, str]


def required_capabilities(layout: ModelLayout, page_size: int) -> PoolChoice:
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
    else:
        names = ", ".join(sorted(k.value for k in kinds))
        raise UnsupportedLayerError(
            f"no pool kind serves a model mixing {names} layers (supported: full attention, "
            "full + sliding-window, MLA latent only, full attention + Mamba)"
        )
    return PoolChoice(frozenset(why), why)


def choose_pool(registry: Registry, name: str | None, choice: PoolChoice) -> str:
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


def _check_named(spec: PoolSpec, choice: PoolChoice) -> None:
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
        # Pools that can keep rows head-major (``mha``) do: attention then reads a row's run
        # of slots in place, each head contiguous, with no copy per step (other kinds ignore
        # the option; see docs/integrations/transformers.md, "Performance").
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
            conv_state_shapes=(conv,),
            temporal_state_shape=state,
            mamba_dtype=layout.state_dtype,
        )
    return config
