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
    """The dtype a buffer is stored in: fp8 is kept as uint8 (indexing kernels lack fp8)."""
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
    """An uninitialised host tensor; pinned when it will be copied from or to a GPU."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=for_device.type == "cuda")


class LayerRows:
    """``layers`` buffers of ``rows`` rows of ``row_shape``, held in one tensor.

    ``dtype`` is the compute dtype callers see; the data is kept in ``storage_dtype(dtype)``.
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
        return int(self.data.shape[0])

    @property
    def rows(self) -> int:
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
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
