"""A tiny seeded decoder whose every attention read goes through the pool.

Why random weights: the point is not language but arithmetic that depends on every stored byte.
Each layer writes its new K/V (or latent, indexer keys, recurrent state) into the pool and then
reads the whole context back *from the pool*, through the contract's getters, so a pool that
stores, offloads or reloads wrongly changes the logits and therefore the greedy tokens.

Why bit-reproducible: a request is always computed on its own (never stacked with others, whose
number changes with memory pressure), prefill always covers the whole prompt and decode one
token, and every gather is in position order (or score order) rather than slot order. So the
floating-point operations for a request are the same in a run with ample memory and in one that
retracted it five times; only the slots differ. Logits are float32 sums over random weights,
so ties in argmax (or in the indexer's top-k) are astronomically unlikely.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch

from kvcache_core import (
    HiSparsePool,
    IndexerKeyPool,
    KVPool,
    KVWriteLoc,
    MambaStatePool,
    MLAPool,
    SlidingWindowPool,
)

__all__ = ["MODEL_KINDS", "LayerRef", "ModelShape", "Step", "TinyModel", "layer_types"]

#: Model kinds, one per pool family: what each layer of the model is.
MODEL_KINDS: tuple[str, ...] = ("mha", "mla", "dsa", "swa", "mamba", "hisparse")

#: The largest finite float8_e4m3fn value: indexer keys are scaled into it, as engines do.
_FP8_MAX = 448.0


@dataclass(frozen=True)
class ModelShape:
    """Tiny sizes: fast on CPU, still enough structure for every pool feature to matter."""

    vocab: int = 64
    hidden: int = 32
    layers: int = 4
    heads: int = 2
    head_dim: int = 16
    kv_lora_rank: int = 16
    rope_dim: int = 8
    index_dim: int = 16
    topk: int = 8  # sparse layers attend to this many tokens, chosen by the indexer
    window: int = 8  # sliding-window layers see the last `window` tokens
    conv_width: int = 4  # Mamba layers: causal conv over the last `conv_width` inputs
    max_positions: int = 512


@dataclass(frozen=True)
class LayerRef:
    """What the pool's ``layer`` argument needs: an integer ``layer_id``."""

    layer_id: int


@dataclass
class Step:
    """One request's forward: new tokens, where they go, and where its context lives.

    ``context`` holds the slot of every position ``0 .. start + n - 1`` in position order (the
    new tokens' slots ``write`` at the end). ``resident`` (HiSparse only) makes logical slots
    device-resident before the model reads them; ``mamba_slot`` is the request's state slot.
    """

    tokens: torch.Tensor
    start: int
    write: torch.Tensor
    context: torch.Tensor
    mamba_slot: torch.Tensor | None = None
    resident: Callable[[torch.Tensor], None] | None = None


def layer_types(kind: str, layers: int) -> tuple[str, ...]:
    """Layer kinds of a model: uniform, or (swa, mamba) attention on even layers mixed in."""
    if kind in ("mha", "mla", "dsa", "hisparse"):
        return (kind,) * layers
    if kind == "swa":
        return tuple("mha" if i % 2 == 0 else "window" for i in range(layers))
    if kind == "mamba":
        return tuple("mha" if i % 2 == 0 else "mamba" for i in range(layers))
    raise ValueError(f"unknown model kind {kind!r}; known: {', '.join(MODEL_KINDS)}")


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Softmax attention. q ``[n, H, Dk]``, k ``[S, h, Dk]``, v ``[S, h, Dv]`` (h is H or 1),
    mask ``[n, S]`` True where visible (None: all visible, as for every decode step). Returns
    ``[n, H * Dv]``. Plain matmuls rather than einsum: this is the hot loop, and einsum's
    parsing cost more than the arithmetic at these sizes."""
    heads = q.shape[1]
    k = k.expand(k.shape[0], heads, k.shape[2])
    v = v.expand(v.shape[0], heads, v.shape[2])
    scores = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0)) * (q.shape[2] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(0, 1))  # [H, n, Dv]
    return out.transpose(0, 1).reshape(out.shape[1], -1)


def _causal(start: int, n: int, first: int, keys: int, window: int | None) -> torch.Tensor | None:
    """Which keys (positions ``first .. first + keys - 1``) each query ``start + i`` sees;
    None for a single query (decode), which sees every key it was given."""
    if n == 1:
        return None
    q = torch.arange(start, start + n).view(-1, 1)
    k = torch.arange(first, first + keys).view(1, -1)
    seen = k <= q
    if window is not None:
        seen &= k > q - window
    return seen


class TinyModel:
    """A decoder-only model of ``shape`` whose layers follow ``kind`` (see `layer_types`).

    The weights depend only on ``seed`` and the shape, so two engines built with the same seed
    compute the same function. ``forward`` returns the logits of the last new token.
    """

    def __init__(self, kind: str, shape: ModelShape | None = None, seed: int = 0) -> None:
        self.kind = kind
        self.shape = s = shape or ModelShape()
        self.types = layer_types(kind, s.layers)
        gen = torch.Generator().manual_seed(seed)

        def w(*dims: int) -> torch.Tensor:
            return torch.randn(*dims, generator=gen, dtype=torch.float32) / math.sqrt(dims[0])

        self.embed = torch.randn(s.vocab, s.hidden, generator=gen)
        self.pos = torch.randn(s.max_positions, s.hidden, generator=gen) * 0.5
        self.unembed = w(s.hidden, s.vocab) * 4.0  # sharper logits: fewer near-ties
        hd, lat = s.heads * s.head_dim, s.kv_lora_rank + s.rope_dim
        self.weights: list[dict[str, torch.Tensor]] = []
        self._protocols: dict[tuple[int, type], bool] = {}
        for kind_i in self.types:
            if kind_i in ("mha", "window"):
                layer = {"qkv": w(s.hidden, 3 * hd), "o": w(hd, s.hidden)}
            elif kind_i == "mamba":
                layer = {
                    "in": w(s.hidden, s.hidden),
                    "gate": w(s.hidden, s.hidden),
                    "conv": torch.randn(s.conv_width, s.hidden, generator=gen) * 0.5,
                    "decay": torch.sigmoid(torch.randn(s.hidden, generator=gen) + 1.0),
                    "o": w(s.hidden, s.hidden),
                }
            else:  # latent attention (mla, dsa, hisparse)
                layer = {
                    "q": w(s.hidden, s.heads * lat),
                    "c": w(s.hidden, s.kv_lora_rank),
                    "r": w(s.hidden, s.rope_dim),
                    "o": w(s.heads * s.kv_lora_rank, s.hidden),
                    "iq": w(s.hidden, s.index_dim),
                    "ik": w(s.hidden, s.index_dim),
                }
            self.weights.append(layer)

    def _is(self, pool: KVPool, protocol: type) -> bool:
        """``isinstance(pool, protocol)``, remembered: a Protocol check walks every member."""
        key = (id(pool), protocol)
        known = self._protocols.get(key)
        if known is None:
            known = self._protocols[key] = isinstance(pool, protocol)
        return known

    # -- the forward pass --------------------------------------------------------------------
    def forward(self, pool: KVPool, step: Step) -> torch.Tensor:
        """Write the new tokens' cache entries into ``pool``, attend over what the pool holds,
        and return the logits ``[vocab]`` of the last new token."""
        positions = torch.arange(step.start, step.start + step.tokens.numel())
        x = self.embed.index_select(0, step.tokens) + self.pos.index_select(0, positions)
        loc = KVWriteLoc(step.write)
        if self._is(pool, SlidingWindowPool):  # translated once per forward, as engines do
            swa = cast(SlidingWindowPool, pool).translate_loc_from_full_to_swa(step.write)
            loc = KVWriteLoc(step.write, swa_loc=swa)
        for layer_id, kind in enumerate(self.types):
            h = _rms(x)
            if kind in ("mha", "window"):
                x = x + self._mha(pool, layer_id, h, step, loc, kind == "window")
            elif kind == "mla":
                x = x + self._mla(cast(MLAPool, pool), layer_id, h, step, loc)
            elif kind == "mamba":
                x = x + self._mamba(cast(MambaStatePool, pool), layer_id, h, step)
            else:
                x = x + self._sparse(pool, layer_id, h, step, loc)
        return _rms(x[-1]) @ self.unembed

    def _mha(
        self, pool: KVPool, lid: int, h: torch.Tensor, step: Step, loc: KVWriteLoc, window: bool
    ) -> torch.Tensor:
        s, wt, n = self.shape, self.weights[lid], h.shape[0]
        q, k, v = (h @ wt["qkv"]).view(n, 3, s.heads, s.head_dim).unbind(1)
        pool.set_kv_buffer(LayerRef(lid), loc, k, v)
        first = 0
        slots = step.context
        if window:  # window layers read only the last W tokens, through their window slots
            first = max(0, step.start - s.window + 1)
            slots = cast(SlidingWindowPool, pool).translate_loc_from_full_to_swa(slots[first:])
            if bool((slots <= 0).any()):
                raise RuntimeError(
                    "a token inside the window has no window slot (the pool or allocator lost it)"
                )
        keys = pool.get_key_buffer(lid).index_select(0, slots)
        values = pool.get_value_buffer(lid).index_select(0, slots)
        mask = _causal(step.start, n, first, slots.numel(), s.window if window else None)
        return _attend(q, keys, values, mask) @ wt["o"]

    def _latent_q(self, lid: int, h: torch.Tensor) -> torch.Tensor:
        s = self.shape
        return (h @ self.weights[lid]["q"]).view(h.shape[0], s.heads, s.kv_lora_rank + s.rope_dim)

    def _write_latent(self, pool: MLAPool, lid: int, h: torch.Tensor, loc: KVWriteLoc) -> None:
        wt = self.weights[lid]
        nope, rope = (h @ wt["c"]).unsqueeze(1), (h @ wt["r"]).unsqueeze(1)
        pool.set_mla_kv_buffer(LayerRef(lid), loc, nope, rope)

    def _mla(
        self, pool: MLAPool, lid: int, h: torch.Tensor, step: Step, loc: KVWriteLoc
    ) -> torch.Tensor:
        """Latent attention: K is the whole latent row, V its first ``kv_lora_rank`` columns."""
        self._write_latent(pool, lid, h, loc)
        keys = pool.get_key_buffer(lid).index_select(0, step.context)
        values = pool.get_value_buffer(lid).index_select(0, step.context)
        mask = _causal(step.start, h.shape[0], 0, step.context.numel(), None)
        return _attend(self._latent_q(lid, h), keys, values, mask) @ self.weights[lid]["o"]

    def _sparse(
        self, pool: KVPool, lid: int, h: torch.Tensor, step: Step, loc: KVWriteLoc
    ) -> torch.Tensor:
        """DSA: latent attention over the top-k tokens the indexer keys score highest.

        HiSparse: the same, but the latent is read from the device buffer, so the chosen tokens
        are first made resident (``step.resident``) and addressed by device slot.
        """
        s, wt, n = self.shape, self.weights[lid], h.shape[0]
        mla, indexer = cast(MLAPool, pool), cast(IndexerKeyPool, pool)
        self._write_latent(mla, lid, h, loc)
        raw = h @ wt["ik"]
        scale = raw.abs().amax(-1).clamp_min(1e-6) / _FP8_MAX
        indexer.set_index_k_scale_buffer(lid, step.write, raw / scale.view(-1, 1), scale)
        keys, scales = indexer.get_index_k_scale_buffer(lid, step.context)
        scores = (h @ wt["iq"]) @ (keys.to(torch.float32) * scales.view(-1, 1)).T
        q = self._latent_q(lid, h)
        key_buffer, value_buffer = pool.get_key_buffer(lid), pool.get_value_buffer(lid)
        out = []
        for i in range(n):
            visible = step.start + i + 1
            chosen = torch.topk(scores[i, :visible], min(s.topk, visible)).indices
            slots = step.context.index_select(0, chosen)
            if self._is(pool, HiSparsePool):
                pool = cast(HiSparsePool, pool)
                if step.resident is not None:
                    step.resident(slots)
                slots = pool.translate_loc_to_device(slots)
                if bool((slots < 0).any()):
                    raise RuntimeError("a chosen token is not device-resident after admission")
            keys_i = key_buffer.index_select(0, slots)
            values_i = value_buffer.index_select(0, slots)
            out.append(_attend(q[i : i + 1], keys_i, values_i, None))
        return torch.cat(out) @ wt["o"]

    def _mamba(self, pool: MambaStatePool, lid: int, h: torch.Tensor, step: Step) -> torch.Tensor:
        """A gated linear recurrence after a causal depthwise conv; state lives in the pool at
        the request's Mamba slot, read before and written back after the new tokens."""
        if step.mamba_slot is None:
            raise RuntimeError("a Mamba layer needs the request's Mamba slot")
        wt = self.weights[lid]
        convs, temporal = pool.get_mamba_state(lid)
        slot = int(step.mamba_slot.reshape(-1)[0])
        window = convs[0][slot].clone()  # [conv_width - 1, hidden]
        state = temporal[slot].clone()  # [hidden]
        u, gate = h @ wt["in"], torch.nn.functional.silu(h @ wt["gate"])
        decay = wt["decay"]
        out = []
        for t in range(h.shape[0]):
            full = torch.cat([window, u[t : t + 1]])
            mixed = torch.nn.functional.silu((full * wt["conv"]).sum(0))
            state = decay * state + (1 - decay) * mixed
            window = full[1:]
            out.append(state * gate[t])
        convs[0][slot] = window
        temporal[slot] = state
        return torch.stack(out) @ wt["o"]
