"""``kvcache list`` reports plugins found through entry points, in text and JSON.

Every test runs the real command in a fresh process; fake distributions are installed with the
``fake_site`` fixture and put on that process's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BUILTINS = ["dsa", "hisparse", "mamba", "mha", "mla", "swa"]

HEADER = """
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool, create
"""

NEWER = (
    HEADER
    + """
@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="future", pool_class=MHATokenToKVPool,
                     allocator_class=PagedSlotAllocator, factory=create, contract_version=3,
                     capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}))]
"""
)

RAW_LOC = (
    HEADER
    + """
class RawLocPool(MHATokenToKVPool):
    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        self.get_key_buffer(layer.layer_id)[loc] = cache_k


@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="rawloc", pool_class=RawLocPool, allocator_class=PagedSlotAllocator,
                     factory=create, capabilities=frozenset({Capability.OFFLOAD}))]
"""
)


def run_list(*args: str, site: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVCACHE_")}
    environ.update(env)
    if site is not None:
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), environ.get("PYTHONPATH", "")) if p
        )
    return subprocess.run(
        [sys.executable, "-m", "kvcache_core.cli", "list", *args],
        capture_output=True,
        text=True,
        check=False,
        env=environ,
    )


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    data = json.loads(proc.stdout)
    assert data["contract_version"] == 2
    return {f"{r['status']}:{r['pool'] or r['plugin']}": r for r in data["plugins"]}


@pytest.fixture
def newer(fake_site):
    return fake_site(
        "kv-future", entry_points={"future": "kvlist_future"}, modules={"kvlist_future": NEWER}
    )


@pytest.fixture
def rawloc(fake_site):
    return fake_site(
        "kv-rawloc", entry_points={"rawloc": "kvlist_rawloc"}, modules={"kvlist_rawloc": RAW_LOC}
    )


def test_json_lists_every_builtin_accepted_and_exits_0():
    proc = run_list("--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = _json(proc)
    assert sorted(rows) == [f"accepted:{name}" for name in BUILTINS]
    mha = rows["accepted:mha"]
    assert mha["plugin"] == "mha" and mha["distribution"] == "kvcache"
    assert mha["version"] == "0.1.0" and mha["contract_version"] == 2
    assert mha["capabilities"] == ["offload", "paged"]
    assert mha["reason"] is None
    assert all(r["warnings"] == [] and r["notes"] == [] for r in rows.values())


def test_text_names_distribution_and_status_and_exits_0():
    proc = run_list()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0]
        == "kvcache contract 2: 6 pool(s) accepted (0 with warnings), 0 rejected, 0 skipped"
    )
    assert (
        "  accepted mha        plugin=mha dist=kvcache 0.1.0 contract=2 capabilities=offload,paged"
        in lines
    )
    assert len(lines) == 1 + len(BUILTINS)  # no reason, warning or note lines


def test_rejected_plugin_exits_1_and_shows_what_it_declared(newer):
    proc = run_list(site=newer)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0]
        == "kvcache contract 2: 6 pool(s) accepted (0 with warnings), 1 rejected, 0 skipped"
    )
    i = lines.index(
        "  rejected future     plugin=future dist=kv-future 1.0 contract=3 "
        "capabilities=offload,paged"
    )
    assert lines[i + 1] == (
        "           reason: built for contract 3; this kvcache knows up to 2: upgrade kvcache"
    )

    proc = run_list("--format", "json", site=newer)
    assert proc.returncode == 1, proc.stderr
    row = _json(proc)["rejected:future"]
    assert row["distribution"] == "kv-future" and row["version"] == "1.0"
    assert row["contract_version"] == 3 and row["capabilities"] == ["offload", "paged"]
    assert row["reason"] == "built for contract 3; this kvcache knows up to 2: upgrade kvcache"
    assert row["findings"] == []


def test_plugin_that_fails_to_import_exits_1_with_its_distribution(fake_site):
    site = fake_site(
        "kv-broken",
        entry_points={"broken": "kvlist_broken"},
        modules={"kvlist_broken": "raise SystemExit('no GPU here')"},
        version="2.5",
    )
    proc = run_list(site=site)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    i = lines.index(
        "  rejected -          plugin=broken dist=kv-broken 2.5 contract=- capabilities=-"
    )
    assert lines[i + 1].startswith("           reason: import failed: SystemExit: no GPU here at ")

    row = _json(run_list("--format", "json", site=site))["rejected:broken"]
    assert row["pool"] is None and row["contract_version"] is None and row["capabilities"] == []
    assert str(row["reason"]).startswith("import failed: SystemExit: no GPU here at ")


def test_body_rule_findings_are_warnings_and_exit_0(rawloc):
    proc = run_list(site=rawloc)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0]
        == "kvcache contract 2: 7 pool(s) accepted (1 with warnings), 0 rejected, 0 skipped"
    )
    i = lines.index(
        "  accepted rawloc     plugin=rawloc dist=kv-rawloc 1.0 contract=2 capabilities=offload"
    )
    warning = lines[i + 1]
    assert warning.startswith(
        "           warning: [writeloc-not-unwrapped] `set_kv_buffer` indexes with `loc` as it "
        "arrives (`self.get_key_buffer(layer.layer_id)[loc]`)"
    )
    assert warning.endswith(f"({rawloc / 'kvlist_rawloc.py'}:8)")
    assert not lines[i + 2].startswith("           ")

    proc = run_list("--format", "json", site=rawloc)
    assert proc.returncode == 0, proc.stderr
    row = _json(proc)["accepted:rawloc"]
    (found,) = row["warnings"]
    assert found["rule"] == "writeloc-not-unwrapped" and found["severity"] == "warning"
    assert found["method"] == "set_kv_buffer" and found["parameter"] == "loc"
    assert found["impl_location"] == {"path": str(rawloc / "kvlist_rawloc.py"), "line": 8}
    assert row["notes"] == []


def test_policy_skips_are_listed_and_exit_0(newer):
    proc = run_list("--format", "json", site=newer, KVCACHE_DISABLE_PLUGINS="future,swa")
    assert proc.returncode == 0, proc.stderr
    rows = _json(proc)
    for plugin, dist in (("future", "kv-future"), ("swa", "kvcache")):
        row = rows[f"skipped:{plugin}"]
        assert row["reason"] == "disabled by deny list" and row["distribution"] == dist
    assert "accepted:swa" not in rows and not any(k.startswith("rejected:") for k in rows)
