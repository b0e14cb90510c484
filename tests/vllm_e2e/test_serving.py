"""The demo over a real redis-server (bf16, block size 128), preemption under a small KV
space resuming from the store, and two OpenAI-compatible servers talking through a store."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvcache_core.integrations._vllm_models import prompt_words
from kvcache_core.stores.local_redis import LocalRedis

from .conftest import connector, run_instance


def test_the_demo_over_redis_in_bf16_with_blocks_of_128(tmp_path):
    with LocalRedis(timeout=10.0) as server:
        kvcache = Path(sys.executable).with_name("kvcache")
        proc = subprocess.run(
            [str(kvcache), "demo", "--engine", "vllm", "--store", server.url,
             "--dtype", "bfloat16", "--block-size", "128", "--prompt-tokens", "300",
             "--format", "json"],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["tokens_identical"] is True
    assert (summary["b_prompt_tokens_loaded"], summary["b_prompt_tokens_computed"]) == (256, 44)
    assert summary["bytes_loaded_by_b"] > 0 and summary["bytes_saved_by_a"] > 0


def test_preempted_requests_resume_from_the_store(models, tmp_path):
    """Six requests of 150 prompt and 120 new tokens each need about 54 blocks of 32; the
    KV space holds 40, so vLLM preempts. With ``kv_both`` and no local prefix cache, a
    preempted request can only resume from the store; its output must equal a run with
    ample memory and no connector."""
    prompts = [prompt_words(150, seed=100 + i) for i in range(6)]
    common: dict[str, Any] = {
        "model": models["m1"],
        "prompts": prompts,
        "max_tokens": 120,
        "block_size": 32,
        "batch": True,
        "prefix_caching": False,
    }
    ample = run_instance({**common, "connector": None})
    tight = run_instance(
        {
            **common,
            "kv_cache_memory_bytes": 40 * 32 * 1024,
            "connector": connector("kv_both", f"dir:{tmp_path / 'store'}", tmp_path / "s"),
        }
    )
    assert tight.result["counters"]["vllm:num_preemptions"] >= 1
    assert tight.tokens == ample.tokens
    assert tight.side("scheduler")["resumed_requests"] >= 1
    assert tight.side("worker")["load_errors"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server(model: str, transfer: dict[str, Any], port: int, log: Path) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
        "--max-model-len", "1024", "--block-size", "32", "--gpu-memory-utilization", "0.3",
        "--kv-cache-memory-bytes", str(256 << 20), "--kv-transfer-config", json.dumps(transfer),
    ]  # fmt: skip
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait(port: int, proc: subprocess.Popen[bytes], log: Path, limit: float = 900) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    pytest.fail(f"the server on port {port} did not come up:\n{log.read_text()[-4000:]}")


def _complete(port: int, model: str, prompt: str) -> str:
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        return str(json.loads(r.read())["choices"][0]["text"])


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_two_openai_servers_share_a_prefix_through_the_store(models, tmp_path):
    store = f"dir:{tmp_path / 'store'}"
    prompt = prompt_words(300, seed=7)
    ports = _free_port(), _free_port()
    servers = []
    try:
        for role, port, name in zip(("kv_producer", "kv_consumer"), ports, "ab", strict=True):
            transfer = {
                "kv_connector": "KVCacheConnector",
                "kv_role": role,
                "kv_connector_extra_config": {"store": store},
            }
            log = tmp_path / f"server-{name}.log"
            servers.append((_server(models["m1"], transfer, port, log), port, log))
        for proc, port, log in servers:
            _wait(port, proc, log)
        first = _complete(ports[0], models["m1"], prompt)
        second = _complete(ports[1], models["m1"], prompt)
        hits = _metric(ports[1], "vllm:external_prefix_cache_hits_total")
    finally:
        for proc, _, _ in servers:
            proc.terminate()
        for proc, _, _ in servers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert first == second and len(first.split()) == 12
    assert hits == 9 * 32


def test_the_connector_is_registered_by_the_entry_point():
    """The ``vllm.general_plugins`` entry point this checkout installs is what vLLM loads."""
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "kvcache"]
    assert [ep.value for ep in found] == ["kvcache_core.integrations.vllm:register"]
    found[0].load()()
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from kvcache_core.integrations.vllm import KVCacheConnector

    assert KVConnectorFactory.get_connector_class_by_name("KVCacheConnector") is KVCacheConnector


def test_the_benchmark_runs_and_prints_every_ratio():
    """benchmarks/bench_vllm.py --quick (a tiny model, one round): the figures are read by
    people; here only that every line is printed and the first tokens agree."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vllm.py"
    proc = subprocess.run(
        [sys.executable, str(bench), "--quick"],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    needles = (
        "recompute / B/dir",
        "recompute / B/redis",
        "B/dir / B/example",
        "save overhead",
        "A/dir / recompute",
        "first tokens equal to recompute's in every run: yes",
    )
    for needle in needles:
        assert needle in proc.stdout, proc.stdout
