"""``kvcache check``: targets, levels, exit codes, and plugins that do not even import."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kvcache_core.conformance.behaviour.level import NO_SPEC
from kvcache_core.conformance.reporting import report as _output
from kvcache_core.conformance.results.model import Outcome
from kvcache_core.discovery import discover

from ._corpus import CORPUS

CLEAN = """
import torch
from kvcache_core import KVSnapshot

class CleanAllocator:
    def __init__(self, pool):
        self.size = 4
        self.page_size = 1
        self._pool = pool
    def available_size(self) -> int: return 0
    def alloc(self, need_size: int) -> torch.Tensor | None: return None
    def free(self, indices: torch.Tensor) -> None: pass
    def free_group_begin(self) -> None: pass
    def free_group_end(self) -> None: pass
    def backup_state(self) -> object: return None
    def restore_state(self, state: object) -> None: pass
    def clear(self) -> None: pass
    def get_kvcache(self) -> "KVPool": return self._pool
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._pool.get_cpu_copy(indices, mamba_indices=mamba_indices)
    def load_cpu_copy(
        self, snapshot: KVSnapshot, indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._pool.load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
"""


@pytest.fixture
def clean_file(tmp_path: Path) -> Path:
    path = tmp_path / "clean_alloc.py"
    path.write_text(textwrap.dedent(CLEAN), encoding="utf-8")
    return path


def test_drifted_file_exits_1_with_findings(run_cli, isolated_modules):
    run = run_cli("check", str(CORPUS / "swa_missing_mamba.py"), "--level", "source,signature")
    assert run.code == 1, run.err
    checks = {r.check for r in run.results}
    assert {
        "source:OffloadablePool",
        "signature:OffloadablePool",
        "source:TokenAllocator",
    } <= checks
    # 4 methods, each seen by 2 levels, reported once
    assert len(run.findings("missing-parameter")) == 4
    assert {f.levels for f in run.findings("missing-parameter")} == {("source", "signature")}


def test_clean_file_exits_0(run_cli, clean_file, isolated_modules):
    run = run_cli("check", str(clean_file), "--level", "source", "--level", "signature")
    assert run.code == 0, (run.err, run.results)
    assert {r.check for r in run.results} == {"source:TokenAllocator", "signature:TokenAllocator"}
    assert all(r.outcome is Outcome.PASSED for r in run.results)


def test_against_overrides_inference(run_cli, clean_file):
    run = run_cli("check", str(clean_file), "--level", "source", "--against", "PagedAllocator")
    assert run.code == 1
    missing = {f.method for f in run.findings("missing-method")}
    assert missing == {"alloc_extend", "alloc_decode"}


def test_module_class_target(run_cli, monkeypatch, isolated_modules):
    monkeypatch.syspath_prepend(str(CORPUS.parent))
    run = run_cli(
        "check", "drift_corpus.allocator_drop:DroppingAllocator", "--level", "source,signature"
    )
    assert run.code == 1, run.err
    assert {r.target for r in run.results} == {"drift_corpus.allocator_drop.DroppingAllocator"}
    assert len(run.findings("parameter-not-forwarded")) == 2  # source and signature, merged


def test_behaviour_skips_targets_without_a_spec(run_cli, clean_file):
    """A path (or module:Class) has no factory to build a pool with: SKIPPED, exit code 0."""
    run = run_cli("check", str(clean_file), "--level", "behaviour")
    assert run.code == 0
    (result,) = run.results
    assert result.check == "behaviour" and result.outcome is Outcome.SKIPPED
    assert result.detail == NO_SPEC


def test_behaviour_runs_the_battery_on_an_installed_pool(run_cli):
    run = run_cli("check", "mha", "--level", "behaviour")
    assert run.code == 0, (run.err, run.results)
    assert {r.target for r in run.results} == {"pool:mha"}
    checks = {r.check for r in run.results}
    assert {"behaviour/write-readback", "behaviour/offload-roundtrip"} <= checks
    assert "behaviour/swa-loc-window" not in checks  # mha declares no sliding window
    assert all(r.outcome is Outcome.PASSED for r in run.results)


BROKEN_PLUGIN = """
import torch
from kvcache_core import PoolSpec, hookimpl
from kvcache_plugins import mha


class FlippingPool(mha.MHATokenToKVPool):
    def load_cpu_copy(self, snapshot, indices, mamba_indices=None):
        super().load_cpu_copy(snapshot, indices.flip(0), mamba_indices)


def create(config):
    pool, allocator = mha.create(config)
    pool.__class__ = FlippingPool
    return pool, allocator


@hookimpl
def kvcache_pool_specs():
    base = mha.kvcache_pool_specs()[0]
    return [PoolSpec(name="flipping", pool_class=FlippingPool,
                     allocator_class=base.allocator_class, factory=create,
                     capabilities=base.capabilities)]
"""


def test_pool_name_is_a_target_and_a_behaviour_finding_fails_the_run(
    run_cli, fake_site, isolated_modules
):
    """`kvcache check flipping` names a pool whose plugin is called `kvbroken`."""
    fake_site(
        "kv-broken",
        entry_points={"kvbroken": "kvfake_flip"},
        modules={"kvfake_flip": BROKEN_PLUGIN},
    )
    run = run_cli("check", "flipping", "--level", "signature,behaviour")
    assert run.code == 1, (run.err, run.results)
    failed = [r for r in run.results if r.outcome is Outcome.FAILED]
    assert [(r.target, r.check) for r in failed] == [
        ("pool:flipping", "behaviour/offload-roundtrip")
    ]
    (finding,) = failed[0].findings
    assert finding.rule == "behaviour-failed" and "from kvfake_flip import create" in (
        finding.reproduction
    )
    # Only that pool's classes were targets (the plugin declares no other pool).
    assert {r.target for r in run.results if r.check.startswith("signature")} == {
        "kvfake_flip.FlippingPool",
        "kvcache_core.allocation.paged.PagedSlotAllocator",
    }


def test_unknown_name_lists_plugins_and_pools(run_cli):
    run = run_cli("check", "no_such_pool")
    assert run.code == 2
    assert "no installed kvcache plugin named 'no_such_pool'" in run.err
    assert "pools: " in run.err and "hisparse" in run.err


def test_types_level_runs_or_reports_that_it_cannot(run_cli, clean_file, monkeypatch):
    import dataclasses

    from kvcache_core.conformance import runner

    missing = "kvcache_core.conformance.no_such_types_level"
    levels = tuple(
        dataclasses.replace(level, module=missing) if level.name == "types" else level
        for level in runner.LEVELS
    )
    monkeypatch.setattr(runner, "LEVELS", levels)
    run = run_cli("check", str(clean_file), "--level", "types")
    assert run.code == 2
    (result,) = run.results
    assert result.outcome is Outcome.ERROR and "types level is not available" in result.detail


def test_default_levels_include_types(run_cli, isolated_modules):
    run = run_cli("check", str(CORPUS / "positional_rename.py"))
    assert run.code == 1, run.err
    levels = {r.check.split(":")[0] for r in run.results}
    assert levels == {"source", "signature", "types", "behaviour"}
    assert all(
        r.outcome is Outcome.SKIPPED and r.detail == NO_SPEC
        for r in run.results
        if r.check == "behaviour"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--level", "sourcery"], "unknown level 'sourcery'"),
        (["--against", "KVPol"], "unknown protocol 'KVPol'"),
        (["--contract-version", "7"], "unknown contract version 7"),
        (["no_such_plugin"], "no installed kvcache plugin named 'no_such_plugin'"),
        (["./does/not/exist"], "no such file or directory"),
        (["mod:"], "expected module:Class"),
    ],
)
def test_usage_errors_exit_2(run_cli, argv, message):
    run = run_cli("check", *argv)
    assert run.code == 2
    assert message in run.err


def test_missing_renderers_are_a_usage_error(clean_file, monkeypatch, capsys):
    from kvcache_core import cli

    monkeypatch.setattr(_output, "_RENDER_MODULE", "kvcache_core.conformance.no_such_render")
    code = cli.main(["check", str(clean_file), "--level", "source"])
    assert code == 2
    assert "output renderers are not available" in capsys.readouterr().err


def test_output_file(run_cli, clean_file, tmp_path):
    out = tmp_path / "report.txt"
    run = run_cli("check", str(clean_file), "--level", "source", "--output", str(out))
    assert run.code == 0
    assert out.read_text() == f"{len(run.results)} results\n"
    assert run.out == ""


def test_builtin_plugins_pass_source_and_signature(run_cli, isolated_modules):
    accepted = discover().names()
    plugins = sorted({discover().accepted[n].plugin.name for n in accepted})
    assert plugins, "no built-in plugin is accepted by discovery"
    run = run_cli("check", *plugins, "--level", "source,signature")
    errors = {(f.rule, f.target) for r in run.results for f in r.findings if f.is_error}
    assert run.code == 0, errors
    checked = {r.target for r in run.results}
    assert "kvcache_plugins.mha.MHATokenToKVPool" in checked
    assert "kvcache_core.allocation.paged.PagedSlotAllocator" in checked


def test_no_target_checks_every_installed_plugin_and_survives_broken_ones(
    run_cli, fake_site, isolated_modules
):
    fake_site(
        "broken-pool",
        entry_points={"broken": "broken_pool_mod"},
        modules={"broken_pool_mod": "raise RuntimeError('needs a GPU')\n"},
    )
    fake_site(
        "drifted-pool",
        entry_points={"drifted": "drifted_pool_mod"},
        modules={
            "drifted_pool_mod": """
                from kvcache_core import PoolSpec, Capability, hookimpl
                from kvcache_plugins.mha import MHATokenToKVPool
                from kvcache_plugins.allocators import PagedSlotAllocator

                class DriftedPool(MHATokenToKVPool):
                    def get_cpu_copy(self, indices):
                        return super().get_cpu_copy(indices)

                @hookimpl
                def kvcache_pool_specs():
                    return [PoolSpec("drifted", DriftedPool, PagedSlotAllocator,
                                     lambda c: (None, None), frozenset({Capability.OFFLOAD}))]
            """
        },
    )
    run = run_cli("check", "--level", "source,signature")
    assert run.code == 1
    load = [r for r in run.results if r.check == "load"]
    assert [r.target for r in load] == ["plugin:broken"]
    assert load[0].outcome is Outcome.ERROR
    assert "RuntimeError: needs a GPU" in load[0].findings[0].message
    drifted = [f for f in run.findings("missing-parameter") if f.target.endswith("DriftedPool")]
    assert len(drifted) == 1  # source and signature agree: one finding
    assert drifted[0].levels == ("source", "signature")
    assert any(r.target == "kvcache_plugins.mha.MHATokenToKVPool" for r in run.results)


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "sarif", "github"])
def test_every_format_renders_through_the_real_renderers(fmt, tmp_path, capsys):
    import json

    from kvcache_core import cli

    out = tmp_path / f"report.{fmt}"
    target = str(CORPUS / "allocator_drop.py")
    code = cli.main(["check", target, "--level", "source", "--format", fmt, "--output", str(out)])
    assert code == 1
    text = out.read_text(encoding="utf-8")
    assert "parameter-not-forwarded" in text
    if fmt in ("json", "sarif"):
        json.loads(text)


JUNK_SPECS = {
    "pool-class-is-an-instance": (
        "PoolSpec('junk', MHATokenToKVPool.__new__(MHATokenToKVPool), PagedSlotAllocator, "
        "create, frozenset({Capability.OFFLOAD}))",
        "pool_class is MHATokenToKVPool",
    ),
    "allocator-class-is-an-instance": (
        "PoolSpec('junk', MHATokenToKVPool, object(), create)",
        "allocator_class is object",
    ),
    "allocator-class-is-none": (
        "PoolSpec('junk', MHATokenToKVPool, None, create)",
        "allocator_class is NoneType None, not a class",
    ),
    "future-contract": (
        "PoolSpec('junk', MHATokenToKVPool, PagedSlotAllocator, create, contract_version=99)",
        "built for contract 99",
    ),
    "contract-not-an-int": (
        "PoolSpec('junk', MHATokenToKVPool, PagedSlotAllocator, create, contract_version='2')",
        "contract_version must be an int",
    ),
    "the-class-poolspec": ("PoolSpec", "hook returned the class PoolSpec"),
    "not-a-spec": ("{'name': 'junk'}", "hook returned dict"),
}


@pytest.mark.parametrize("case", sorted(JUNK_SPECS))
def test_a_junk_spec_is_a_load_error_naming_the_problem_not_a_traceback(
    case, run_cli, fake_site, isolated_modules
):
    """The checker's loader uses discovery's own shape check: a spec discovery rejects before
    validating it is a ``load-error`` result with the same reason, and the plugin's other
    (good) spec is still checked."""
    expression, reason = JUNK_SPECS[case]
    fake_site(
        "kv-junk",
        entry_points={"kvjunk": "kvfake_junk"},
        modules={
            "kvfake_junk": f"""
                from kvcache_core import Capability, PoolSpec, hookimpl
                from kvcache_plugins import mha
                from kvcache_plugins.mha import MHATokenToKVPool, create
                from kvcache_plugins.allocators import PagedSlotAllocator

                @hookimpl
                def kvcache_pool_specs():
                    good = mha.kvcache_pool_specs()[0]
                    return [{expression}, PoolSpec("fine", good.pool_class,
                            good.allocator_class, good.factory, good.capabilities)]
            """
        },
    )
    run = run_cli("check", "kvjunk", "--level", "signature")
    assert run.code == 1, (run.err, run.results)
    assert "Traceback" not in run.err
    load = [r for r in run.results if r.check == "load"]
    assert [r.target for r in load] == ["plugin:kvjunk"], run.results
    assert load[0].outcome is Outcome.ERROR
    (finding,) = load[0].findings
    assert finding.rule == "load-error" and reason in finding.message, finding.message
    discovered = discover(allow={"kvjunk"})
    assert any(reason in r.reason for r in discovered.rejected), discovered.rejected
    checked = {r.target for r in run.results if r.check.startswith("signature")}
    assert "kvcache_plugins.mha.MHATokenToKVPool" in checked  # the good spec still checked
