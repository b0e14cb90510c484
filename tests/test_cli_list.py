"""``kvcache list`` reports plugins found through entry points (pools and snapshot stores), in
text and JSON.

The pool tests run the real command in a fresh process; fake distributions are installed with
the ``fake_site`` fixture and put on that process's ``PYTHONPATH``. The store-plugin test runs
it in this process (the fake distributions are on ``sys.path`` already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BUILTINS = ["dsa", "hisparse", "mamba", "mha", "mla", "swa"]
BUILTIN_STORES = ["dir", "memory", "redis", "redis-cluster"]

# A store plugin whose class lacks most of the SnapshotStore methods (contract drift), and one
# whose second store claims the ``dir:`` scheme the built-in directory store opens.
DRIFTING_STORE = """
from kvcache_core import StoreSpec, hookimpl


class HalfStore:
    def put(self, key, value, *, ttl=None):
        pass


@hookimpl
def kvcache_store_specs():
    return [StoreSpec(name="half", schemes=("half",), factory=HalfStore, store_class=HalfStore)]
"""

CLASHING_STORE = """
from kvcache_core import StoreSpec, hookimpl
from kvcache_plugins.stores.memory import MemoryStore, open_memory


@hookimpl
def kvcache_store_specs():
    return [StoreSpec(name="mine", schemes=("mine",), factory=open_memory,
                      store_class=MemoryStore),
            StoreSpec(name="other", schemes=("dir",), factory=open_memory,
                      store_class=MemoryStore)]
"""

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
    stores = {r["store"]: r for r in json.loads(proc.stdout)["stores"]}
    assert sorted(stores) == BUILTIN_STORES
    assert [stores[n]["schemes"] for n in BUILTIN_STORES] == [
        ["dir"],
        ["memory"],
        ["redis", "rediss"],
        ["redis+cluster", "rediss+cluster"],
    ]
    redis = stores["redis"]
    assert redis["status"] == "accepted" and redis["reason"] is None
    assert redis["plugin"] == "redis" and redis["distribution"] == "kvcache"
    assert redis["version"] == "0.1.0" and redis["shared"] is True
    assert stores["memory"]["shared"] is False
    assert stores["memory"]["example_url"] == "memory:kvcache-check"


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
    assert lines[1 + len(BUILTINS) :] == [  # no reason, warning or note lines
        "snapshot stores: 4 accepted, 0 rejected, 0 skipped",
        "  accepted dir           plugin=dir dist=kvcache 0.1.0 schemes=dir:",
        "  accepted memory        plugin=memory dist=kvcache 0.1.0 schemes=memory:",
        "  accepted redis         plugin=redis dist=kvcache 0.1.0 schemes=redis:,rediss:",
        "  accepted redis-cluster plugin=redis-cluster dist=kvcache 0.1.0 "
        "schemes=redis+cluster:,rediss+cluster:",
    ]


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


def test_store_plugins_rejected_and_skipped_are_listed_with_the_reason(
    fake_site, capsys, monkeypatch
):
    """In this process (the other tests pay a fresh interpreter each): ``fake_site`` puts the
    distributions on ``sys.path``, which is all entry-point discovery reads."""
    from kvcache_core.cli import main

    def listed(*args: str) -> tuple[int, str]:
        code = main(["list", *args])
        return code, capsys.readouterr().out

    fake_site(
        "kv-halfstore",
        entry_points={"half": "kvlist_halfstore"},
        modules={"kvlist_halfstore": DRIFTING_STORE},
        group="kvcache.stores",
        version="0.3",
    )
    fake_site(
        "kv-clash",
        entry_points={"clash": "kvlist_clash"},
        modules={"kvlist_clash": CLASHING_STORE},
        group="kvcache.stores",
    )
    fake_site(
        "kv-nostore",
        entry_points={"nostore": "kvlist_nostore"},
        modules={"kvlist_nostore": "raise ImportError('needs a cloud SDK')"},
        group="kvcache.stores",
    )
    for var in (
        "KVCACHE_STORES",
        "KVCACHE_PLUGINS",
        "KVCACHE_DISABLE_PLUGINS",
        "KVCACHE_DISABLE_PLUGIN_AUTOLOAD",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KVCACHE_DISABLE_STORES", "redis")
    code, out = listed()
    assert code == 1, out
    lines = out.splitlines()
    first = lines.index("snapshot stores: 3 accepted, 4 rejected, 1 skipped")
    stores = lines[first + 1 :]
    assert "  accepted mine          plugin=clash dist=kv-clash 1.0 schemes=mine:" in stores
    i = stores.index("  rejected half          plugin=half dist=kv-halfstore 0.3 schemes=-")
    assert stores[i + 1].startswith("           reason: ") and "get" in stores[i + 1]
    i = stores.index("  rejected -             plugin=nostore dist=kv-nostore 1.0 schemes=-")
    assert stores[i + 1].startswith(
        "           reason: import failed: ImportError: needs a cloud SDK"
    )
    i = stores.index("  skipped  -             plugin=redis dist=kvcache 0.1.0 schemes=-")
    assert stores[i + 1] == "           reason: disabled by deny list"
    clashes = [line for line in stores if "duplicate scheme dir:" in line]
    assert len(clashes) == 2, stores  # both claimants refused, neither shadows the other

    monkeypatch.delenv("KVCACHE_DISABLE_STORES")
    code, out = listed("--format", "json")
    assert code == 1
    data = json.loads(out)
    rows = {(r["status"], r["store"] or r["plugin"]): r for r in data["stores"]}
    half = rows[("rejected", "half")]
    assert half["distribution"] == "kv-halfstore" and half["version"] == "0.3"
    assert "get" in half["reason"] and half["schemes"] == []
    assert rows[("rejected", "nostore")]["store"] is None
    assert rows[("accepted", "mine")]["schemes"] == ["mine"]
    assert ("accepted", "redis") in rows  # no deny list this time
    assert {k for k in rows if k[0] == "rejected"} == {
        ("rejected", "half"),
        ("rejected", "nostore"),
        ("rejected", "dir"),
        ("rejected", "other"),
    }
