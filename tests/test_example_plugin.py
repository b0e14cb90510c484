"""A third-party plugin installed on its own (not on this repo's path) is discovered through
its entry point, passes the checker, and round-trips through offload in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kvcache-example-pool"

ROUND_TRIP = """
import torch
from kvcache_core import PoolConfig, discover
registry = discover(strict=True)
pool, alloc = registry.create("int8-mha", PoolConfig(size=64, layer_num=2, head_num=2,
                                                     head_dim=4, dtype=torch.float16))
slots = alloc.alloc(8)
# multiples of 1/2 up to 8: exactly representable in int8 with a power-of-two scale per token
k, v = torch.randint(-16, 16, (8, 2, 4)) / 2, torch.randint(-16, 16, (8, 2, 4)) / 2
layer = type("L", (), {"layer_id": 1})()
pool.set_kv_buffer(layer, slots, k, v)
snap = alloc.get_cpu_copy(slots, mamba_indices=None)
new = alloc.alloc(16)[8:]
alloc.load_cpu_copy(snap, new, mamba_indices=None)
assert torch.equal(pool.get_key_buffer(1)[new], k.half())
assert torch.equal(pool.get_value_buffer(1)[new], v.half())
stored, scales = pool.get_key_storage(1)
assert stored.dtype == torch.int8 and scales.shape == (64 + 1, 1)
print("round trip ok")
"""


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example project: pip builds in place, so the checkout stays clean."""
    source = tmp_path_factory.mktemp("src") / EXAMPLE.name
    shutil.copytree(EXAMPLE, source)
    return source


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, example: Path) -> dict[str, str]:
    target = tmp_path_factory.mktemp("site")
    source = example
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    env["KVCACHE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    return env


def kvcache(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcache_core.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_listed_with_its_own_distribution(installed):
    proc = kvcache(installed, "list", "--format", "json")
    rows = {r["pool"]: r for r in json.loads(proc.stdout)["plugins"]}
    assert rows["int8-mha"]["status"] == "accepted"
    assert rows["int8-mha"]["distribution"] == "kvcache-example-pool"
    assert rows["int8-mha"]["version"] == "0.1.0"


def test_passes_every_checker_level(installed):
    proc = kvcache(installed, "check", "int8-mha")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 findings" in proc.stdout and "types:OffloadablePool" in proc.stdout


def test_round_trips_in_a_fresh_process(installed):
    proc = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP], env=installed, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "round trip ok" in proc.stdout


def test_pytest_conformance_battery_runs_in_the_example_within_10_s(installed, example):
    """The acceptance point: `pytest --kvcache-conformance` in the example project, every
    installed pool (the built-ins and int8-mha), in a fresh process, under 10 s wall time.
    ``-p`` names the plugin because this venv's editable kvcache may predate its pytest11 entry
    point; with it installed, ``-p`` is the same plugin (see test_pytest_plugin.py).
    ``no:hypothesispytest``: hypothesis is this repository's dev dependency, not the example's;
    its plugin imports all of hypothesis at the end of every run, which here (no bytecode
    cache: PYTHONDONTWRITEBYTECODE) recompiles it each time, seconds that are not the battery's.
    """
    start = time.perf_counter()
    command = ["-m", "pytest", "-p", "kvcache_core.pytest_plugin", "-p", "no:hypothesispytest"]
    command += ["-v", "--kvcache-conformance"]
    proc = subprocess.run(
        [sys.executable, *command],
        cwd=example,
        env=installed,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_kvcache_conformance[int8-mha-behaviour/write-forms-agree] PASSED" in proc.stdout
    assert "test_kvcache_conformance[mha-behaviour/write-forms-agree] PASSED" in proc.stdout
    # 10 s on this 2-core machine when it is not oversubscribed. Most of it is importing torch;
    # discovery and the battery itself take well under a second. Other jobs sharing the cores
    # stretch every process alike, so the budget scales with the load beyond the core count
    # (see benchmarks/bench_behaviour.py).
    cores = os.cpu_count() or 1
    budget = 10.0 * max(1.0, os.getloadavg()[0] / cores)
    print(f"pytest --kvcache-conformance in the example: {took:.2f} s (budget {budget:.1f} s)")
    assert took < budget, proc.stdout
