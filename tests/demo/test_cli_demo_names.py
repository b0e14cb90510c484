"""``kvcache demo --pool NAME`` on a pool discovery refused says why, and the text table's
columns stay aligned whatever the pools are called."""

from __future__ import annotations

from kvcache_core.cli import main

SMALL = ["--requests", "3", "--budget", "56"]
LONG = "vendor-pool-with-a-name-longer-than-any-column"

PLUGIN = f'''
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins import mha


class DriftedPool(mha.MHATokenToKVPool):
    """Offload without ``mamba_indices``: discovery refuses it."""

    def get_cpu_copy(self, indices):
        return super().get_cpu_copy(indices)


@hookimpl
def kvcache_pool_specs():
    base = mha.kvcache_pool_specs()[0]
    return [
        PoolSpec(
            name="drifted",
            pool_class=DriftedPool,
            allocator_class=base.allocator_class,
            factory=mha.create,
            capabilities=frozenset({{Capability.OFFLOAD, Capability.PAGED}}),
        ),
        PoolSpec(
            name="{LONG}",
            pool_class=base.pool_class,
            allocator_class=base.allocator_class,
            factory=mha.create,
            capabilities=base.capabilities,
        ),
    ]
'''


def _install(fake_site, monkeypatch) -> None:
    fake_site("kv-names", entry_points={"names": "kvdemo_names"}, modules={"kvdemo_names": PLUGIN})
    monkeypatch.setenv("KVCACHE_PLUGINS", "names")


def test_a_rejected_pool_is_refused_with_discoverys_reason(fake_site, monkeypatch, capsys):
    _install(fake_site, monkeypatch)
    assert main(["demo", "--pool", "drifted", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "no accepted pool 'drifted'" in err
    # the reason discovery gave, naming the drifted method and the parameter it lost
    (line,) = [x for x in err.splitlines() if "rejected at discovery" in x]
    assert "'drifted'" in line and "get_cpu_copy" in line and "mamba_indices" in line, err


def test_an_unknown_pool_names_no_rejection(fake_site, monkeypatch, capsys):
    _install(fake_site, monkeypatch)
    assert main(["demo", "--pool", "nope", *SMALL]) == 2
    assert "rejected at discovery" not in capsys.readouterr().err


def test_columns_fit_a_long_pool_name(fake_site, monkeypatch, capsys):
    _install(fake_site, monkeypatch)
    assert main(["demo", "--pool", LONG, *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(x for x in lines if x.startswith("pool"))
    (row,) = [x for x in lines if x.startswith(LONG)]
    # the name is followed by a gap, and every column starts where its header says
    assert row[len(LONG)] == " ", row
    assert row.index(" mha ") + 1 == header.index("model"), (header, row)
    assert len(row.rstrip()) == len(header.rstrip()), (header, row)
