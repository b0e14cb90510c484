"""What a transformers model caches per layer, learned by asking transformers itself.

Why a probe rather than reading config fields: every model family spells its geometry
differently (``num_key_value_heads``, ``head_dim``, ``kv_lora_rank``, ``mamba_d_conv``, ...), and
what matters to a pool is not the config but what the model's forward actually hands its cache.
So [`probe_layout`][kvcache_core.integrations._hf_layout.probe_layout] runs one forward pass of
one token with transformers' own ``DynamicCache`` and reads, layer by layer, which cache layer
class transformers chose (full, sliding-window, linear-attention state, ...) and the shapes it
was given. Nothing here is keyed to a model's name: any model whose layers fall into the
kinds below maps to a pool.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import KVCacheError

__all__ = [
    "LayerKind",
    "LayerPlan",
    "ModelLayout",
    "UnsupportedLayerError",
    "UnsupportedModelError",
    "probe_layout",
]


class UnsupportedLayerError(KVCacheError, ValueError):
    """A model layer caches something no pool kind serves (named in the message)."""


class UnsupportedModelError(UnsupportedLayerError):
    """The model as a whole cannot run on a cache of layers (said why in the message): its
    forward refuses transformers' ``DynamicCache``, or caches nothing in it."""


class LayerKind(str, enum.Enum):
    """What one layer keeps between forward passes, as a pool sees it."""

    FULL = "full attention"
    SLIDING = "sliding-window attention"
    MLA = "MLA latent"
    MAMBA = "Mamba / linear-attention state"
    #: Caches nothing itself: an MLP/MoE-only layer, or one reading KV another layer cached
    #: (transformers' ``DummyLayer``). It keeps its index; no pool layer of its own is used.
    NONE = "no cache of its own"


@dataclass(frozen=True)
class LayerPlan:
    """One layer's kind and the per-token (or per-request) shapes it caches.

    Attention kinds fill ``heads``/``head_dim``/``v_head_dim`` (MLA: one head, the latent and
    rope widths); sliding layers also ``window``; Mamba layers ``conv_shape`` and
    ``state_shape`` (per request, without the batch dimension; ``()`` for a state the layer
    does not keep, such as the recurrent state of a short-convolution layer).
    """

    index: int
    kind: LayerKind
    heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    window: int = 0
    conv_shape: tuple[int, ...] = ()
    state_shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelLayout:
    """Every layer's plan, with the dtype and device the model computes in."""

    layers: tuple[LayerPlan, ...]
    dtype: torch.dtype
    device: torch.device
    state_dtype: torch.dtype | None

    def of_kind(self, kind: LayerKind) -> tuple[LayerPlan, ...]:
        """The plans of the layers of ``kind``, in layer order."""
        return tuple(p for p in self.layers if p.kind is kind)

    @property
    def kinds(self) -> frozenset[LayerKind]:
        """The layer kinds the model caches (layers that cache nothing aside)."""
        return frozenset(p.kind for p in self.layers if p.kind is not LayerKind.NONE)


def _name_of(config: Any, index: int, layer: object) -> str:
    types = getattr(config, "layer_types", None)
    declared = f"{types[index]!r}, " if isinstance(types, (list, tuple)) else ""
    return f"layer {index} ({declared}cached by transformers' {type(layer).__name__})"


def _mla_dims(config: Any) -> tuple[int, int] | None:
    rank = getattr(config, "kv_lora_rank", None)
    rope = getattr(config, "qk_rope_head_dim", None)
    if isinstance(rank, int) and isinstance(rope, int) and rank > 0 and rope > 0:
        return rank, rope
    return None


def _plan(config: Any, index: int, layer: Any, cache_utils: Any) -> LayerPlan:
    """Classify one probed cache layer; unsupported ones raise, naming the layer."""
    name = _name_of(config, index, layer)
    if type(layer) is cache_utils.DummyLayer:
        return LayerPlan(index, LayerKind.NONE)
    is_state = isinstance(layer, cache_utils.LinearAttentionCacheLayerMixin)
    is_attention = isinstance(layer, cache_utils.CacheLayerMixin)
    if is_state and is_attention:
        raise UnsupportedLayerError(
            f"{name} keeps both a linear-attention state and attention KV in one layer; no "
            "pool kind serves such hybrid layers yet"
        )
    if is_state:
        if layer.number_of_states != 1:
            raise UnsupportedLayerError(
                f"{name} keeps {layer.number_of_states} recurrent states; the Mamba pool keeps one"
            )
        conv, state = layer.conv_states[0], layer.recurrent_states[0]
        if conv is None and state is None:
            raise UnsupportedLayerError(
                f"{name} was not written by a forward pass: the model keeps that state outside "
                "transformers' cache, where no retraction could move it"
            )
        return LayerPlan(
            index,
            LayerKind.MAMBA,
            conv_shape=() if conv is None else tuple(conv.shape[1:]),
            state_shape=() if state is None else tuple(state.shape[1:]),
        )
    if not is_attention or isinstance(layer, cache_utils.DynamicIndexedLayer):
        what = "DSA indexer keys" if is_attention else "no per-token KV of its own"
        raise UnsupportedLayerError(f"{name} holds {what}; no pool kind serves it here yet")
    keys, values = layer.keys, layer.values
    if keys is None or values is None or keys.dim() != 4:
        raise UnsupportedLayerError(f"{name} was not written by a forward pass; cannot size it")
    heads, head_dim, v_heads, v_dim = keys.shape[1], keys.shape[3], values.shape[1], values.shape[3]
    mla = _mla_dims(config)
    if mla is not None and (heads, head_dim, v_heads, v_dim) == (1, mla[0], 1, mla[1]):
        return LayerPlan(index, LayerKind.MLA, heads=1, head_dim=mla[0], v_head_dim=mla[1])
    if heads != v_heads:
        raise UnsupportedLayerError(
            f"{name} caches {heads} key heads but {v_heads} value heads; pools store one head "
            "count per layer"
        )
    if type(layer) is cache_utils.DynamicSlidingWindowLayer:
        return LayerPlan(
            index,
            LayerKind.SLIDING,
            heads=heads,
            head_dim=head_dim,
            v_head_dim=v_dim,
            window=int(layer.sliding_window),
        )
    if type(layer) is not cache_utils.DynamicLayer:
        # A subclass keeps more than keys and values (the model calls its own methods on it).
        raise UnsupportedLayerError(f"{name} is a cache layer kind kvcache does not know")
    return LayerPlan(index, LayerKind.FULL, heads=heads, head_dim=head_dim, v_head_dim=v_dim)


def _written(layer: Any) -> bool:
    """Whether the probe's forward pass stored anything in ``layer``."""
    states = [*getattr(layer, "conv_states", ()), *getattr(layer, "recurrent_states", ())]
    return getattr(layer, "keys", None) is not None or any(s is not None for s in states)


def probe_layout(model: Any) -> ModelLayout:
    """Run one token through ``model`` with a fresh ``DynamicCache`` and read each layer's plan.

    :raises UnsupportedLayerError: A layer caches something no pool kind serves.
    :raises TypeError: ``model`` is not a transformers model with a config.
    """
    from transformers import cache_utils

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        raise TypeError(f"expected a transformers model, got {type(model).__name__}")
    text = config.get_text_config(decoder=True)
    probe = cache_utils.DynamicCache(config=text)
    device = next(model.parameters()).device
    token = torch.ones((1, 1), dtype=torch.long, device=device)
    try:
        with torch.no_grad():
            model(input_ids=token, cache=probe, use_cache=True)
    except Exception as exc:  # the model's own error, whatever its type, says why
        raise UnsupportedModelError(
            f"{type(model).__name__} cannot run one token on transformers' DynamicCache "
            f"({type(exc).__name__}: {exc}); KVPoolCache stands in for DynamicCache's layers, "
            "so it cannot serve this model either"
        ) from exc
    if not any(_written(layer) for layer in probe.layers):
        raise UnsupportedModelError(
            f"{type(model).__name__}'s forward pass wrote nothing into transformers' "
            "DynamicCache (it keeps no cache, or one of its own); no pool can serve it"
        )
    # Some layer was written, so not every layer is a placeholder (``LayerKind.NONE``).
    layers = tuple(_plan(text, i, layer, cache_utils) for i, layer in enumerate(probe.layers))
    dtype: torch.dtype | None = None
    state_dtype: torch.dtype | None = None
    for i, layer in enumerate(probe.layers):
        if layers[i].kind is LayerKind.MAMBA:
            kept = layer.recurrent_states[0]
            state_dtype = (kept if kept is not None else layer.conv_states[0]).dtype
        elif layers[i].kind is not LayerKind.NONE and dtype is None:
            dtype = layer.keys.dtype
    return ModelLayout(
        layers=layers,
        dtype=dtype if dtype is not None else next(model.parameters()).dtype,
        device=device,
        state_dtype=state_dtype,
    )
