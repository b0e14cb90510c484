"""transformers' offloading manager with the pool's allocator as the host copy path.

transformers decides *which* requests leave under block pressure and requeues them; that
logic is kept. Only the copy is replaced: its own path copies arena blocks into a pinned host
buffer, which cannot be allocated on a machine without an accelerator. Here a victim's tokens
leave through the allocator's ``get_cpu_copy`` (a [`KVSnapshot`][kvcache_core.KVSnapshot] in
ordinary host memory) and come back through its ``load_cpu_copy`` into newly allocated pages.
"""

from __future__ import annotations

from typing import Any

from transformers.generation.continuous_batching.offloading_manager import OffloadingManager

from ._batching_cache import CapturedRequest, KVPoolPagedCache


class KVPoolOffloading(OffloadingManager):
    """Offload and restore through the kvcache allocator; no pinned host buffer.

    Every victim that holds tokens is offloaded (host memory is the only bound); a victim that
    holds none is left to transformers' soft reset, which re-runs its prompt.
    """

    def __init__(self, cache: KVPoolPagedCache, scheduler: Any, distributed_helper: Any) -> None:
        # A zero-sized host pool: transformers' own copy path is never set up.
        super().__init__(
            cache=cache,
            scheduler=scheduler,
            cpu_offload_space_gib=0.0,
            safety_threshold=1.0,
            compute_stream=None,
            distributed_helper=distributed_helper,
        )
        self.kv_cache = cache
        self._snapshots: dict[str, CapturedRequest] = {}
        self._captured: dict[str, CapturedRequest] = {}

    def offload_requests(self) -> bool:
        """transformers' victim choice, with the victims' tokens snapshotted as they are freed."""
        with self.kv_cache.capturing() as captured:
            self._captured = captured
            try:
                return bool(super().offload_requests())
            finally:
                self._captured = {}

    def _offload_to_cpu(self, victims: list[Any], victim_block_tables: Any) -> set[str]:
        done: set[str] = set()
        for state in victims:
            captured = self._captured.pop(state.request_id, None)
            if captured is None:
                continue
            self._snapshots[state.request_id] = captured
            state.is_cpu_offloaded = True
            done.add(state.request_id)
        return done

    def restore_scheduled_requests(self, requests_in_batch: list[Any]) -> None:
        """Load the offloaded requests of this batch back before its slots are computed."""
        for future_state in requests_in_batch:
            state = future_state.state
            if not state.is_cpu_offloaded:
                continue
            captured = self._snapshots.pop(state.request_id)
            self.kv_cache.restore(state.request_id, captured, keep=state.position_offset)
            state.is_cpu_offloaded = False

    def free_request_cpu_cache(self, state: Any) -> None:
        """Drop the snapshot of a cancelled or failed request."""
        if state.is_cpu_offloaded:
            self._snapshots.pop(state.request_id, None)
            state.is_cpu_offloaded = False

    def reset(self) -> None:
        """Forget every snapshot (a new generation session)."""
        self.free_all_waiting_cpu_caches()
        self._snapshots.clear()

    @property
    def held_snapshots(self) -> int:
        """Requests currently offloaded to the host."""
        return len(self._snapshots)
