"""The demo's reference: the same model over a plain store, one request at a time.

Why: the demo compares a pool with ample memory against the same pool under retraction. A pool
that corrupts its cache on every write (a window-layer write that also lands in a full layer)
corrupts both runs alike, and the two agree. The model is bit-reproducible per request (see
``model``), so the tokens a correct pool produces are exactly the tokens of the same model over
a store with nothing to get wrong: one tensor per layer and buffer, indexed by position, no
allocator, no window table, no retraction. Comparing against that catches what comparing two
runs of one pool cannot.

Only model kinds whose every stored value is exact are compared (``mha``, ``mla``, ``swa``,
``mamba``, at the demo's float32): the sparse kinds choose tokens through indexer keys whose
storage precision is the pool's own choice (fp8 or wider), so their tokens may legitimately
differ from any one reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvcache_core import KVWriteLoc, LayerLike, unwrap_write_loc

from .model import ModelShape, Step, TinyModel, layer_types
from .scheduler import Request

__all__ = ["REFERENCE_KINDS", "ReferenceStore", "reference_outputs"]

#: Model kinds the reference is exact for (see the module docstring).
REFERENCE_KINDS = frozenset({"mha", "mla", "swa", "mamba"})


class ReferenceStore:
    """Per-layer float32 tensors indexed by slot; slot ``i`` of a request is position ``i - 1``.

    It offers exactly what the model calls, with the pool contract's names, and holds one
    request at a time. Window layers are stored by full slot (the window translation is the
    identity: nothing ever leaves the window of a store that never frees).
    """

    def __init__(self, kind: str, shape: ModelShape, tokens: int) -> None:
        rows, s = tokens + 1, shape
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}
        self._state: dict[int, tuple[list[torch.Tensor], torch.Tensor]] = {}
        for layer, what in enumerate(layer_types(kind, s.layers)):
            if what in ("mha", "window"):
                self._k[layer] = torch.zeros(rows, s.heads, s.head_dim)
                self._v[layer] = torch.zeros(rows, s.heads, s.head_dim)
            elif what == "mla":
                self._k[layer] = torch.zeros(rows, 1, s.kv_lora_rank + s.rope_dim)
                self._v[layer] = self._k[layer][..., : s.kv_lora_rank]
            elif what == "mamba":
                conv = torch.zeros(2, s.conv_width - 1, s.hidden)
                self._state[layer] = ([conv], torch.zeros(2, s.hidden))
            else:
                raise ValueError(f"no reference for layer kind {what!r}")

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        """Store K and V at the full slots of ``loc``."""
        slots, _ = unwrap_write_loc(loc)
        self._k[layer.layer_id][slots] = cache_k
        self._v[layer.layer_id][slots] = cache_v

    def set_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Store the latent row (nope then rope) at the full slots of ``loc``."""
        slots, _ = unwrap_write_loc(loc)
        self._k[layer.layer_id][slots] = torch.cat([cache_k_nope, cache_k_rope], dim=-1)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's key rows (the latent, for an MLA layer)."""
        return self._k[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's value rows (the latent's first ``kv_lora_rank`` columns, for MLA)."""
        return self._v[layer_id]

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The identity: window layers are stored by full slot."""
        return kv_indices

    def get_mamba_state(self, layer_id: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Views of the layer's recurrent state (request slot 1 is the one request's)."""
        return self._state[layer_id]


def reference_outputs(
    kind: str, shape: ModelShape, seed: int, requests: Sequence[Request]
) -> dict[int, list[int]]:
    """The tokens each request gets from ``TinyModel(kind, shape, seed)`` over a
    [`ReferenceStore`][kvcache_core.engine.reference.ReferenceStore]: prefill the whole
    prompt, then decode one token at a time, exactly as the scheduler drives the model."""
    model = TinyModel(kind, shape, seed)
    out: dict[int, list[int]] = {}
    for req in requests:
        total = len(req.prompt) + req.max_new
        store = ReferenceStore(kind, shape, total)
        slots = torch.arange(1, total + 1, dtype=torch.int64)
        mamba = torch.tensor([1], dtype=torch.int64)
        n = len(req.prompt)
        tokens = torch.tensor(req.prompt, dtype=torch.int64)
        step = Step(tokens, 0, slots[:n], slots[:n], mamba)
        output = [int(torch.argmax(model.forward(store, step)))]  # type: ignore[arg-type]
        while len(output) < req.max_new:
            at = n + len(output) - 1
            token = torch.tensor(output[-1:], dtype=torch.int64)
            step = Step(token, at, slots[at : at + 1], slots[: at + 1], mamba)
            output.append(int(torch.argmax(model.forward(store, step))))  # type: ignore[arg-type]
        out[req.rid] = output
    return out
