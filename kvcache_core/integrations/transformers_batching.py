"""transformers' continuous batching with a kvcache pool as its KV storage.

[`generate_batch`][kvcache_core.integrations.transformers_batching.generate_batch] runs
transformers' own continuous-batching scheduler (``ContinuousBatchingManager``) with every key
and value kept in the pages of a discovered kvcache pool, and with the pool's allocator
(``get_cpu_copy`` / ``load_cpu_copy``) as the path requests take to the host and back when the
blocks run out.
[`KVPoolBatchingManager`][kvcache_core.integrations.transformers_batching.KVPoolBatchingManager]
is the same manager for callers that stream requests in themselves.

Importing this module imports transformers (the ``kvcache[hf]`` extra); nothing else in
``kvcache_core`` does.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import continuous_api
from transformers.generation.continuous_batching.continuous_api import (
    ContinuousBatchingManager,
)

from ..contracts import PoolConfig
from ..discovery import Registry
from ..errors import KVCacheError, UnsupportedDtypeError
from ._batching_cache import BatchingStats, KVPoolPagedCache
from ._batching_offload import KVPoolOffloading
from ._hf_pool_choice import SLIDING_ATTENTION, PoolChoice, choose_batching_pool, layer_groups

__all__ = [
    "BatchOutputs",
    "BatchingStats",
    "KVPoolBatchingManager",
    "generate_batch",
    "kvpool_paged_cache",
]

_SWAP_LOCK = threading.Lock()
#: The module-level name transformers' batch processor factory builds its cache by.
_CACHE_NAME = "PagedAttentionCache"


@contextmanager
def kvpool_paged_cache(choice: PoolChoice, stats: BatchingStats) -> Iterator[None]:
    """While open, transformers' batch processor builds a pool-backed cache in this thread.

    transformers 5.24 offers no argument for the cache class: the manager's processor factory
    constructs ``PagedAttentionCache`` by its module-level name. This swaps that one name for
    the span of the ``with`` block and puts the original back on exit, even on error. The
    stand-in builds the pool-backed cache only when called from the thread that opened the
    block; any other thread (another manager starting at the same moment) gets transformers'
    own class, so the swap is invisible outside its caller.
    """
    original = getattr(continuous_api, _CACHE_NAME)
    owner = threading.get_ident()
    pool_cache = partial(KVPoolPagedCache, choice=choice, stats=stats)

    def factory(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == owner:
            return pool_cache(*args, **kwargs)
        return original(*args, **kwargs)

    with _SWAP_LOCK:
        setattr(continuous_api, _CACHE_NAME, factory)
        try:
            yield
        finally:
            setattr(continuous_api, _CACHE_NAME, original)


def _batching_config(
    base: ContinuousBatchingConfig | None,
    *,
    num_blocks: int,
    block_size: int,
    max_batch_tokens: int | None,
) -> ContinuousBatchingConfig:
    """A copy of ``base`` with the settings kvcache storage needs (see the manager's doc)."""
    cfg = copy.deepcopy(base) if base is not None else ContinuousBatchingConfig()
    cfg.page_size = block_size
    cfg.num_blocks = num_blocks
    if max_batch_tokens is not None:
        cfg.max_batch_tokens = max_batch_tokens
    cfg.allow_block_sharing = False  # shared blocks would need ref-counted pool pages
    cfg.max_blocks_per_request = 0  # the block-table decode path reads transformers' arena
    cfg.use_async_batching = False  # offload snapshots right after a finished forward
    cfg.use_cuda_graph = False
    cfg.cpu_offload_space = 0.0  # transformers' pinned host pool: replaced, never allocated
    cfg.auto_switch_to_flash = False  # eager / sdpa read the cache through ``update``
    return cfg


def _probe_pool(
    choice: PoolChoice, text: Any, *, block_size: int, dtype: torch.dtype, device: Any
) -> None:
    """Build a one-page pool of the chosen kind, so a factory that fails or stores another
    dtype is refused here, in the caller's thread, rather than in transformers' generation
    thread once requests are queued."""
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    sliding = choice.groups.get(SLIDING_ATTENTION, ()) if choice.windowed else ()
    probe = PoolConfig(
        size=block_size,
        layer_num=int(text.num_hidden_layers),
        head_num=int(heads),
        head_dim=int(head_dim),
        page_size=block_size,
        dtype=dtype,
        device=torch.device(device),
        swa_layer_ids=tuple(sliding),
    )
    pool, _ = choice.registry.create(choice.name, probe)
    if pool.dtype != dtype:
        raise UnsupportedDtypeError(
            f"pool {choice.name!r} stores {pool.dtype}, the model computes in {dtype}: "
            "continuous batching needs the model's dtype, bit for bit"
        )


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class KVPoolBatchingManager(ContinuousBatchingManager):
    """transformers' ``ContinuousBatchingManager`` with a kvcache pool as the KV storage.

    Use it like transformers' manager (``start``, ``add_request(s)``, ``get_result``, ``stop``);
    [`generate_batch`][kvcache_core.integrations.transformers_batching.generate_batch] drives
    it for a list of prompts. The pool is chosen and checked here, in the caller's thread, so
    a bad pool or model is refused before any thread starts:
    ``pool`` names a discovered pool, or ``None`` picks one from the model's layer types (a
    sliding-window pool for a model with sliding layers, an MHA-kind pool otherwise).

    The continuous-batching config is copied and these settings forced, because each of them
    would make transformers address its own arena or need a page shared between requests:
    ``allow_block_sharing=False`` (no prefix sharing), ``max_blocks_per_request=0`` (no
    block-table decode path), ``use_async_batching=False``, ``use_cuda_graph=False``,
    ``cpu_offload_space=0`` (the pool's allocator is the offload path) and
    ``auto_switch_to_flash=False``; ``page_size`` becomes ``block_size`` and ``num_blocks``
    the block capacity.

    :param model: A transformers causal LM (its config's layer types decide the pool kind).
    :param generation_config: Generation settings (default: the model's); greedy or sampled.
    :param num_blocks: Blocks of ``block_size`` tokens the cache holds: the pool gets this
        many pages (rounded up to transformers' sector size). Required: transformers would
        otherwise size the cache from free device memory.
    :param block_size: Tokens per block, which is the pool's page size (transformers requires
        at least 4).
    :param pool: A discovered pool name, or None to choose by the model's layer types.
    :param registry: Where to look pools up (default: ``discover()``).
    :param continuous_batching_config: Further transformers settings (copied, then forced as
        above).
    :param max_batch_tokens: Tokens per forward pass (default: transformers').
    :raises KVCacheError: A layer type no pool kind serves, a pool lacking a capability, a
        sliding-only model, or ``num_return_sequences > 1``.
    :raises ValueError: ``num_blocks`` or ``block_size`` is not a positive int.
    """

    def __init__(
        self,
        model: Any,
        generation_config: GenerationConfig | None = None,
        *,
        num_blocks: int,
        block_size: int = 16,
        pool: str | None = None,
        registry: Registry | None = None,
        continuous_batching_config: ContinuousBatchingConfig | None = None,
        max_batch_tokens: int | None = None,
        workload_hints: Any = None,
    ) -> None:
        _positive_int("num_blocks", num_blocks)
        _positive_int("block_size", block_size)
        if max_batch_tokens is not None:
            _positive_int("max_batch_tokens", max_batch_tokens)
        gen = copy.deepcopy(generation_config or model.generation_config)
        if gen is None:
            raise ValueError("a GenerationConfig is needed (the model has none)")
        if (gen.num_return_sequences or 1) > 1:
            raise KVCacheError(
                "num_return_sequences > 1 forks requests by copying transformers' arena "
                "blocks; not supported on kvcache storage"
            )
        if gen.eos_token_id is None:
            gen.eos_token_id = -1  # what transformers' own entry point does: no EOS stop
        text = model.config.get_text_config()
        groups = layer_groups(
            getattr(text, "layer_types", None),
            int(text.num_hidden_layers),
            getattr(text, "sliding_window", None),
        )
        choice = choose_batching_pool(groups, pool, registry, block_size=block_size)
        _probe_pool(choice, text, block_size=block_size, dtype=model.dtype, device=model.device)
        self.pool_choice = choice
        """The pool this manager stores keys and values in, and why it was chosen."""
        self.stats = BatchingStats()
        """Offloads, restores and bytes moved, updated while requests run."""
        cfg = _batching_config(
            continuous_batching_config,
            num_blocks=num_blocks,
            block_size=block_size,
            max_batch_tokens=max_batch_tokens,
        )
        super().__init__(model, gen, cfg, workload_hints)

    def _create_batch_processor(self) -> Any:
        with kvpool_paged_cache(self.pool_choice, self.stats):
            processor = super()._create_batch_processor()
        cache = processor.cache
        if not isinstance(cache, KVPoolPagedCache):  # pragma: no cover - a transformers change
            raise KVCacheError(
                "transformers built its own paged cache: this transformers version no longer "
                "constructs it by the name kvcache swaps"
            )
        if not isinstance(processor.offloading_manager, KVPoolOffloading):
            processor.offloading_manager = KVPoolOffloading(
                cache, processor.scheduler, self.distributed_helper
            )
        return processor


class BatchOutputs(dict[str, Any]):
    """``generate_batch``'s result: transformers' ``{request_id: GenerationOutput}``, in input
    order, plus ``stats`` (a
    [`BatchingStats`][kvcache_core.integrations.transformers_batching.BatchingStats])."""

    def __init__(self, outputs: dict[str, Any], stats: BatchingStats) -> None:
        super().__init__(outputs)
        self.stats = stats
        """What the run did with its pool: offloads, restores, bytes moved."""


def _check_inputs(inputs: object) -> list[list[int]]:
    if isinstance(inputs, (torch.Tensor, str)) or not isinstance(inputs, Sequence):
        raise TypeError(f"inputs must be a list of token-id lists, got {type(inputs).__name__}")
    prompts: list[list[int]] = []
    for i, item in enumerate(inputs):
        prompt: object = item.tolist() if isinstance(item, torch.Tensor) else item
        if isinstance(prompt, str) or not isinstance(prompt, Sequence) or not prompt:
            raise ValueError(f"inputs[{i}] must be a non-empty list of token ids, got {prompt!r}")
        ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ValueError(f"inputs[{i}] holds something other than non-negative int ids")
        prompts.append(ids)
    return prompts


def generate_batch(
    model: Any,
    inputs: Sequence[Sequence[int]],
    generation_config: GenerationConfig | None = None,
    *,
    num_blocks: int,
    block_size: int = 16,
    pool: str | None = None,
    registry: Registry | None = None,
    max_new_tokens: int | None = None,
    max_batch_tokens: int | None = None,
    continuous_batching_config: ContinuousBatchingConfig | None = None,
    timeout: float = 600.0,
) -> BatchOutputs:
    """Generate for every prompt with transformers' continuous batching on a kvcache pool.

    The kvcache counterpart of ``model.generate_batch``: the same scheduler, the same
    results, but keys and values live in the pages of a discovered pool and, when the blocks
    run out, transformers' chosen victims go to the host through the pool allocator's
    ``get_cpu_copy`` and come back into new pages through ``load_cpu_copy`` (ordinary host
    memory: it works on machines without an accelerator). See
    [`KVPoolBatchingManager`][kvcache_core.integrations.transformers_batching.KVPoolBatchingManager]
    for the parameters and the transformers settings this forces.

    :param inputs: One list of token ids per request (no padding).
    :param max_new_tokens: Overrides the generation config's.
    :param timeout: Seconds to wait for the next result before giving up.
    :returns: [`BatchOutputs`][kvcache_core.integrations.transformers_batching.BatchOutputs].
    :raises KVCacheError: As the manager, or when a request failed during generation (the
        first failure's message is included).
    :raises TypeError: ``inputs`` is not a list of lists.
    :raises ValueError: An empty prompt, a non-integer token id, a bad size.
    """
    prompts = _check_inputs(inputs)
    if max_new_tokens is not None:
        _positive_int("max_new_tokens", max_new_tokens)
    if not prompts:  # as transformers' own: nothing to run, no manager built
        _positive_int("num_blocks", num_blocks)
        _positive_int("block_size", block_size)
        return BatchOutputs({}, BatchingStats())
    manager = KVPoolBatchingManager(
        model,
        generation_config,
        num_blocks=num_blocks,
        block_size=block_size,
        pool=pool,
        registry=registry,
        continuous_batching_config=continuous_batching_config,
        max_batch_tokens=max_batch_tokens,
    )
    results: dict[str, Any] = {}
    manager.start()
    try:
        with torch.no_grad():
            ids = manager.add_requests(inputs=prompts, max_new_tokens=max_new_tokens)
            while len(results) < len(ids):
                result = manager.get_result(timeout=timeout)
                if result is None:
                    if not manager.is_running():
                        break
                    raise KVCacheError(f"no result within {timeout} s")
                if result.is_finished():
                    results[result.request_id] = result
    finally:
        manager.stop(block=True)
        manager.destroy()
    failed = [r for r in results.values() if r.error is not None]
    if failed or len(results) < len(ids):
        why = failed[0].error if failed else "the generation thread stopped"
        raise KVCacheError(
            f"{len(failed) or len(ids) - len(results)} of {len(ids)} requests failed: {why}"
        )
    return BatchOutputs({i: results[i] for i in ids}, manager.stats)
