"""The connector's two halves, written against plain values so they run without vLLM.

``SchedulerSide`` decides (which stored prefix a request can load, which of its blocks a step
completes and must save) and ``WorkerSide`` moves bytes (store <-> vLLM's blocks through a
``VLLMBlockPool``). ``KVCacheConnector`` (``_vllm_connector``) only translates vLLM's objects
into these calls. Every store call goes through ``StoreLink``: a store that fails or goes away
costs a warning and a recompute, never a request.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ..contracts.snapshot import KVSnapshot
from ..stores.spec import SnapshotStore
from ._vllm_keys import BlockKeys
from ._vllm_plan import BlockTransfer, StepPlan
from ._vllm_pool import VLLMBlockPool

__all__ = ["ConnectorStats", "ScheduledRequest", "SchedulerSide", "StoreLink", "WorkerSide"]

LOG = logging.getLogger("kvcache.vllm")

T = TypeVar("T")

#: Meta keys every saved block carries on top of the pool's own.
FINGERPRINT_META = "vllm_fingerprint"
KEY_META = "vllm_key"


@dataclass
class ConnectorStats:
    """Counters of one side of the connector; written to ``path`` (JSON) when one is given."""

    path: str | None = None
    fingerprint: str = ""
    """The engine's fingerprint (what its keys are chained from)."""
    matched_tokens: int = 0
    """Tokens the scheduler side promised vLLM from the store."""
    resumed_requests: int = 0
    """Preempted requests that resumed from the store (loaded blocks instead of recomputing)."""
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    load_errors: int = 0
    """Blocks reported to vLLM as not loaded (it recomputes them)."""
    saved_blocks: int = 0
    saved_bytes: int = 0
    save_seconds: float = 0.0
    save_errors: int = 0
    store_errors: int = 0

    def flush(self) -> None:
        """Write the counters to ``path`` (atomically: a reader sees old or new, never half)."""
        if self.path is None:
            return
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del values["path"]
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(values, fh)
        os.replace(tmp, self.path)


class StoreLink:
    """A snapshot store opened on first use; after a failure, left alone for ``retry_after`` s.

    Why: a store that is down answers every call with a timeout, and a serving engine must not
    pay that timeout on every request; between retries the connector simply finds nothing
    (vLLM recomputes) and saves nothing.
    """

    def __init__(
        self,
        url: str,
        opener: Callable[[str], SnapshotStore],
        *,
        retry_after: float = 5.0,
        stats: ConnectorStats | None = None,
    ) -> None:
        self.url = url
        self._opener = opener
        self._store: SnapshotStore | None = None
        self._down_until = 0.0
        self.retry_after = retry_after
        self.stats = stats
        self._lock = threading.Lock()

    def call(self, what: str, fn: Callable[[SnapshotStore], T]) -> T | None:
        """``fn(store)``, or None (with one warning) when the store cannot be opened or fails."""
        with self._lock:
            if time.monotonic() < self._down_until:
                return None
            try:
                if self._store is None:
                    self._store = self._opener(self.url)
                return fn(self._store)
            except Exception as exc:  # any store plugin's failure: serving goes on
                self._down_until = time.monotonic() + self.retry_after
                if self.stats is not None:
                    self.stats.store_errors += 1
                LOG.warning(
                    "kvcache: store %s failed during %s (%s: %s); serving without it for %.0f s",
                    self.url,
                    what,
                    type(exc).__name__,
                    exc,
                    self.retry_after,
                )
                self._close_quietly()
                return None

    def _close_quietly(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception:  # closing a broken connection may fail too
                LOG.debug("kvcache: closing store %s failed", self.url, exc_info=True)

    def close(self) -> None:
        """Close the store (the connector is shutting down)."""
        with self._lock:
            self._close_quietly()


@dataclass(frozen=True)
class ScheduledRequest:
    """One request in one scheduler step, as the scheduler side needs it.

    :param request_id: vLLM's request id.
    :param num_computed: Tokens whose KV exists before this step (local and loaded).
    :param num_scheduled: Tokens this step computes.
    :param block_ids: Every block of the request, in order.
    :param token_ids: Every token id known (prompt and output so far).
    """

    request_id: str
    num_computed: int
    num_scheduled: int
    block_ids: Sequence[int]
    token_ids: Sequence[int]


class SchedulerSide:
    """Matching and planning: which stored prefix each request loads, which blocks get saved.

    :param store: The store link (this process's own).
    :param fingerprint: What makes KV reusable (see ``_vllm_keys``).
    :param block_size: vLLM's block size.
    :param load: Whether this instance loads (roles ``kv_consumer`` and ``kv_both``).
    :param save: Whether it saves (roles ``kv_producer`` and ``kv_both``).
    """

    def __init__(
        self,
        store: StoreLink,
        fingerprint: str,
        block_size: int,
        *,
        load: bool,
        save: bool,
        stats: ConnectorStats | None = None,
        key_prefix: str = "kvcache-vllm/",
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.load = load
        self.save = save
        self.stats = stats if stats is not None else ConnectorStats()
        self.key_prefix = key_prefix
        self._keys: dict[str, BlockKeys] = {}
        # request id -> (num_computed asked with, token count, blocks matched): vLLM may ask
        # the same question several times per step and must get the same answer cheaply.
        self._matched: dict[str, tuple[int, int, int]] = {}
        self._loads: dict[str, BlockTransfer] = {}

    def keys_for(self, request_id: str, token_ids: Sequence[int], blocks: int | None) -> list[str]:
        """Keys of the request's first ``blocks`` full blocks (all full blocks when None)."""
        keys = self._keys.get(request_id)
        if keys is None:
            keys = self._keys[request_id] = BlockKeys(
                self.fingerprint, self.block_size, self.key_prefix
            )
        return keys.keys(token_ids, blocks)

    def matched_tokens(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> int:
        """Tokens beyond ``num_computed`` (block-aligned) that whole stored blocks provide.

        The last token is always left to compute (vLLM needs one token to run the model on),
        so a prompt of exactly ``n`` blocks matches at most ``n - 1``. Blocks are matched in
        order and the first missing one ends the match (a later block's KV is useless without
        every block before it).
        """
        if not self.load or num_computed % self.block_size:
            return 0
        usable = (len(token_ids) - 1) // self.block_size
        start = num_computed // self.block_size
        if usable <= start:
            return 0
        cached = self._matched.get(request_id)
        if cached is not None and cached[:2] == (num_computed, len(token_ids)):
            return cached[2] * self.block_size
        keys = self.keys_for(request_id, token_ids, usable)[start:]

        def count(store: SnapshotStore) -> int:
            hits = 0
            for key in keys:
                if not store.exists(key):
                    break
                hits += 1
            return hits

        hits = self.store.call("a prefix lookup", count) or 0
        self._matched[request_id] = (num_computed, len(token_ids), hits)
        return hits * self.block_size

    def after_alloc(
        self,
        request_id: str,
        block_ids: Sequence[int],
        num_external: int,
        *,
        resumed: bool = False,
    ) -> None:
        """vLLM allocated ``block_ids`` and will take ``num_external`` tokens from the store."""
        matched = self._matched.pop(request_id, None)
        if num_external <= 0 or matched is None:
            return
        first = matched[0] // self.block_size
        count = num_external // self.block_size
        keys = self._keys[request_id].computed[first : first + count]
        if len(keys) != count or len(block_ids) < first + count:
            LOG.warning(
                "kvcache: request %s: vLLM allocated %d blocks for %d external tokens from "
                "block %d; loading nothing",
                request_id,
                len(block_ids),
                num_external,
                first,
            )
            return
        self._loads[request_id] = BlockTransfer(
            request_id,
            tuple(keys),
            tuple(int(b) for b in block_ids[first : first + count]),
            first,
            resumed,
        )
        self.stats.matched_tokens += count * self.block_size
        self.stats.resumed_requests += int(resumed)
        self.stats.flush()

    def plan_step(self, scheduled: Iterable[ScheduledRequest]) -> StepPlan:
        """The loads allocated since the last step and the blocks this step fills."""
        saves: list[BlockTransfer] = []
        loads: list[BlockTransfer] = []
        for req in scheduled:
            load = self._loads.pop(req.request_id, None)
            if load is not None:
                loads.append(load)
            if not self.save:
                continue
            done = min(req.num_computed + req.num_scheduled, len(req.token_ids))
            first, last = req.num_computed // self.block_size, done // self.block_size
            if last <= first or len(req.block_ids) < last:
                continue
            keys = self.keys_for(req.request_id, req.token_ids, last)[first:last]
            blocks = tuple(int(b) for b in req.block_ids[first:last])
            saves.append(BlockTransfer(req.request_id, tuple(keys), blocks, first))
        self._loads.clear()  # allocated but not scheduled: vLLM will ask again
        return StepPlan(loads=tuple(loads), saves=tuple(saves))

    def finished(self, request_id: str) -> None:
        """Forget a request (finished or aborted)."""
        self._keys.pop(request_id, None)
        self._matched.pop(request_id, None)
        self._loads.pop(request_id, None)


class WorkerSide:
    """Loads and saves whole blocks between the store and vLLM's KV tensors.

    :param store: The store link (this process's own).
    :param fingerprint: Must equal the scheduler side's; checked in every loaded snapshot.
    :param block_size: vLLM's block size.
    """

    def __init__(
        self,
        store: StoreLink,
        fingerprint: str,
        block_size: int,
        *,
        stats: ConnectorStats | None = None,
        verify: Callable[[bytes], KVSnapshot] = KVSnapshot.from_bytes,
        async_save: bool = True,
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.stats = stats if stats is not None else ConnectorStats()
        self.pool: VLLMBlockPool | None = None
        self._verify = verify
        self._errors: set[int] = set()
        self._failed_requests: set[str] = set()
        self.async_save = async_save
        """Write saved blocks on a background thread (their host copies are taken first)."""
        self._writer: threading.Thread | None = None

    def register(self, pool: VLLMBlockPool) -> None:
        """The pool over vLLM's registered tensors (its block size must be ``block_size``)."""
        if pool.page_size != self.block_size:
            raise ValueError(
                f"the KV tensors hold blocks of {pool.page_size} tokens; the engine says "
                f"{self.block_size}"
            )
        self.pool = pool

    def _slots(self, block: int) -> torch.Tensor:
        start = block * self.block_size
        return torch.arange(start, start + self.block_size, dtype=torch.int64)

    def _expected_bytes(self) -> int:
        """An upper bound on one block's blob: its tensors plus room for the header."""
        assert self.pool is not None
        per_token = 2 * self.pool.layer_num * self.pool.head_num * self.pool.head_dim
        return per_token * self.block_size * self.pool.dtype.itemsize + (1 << 20)

    def _refuse(self, transfer: BlockTransfer, at: int, reason: str) -> None:
        bad = transfer.block_ids[at:]
        self._errors.update(bad)
        self._failed_requests.add(transfer.request_id)
        self.stats.load_errors += len(bad)
        LOG.warning(
            "kvcache: request %s: not using stored block %s (%s); vLLM recomputes %d block(s)",
            transfer.request_id,
            transfer.keys[at],
            reason,
            len(bad),
        )

    def _check(self, key: str, blob: bytes | None) -> KVSnapshot | str:
        """The snapshot stored as ``blob`` under ``key`` if it may be used, else why not."""
        if blob is None:
            return "missing from the store"
        try:
            snapshot = self._verify(blob)
        except Exception as exc:  # every way a blob can be unreadable
            return f"unreadable: {exc}"
        got = snapshot.meta.get(FINGERPRINT_META)
        if got != self.fingerprint:
            return (
                f"foreign: made by an engine with fingerprint {got!r}, this one is "
                f"{self.fingerprint!r} (another model, dtype, block size or geometry)"
            )
        if snapshot.meta.get(KEY_META) != key:
            return f"stored under the wrong key (it says {snapshot.meta.get(KEY_META)!r})"
        return snapshot

    def load(self, plan: StepPlan) -> None:
        """Load every planned block; a block that cannot be used ends its request's load."""
        self._failed_requests.clear()
        if self.pool is None or not plan.loads:
            for transfer in plan.loads:
                self._refuse(transfer, 0, "the connector has no KV tensors registered")
            return
        pool = self.pool
        for transfer in plan.loads:
            started = time.perf_counter()
            keys = list(transfer.keys)

            def fetch(store: SnapshotStore, keys: list[str] = keys) -> list[bytes | None]:
                return store.get_many(keys)

            blobs = self.store.call("a load", fetch)
            if blobs is None or len(blobs) != len(keys):
                self._refuse(transfer, 0, "the store did not answer")
                continue
            for at, (key, blob, block) in enumerate(
                zip(transfer.keys, blobs, transfer.block_ids, strict=True)
            ):
                if blob is not None and len(blob) > self._expected_bytes():
                    self._refuse(transfer, at, f"oversized: {len(blob)} bytes")
                    break
                checked = self._check(key, blob)
                if isinstance(checked, str):
                    self._refuse(transfer, at, checked)
                    break
                try:
                    pool.load_cpu_copy(checked, self._slots(block))
                except Exception as exc:  # a snapshot this pool refuses (shapes, dtype)
                    self._refuse(transfer, at, f"does not fit these KV tensors: {exc}")
                    break
                self.stats.loaded_blocks += 1
                self.stats.loaded_bytes += len(blob) if blob is not None else 0
            self.stats.load_seconds += time.perf_counter() - started
        self.stats.flush()

    def take_load_errors(self) -> set[int]:
        """Block ids that failed to load since the last call (vLLM recomputes them)."""
        errors, self._errors = self._errors, set()
        return errors

    def block_snapshot(self, key: str, block: int) -> KVSnapshot:
        """Block ``block`` as the snapshot the connector stores under ``key``."""
        assert self.pool is not None
        snapshot = self.pool.get_cpu_copy(self._slots(block))
        meta: Mapping[str, Any] = {
            **snapshot.meta,
            FINGERPRINT_META: self.fingerprint,
            KEY_META: key,
        }
        return dataclasses.replace(snapshot, meta=meta)

    def save(self, plan: StepPlan) -> None:
        """Store every planned block, except those of a request whose load failed this step
        (its step ran on KV that vLLM is about to recompute).

        The blocks are copied to the host before this returns (vLLM may reuse them right
        after); serialising and writing them runs on a background thread when ``async_save``
        is set, overlapping the next step, and the next ``save`` (or ``flush``) waits for it.
        """
        if self.pool is None or not plan.saves:
            return
        started = time.perf_counter()
        snapshots: dict[str, KVSnapshot] = {}
        for transfer in plan.saves:
            if transfer.request_id in self._failed_requests:
                continue
            for key, block in zip(transfer.keys, transfer.block_ids, strict=True):
                snapshots[key] = self.block_snapshot(key, block)
        if not snapshots:
            return
        copied = time.perf_counter() - started
        self.flush()
        if not self.async_save:
            self._write(snapshots, copied)
            return
        self._writer = threading.Thread(
            target=self._write, args=(snapshots, copied), name="kvcache-save", daemon=False
        )
        self._writer.start()

    def flush(self) -> None:
        """Wait until the blocks handed to ``save`` are written (or refused by the store)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()

    def _write(self, snapshots: Mapping[str, KVSnapshot], copied: float) -> None:
        started = time.perf_counter()
        items = {key: snap.to_bytes() for key, snap in snapshots.items()}

        def put(store: SnapshotStore) -> bool:
            store.put_many(items)
            return True

        if self.store.call("a save", put):
            self.stats.saved_blocks += len(items)
            self.stats.saved_bytes += sum(len(b) for b in items.values())
        else:
            self.stats.save_errors += len(items)
        self.stats.save_seconds += copied + time.perf_counter() - started
        self.stats.flush()
