"""vLLM end to end: real vLLM processes serving on KVCacheConnector (``make vllm`` runs these).

Skipped where vLLM is not importable (the default ``make test`` venv cannot hold it: vLLM's
CPU build pins a transformers older than the ``[hf]`` extra's). Every instance is a new
process started through ``kvcache_core.integrations._vllm_run``, as two servers would be.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed in this venv: `make vllm` builds .venv-vllm and runs these",
)

from kvcache_core.integrations._vllm_models import build_llama
from kvcache_core.integrations._vllm_run import spawn_instance


@dataclass
class Run:
    """One finished instance: its result and what it printed on stderr (vLLM's log, ours)."""

    result: dict[str, Any]
    stderr: str

    @property
    def tokens(self) -> list[list[int]]:
        return self.result["tokens"]

    def counter(self, prompt: int, name: str) -> int:
        return int(self.result["per_prompt"][prompt].get(name, 0))

    def computed(self, prompt: int) -> int:
        return self.counter(prompt, "vllm:prompt_tokens_by_source/local_compute")

    def loaded(self, prompt: int) -> int:
        return self.counter(prompt, "vllm:prompt_tokens_by_source/external_kv_transfer")

    def side(self, name: str) -> dict[str, Any]:
        return self.result["connector"].get(name, {})


def run_instance(spec: dict[str, Any], *, timeout: float = 900) -> Run:
    """Start one vLLM instance in a new process and wait for its result."""
    result, stderr = spawn_instance(spec, timeout=timeout)
    if result is None:
        raise AssertionError(f"the instance failed:\n{stderr[-6000:]}")
    return Run(result, stderr)


def connector(
    role: str, store: str, stats: Path, *, by_name: bool = False, **extra: Any
) -> dict[str, Any]:
    """A KVCacheConnector config: by module path, or by the name the entry point registers."""
    config: dict[str, Any] = {
        "role": role,
        "extra": {"store": store, "stats_file": str(stats), **extra},
    }
    if not by_name:
        config["module_path"] = "kvcache_core.integrations.vllm"
    return config


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two tiny Llamas of one geometry and different seeds: "m1" serves, "m2" is the other
    model of the fingerprint test."""
    root = tmp_path_factory.mktemp("models")
    return {name: build_llama(str(root / name), seed=seed) for name, seed in (("m1", 0), ("m2", 1))}


@pytest.fixture(scope="session", autouse=True)
def _quiet_env() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
