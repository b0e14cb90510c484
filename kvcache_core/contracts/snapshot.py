"""``KVSnapshot``: what ``get_cpu_copy`` returns and ``load_cpu_copy`` takes back.

A snapshot is self-describing so that loading it into the wrong pool fails *before* a byte is
written: it names the pool kind, the compute dtype, how many tokens (or request slots) it holds,
and carries its tensors as named parts whose shapes and dtypes are checked against what the
target pool expects. Composite pools (SWA, hybrid Mamba) nest the snapshots of their parts in
``children``; ``meta`` holds small plain values (a config fingerprint, a mask's meaning).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from ..errors import SnapshotMismatchError

__all__ = ["KVSnapshot", "PartLayout", "expect_snapshot"]

PartLayout = tuple[tuple[int, ...], torch.dtype]
"""Expected ``(shape, dtype)`` of one snapshot part, as
[`expect_snapshot`][kvcache_core.expect_snapshot] takes it and
[`KVSnapshot.layout`][kvcache_core.KVSnapshot.layout] returns it.

Shape and dtype only, never values: enough to refuse a snapshot from another pool or config
before any byte is written, and cheap to compare.
"""


@dataclass(frozen=True)
class KVSnapshot:
    """A host-side copy of some slots of a pool: what ``get_cpu_copy`` returns on retraction
    and ``load_cpu_copy`` takes back on resume.

    Self-describing so that loading it into the wrong pool fails before a byte is written. The
    constructor freezes ``parts``, ``children`` and ``meta`` (copies them into read-only
    mappings): a snapshot is a value, shared between threads and retries.

    :param pool_kind: The kind of pool it was taken from (``"mha"``, ``"mla"`` ...).
    :param dtype: The pool's compute dtype.
    :param token_count: How many indices it was taken at: ``load_cpu_copy`` must be given
        exactly that many new indices, in the same order.
    :param parts: Named host tensors (copies, never views of the pool's buffers).
    :param children: Snapshots of the parts of a composite pool (SWA's window side, hybrid
        Mamba state), by name; None for a part that held nothing.
    :param meta: Small plain values a pool checks on load (a config fingerprint, a mask's
        meaning).
    :raises ValueError: ``token_count`` is negative.
    :raises TypeError: A part is not a ``torch.Tensor``.
    """

    pool_kind: str
    """The kind of pool it was taken from (``"mha"``, ``"mla"`` ...)."""
    dtype: torch.dtype
    """The pool's compute dtype."""
    token_count: int
    """How many indices it was taken at: ``load_cpu_copy`` must be given exactly that many new
    indices, in the same order.
    """
    parts: Mapping[str, torch.Tensor]
    """Named host tensors (copies, never views of the pool's buffers)."""
    children: Mapping[str, KVSnapshot | None] = field(default_factory=dict)
    """Snapshots of the parts of a composite pool (SWA's window side, hybrid Mamba state), by name;
    None for a part that held nothing.
    """
    meta: Mapping[str, object] = field(default_factory=dict)
    """Small plain values a pool checks on load (a config fingerprint, a mask's meaning)."""

    def __post_init__(self) -> None:
        """Validate the count and the parts, then freeze the mappings (see the class)."""
        if self.token_count < 0:
            raise ValueError(f"token_count must be >= 0, got {self.token_count}")
        for name, tensor in self.parts.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"snapshot part {name!r} must be a tensor, got {type(tensor)}")
        # Freeze the containers too: a snapshot is a value, shared between threads and retries.
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))
        object.__setattr__(self, "children", MappingProxyType(dict(self.children)))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    @property
    def nbytes(self) -> int:
        """Bytes held by this snapshot and its children."""
        own = sum(t.numel() * t.element_size() for t in self.parts.values())
        return own + sum(c.nbytes for c in self.children.values() if c is not None)

    def layout(self) -> dict[str, PartLayout]:
        """Shape and dtype of every part (for error messages and comparisons)."""
        return {name: (tuple(t.shape), t.dtype) for name, t in self.parts.items()}

    def to_bytes(self) -> bytes:
        """This snapshot as bytes that can leave the process (a store, a socket, a file).

        The format is safetensors with a versioned kvcache header and a checksum, never
        pickle; see [`snapshot_wire`][kvcache_core.snapshot_wire] for what it holds and costs.

        :raises TypeError: A meta value the format cannot carry (the message names its key).
        """
        from ..snapshot_wire import snapshot_to_bytes

        return snapshot_to_bytes(self)

    @classmethod
    def from_bytes(
        cls, data: bytes | bytearray | memoryview, *, max_bytes: int | None = None
    ) -> KVSnapshot:
        """The snapshot [`to_bytes`][kvcache_core.KVSnapshot.to_bytes] wrote, bit for bit,
        after checking every byte of ``data`` (the data is copied once, while it is hashed, into
        memory the snapshot owns: writing to its tensors changes nothing else).

        :param max_bytes: Refuse a blob larger than this, before anything of it is copied.
        :raises SnapshotMismatchError: The only exception for a bad blob: truncated, oversized,
            corrupted, foreign, hostile (past the format's bounds) or of a newer format; the
            message says which, and nothing has been loaded anywhere.
        """
        from ..snapshot_wire import snapshot_from_bytes

        return snapshot_from_bytes(data, snapshot_type=cls, max_bytes=max_bytes)


def expect_snapshot(
    snapshot: object,
    *,
    kind: str,
    dtype: torch.dtype,
    token_count: int,
    parts: Mapping[str, PartLayout],
    meta: Mapping[str, object] | None = None,
) -> KVSnapshot:
    """Check that ``snapshot`` fits a pool before ``load_cpu_copy`` writes any of it.

    Every pool's ``load_cpu_copy`` calls this first, so a wrong snapshot is refused with the
    same wording everywhere and never half-loaded. The message names both sides (what the
    snapshot holds, what the pool expects), in the style of mypy's stubtest, so the caller can
    tell a wrong pool from a wrong index count.

    :param snapshot: What the caller passed (anything: a non-snapshot is refused too).
    :param kind: The loading pool's kind; must equal ``snapshot.pool_kind``.
    :param dtype: The loading pool's compute dtype.
    :param token_count: How many indices the caller gave ``load_cpu_copy``.
    :param parts: Every part the pool expects, by name, as a
        [`PartLayout`][kvcache_core.PartLayout]; extra or missing parts are refused.
    :param meta: Entries ``snapshot.meta`` must hold with equal values (others are ignored).
    :returns: ``snapshot``, typed as a [`KVSnapshot`][kvcache_core.KVSnapshot].
    :raises SnapshotMismatchError: The first mismatch found, naming both sides.
    """
    if not isinstance(snapshot, KVSnapshot):
        raise SnapshotMismatchError(f"expected a KVSnapshot, got {type(snapshot).__name__}")
    if snapshot.pool_kind != kind:
        raise SnapshotMismatchError(
            f"snapshot was taken from a {snapshot.pool_kind!r} pool; this pool is {kind!r}"
        )
    if snapshot.dtype != dtype:
        raise SnapshotMismatchError(f"snapshot dtype is {snapshot.dtype}; this pool stores {dtype}")
    if snapshot.token_count != token_count:
        raise SnapshotMismatchError(
            f"snapshot holds {snapshot.token_count} entries but {token_count} indices were given "
            "(load_cpu_copy needs new indices of the same count and order)"
        )
    for key, expected in (meta or {}).items():
        got = snapshot.meta.get(key)
        if got != expected:
            raise SnapshotMismatchError(f"snapshot {key} is {got!r}; this pool has {expected!r}")
    have = snapshot.layout()
    if set(have) != set(parts):
        raise SnapshotMismatchError(
            f"snapshot has parts {sorted(have)}; this pool expects {sorted(parts)}"
        )
    for name, (shape, part_dtype) in parts.items():
        got_shape, got_dtype = have[name]
        if got_shape != tuple(shape) or got_dtype != part_dtype:
            raise SnapshotMismatchError(
                f"snapshot part {name!r} is {list(got_shape)} {got_dtype}; "
                f"this pool expects {list(shape)} {part_dtype}"
            )
    return snapshot
