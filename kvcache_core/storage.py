"""Per-layer row buffers shared by pool implementations: storage dtypes, batched gathers into
host snapshots and scatters back.

Why one helper: every pool kind stores "L layers x rows x row shape" somewhere, and offload speed
is decided here (``index_select`` into a preallocated snapshot, never ``buf[idx]``;
docs/architecture.md, "Performance notes"). Third-party pools may use it too; it is part of the
public face.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .errors import UnsupportedDtypeError
from .hostmem import host_empty_cpu, host_zeros_cpu

__all__ = ["LayerRows", "host_empty", "host_zeros", "storage_dtype"]

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
    asynchronous (torch's caching host allocator reuses pinned blocks across snapshots);
    never pinned for CPU pools, where pinning costs time and needs a GPU build. For CPU pools a
    tensor of at least 2 MiB comes from kvcache's host block cache, and its block is
    reused once every tensor viewing it is gone (``kvcache_core.hostmem``). Uninitialised
    because the caller overwrites every element (zeroing would double the cost of an offload).
    """
    if for_device.type == "cpu":
        return host_empty_cpu(shape, dtype)
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=for_device.type == "cuda")


def host_zeros(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer for a pool on ``device``: on CPU, at least 2 MiB are backed by huge pages.

    An anonymous mapping advised ``MADV_HUGEPAGE`` is zero-filled by the kernel as it is first
    touched, so it costs no more than ``torch.zeros`` and random-row copies into it miss the
    TLB less. Other devices, small buffers and systems without huge-page advice get
    ``torch.zeros``.
    """
    if device.type == "cpu":
        return host_zeros_cpu(shape, dtype)
    return torch.zeros(tuple(shape), dtype=dtype, device=device)


def whole_pages(slots: torch.Tensor, page_size: int, rows: int) -> torch.Tensor | None:
    """Page ids when ``slots`` are whole pages, in order; else None.

    Whole pages: ``page_size > 1``, ``rows`` a multiple of it, and ``slots`` (1-D) made of
    groups of ``page_size`` consecutive slots each starting at a multiple of ``page_size``.
    Then row ``j`` of the gather is row ``j % page_size`` of page ``j // page_size``, so a
    per-page copy yields exactly the rows a per-row copy would (one host sync to decide).
    """
    n = slots.numel()
    if page_size <= 1 or n == 0 or n % page_size or rows % page_size or slots.dim() != 1:
        return None
    grid = slots.reshape(-1, page_size)
    first = grid[:, :1]
    step = torch.arange(page_size, dtype=slots.dtype, device=slots.device)
    aligned = (first % page_size == 0).all() & (grid == first + step).all()
    return first.reshape(-1) // page_size if bool(aligned) else None


#: Element types a scatter may view rows as, widest first. complex128 is only ever moved (16
#: bytes per element, loads and stores, never arithmetic), which keeps every bit, NaN payloads
#: included; tests/test_host_memory.py checks it on random bit patterns.
_WIDE_DTYPES = (torch.complex128, torch.int64, torch.int32, torch.int16)


def _wide(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` (2-D, contiguous) viewed as the widest element type that tiles a row.

    ``index_copy_`` copies element by element on CPU: the same bytes in fewer, wider elements
    are copied bit for bit and faster (bf16 rows of 2 KiB, random slots: 5.1 GB/s as bf16,
    5.8 as int64, more as 16-byte elements; whole pages of 16 slots: 0.75x memcpy as int64,
    1.0x as 16-byte elements, measured on this 2-core machine).
    """
    row_bytes = rows.shape[1] * rows.element_size()
    offset = rows.storage_offset() * rows.element_size()
    for wide in _WIDE_DTYPES:
        if row_bytes % wide.itemsize == 0 and offset % wide.itemsize == 0:
            return rows.view(wide)
    return rows if rows.element_size() == 1 else rows.view(torch.uint8)


def _flat_index(index: torch.Tensor, layers: int, per_layer: int) -> torch.Tensor:
    """``index`` repeated for every layer of a ``[layers * per_layer, ...]`` view: entry
    ``l * len(index) + j`` is ``l * per_layer + index[j]``."""
    base = torch.arange(layers, dtype=index.dtype, device=index.device).mul_(per_layer)
    return base.unsqueeze(1).add(index.reshape(1, -1)).reshape(-1)


def _units(
    data: torch.Tensor, slots: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, int, int]:
    """What to copy: ``(index, units per layer, elements per unit)``: pages of the pool when
    ``slots`` are whole pages, else rows."""
    rows, width = int(data.shape[1]), math.prod(data.shape[2:])
    pages = whole_pages(slots, page_size, rows)
    if pages is not None:
        return pages, rows // page_size, width * page_size
    return slots, rows, width


#: Whole pages are gathered in pieces of at most this many bytes: pages of 72-128 KiB per layer
#: copied whole ran at 0.75-0.85x memcpy here, in pieces of 16-32 KiB at 0.95-1.0x.
_GATHER_PIECE = 32 << 10


def gather_rows(data: torch.Tensor, slots: torch.Tensor, page_size: int = 1) -> torch.Tensor:
    """Rows ``slots`` of every layer of ``data`` (``[layers, rows, *row_shape]``), as a host
    tensor ``[layers, n, *row_shape]``.

    On CPU one ``index_select`` over every layer at once (a flat view, so one parallel region:
    per-layer calls lose far more when other processes share the cores), copying whole pages
    when ``slots`` are whole pages of ``page_size``. Elsewhere one gather per layer, so device
    memory never holds more than one layer's copy.
    """
    layers = int(data.shape[0])
    n = slots.numel()
    out = host_empty((layers, n, *data.shape[2:]), data.dtype, data.device)
    if n == 0 or layers == 0:
        return out
    index, per_layer, unit = _units(data, slots, page_size)
    source = data.view(layers * per_layer, unit)
    target = out.view(layers * index.numel(), unit)
    if data.device.type == "cpu":
        flat = _flat_index(index, layers, per_layer)
        split = 1  # whole pages: copy them in pieces of at most _GATHER_PIECE bytes
        while (
            unit * data.element_size() > split * _GATHER_PIECE
            and unit != math.prod(data.shape[2:])
            and page_size % (2 * split) == 0
        ):
            split *= 2
        if split > 1:
            step = torch.arange(split, dtype=flat.dtype)
            flat = flat.unsqueeze(1).mul(split).add(step).reshape(-1)
            source = source.view(-1, unit // split)
            target = target.view(-1, unit // split)
        torch.index_select(source, 0, flat, out=target)
    else:
        for i in range(layers):
            part = torch.index_select(source[i * per_layer : (i + 1) * per_layer], 0, index)
            target[i * index.numel() : (i + 1) * index.numel()].copy_(part)
    return out


def scatter_rows(
    data: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, page_size: int = 1
) -> None:
    """Write ``values`` (``[layers, n, *row_shape]``, host or device) at ``slots`` of every
    layer of ``data``.

    On CPU one ``index_copy_`` over every layer at once, of rows (or whole pages) viewed as the
    widest integer type that tiles them (bit for bit). Elsewhere one per layer, each layer's
    values moved to the device first.
    """
    layers = int(data.shape[0])
    n = slots.numel()
    if values.dtype != data.dtype or tuple(values.shape) != (layers, n, *data.shape[2:]):
        for i in range(layers):  # let index_copy_ report the mismatch as it always has
            data[i].index_copy_(0, slots, values[i].to(data.device, non_blocking=True))
        return
    if n == 0 or layers == 0:
        return
    index, per_layer, unit = _units(data, slots, page_size)
    target = _wide(data.view(layers * per_layer, unit))
    count = index.numel()
    if data.device.type == "cpu" and values.device.type == "cpu":
        source = values.reshape(layers * count, unit).contiguous().view(target.dtype)
        target.index_copy_(0, _flat_index(index, layers, per_layer), source)
        return
    for i in range(layers):
        part = values[i].to(data.device, non_blocking=True).reshape(count, unit).contiguous()
        target[i * per_layer : (i + 1) * per_layer].index_copy_(0, index, part.view(target.dtype))


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
    :param page_size: Slots per page of the pool: offloads of whole pages (runs of
        ``page_size`` slots starting at a multiple of it) are copied a page at a time, at
        memcpy speed; the snapshot is the same either way.
    :param head_major: Keep a ``(heads, dim)`` row shape in memory as ``[layers, heads, rows,
        dim]``, so that one head's rows on consecutive slots are one contiguous block. ``data``
        and ``layer`` still index rows first (they are then strided views), writes and
        snapshots are unchanged, bit for bit; what changes is speed. Attention that reads a
        run of slots in place (transformers' SDPA on CPU) streams each head from contiguous
        memory, about twice as fast at a 2,048-token context as through the row-major
        stride, while offload gathers each head separately (slower than whole rows).
    :raises UnsupportedDtypeError: ``dtype`` cannot be stored (see ``storage_dtype``).
    :raises ValueError: ``head_major`` with a row shape that is not ``(heads, dim)``.
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        row_shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
        page_size: int = 1,
        *,
        head_major: bool = False,
    ) -> None:
        self.dtype = dtype
        """The compute dtype: what ``layer`` views rows as and what writes are cast to."""
        self.store_dtype = storage_dtype(dtype)
        """The dtype the tensor holds (uint8 for fp8, else ``dtype``)."""
        self.row_shape = tuple(int(d) for d in row_shape)
        """The shape of one row, e.g. ``(head_num, head_dim)``."""
        self.device = device
        """Where the rows live."""
        self.page_size = int(page_size)
        """Slots per page of the pool: whole-page offloads are copied a page at a time."""
        if head_major and len(self.row_shape) != 2:
            raise ValueError(
                f"head_major needs a (heads, dim) row shape, got {list(self.row_shape)}"
            )
        self.head_major = head_major
        """Whether memory holds ``[layers, heads, rows, dim]`` (see the class's parameters)."""
        # Head-major: memory ``[layers, heads, rows, dim]``, seen through ``data`` row-first.
        shape = (layers, *self.row_shape[:1], rows, *self.row_shape[1:])
        self.data = (
            host_zeros(shape, self.store_dtype, device).transpose(1, 2)
            if head_major
            else host_zeros((layers, rows, *self.row_shape), self.store_dtype, device)
        )
        """Every row, ``[layers, rows, *row_shape]`` in ``store_dtype``; kernels and custom
        copies may use it directly (a strided view when ``head_major``)."""
        # One view per layer, made once: indexing ``data`` anew costs as much as a one-row
        # write, which every layer of every forward pass makes.
        self._layer_views = tuple(self.data.unbind(0))

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
        buf = self._layer_views[local_id]
        return buf if self.store_dtype == self.dtype else buf.view(self.dtype)

    def to_storage(self, values: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """Cast values into the stored representation, never in place.

        ``scale`` divides only when the write casts (``values.dtype`` is not the pool's dtype),
        as engines apply it: attention backends pass the layer's ``k_scale`` on every write
        whenever the checkpoint has one (an fp8 checkpoint served with a bf16 KV cache), and a
        write that needs no cast must store the values as given. Dividing out of place keeps the
        caller's tensor intact (engines divide in place; callers may still read theirs).
        """
        if values.dtype == self.dtype == self.store_dtype and values.device == self.device:
            return values  # already stored as-is (the common write): no cast, no move
        if values.dtype != self.dtype:
            if scale is not None:
                values = values / scale
            values = values.to(self.dtype)
        if self.store_dtype != self.dtype:
            values = values.view(self.store_dtype)
        return values.to(self.device)

    def write(self, local_id: int, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Scatter stored-representation ``values`` (``[n, *row_shape]``) into one layer."""
        self._layer_views[local_id].index_copy_(0, slots, values)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` of every layer, as a host tensor ``[layers, n, *row_shape]``."""
        if self.head_major:
            out = host_empty(
                (self.layers, slots.numel(), *self.row_shape), self.data.dtype, self.device
            )
            by_head = self.data.transpose(1, 2)
            out.transpose(1, 2).copy_(by_head.index_select(2, slots))
            return out
        return gather_rows(self.data, slots, self.page_size)

    def scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write host ``rows`` (``[layers, n, *row_shape]``) back at ``slots`` of every layer."""
        if self.head_major:
            by_head = self.data.transpose(1, 2)
            by_head.index_copy_(2, slots, rows.to(self.device).transpose(1, 2))
            return
        scatter_rows(self.data, slots, rows, self.page_size)

    def part_layout(self, count: int) -> tuple[tuple[int, ...], torch.dtype]:
        """The (shape, dtype) a snapshot part of ``count`` rows has."""
        return (self.layers, count, *self.row_shape), self.store_dtype
