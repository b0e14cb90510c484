"""Input checks every pool needs before it writes: public, so third-party pools use the same
wording and the same rules as the built-ins.

The rule of the house: a bad call raises a specific error *before* any byte is written, so what
the pool already stores is never half-overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import InvalidSlotError, ShapeMismatchError

__all__ = ["check_rows", "check_slots"]

_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)


def check_slots(
    indices: object,
    *,
    limit: int,
    name: str = "indices",
    allow_zero: bool = False,
    allow_duplicates: bool = True,
    check_values: bool = True,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Validate slot indices and return them as a 1-D int64 tensor on ``device``.

    Pools call this before touching a buffer so that a bad index raises a precise error instead
    of writing into the padding slot, wrapping around (negative indices) or corrupting another
    request's rows. The flags differ by call site, which is why they are flags:

    :param indices: What the caller passed: an integer tensor, 1-D or a scalar.
    :param limit: One past the largest valid slot: the buffer's row count (``size + page_size``
        for a token pool).
    :param name: How the message names the argument (``"loc"``, ``"indices"`` ...).
    :param allow_zero: Accept slot 0, the padding slot, which padded writes (batches rounded
        up to a kernel's size) legitimately target; valid slots are then ``[0, limit)``
        instead of ``[1, limit)``.
    :param allow_duplicates: Accept a slot named twice. Off where a repeat would be a bug
        whose result depends on write order (frees, loads into new slots).
    :param check_values: Run the range and duplicate checks. They read the tensor back, which
        synchronises an accelerator, so hot GPU paths turn them off
        ([`PoolConfig.validate_write_slots`][kvcache_core.PoolConfig]); dtype and rank are
        always checked.
    :param device: Move the result there (None: leave it where it is).
    :returns: The slots, flattened, as int64.
    :raises InvalidSlotError: Not a tensor, not an integer dtype, more than 1-D, out of range,
        padding slot 0 without ``allow_zero``, or a duplicate without ``allow_duplicates``; the
        message names the first offending position and value.
    """
    if not isinstance(indices, torch.Tensor):
        raise InvalidSlotError(f"{name} must be a torch.Tensor of slot ids, got {type(indices)}")
    if indices.dtype not in _INDEX_DTYPES:
        raise InvalidSlotError(f"{name} must have an integer dtype, got {indices.dtype}")
    if indices.dim() > 1:
        raise InvalidSlotError(f"{name} must be 1-D (or a scalar), got shape {list(indices.shape)}")
    flat = indices.reshape(-1).to(dtype=torch.int64)
    if device is not None and flat.device != device:
        flat = flat.to(device)
    if check_values and flat.numel():
        low = 0 if allow_zero else 1
        bad = (flat < low) | (flat >= limit)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0, 0])
            value = int(flat[pos])
            if value < 0:
                why = "is negative"
            elif value == 0:
                why = "is the reserved padding slot 0"
            else:
                why = f"is out of range [{low}, {limit})"
            raise InvalidSlotError(f"{name}[{pos}] = {value} {why}")
        if not allow_duplicates and flat.numel() > 1:
            ordered = torch.sort(flat).values
            dup = ordered[1:] == ordered[:-1]
            if bool(dup.any()):
                value = int(ordered[1:][dup][0])
                raise InvalidSlotError(f"{name} names slot {value} more than once")
    return flat


def check_rows(
    tensor: object,
    *,
    name: str,
    rows: int,
    row_shape: Sequence[int],
) -> torch.Tensor:
    """Check that ``tensor`` holds ``rows`` rows of ``row_shape`` and a floating dtype.

    A row with the right number of elements but another shape (``[n, H*D]`` for ``[n, H, D]``)
    is accepted and viewed, as engines commonly pass flattened heads.

    :param tensor: What the caller passed as values to write.
    :param name: How the message names the argument (``"cache_k"`` ...).
    :param rows: How many rows it must hold (one per slot written).
    :param row_shape: The shape of one stored row.
    :returns: ``tensor``, reshaped to ``[rows, *row_shape]`` when it was flattened.
    :raises ShapeMismatchError: Not a tensor, not floating point, or the wrong size; the
        message gives both shapes.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ShapeMismatchError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not (tensor.is_floating_point()):
        raise ShapeMismatchError(f"{name} must have a floating dtype, got {tensor.dtype}")
    want = (rows, *row_shape)
    if tuple(tensor.shape) == want:
        return tensor
    per_row = 1
    for d in row_shape:
        per_row *= d
    if tensor.dim() >= 1 and tensor.shape[0] == rows and tensor.numel() == rows * per_row:
        return tensor.reshape(want)
    raise ShapeMismatchError(
        f"{name} has shape {list(tensor.shape)}; this pool expects {list(want)} "
        f"({rows} rows for {rows} slots)"
    )
