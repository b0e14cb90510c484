"""What the connector's scheduler side tells its worker side for one step (picklable values).

vLLM runs the scheduler and the workers in different processes on CPU, and sends this plan
inside its scheduler output, so it holds only ints and strings: block ids and store keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BlockTransfer", "StepPlan"]


@dataclass(frozen=True)
class BlockTransfer:
    """Blocks of one request to load from (or save to) the store, key ``i`` for block ``i``.

    :param request_id: vLLM's request id (for messages and per-request bookkeeping).
    :param keys: Store keys, one per block, in prefix order.
    :param block_ids: vLLM block ids, as many as ``keys``.
    :param first_block: Index of the first of these blocks within the request.
    :param resumed: The request was preempted before and resumes from the store.
    """

    request_id: str
    keys: tuple[str, ...]
    block_ids: tuple[int, ...]
    first_block: int = 0
    resumed: bool = False

    def __post_init__(self) -> None:
        """Refuse a transfer whose keys and blocks do not pair up."""
        if len(self.keys) != len(self.block_ids):
            raise ValueError(
                f"request {self.request_id}: {len(self.keys)} keys for {len(self.block_ids)} blocks"
            )


@dataclass(frozen=True)
class StepPlan:
    """Every load and save of one scheduler step."""

    loads: tuple[BlockTransfer, ...] = field(default_factory=tuple)
    saves: tuple[BlockTransfer, ...] = field(default_factory=tuple)
