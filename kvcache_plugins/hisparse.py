"""HiSparse pool: a DSA pool over a large *logical* slot space, of which a subset is resident in a
small device latent buffer that sparse-attention kernels read.

- ``size`` counts logical slots (``device_size * ratio``): allocators hand them out, and every
  ``loc``/``indices`` argument names them. The logical latent store and the indexer keys (which
  the indexer scans over every token) cover the logical space.
- ``get_key_buffer`` and friends return the **device** latent, ``[device_size + P, 1, dim]``,
  indexed by device slot. A logical -> device table (registered by the allocator; -1 = not
  resident) translates.
- Writes go through to both: the logical store always, the device buffer where the slot is
  resident. Non-resident rows are redirected to device slot 0, the padding slot, which keeps the
  write free of a host sync.
- Reads and offload take a slot's device row when it is resident, else its store row: a kernel
  that writes the device buffer in place is then still captured. Offload therefore captures the
  full logical content of any slot set bit-exactly, resident or not; reload writes the store at
  the new slots and the device rows of those new slots that are resident.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    InvalidSlotError,
    LayerRows,
    PoolConfig,
    PoolSpec,
    ShapeMismatchError,
    check_slots,
    hookimpl,
)

from ._hisparse_alloc import HiSparseSlotAllocator, empty_logical_to_device
from .dsa import DSATokenToKVPool, index_dtype_of
from .mla import require

__all__ = ["HiSparseSlotAllocator", "HiSparseTokenToKVPool", "create", "kvcache_pool_specs"]

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class HiSparseTokenToKVPool(DSATokenToKVPool):
    """DSA over ``device_size * ratio`` logical slots; ``device_size`` of them resident."""

    kind = "hisparse"

    def __init__(
        self,
        device_size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device | str = "cpu",
        *,
        index_head_dim: int,
        index_dtype: torch.dtype | None = None,
        ratio: int = 2,
        store_device: torch.device | str | None = None,
        start_layer: int = 0,
        check_write_slots: bool | None = None,
    ) -> None:
        if not isinstance(ratio, int) or isinstance(ratio, bool) or ratio < 1:
            raise ValueError(f"ratio must be an int >= 1, got {ratio!r}")
        if device_size <= 0:
            raise ValueError(f"device_size must be positive, got {device_size}")
        self.device_size = device_size
        self.ratio = ratio
        # Set before the base class builds the latent store there (see _latent_device).
        self.store_device = torch.device(device if store_device is None else store_device)
        super().__init__(
            device_size * ratio,
            page_size,
            dtype,
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            index_head_dim=index_head_dim,
            index_dtype=index_dtype,
            start_layer=start_layer,
            check_write_slots=check_write_slots,
        )
        self._device_latent = LayerRows(
            layer_num,
            self.device_rows,
            (1, self.latent_dim),
            dtype,
            self.device,
            page_size=page_size,
        )
        self._l2d = empty_logical_to_device(self.rows, self.device)

    @property
    def device_rows(self) -> int:
        """Rows of the device latent: ``device_size`` slots plus the reserved first page."""
        return self.device_size + self.page_size

    def _latent_device(self) -> torch.device:
        return self.store_device

    # -- buffers ---------------------------------------------------------------------------
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The device latent of a layer, indexed by *device* slot (what kernels read)."""
        return self._device_latent.layer(self._local(layer_id))

    def get_logical_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The logical latent store of a layer, indexed by logical slot."""
        return self._latent.layer(self._local(layer_id))

    def get_kv_size_bytes(self) -> int:
        return super().get_kv_size_bytes() + self._device_latent.nbytes

    # -- logical -> device ------------------------------------------------------------------
    def register_logical_to_device(self, logical_to_device: torch.Tensor) -> None:
        """Use the allocator's table (kept by reference: its later updates are seen here)."""
        table = logical_to_device
        want = (self.rows + 1,)
        if not isinstance(table, torch.Tensor) or table.dtype != torch.int64:
            raise ShapeMismatchError(f"logical_to_device must be an int64 tensor, got {table!r}")
        if tuple(table.shape) != want or table.device != self.device:
            raise ShapeMismatchError(
                f"logical_to_device is {list(table.shape)} on {table.device}; this pool needs "
                f"{list(want)} on {self.device}"
            )
        if self.check_write_slots:
            if bool(((table < -1) | (table >= self.device_rows)).any()):
                raise InvalidSlotError(
                    f"logical_to_device holds values outside [-1, {self.device_rows})"
                )
            if int(table[-1]) != -1:
                raise InvalidSlotError("logical_to_device must end with -1 (so -1 maps to -1)")
        self._l2d = table

    def translate_loc_to_device(self, loc: torch.Tensor) -> torch.Tensor:
        """Device slots of logical ``loc`` (any shape); -1 where not resident, and for -1."""
        if not isinstance(loc, torch.Tensor) or loc.dtype not in _INT_DTYPES:
            raise InvalidSlotError(f"loc must be an integer tensor, got {loc!r}")
        idx = loc.to(self.device, torch.int64)
        if self.check_write_slots and idx.numel():
            bad = (idx < -1) | (idx >= self.rows)
            if bool(bad.any()):
                raise InvalidSlotError(
                    f"loc holds {int(idx[bad].reshape(-1)[0])}, outside [-1, {self.rows})"
                )
        return self._l2d[idx]

    def load_to_device(self, logical: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copy the logical rows ``logical`` into ``device_slots`` (every layer) and record
        ``logical[i] -> device_slots[i]`` in the table.

        With `HiSparseSlotAllocator`, take ``device_slots`` from its ``alloc_device``,
        which already recorded the same pairs and copied the rows. A device slot that another
        logical slot still maps to is refused: that slot would silently read the new row.
        """
        lg = check_slots(
            logical, limit=self.rows, name="logical", allow_duplicates=False, device=self.device
        )
        ds = check_slots(
            device_slots,
            limit=self.device_rows,
            name="device_slots",
            allow_duplicates=False,
            device=self.device,
        )
        if lg.numel() != ds.numel():
            raise ShapeMismatchError(f"{ds.numel()} device slots for {lg.numel()} logical slots")
        if self.check_write_slots and ds.numel():
            self._check_device_slots_free(lg, ds)
        src = lg.to(self.store_device)
        for i in range(self.layer_num):
            rows = self._latent.data[i].index_select(0, src).to(self.device)
            self._device_latent.data[i].index_copy_(0, ds, rows)
        self._l2d[lg] = ds

    def _check_device_slots_free(self, lg: torch.Tensor, ds: torch.Tensor) -> None:
        if bool((ds < self.page_size).any()):
            raise InvalidSlotError(f"device_slots lie in the reserved page 0 (< {self.page_size})")
        # One pass over the table (CPU default; off with check_write_slots=False on accelerators).
        table = self._l2d[:-1]
        held = torch.isin(table, ds)
        held[lg] = False
        if bool(held.any()):
            other = int(held.nonzero()[0, 0])
            raise InvalidSlotError(
                f"device slot {int(table[other])} already holds logical slot {other}"
            )

    # -- latent hooks: write-through, device-preferred reads --------------------------------
    def _latent_write(self, local: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        target = self._l2d[slots].clamp_min(0)  # not resident -> padding slot 0
        if self.check_write_slots:
            # Before the store is written: a table value the device buffer cannot hold would
            # otherwise fail the second scatter with the first one already applied.
            check_slots(
                target, limit=self.device_rows, name="device slots", allow_zero=True, device=None
            )
        self._latent.write(local, slots.to(self.store_device), rows.to(self.store_device))
        self._device_latent.write(local, target, rows.to(self.device))

    def _latent_read(self, local: int, slots: torch.Tensor) -> torch.Tensor:
        stored = self._latent.data[local].index_select(0, slots.to(self.store_device))
        dev = self._l2d[slots]
        resident = self._device_latent.data[local].index_select(0, dev.clamp_min(0))
        return torch.where((dev >= 0).view(-1, 1, 1), resident, stored.to(self.device))

    def _resident(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions (host) in ``slots`` that are resident, and their device slots."""
        dev = self._l2d[slots]
        pos = (dev >= 0).nonzero().reshape(-1)
        return pos.cpu(), dev[pos]

    def _offload_parts(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        # Each latent row is read once: from the device copy when resident (it is the one
        # kernels may have written), else from the logical store.
        pos, dev = self._resident(slots)
        if pos.numel() == slots.numel():
            latent = self._device_latent.gather(dev)
        else:
            latent = self._latent.gather(slots.to(self.store_device))
            if pos.numel():
                latent[:, pos] = self._device_latent.gather(dev)
        return {"latent": latent, **self._index_parts(slots)}

    def _load_parts(self, slots: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        """Store and indexer at ``slots``, then the device rows of the resident ones.

        The device targets are checked (in range, outside page 0, distinct) before the first
        write: the store and the device are two parts of one reload, and a table corrupted
        into naming a row twice or past the buffer must not leave the store loaded and the
        device not.
        """
        pos, dev = self._resident(slots)
        if dev.numel():
            dev = check_slots(
                dev, limit=self.device_rows, name="device slots", allow_duplicates=False
            )
            if bool((dev < self.page_size).any()):
                raise InvalidSlotError(
                    f"the table maps a reloaded slot into device page 0 (< {self.page_size})"
                )
        super()._load_parts(slots, parts)  # write-through: the logical store is always whole
        if pos.numel() == slots.numel():
            self._device_latent.scatter(dev, parts["latent"])
        elif pos.numel():
            self._device_latent.scatter(dev, parts["latent"][:, pos])


def create(config: PoolConfig) -> tuple[HiSparseTokenToKVPool, HiSparseSlotAllocator]:
    """Build a HiSparse pool (``config.size`` device slots, ``size * hisparse_ratio`` logical)
    and its allocator, which registers the logical -> device table with the pool.

    ``config.options["hisparse_store_device"]`` places the logical latent store (default: the
    pool's device).
    """
    store = config.options.get("hisparse_store_device")
    if store is not None and not isinstance(store, (str, torch.device)):
        raise TypeError(f"options['hisparse_store_device'] must be a device, got {store!r}")
    pool = HiSparseTokenToKVPool(
        device_size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        kv_lora_rank=require(config.kv_lora_rank, "kv_lora_rank", "hisparse"),
        qk_rope_head_dim=require(config.qk_rope_head_dim, "qk_rope_head_dim", "hisparse"),
        layer_num=config.layer_num,
        device=config.device,
        index_head_dim=require(config.index_head_dim, "index_head_dim", "hisparse"),
        index_dtype=index_dtype_of(config),
        ratio=config.hisparse_ratio,
        store_device=store,
        start_layer=config.start_layer,
        check_write_slots=config.checks_write_slots,
    )
    return pool, HiSparseSlotAllocator(pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="hisparse",
            pool_class=HiSparseTokenToKVPool,
            allocator_class=HiSparseSlotAllocator,
            factory=create,
            capabilities=frozenset(
                {
                    Capability.OFFLOAD,
                    Capability.MLA,
                    Capability.INDEXER,
                    Capability.HISPARSE,
                    Capability.PAGED,
                }
            ),
            description="HiSparse: DSA over a logical store, a device-resident subset of slots",
        )
    ]
