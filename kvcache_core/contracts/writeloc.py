"""Where a forward pass writes: a bare slot tensor, or a ``KVWriteLoc`` record.

Engines compute the sliding-window slots once per forward pass and hand every pool the same
record. A pool that forgot to unwrap the record (and indexed a buffer with the record itself)
broke scaled MLA prefill in production, so every pool goes through ``unwrap_write_loc``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVWriteLoc", "unwrap_write_loc"]


@dataclass(frozen=True)
class KVWriteLoc:
    """Write locations for one forward pass, as ``set_kv_buffer``'s ``loc`` accepts them.

    Engines compute the sliding-window slots once per forward pass and hand every pool the same
    record, instead of each windowed layer translating ``loc`` again. Pools read it with
    [`unwrap_write_loc`][kvcache_core.unwrap_write_loc], never by indexing with the record.

    :param loc: Full-attention token slots.
    :param swa_loc: The matching sliding-window slots, when the engine already translated them;
        None asks a windowed pool to translate ``loc`` itself.
    :param full_loc: Overrides ``loc`` for full-attention layers when it differs (it falls back
        to ``loc``).
    :raises TypeError: A field is not a ``torch.Tensor`` (or None), caught here rather than as
        a confusing indexing error inside a pool.
    """

    loc: torch.Tensor
    """Full-attention token slots."""
    swa_loc: torch.Tensor | None = None
    """The matching sliding-window slots, when the engine already translated them; None asks a
    windowed pool to translate ``loc`` itself.
    """
    full_loc: torch.Tensor | None = None
    """Overrides ``loc`` for full-attention layers when it differs (it falls back to ``loc``)."""

    def __post_init__(self) -> None:
        """Refuse a field that is not a tensor (or None), where the mistake is made."""
        for name in ("loc", "swa_loc", "full_loc"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"KVWriteLoc.{name} must be a torch.Tensor or None, got {type(value).__name__}"
                )

    @property
    def full(self) -> torch.Tensor:
        """The slots full-attention layers write to."""
        return self.full_loc if self.full_loc is not None else self.loc


def unwrap_write_loc(loc: KVWriteLoc | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``(full_slots, swa_slots_or_None)`` for either accepted form of ``loc``.

    ``set_kv_buffer`` accepts a bare slot tensor (contract 1's form, still what most engines
    pass) or a [`KVWriteLoc`][kvcache_core.KVWriteLoc]; one helper for both keeps every pool
    from re-implementing, and forgetting, the unwrapping (the checker's
    ``writeloc-not-unwrapped`` rule looks for pools that skip it).

    :raises TypeError: ``loc`` is neither form.
    """
    if isinstance(loc, KVWriteLoc):
        return loc.full, loc.swa_loc
    if isinstance(loc, torch.Tensor):
        return loc, None
    raise TypeError(
        f"loc must be a torch.Tensor of slot indices or a KVWriteLoc, got {type(loc).__name__}"
    )
