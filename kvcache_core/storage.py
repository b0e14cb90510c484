"""Per-layer row buffers shared by pool implementations: storage dtypes, batched gathers into
host snapshots and scatters back.

Why one helper: every pool kind stores "L layers x rows x row shape" somewhere, and offload speed
is decided here (``index_select`` into a preallocated snapshot, never ``buf[idx]``; DESIGN.md
section 7). Third-party pools may use it too; it is part of the public face.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import UnsupportedDtypeError

__all__ = ["LayerRows", "host_empty", "storage_dtype"]

_FP8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def _fp8_dtypes() -> tuple[torch.dtype, ...]:
    found = (getattr(torch, name, None) for name in _FP8_NAMES)
    return tuple(d for d in found if isinstance(d, torch.dtype))


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a buffer of compute dtype ``dtype`` is stored in.

    fp8 is kept as uint8 because torch's indexing kernels (``index_select``, ``index_copy_``)
    lack fp8: storing the bytes lets every pool gather and scatter fp8 caches with the same
    fast paths, viewing them back as fp8 for kernels.

    :raises UnsupportedDtypeError: ``dtype`` is not a ``torch.dtype``, or is not floating point.
    """
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedDtypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    if dtype in _fp8_dtypes():
        return torch.uint8
    if not dtype.is_floating_point:
        raise UnsupportedDtypeError(
            f"a KV pool stores floating-point data; {dtype} is not supported "
            f"(fp8 dtypes available in this torch: {[str(d) for d in _fp8_dtypes()] or 'none'})"
        )
    return dtype


def host_empty(shape: Sequence[int], dtype: torch.dtype, for_device: torch.device) -> torch.Tensor:
    """An uninitialised host tensor to copy device rows into (or from).

    Pinned when ``for_device`` is CUDA, because only pinned memory makes those copies
    asynchronous; never pinned for CPU pools, where pinning costs time and needs a GPU build.
    Uninitialised because the caller overwrites every element (zeroing would double the cost
    of an offload).
    """
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=for_device.type == "cuda")


class LayerRows:
    """``layers`` buffers of ``rows`` rows of ``row_shape``, held in one zeroed tensor.

    The storage every built-in pool keeps its per-layer rows in, public so third-party pools
    get the same fast, fp8-safe offload without re-deriving it: one tensor
    ``[layers, rows, *row_shape]`` in [`storage_dtype(dtype)`][kvcache_core.storage_dtype],
    viewed per layer in the compute dtype, gathered into a preallocated host tensor with
    ``index_select`` and scattered back with ``index_copy_``.

    :param layers: Number of layers (index them ``0 .. layers - 1``, local to the pool).
    :param rows: Rows per layer (``size + page_size`` for a token pool: slot 0 is padding).
    :param row_shape: Shape of one row, e.g. ``(head_num, head_dim)``.
    :param dtype: The compute dtype callers see.
    :param device: Where the tensor lives.
    :raises UnsupportedDtypeError: ``dtype`` cannot be stored (see ``storage_dtype``).
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        row_shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.dtype = dtype
        self.store_dtype = storage_dtype(dtype)
        self.row_shape = tuple(int(d) for d in row_shape)
        self.device = device
        self.data = torch.zeros(
            (layers, rows, *self.row_shape), dtype=self.store_dtype, device=device
        )

    @property
    def layers(self) -> int:
        """Number of layers held."""
        return int(self.data.shape[0])

    @property
    def rows(self) -> int:
        """Rows per layer."""
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor (what ``get_kv_size_bytes`` adds up)."""
        return self.data.numel() * self.data.element_size()

    def layer(self, local_id: int) -> torch.Tensor:
        """Layer ``local_id``'s buffer, viewed in the compute dtype (no copy)."""
        buf = self.data[local_id]
        return buf if self.store_dtype == self.dtype else buf.view(self.dtype)

    def to_storage(self, values: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """Cast values into the stored representation, never in place.

        ``scale`` divides only when the write casts (``values.dtype`` is not the pool's dtype),
        as engines apply it: attention backends pass the layer's ``k_scale`` on every write
        whenever the checkpoint has one (an fp8 checkpoint served with a bf16 KV cache), and a
        write that needs no cast must store the values as given. Dividing out of place keeps the
        caller's tensor intact (engines divide in place; callers may still read theirs).
        """
        if values.dtype != self.dtype:
            if scale is not None:
                values = values / scale
            values = values.to(self.dtype)
        if self.store_dtype != self.dtype:
            values = values.view(self.store_dtype)
        return values.to(self.device)

    def write(self, local_id: int, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Scatter stored-representation ``values`` (``[n, *row_shape]``) into one layer."""
        self.data[local_id].index_copy_(0, slots, values)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` of every layer, as a host tensor ``[layers, n, *row_shape]``."""
        out = host_empty(
            (self.layers, slots.numel(), *self.row_shape), self.store_dtype, self.device
        )
        if self.device.type == "cpu":
            for i in range(self.layers):
                torch.index_select(self.data[i], 0, slots, out=out[i])
        else:
            for i in range(self.layers):
                out[i].copy_(torch.index_select(self.data[i], 0, slots))
        return out

    def scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write host ``rows`` (``[layers, n, *row_shape]``) back at ``slots`` of every layer."""
        for i in range(self.layers):
            self.data[i].index_copy_(0, slots, rows[i].to(self.device, non_blocking=True))

    def part_layout(self, count: int) -> tuple[tuple[int, ...], torch.dtype]:
        """The (shape, dtype) a snapshot part of ``count`` rows has."""
        return (self.layers, count, *self.row_shape), self.store_dtype
