"""``KVCacheConnector``: vLLM's v1 KV-connector interface on a kvcache pool and snapshot store.

This module imports vLLM; ``kvcache_core.integrations.vllm`` imports it only when
``KVCacheConnector`` (or ``register``) is used. What it does is translate: vLLM's request and
scheduler-output objects into ``SchedulerSide`` calls, the step's plan into vLLM's connector
metadata, and the registered KV tensors into a ``VLLMBlockPool`` for ``WorkerSide``.
docs/integrations/vllm.md describes the behaviour and its limits.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ..stores.discovery import open_store
from ._vllm_keys import fingerprint_of, weights_signature
from ._vllm_plan import StepPlan
from ._vllm_pool import VLLMBlockPool
from ._vllm_sides import LOG, ConnectorStats, ScheduledRequest, SchedulerSide, StoreLink, WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["KVCacheConnector", "KVCacheConnectorMetadata", "engine_fingerprint", "register"]

CONNECTOR_NAME = "KVCacheConnector"
_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass
class KVCacheConnectorMetadata(KVConnectorMetadata):
    """One step's plan, as vLLM carries it from the scheduler to the workers."""

    plan: StepPlan = field(default_factory=StepPlan)


def engine_facts(vllm_config: VllmConfig, extra: Mapping[str, Any]) -> dict[str, object]:
    """Everything that makes one engine's KV reusable by another: the fingerprint's input.

    The model is named by ``model_id`` when given (instances loading one checkpoint from
    different paths), else by the path or hub name vLLM was given; its config (minus the path
    it was read from) and, for a local directory, a signature of its weight files are hashed in
    too, so a different checkpoint under the same name does not match.
    """
    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    cache = vllm_config.cache_config
    hf = model.hf_config.to_dict()
    hf.pop("_name_or_path", None)
    return {
        "model": extra.get("model_id") or model.model,
        "revision": model.revision,
        "config": fingerprint_of(hf),
        "weights": weights_signature(model.model),
        "dtype": str(model.dtype),
        "kv_cache_dtype": str(cache.cache_dtype),
        "block_size": cache.block_size,
        "layers": model.get_num_layers(parallel),
        "kv_heads": model.get_num_kv_heads(parallel),
        "head_size": model.get_head_size(),
        "tensor_parallel": parallel.tensor_parallel_size,
        "pipeline_parallel": parallel.pipeline_parallel_size,
        "tensor_parallel_rank": 0,
        "layout": "vllm-cpu/1",
    }


def engine_fingerprint(vllm_config: VllmConfig, extra: Mapping[str, Any] | None = None) -> str:
    """The fingerprint hashed into every key and written into every snapshot's meta."""
    return fingerprint_of(engine_facts(vllm_config, extra or {}))


def _unsupported(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None) -> str | None:
    """Why this engine cannot use the connector, or None."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "only the CPU backend's KV layout is read yet (this is not a CPU platform)"
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        return "tensor or pipeline parallelism above 1 is not supported yet"
    if vllm_config.model_config.use_mla:
        return "MLA models are not supported yet (their cache is one latent per token)"
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) > 1:
        return "hybrid models (several KV cache groups) are not supported yet"
    if vllm_config.speculative_config is not None:
        return "speculative decoding is not supported yet"
    return None


def layout_problem(pool: VLLMBlockPool) -> str | None:
    """Why vLLM's own cache kernel does not write the layout ``pool`` reads, or None.

    One block per head is written with ``cpu_attn_reshape_and_cache`` in the ISA vLLM picks
    for this dtype, block size and head size, and read back through a pool of the same
    geometry: a kernel that packs keys otherwise (another ISA, a later vLLM) turns the
    connector off instead of loading misread KV.
    """
    try:
        import vllm._custom_ops as ops
        from vllm.v1.attention.backends import cpu_attn

        # vLLM has no public way to ask which ISA its CPU kernels use; the check must use it.
        attn_isa = getattr(cpu_attn, "_get_attn_isa")  # noqa: B009

        bs, heads, dim = pool.page_size, pool.head_num, pool.head_dim
        scratch = torch.zeros(2, heads, bs, 2 * dim, dtype=pool.dtype)
        key_cache, value_cache = scratch.view(2, heads, 2 * bs, dim).chunk(2, dim=2)
        gen = torch.Generator().manual_seed(0)
        k = torch.randn(bs, heads, dim, generator=gen).to(pool.dtype)
        v = torch.randn(bs, heads, dim, generator=gen).to(pool.dtype)
        slots = torch.arange(bs, 2 * bs)
        ops.cpu_attn_reshape_and_cache(
            k, v, key_cache, value_cache, slots, attn_isa(pool.dtype, bs, dim),
            k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto",
        )  # fmt: skip
        snap = VLLMBlockPool([scratch]).get_cpu_copy(slots)
    except Exception as exc:  # a vLLM without these: the layout cannot be confirmed
        return f"could not check the KV layout with vLLM's cache kernel ({exc})"
    if not (torch.equal(snap.parts["k"][0], k) and torch.equal(snap.parts["v"][0], v)):
        return "vLLM's cache kernel writes another KV layout than the one this pool reads"
    return None


def _layer_order(name: str) -> tuple[int, str]:
    found = re.search(r"\d+", name)
    return (int(found.group()) if found else -1, name)


class KVCacheConnector(KVConnectorBase_V1):
    """A vLLM v1 KV connector that stores full KV blocks as kvcache snapshots.

    Configure with ``KVTransferConfig(kv_connector="KVCacheConnector", kv_role=ROLE,
    kv_connector_extra_config={"store": URL})`` (or ``kv_connector_module_path=
    "kvcache_core.integrations.vllm"`` without the entry point). Extra config keys:
    ``store`` (required: ``dir:PATH``, ``redis://...``, ``redis+cluster://...``, a plugin's
    scheme; ``memory:`` only within one process), ``model_id`` (names the model in the
    fingerprint), ``key_prefix``, ``retry_after`` (seconds a failed store is left alone) and
    ``stats_file`` (where each side writes its counters as JSON).
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        extra: Mapping[str, Any] = transfer.kv_connector_extra_config or {}
        url = extra.get("store")
        if not isinstance(url, str) or not url:
            raise ValueError(
                'KVCacheConnector needs kv_connector_extra_config={"store": URL} (dir:PATH, '
                "redis://HOST:PORT/DB, redis+cluster://HOST:PORT, or a store plugin's URL)"
            )
        if transfer.kv_role not in _ROLES:
            raise ValueError(f"kv_role must be one of {_ROLES}, got {transfer.kv_role!r}")
        # A snapshot that fails on the worker is reported as invalid blocks; vLLM's default
        # policy for those fails the request, while this connector's promise is a recompute.
        if transfer.kv_load_failure_policy != "recompute":
            LOG.info("kvcache: kv_load_failure_policy set to 'recompute' (blocks are rechecked)")
            transfer.kv_load_failure_policy = "recompute"
        self.block_size = int(vllm_config.cache_config.block_size)
        self.fingerprint = engine_fingerprint(vllm_config, extra)
        self.disabled = _unsupported(vllm_config, kv_cache_config)
        if self.disabled:
            LOG.warning("kvcache: KVCacheConnector is off for this engine: %s", self.disabled)
        side = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        stats_file = extra.get("stats_file")
        self.stats = ConnectorStats(
            f"{stats_file}.{side}.json" if stats_file else None, fingerprint=self.fingerprint
        )
        self.store = StoreLink(
            url, open_store, retry_after=float(extra.get("retry_after", 5.0)), stats=self.stats
        )
        prefix = str(extra.get("key_prefix", "kvcache-vllm/"))
        load = transfer.kv_role in ("kv_consumer", "kv_both") and not self.disabled
        save = transfer.kv_role in ("kv_producer", "kv_both") and not self.disabled
        self.scheduler_side = SchedulerSide(
            self.store,
            self.fingerprint,
            self.block_size,
            load=load,
            save=save,
            stats=self.stats,
            key_prefix=prefix,
        )
        self.worker_side = WorkerSide(
            self.store,
            self.fingerprint,
            self.block_size,
            stats=self.stats,
            async_save=bool(extra.get("async_save", True)),
        )
        if not self.disabled:  # open it now: discovering the store plugins costs a first request
            self.store.call("opening the store", lambda store: True)
        self._requests: dict[str, Request] = {}
        self._manager: Any = None
        self._step = StepPlan()

    @property
    def requires_kv_delivery(self) -> bool:
        """False: saves finish inside the step that computed the blocks, never after it."""
        return False

    # -- worker side -----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Wrap vLLM's KV tensors (layers in model order) in a ``VLLMBlockPool``."""
        if self.disabled:
            return
        names = sorted(kv_caches, key=_layer_order)
        try:
            pool = VLLMBlockPool([kv_caches[n] for n in names])
            problem = layout_problem(pool)
            if problem is None:
                self.worker_side.register(pool)
        except Exception as exc:  # another backend's layout: serve without us
            problem = f"the KV tensors are not vLLM's CPU layout ({exc})"
        if problem is not None:  # the worker loads nothing; vLLM recomputes what was matched
            self.disabled = problem
            LOG.warning("kvcache: KVCacheConnector is off for this engine: %s", problem)
            return
        LOG.info("kvcache: connector on %d layers, pid %d", len(names), os.getpid())

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Keep this step's plan (vLLM binds the metadata before the forward pass)."""
        super().bind_connector_metadata(connector_metadata)
        plan = getattr(connector_metadata, "plan", None)
        self._step = plan if isinstance(plan, StepPlan) else StepPlan()

    def clear_connector_metadata(self) -> None:
        """Forget the step's plan (vLLM clears the metadata after the step)."""
        super().clear_connector_metadata()
        self._step = StepPlan()

    def _plan(self) -> StepPlan:
        return self._step

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Load this step's planned blocks before the forward pass reads them."""
        self.worker_side.load(self._plan())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: ``start_load_kv`` loads every layer before the forward."""

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Nothing per layer: whole blocks are saved once the step has computed them."""

    def wait_for_save(self) -> None:
        """Save the blocks this step completed, before vLLM may reuse them."""
        self.worker_side.save(self._plan())

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose snapshot was missing, corrupted, foreign or refused: vLLM recomputes."""
        return self.worker_side.take_load_errors()

    def shutdown(self) -> None:
        """Finish the last saves, then close this process's store connection."""
        self.worker_side.flush()
        self.store.close()

    # -- scheduler side --------------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """Keep vLLM's cache manager: it knows every block of a running request."""
        super().bind_kv_cache_manager(kv_cache_manager)
        self._manager = kv_cache_manager

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """Tokens whole stored blocks provide beyond ``num_computed_tokens``; loads are sync."""
        self._requests[request.request_id] = request
        tokens = request.all_token_ids
        found = self.scheduler_side.matched_tokens(request.request_id, tokens, num_computed_tokens)
        return found, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Plan the load of the matched blocks into the blocks vLLM just allocated."""
        self._requests[request.request_id] = request
        if num_external_tokens <= 0:
            self.scheduler_side.after_alloc(request.request_id, [], 0)
            return
        (block_ids,) = blocks.get_block_ids()
        self.scheduler_side.after_alloc(
            request.request_id,
            block_ids,
            num_external_tokens,
            resumed=request.num_preemptions > 0,
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's loads and saves, for the workers."""
        scheduled: list[ScheduledRequest] = []
        manager = self._manager
        counts = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            request = self._requests.get(new.req_id)
            tokens = request.all_token_ids if request is not None else new.prompt_token_ids
            scheduled.append(
                ScheduledRequest(
                    new.req_id,
                    new.num_computed_tokens,
                    counts.get(new.req_id, 0),
                    new.block_ids[0],
                    tokens or [],
                )
            )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            request = self._requests.get(req_id)
            if request is None or manager is None:
                continue
            (block_ids,) = manager.get_block_ids(req_id)
            scheduled.append(
                ScheduledRequest(
                    req_id,
                    cached.num_computed_tokens[i],
                    counts.get(req_id, 0),
                    block_ids,
                    request.all_token_ids,
                )
            )
        return KVCacheConnectorMetadata(plan=self.scheduler_side.plan_step(scheduled))

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; its blocks were saved in the steps that computed them."""
        self._requests.pop(request.request_id, None)
        self.scheduler_side.finished(request.request_id)
        return False, None


def register() -> None:
    """The ``vllm.general_plugins`` entry point: ``kv_connector="KVCacheConnector"`` by name.

    vLLM loads general plugins in every process it starts; registering twice (a plugin
    loaded again in one process) is harmless.
    """
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    with contextlib.suppress(ValueError):  # already registered in this process
        KVConnectorFactory.register_connector(
            CONNECTOR_NAME, "kvcache_core.integrations.vllm", CONNECTOR_NAME
        )
