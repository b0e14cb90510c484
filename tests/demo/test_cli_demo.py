"""``kvcache demo``: JSON that validates against docs/demo-json-schema.json, text, exit codes,
silence when stderr is not a terminal, and third-party pools found by entry point."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from kvcache_core.cli import main

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "demo-json-schema.json").read_text()
)
SMALL = ["--requests", "3", "--budget", "56"]

THIRD_PARTY = '''
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins import mha


class VendorPool(mha.MHATokenToKVPool):
    """A vendor's pool: the engine sees only its capabilities."""


def create(config):
    pool, allocator = mha.create(config)
    pool.__class__ = VendorPool
    return pool, allocator


@hookimpl
def kvcache_pool_specs():
    base = mha.kvcache_pool_specs()[0]
    return [
        PoolSpec(
            name="vendor",
            pool_class=VendorPool,
            allocator_class=base.allocator_class,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
        ),
        PoolSpec(
            name="vendor-no-offload",
            pool_class=VendorPool,
            allocator_class=base.allocator_class,
            factory=create,
            capabilities=frozenset({Capability.PAGED}),
        ),
    ]
'''


def test_json_validates_and_reports_the_figures(capsys):
    code = main(["demo", "--pool", "mha", *SMALL, "--format", "json"])
    out, err = capsys.readouterr()
    assert err == ""  # progress only on a terminal
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert code == 0 and doc["ok"] is True
    (pool,) = doc["pools"]
    assert pool["status"] == "identical" and pool["model"] == "mha"
    assert pool["constrained"]["retractions"] >= 1
    assert pool["constrained"]["resumes"] == pool["constrained"]["retractions"]
    assert pool["ample"]["retractions"] == 0


def test_text_names_every_column(capsys):
    assert main(["demo", "--pool", "mamba", *SMALL]) == 0
    out = capsys.readouterr().out
    for column in ("retract", "resume", "offloaded", "GB/s", "peak", "identical"):
        assert column in out
    assert "mamba" in out and "all tokens identical" in out


def test_usage_errors_exit_2(capsys):
    assert main(["demo", "--pool", "nope"]) == 2
    assert "no accepted pool 'nope'" in capsys.readouterr().err
    assert main(["demo", "--budget", "8"]) == 2
    assert "cannot hold the longest request" in capsys.readouterr().err


def test_third_party_pool_runs_by_its_capabilities(fake_site, capsys, monkeypatch):
    fake_site(
        "kv-vendor",
        entry_points={"vendor": "kvdemo_vendor"},
        modules={"kvdemo_vendor": THIRD_PARTY},
    )
    monkeypatch.setenv("KVCACHE_PLUGINS", "vendor")
    code = main(["demo", *SMALL, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    by_name = {p["pool"]: p for p in doc["pools"]}
    assert code == 0, by_name
    assert by_name["vendor"]["status"] == "identical" and by_name["vendor"]["model"] == "mha"
    assert by_name["vendor-no-offload"]["status"] == "skipped"
    assert "offload" in by_name["vendor-no-offload"]["reason"]


def test_a_differing_pool_exits_1(capsys, monkeypatch):
    from kvcache_core.commands import demo

    from . import broken_pools

    original = demo.discover
    monkeypatch.setattr(demo, "discover", lambda: original(plugins=[broken_pools], allow=[]))
    code = main(["demo", "--pool", "mamba-drops-state", *SMALL])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED: mamba-drops-state" in out and " NO " in out


def test_page_size_applies_to_every_pool(capsys):
    assert main(["demo", "--pool", "mha", "--page-size", "2", *SMALL, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["page_size"] == 2 and doc["pools"][0]["page_size"] == 2
