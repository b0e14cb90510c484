"""Small helpers every built-in pool shares: layer-id resolution, write-slot checks and the
``head_major`` option."""

from __future__ import annotations

import torch

from kvcache_core import (
    InvalidLayerError,
    InvalidSlotError,
    KVWriteLoc,
    LayerLike,
    PoolConfig,
    check_slots,
)


class LayerTypeError(InvalidLayerError, TypeError):
    """``layer`` has no integer ``layer_id``.

    A ``KVCacheError`` like every other refused pool call (so one ``except`` covers bad input),
    and still a ``TypeError`` for callers that caught the type problem as one.
    """


class LocTypeError(InvalidSlotError, TypeError):
    """``loc`` is neither a slot tensor nor a ``KVWriteLoc`` (same reasoning as above)."""


def check_loc(loc: object) -> None:
    """Refuse a location of the wrong type with a ``KVCacheError``, before unwrapping it."""
    if not isinstance(loc, (torch.Tensor, KVWriteLoc)):
        raise LocTypeError(
            f"loc must be a torch.Tensor of slot indices or a KVWriteLoc, got {type(loc).__name__}"
        )


def layer_id_of(layer: LayerLike) -> int:
    """The layer id of anything that has one, with a clear error when it does not."""
    try:
        value = layer.layer_id
    except AttributeError:
        raise LayerTypeError(
            f"layer must have an integer `layer_id` (e.g. an attention module), got "
            f"{type(layer).__name__}"
        ) from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise LayerTypeError(f"layer.layer_id must be an int, got {type(value).__name__}")
    return value


def local_layer(layer_id: int, start_layer: int, layer_num: int) -> int:
    """Global layer id -> index into this pool's buffers."""
    local = layer_id - start_layer
    if not 0 <= local < layer_num:
        raise InvalidLayerError(
            f"layer {layer_id} is not in this pool (it holds layers "
            f"{start_layer}..{start_layer + layer_num - 1})"
        )
    return local


def write_slots(
    loc: torch.Tensor, *, limit: int, check_values: bool, device: torch.device, name: str = "loc"
) -> torch.Tensor:
    """Slots a forward pass writes to: slot 0 (padding) allowed, values checked on request.

    Every layer of every forward pass comes through here, so a tensor that already is what
    ``check_slots`` would return (1-D int64 on ``device``) is returned as it is when its values
    need no check, without the reshape and cast calls that cost more than the write itself.
    """
    if (
        not check_values
        and isinstance(loc, torch.Tensor)
        and loc.dtype == torch.int64
        and loc.dim() == 1
        and loc.device == device
    ):
        return loc
    return check_slots(
        loc, limit=limit, name=name, allow_zero=True, check_values=check_values, device=device
    )


def head_major_option(config: PoolConfig) -> bool:
    """``config.options["head_major"]`` (default False), refused unless it is a bool.

    One parser for every pool whose token rows are ``MHATokenToKVPool`` buffers (``mha``,
    ``swa``, ``mamba``), so they accept the same values and refuse the rest with the
    same message. A truthy string such as ``"no"`` is refused rather than read as True.
    """
    head_major = config.options.get("head_major", False)
    if not isinstance(head_major, bool):
        raise TypeError(f"PoolConfig.options['head_major'] must be a bool, got {head_major!r}")
    return head_major
