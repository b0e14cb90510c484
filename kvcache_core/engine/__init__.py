"""A small reference engine: proof that the contracts are enough to serve a model.

It discovers pools at start-up, picks a model whose layers fit each pool's declared
capabilities, and decodes many requests with continuous batching, retracting requests when the
KV budget runs out and resuming them from their snapshots. Everything it does to a pool goes
through the Protocols in `kvcache_core.contracts` (plus the two allocator extras the pool
docs promise: ``mamba_allocator`` and HiSparse residency), never through a plugin's internals.

Modules, one job each: ``model`` (a seeded random-weight decoder whose attention reads the pool),
``scheduler`` (batching, paged allocation, retraction and resume), ``runner`` (choose a model
from capabilities, run a pool twice and compare the tokens).
"""

from .model import MODEL_KINDS, ModelShape, TinyModel
from .runner import (
    DemoSettings,
    PoolReport,
    RunStats,
    choose_model,
    pool_config,
    run_demo,
    run_pool,
    single_thread,
    smallest_budget,
)
from .scheduler import EngineError, Request, Scheduler, Unsupported, make_requests

__all__ = [
    "MODEL_KINDS",
    "DemoSettings",
    "EngineError",
    "ModelShape",
    "PoolReport",
    "Request",
    "RunStats",
    "Scheduler",
    "TinyModel",
    "Unsupported",
    "choose_model",
    "make_requests",
    "pool_config",
    "run_demo",
    "run_pool",
    "single_thread",
    "smallest_budget",
]
