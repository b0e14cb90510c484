"""Quantised per-layer rows: int8 or fp8 values plus their scales, for pool authors.

Why a helper: a quantised KV cache (int8 or fp8, with a scale per token or per block of a
token's row) is a main reason to write a pool of one's own, and every such pool needs the same
pieces: quantise on write, dequantise on read, gather values *and* scales into one snapshot,
scatter both back, and describe both parts so ``expect_snapshot`` can validate a snapshot
before any byte is written. [`QuantizedLayerRows`][kvcache_core.QuantizedLayerRows] is those
pieces, built on the same rules as [`LayerRows`][kvcache_core.LayerRows] (``index_select``
into a preallocated host tensor; fp8 kept as uint8 because indexing kernels lack fp8).

Why power-of-two scales: a scale ``2**e`` makes dequantisation (``q * scale``) exact and makes
quantisation exact for every value that fits ``qmax`` steps of that scale, so a pool built on
this helper reads back exactly what it was given whenever the values are representable (small
multiples of a power of two, such as the behaviour battery's ``randint(-16, 16) / 2``), and
differs by at most one quantisation step otherwise. The price is at most one bit of range
compared with ``absmax / qmax`` scales. An all-zero row gets scale 1.

``k_scale``/``v_scale`` of ``set_kv_buffer`` divide the values before quantising (a quantised
write always casts, so the contract's scales always apply); the stored scale is the per-token
(or per-block) one computed from the divided values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import ShapeMismatchError, UnsupportedDtypeError
from .storage import gather_rows, host_zeros, scatter_rows, storage_dtype

__all__ = ["QuantizedLayerRows"]


def _qmax(quant_dtype: torch.dtype) -> float:
    if quant_dtype == torch.int8:
        return 127.0
    if quant_dtype.is_floating_point and quant_dtype.itemsize == 1:
        return float(torch.finfo(quant_dtype).max)
    raise UnsupportedDtypeError(
        f"quantised rows store int8 or an fp8 dtype, got {quant_dtype} "
        "(use LayerRows for unquantised storage)"
    )


class QuantizedLayerRows:
    """``layers`` x ``rows`` quantised rows of ``row_shape`` plus their float32 scales.

    ``quant_dtype`` is ``torch.int8`` or an fp8 dtype (kept as uint8 in storage). ``block``
    is the number of trailing row elements that share one scale: ``None`` means one scale per
    row (per token); otherwise it must divide the row's element count, and a row has
    ``row_numel // block`` scales. ``dtype`` is the compute dtype that `dequantize`
    returns and that writes are cast from. ``page_size`` is the pool's: offloads of whole
    pages are copied a page at a time, as in [`LayerRows`][kvcache_core.LayerRows].
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        row_shape: Sequence[int],
        *,
        dtype: torch.dtype,
        device: torch.device,
        quant_dtype: torch.dtype = torch.int8,
        block: int | None = None,
        page_size: int = 1,
    ) -> None:
        self.dtype = dtype
        """The compute dtype ``dequantize`` returns and writes are cast from."""
        self.quant_dtype = quant_dtype
        """What values are quantised to: ``torch.int8`` or an fp8 dtype."""
        self.qmax = _qmax(quant_dtype)
        """The largest magnitude ``quant_dtype`` holds (127 for int8): scales map each group's
        absolute maximum to at most this."""
        self.store_dtype = quant_dtype if quant_dtype == torch.int8 else storage_dtype(quant_dtype)
        """The dtype ``data`` holds (int8, or uint8 for fp8)."""
        self.row_shape = tuple(int(d) for d in row_shape)
        """The shape of one row."""
        row_numel = 1
        for d in self.row_shape:
            row_numel *= d
        if block is not None and (block <= 0 or row_numel % block):
            raise ShapeMismatchError(f"block {block} does not divide a row of {row_numel} values")
        self.block = row_numel if block is None else block
        """Row elements that share one scale (the whole row when ``block`` was None)."""
        self.groups = row_numel // self.block
        """Scales per row."""
        self.device = device
        """Where values and scales live."""
        self.page_size = int(page_size)
        """Slots per page of the pool: whole-page offloads are copied a page at a time."""
        self.data = host_zeros((layers, rows, *self.row_shape), self.store_dtype, device)
        """The quantised values, ``[layers, rows, *row_shape]`` in ``store_dtype``."""
        self.scales = host_zeros((layers, rows, self.groups), torch.float32, device).fill_(1.0)
        """The float32 scales, ``[layers, rows, groups]`` (1 for rows never written)."""

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
        """Bytes of the values and the scales (what ``get_kv_size_bytes`` counts)."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales))

    # -- quantisation ----------------------------------------------------------------------
    def quantize(
        self, values: torch.Tensor, scale: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(stored values, scales)`` for ``values`` (``[n, *row_shape]``), never in place.

        ``scale`` (the contract's ``k_scale``/``v_scale``) divides first only when the write
        casts, i.e. ``values`` are not in the compute dtype: engines pass a layer's checkpoint
        scale on every write, and a write already in the pool's dtype is stored as given
        (docs/contract.md, "Scales"). The per-token or per-block scales of the quantisation
        itself are this helper's own business and always apply.
        """
        x = values.to(device=self.device, dtype=torch.float32)
        if scale is not None and values.dtype != self.dtype:
            x = x / scale
        n = x.shape[0]
        grouped = x.reshape(n, self.groups, self.block)
        absmax = grouped.abs().amax(dim=-1)
        exponent = torch.ceil(torch.log2(absmax / self.qmax))
        scales = torch.where(absmax > 0, torch.exp2(exponent), torch.ones_like(absmax))
        q = grouped / scales[..., None]
        if self.quant_dtype == torch.int8:
            stored = q.round().clamp(-self.qmax, self.qmax).to(torch.int8)
        else:
            stored = q.to(self.quant_dtype).view(self.store_dtype)
        return stored.reshape(n, *self.row_shape), scales

    def _dequantize(self, stored: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        n = stored.shape[0]
        q = stored if self.quant_dtype == torch.int8 else stored.view(self.quant_dtype)
        grouped = q.to(torch.float32).reshape(n, self.groups, self.block) * scales[..., None]
        return grouped.reshape(n, *self.row_shape).to(self.dtype)

    def dequantize(self, local_id: int) -> torch.Tensor:
        """Layer ``local_id`` as a new tensor in the compute dtype (a copy, not a view)."""
        return self._dequantize(self.data[local_id], self.scales[local_id])

    def layer(self, local_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``local_id``'s stored values and scales (live views, for kernels)."""
        return self.data[local_id], self.scales[local_id]

    # -- rows ------------------------------------------------------------------------------
    def write(
        self, local_id: int, slots: torch.Tensor, stored: torch.Tensor, scales: torch.Tensor
    ) -> None:
        """Scatter what `quantize` returned into one layer."""
        self.data[local_id].index_copy_(0, slots, stored)
        self.scales[local_id].index_copy_(0, slots, scales)

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Values and scales of rows ``slots`` of every layer, as host tensors."""
        return (
            gather_rows(self.data, slots, self.page_size),
            gather_rows(self.scales, slots, self.page_size),
        )

    def scatter(self, slots: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
        """Write what `gather` returned back at ``slots`` of every layer."""
        scatter_rows(self.data, slots, values, self.page_size)
        scatter_rows(self.scales, slots, scales, self.page_size)

    def part_layouts(self, name: str, count: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Snapshot parts ``name`` and ``name + "_scale"`` for ``count`` rows, as
        ``expect_snapshot(parts=...)`` takes them."""
        return {
            name: ((self.layers, count, *self.row_shape), self.store_dtype),
            f"{name}_scale": ((self.layers, count, self.groups), torch.float32),
        }
