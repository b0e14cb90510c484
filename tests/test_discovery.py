"""Discovery against real (fake-but-installed) distributions: isolation, policy, duplicates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvcache_core import PluginRejectedError, PoolConfig, UnknownPoolError, discover

GOOD = """
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool, create


@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="{name}", pool_class=MHATokenToKVPool,
                     allocator_class=PagedSlotAllocator, factory=create,
                     capabilities=frozenset({{Capability.OFFLOAD}}))]
"""

RAISES_AT_IMPORT = """
raise RuntimeError("boom while importing")
"""

RAISES_IN_HOOK = """
from kvcache_core import hookimpl


@hookimpl
def kvcache_pool_specs():
    raise ValueError("boom inside the hook")
"""

DRIFTED = """
from kvcache_core import Capability, PoolSpec, hookimpl
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool


class OldPool(MHATokenToKVPool):
    def get_cpu_copy(self, indices):
        return super().get_cpu_copy(indices)


@hookimpl
def kvcache_pool_specs():
    return [PoolSpec(name="oldpool", pool_class=OldPool, allocator_class=PagedSlotAllocator,
                     factory=lambda c: None, capabilities=frozenset({Capability.OFFLOAD}))]
"""

FAKES = ["good", "at_import", "in_hook", "twin_a", "twin_b", "drifted"]


@pytest.fixture
def plugins(fake_site):
    fake_site(
        "kv-good",
        entry_points={"good": "kvfake_good"},
        modules={"kvfake_good": GOOD.format(name="goodpool")},
    )
    fake_site(
        "kv-at-import",
        entry_points={"at_import": "kvfake_import"},
        modules={"kvfake_import": RAISES_AT_IMPORT},
    )
    fake_site(
        "kv-in-hook",
        entry_points={"in_hook": "kvfake_hook"},
        modules={"kvfake_hook": RAISES_IN_HOOK},
    )
    fake_site(
        "kv-twin-a",
        entry_points={"twin_a": "kvfake_twin_a"},
        modules={"kvfake_twin_a": GOOD.format(name="twin")},
    )
    fake_site(
        "kv-twin-b",
        entry_points={"twin_b": "kvfake_twin_b"},
        modules={"kvfake_twin_b": GOOD.format(name="twin")},
    )
    fake_site(
        "kv-drifted",
        entry_points={"drifted": "kvfake_drifted"},
        modules={"kvfake_drifted": DRIFTED},
    )


def _reasons(registry):
    return {r.plugin.name: r for r in registry.rejected}


def test_broken_plugins_are_isolated_and_the_good_one_loads(plugins):
    registry = discover(allow=FAKES)
    assert "goodpool" in registry.accepted
    assert registry.accepted["goodpool"].plugin.distribution == "kv-good"
    reasons = _reasons(registry)
    assert "import failed: RuntimeError: boom while importing" in reasons["at_import"].reason
    assert "kvfake_import.py" in reasons["at_import"].reason  # traceback summary names the file
    assert "raised ValueError: boom inside the hook" in reasons["in_hook"].reason


def test_duplicate_pool_names_reject_both_and_name_both_distributions(plugins):
    registry = discover(allow=FAKES)
    assert "twin" not in registry.accepted
    twins = [r for r in registry.rejected if r.pool == "twin"]
    assert {r.plugin.name for r in twins} == {"twin_a", "twin_b"}
    for rejection in twins:
        assert "kv-twin-a" in rejection.reason and "kv-twin-b" in rejection.reason


def test_drifted_signature_is_rejected_with_the_finding(plugins):
    registry = discover(allow=FAKES)
    rejection = _reasons(registry)["drifted"]
    assert rejection.pool == "oldpool"
    rules = {(f.rule, f.method, f.parameter) for f in rejection.findings}
    assert ("missing-parameter", "get_cpu_copy", "mamba_indices") in rules
    assert "matches contract 1" in rejection.reason


def test_strict_mode_raises_listing_every_rejection(plugins):
    with pytest.raises(PluginRejectedError) as info:
        discover(allow=FAKES, strict=True)
    text = str(info.value)
    for name in ("at_import", "in_hook", "twin_a", "twin_b", "drifted"):
        assert f"plugin {name} " in text or f"of plugin {name} " in text


def test_deny_list_and_environment(plugins, monkeypatch):
    registry = discover(allow=FAKES, deny=["at_import", "in_hook"])
    names = {r.plugin.name for r in registry.rejected}
    assert "at_import" not in names and "in_hook" not in names
    assert {i.name for i, why in registry.skipped if "deny" in why} == {"at_import", "in_hook"}

    monkeypatch.setenv("KVCACHE_PLUGINS", "good,mha")
    registry = discover()
    assert set(registry.accepted) == {"goodpool", "mha"}
    assert not registry.rejected

    monkeypatch.delenv("KVCACHE_PLUGINS")
    monkeypatch.setenv("KVCACHE_DISABLE_PLUGINS", "at_import,in_hook,twin_a,twin_b,drifted")
    registry = discover()
    assert "goodpool" in registry.accepted
    assert not [r for r in registry.rejected if r.plugin.name in FAKES]


def test_autoload_off_loads_only_named_plugins(plugins, monkeypatch):
    monkeypatch.setenv("KVCACHE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert discover().accepted == {}
    registry = discover(allow=["good"])
    assert set(registry.accepted) == {"goodpool"}


def test_builtin_mha_is_found_through_its_entry_point():
    registry = discover(allow=["mha"])
    entry = registry.accepted["mha"]
    assert entry.plugin.value == "kvcache_plugins.mha"
    assert entry.plugin.distribution == "kvcache"
    pool, allocator = registry.create(
        "mha", PoolConfig(size=16, layer_num=2, head_num=2, head_dim=8, dtype=torch.float32)
    )
    assert pool.get_key_buffer(0).shape == (17, 2, 8)
    assert allocator.get_kvcache() is pool


def test_create_unknown_pool_names_the_accepted_ones():
    registry = discover(allow=["mha"])
    with pytest.raises(UnknownPoolError, match="accepted: mha"):
        registry.create("nope", PoolConfig(size=4, layer_num=1))


# --------------------------------------------------------------------------------------------
# Every rejection reason discovery has, each end to end through a real entry point.

HEADER = """
import sys
import torch
from kvcache_core import Capability, KVSnapshot, PoolSpec, hookimpl
from kvcache_plugins.allocators import PagedSlotAllocator
from kvcache_plugins.mha import MHATokenToKVPool, create
"""


def _spec(name: str, **extra: str) -> str:
    fields = {
        "name": repr(name),
        "pool_class": "MHATokenToKVPool",
        "allocator_class": "PagedSlotAllocator",
        "factory": "create",
        "capabilities": "frozenset({Capability.OFFLOAD})",
        **extra,
    }
    return "PoolSpec(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _hook(returns: str, body: str = "") -> str:
    return f"{HEADER}\n{body}\n\n@hookimpl\ndef kvcache_pool_specs():\n    return {returns}\n"


def install(fake_site, source: str, ep: str = "probe", dist: str = "kv-probe") -> None:
    """One fake distribution ``dist`` 1.0 whose entry point ``ep`` is a module of ``source``."""
    module = f"kvprobe_{ep}"
    fake_site(dist, entry_points={ep: module}, modules={module: source})


def only_rejection(registry, ep: str = "probe"):
    (rejection,) = [r for r in registry.rejected if r.plugin.name == ep]
    assert rejection.plugin.distribution == "kv-probe" and rejection.plugin.version == "1.0"
    return rejection


@pytest.mark.parametrize(
    "source, reason",
    [
        pytest.param(
            "raise SystemExit('plugin called sys.exit')",
            "import failed: SystemExit: plugin called sys.exit at ",
            id="systemexit-at-import",
        ),
        pytest.param(
            "import no_such_dependency_kvcache",
            "import failed: ModuleNotFoundError: No module named 'no_such_dependency_kvcache' at ",
            id="missing-dependency",
        ),
        pytest.param(
            HEADER + "\n@hookimpl\ndef kvcache_pool_specs(config):\n    return []\n",
            "could not register with pluggy: PluginValidationError: ",
            id="hookimpl-with-unknown-argument",
        ),
        pytest.param(
            "VALUE = 1\n",
            "implements no kvcache_pool_specs() hook",
            id="no-hook",
        ),
        pytest.param(
            HEADER + f"\ndef kvcache_pool_specs():\n    return [{_spec('nomarker')}]\n",
            "defines kvcache_pool_specs() without the @hookimpl marker",
            id="hook-without-marker",
        ),
        pytest.param(
            _hook("sys.exit(3)"),
            "kvcache_pool_specs() raised SystemExit: 3 at ",
            id="hook-exits",
        ),
        pytest.param(
            _hook("None"),
            "kvcache_pool_specs() returned NoneType None, expected a list",
            id="returns-none",
        ),
        pytest.param(
            _hook("5"),
            "kvcache_pool_specs() returned int 5, expected a list",
            id="returns-int",
        ),
        pytest.param(
            _hook(_spec("bare")),
            "kvcache_pool_specs() returned a bare PoolSpec ('bare'), expected a list of "
            "PoolSpec: return [spec]",
            id="returns-bare-spec",
        ),
        pytest.param(
            _hook(f"[{_spec('sp', factory='None')}]"),
            "kvcache_pool_specs() raised TypeError: PoolSpec.factory of 'sp' is not callable at ",
            id="spec-construction-raises",
        ),
    ],
)
def test_plugin_level_rejections(fake_site, source, reason):
    install(fake_site, source)
    install(fake_site, GOOD.format(name="sibling"), ep="sibling", dist="kv-sibling")
    registry = discover(allow=["probe", "sibling"])
    rejection = only_rejection(registry)
    assert rejection.reason.startswith(reason), rejection.reason
    assert rejection.pool is None and rejection.spec is None
    assert set(registry.accepted) == {"sibling"}  # the others still load


BOOM_SIGNATURE = """
class Boom:
    @property
    def __signature__(self):
        raise RuntimeError("no signature for you")

    def __call__(self, *args, **kwargs):
        return None


class OddPool(MHATokenToKVPool):
    get_kv_size_bytes = Boom()
"""


@pytest.mark.parametrize(
    "returns, body, pool, reason",
    [
        pytest.param("[42]", "", None, "hook returned int 42, expected PoolSpec", id="int-in-list"),
        pytest.param(
            "[PoolSpec]",
            "",
            None,
            "hook returned the class PoolSpec, not a PoolSpec: call it, PoolSpec(name=...)",
            id="class-instead-of-instance",
        ),
        pytest.param(
            f"[{_spec('newer', contract_version='3')}]",
            "",
            "newer",
            "built for contract 3; this kvcache knows up to 2: upgrade kvcache",
            id="newer-contract",
        ),
        pytest.param(
            f"[{_spec('strver', contract_version=repr('2'))}]",
            "",
            "strver",
            "contract_version must be an int, got str '2'",
            id="contract-version-not-int",
        ),
        pytest.param(
            f"[{_spec('zero', contract_version='0')}]",
            "",
            "zero",
            "built for contract 0, which does not exist (contracts start at 1)",
            id="contract-zero",
        ),
        pytest.param(
            f"[{_spec('inst', pool_class='object()')}]",
            "",
            "inst",
            "pool_class is object <object object at",
            id="instance-instead-of-class",
        ),
        pytest.param(
            f"[{_spec('odd', pool_class='OddPool')}]",
            BOOM_SIGNATURE,
            "odd",
            "validating the spec raised RuntimeError: no signature for you at ",
            id="validation-raises",
        ),
    ],
)
def test_spec_level_rejections(fake_site, returns, body, pool, reason):
    install(fake_site, _hook(returns, body))
    install(fake_site, GOOD.format(name="sibling"), ep="sibling", dist="kv-sibling")
    registry = discover(allow=["probe", "sibling"])
    rejection = only_rejection(registry)
    assert rejection.reason.startswith(reason), rejection.reason
    assert rejection.pool == pool
    assert set(registry.accepted) == {"sibling"}


def test_a_bad_spec_rejects_only_itself_not_its_siblings(fake_site):
    install(fake_site, _hook(f"[{_spec('fine')}, 'junk']"))
    registry = discover(allow=["probe"])
    assert set(registry.accepted) == {"fine"}
    assert only_rejection(registry).reason == "hook returned str 'junk', expected PoolSpec"


def test_newer_contract_rejection_keeps_declared_contract_and_capabilities(fake_site):
    install(fake_site, _hook(f"[{_spec('newer', contract_version='3')}]"))
    with pytest.raises(PluginRejectedError, match="built for contract 3; this kvcache knows up to"):
        discover(allow=["probe"], strict=True)
    rejection = only_rejection(discover(allow=["probe"]))
    assert rejection.spec is not None and rejection.spec.contract_version == 3
    assert {str(c) for c in rejection.spec.capabilities} == {"offload"}


def test_same_module_under_two_entry_points_is_registered_once(fake_site):
    fake_site(
        "kv-probe",
        entry_points={"first": "kvprobe_same", "second": "kvprobe_same"},
        modules={"kvprobe_same": GOOD.format(name="same")},
    )
    registry = discover(allow=["first", "second"])
    assert set(registry.accepted) == {"same"}
    (rejection,) = registry.rejected
    assert rejection.plugin.name == "second"
    assert rejection.reason.startswith("could not register with pluggy: ValueError: ")


def test_policy_skips_say_why(plugins, monkeypatch):
    registry = discover(allow=["good", "at_import"], deny=["at_import"])
    skipped = {i.name: why for i, why in registry.skipped}
    assert skipped["at_import"] == "disabled by deny list"
    assert skipped["in_hook"] == "not in allow list"
    assert skipped["mha"] == "not in allow list"
    assert set(registry.accepted) == {"goodpool"} and not registry.rejected

    monkeypatch.setenv("KVCACHE_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = discover()
    assert {why for _, why in registry.skipped} == {"autoload disabled"}
    assert {i.name for i, _ in registry.skipped} >= set(FAKES) | {"mha"}
    monkeypatch.setenv("KVCACHE_PLUGINS", "good")
    registry = discover()
    assert set(registry.accepted) == {"goodpool"}
    assert {i.name: why for i, why in registry.skipped}["in_hook"] == "not in allow list"


# --------------------------------------------------------------------------------------------
# The checker's body rules: warnings on the accepted pool; strict rejects them.

WRITELOC = """
class RawLocPool(MHATokenToKVPool):
    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        self.get_key_buffer(layer.layer_id)[loc] = cache_k
        self.get_value_buffer(layer.layer_id)[loc] = cache_v
"""

NOT_IMPLEMENTED = """
class NoOffloadPool(MHATokenToKVPool):
    def get_cpu_copy(self, indices, mamba_indices=None):
        raise NotImplementedError

    def load_cpu_copy(self, snapshot, indices, mamba_indices=None):
        raise NotImplementedError("not yet")
"""

DROPS = """
class DroppingAllocator(PagedSlotAllocator):
    def get_cpu_copy(self, indices, mamba_indices=None):
        return self.get_kvcache().get_cpu_copy(indices)
"""

NO_SOURCE = """
namespace = {"MHATokenToKVPool": MHATokenToKVPool}
exec(
    "class NoSourcePool(MHATokenToKVPool):\\n"
    "    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):\\n"
    "        self.get_key_buffer(layer.layer_id)[loc] = cache_k\\n",
    namespace,
)
NoSourcePool = namespace["NoSourcePool"]


class LambdaPool(MHATokenToKVPool):
    get_cpu_copy = lambda self, indices, mamba_indices=None: self.x.get_cpu_copy(indices)  # noqa
"""

#: pool name -> (plugin source, spec field and class, rule, method)
BODY_CASES = {
    "rawloc": (WRITELOC, {"pool_class": "RawLocPool"}, "writeloc-not-unwrapped", "set_kv_buffer"),
    "noimpl": (NOT_IMPLEMENTED, {"pool_class": "NoOffloadPool"}, "not-implemented", "get_cpu_copy"),
    "drops": (
        DROPS,
        {"allocator_class": "DroppingAllocator"},
        "parameter-not-forwarded",
        "get_cpu_copy",
    ),
}


def _body_plugin(fake_site, key: str) -> None:
    body, fields, _, _ = BODY_CASES[key]
    install(fake_site, _hook(f"[{_spec(key, **fields)}]", body))


@pytest.mark.parametrize("key", sorted(BODY_CASES))
def test_body_rules_are_warnings_on_the_accepted_pool(fake_site, key):
    _body_plugin(fake_site, key)
    registry = discover(allow=["probe"])
    assert set(registry.accepted) == {key} and not registry.rejected
    _, _, rule, method = BODY_CASES[key]
    warnings = registry.warnings(key)
    assert warnings == registry.accepted[key].warnings
    assert {(w.rule, w.method) for w in warnings} >= {(rule, method)}
    assert {w.rule for w in warnings} == {rule}
    assert all(str(w.severity) == "warning" for w in warnings)
    first = next(w for w in warnings if w.method == method)
    assert first.impl_location is not None
    assert first.impl_location.path.endswith("kvprobe_probe.py")
    assert registry.accepted[key].notes == ()


def test_body_rule_lines_point_at_the_offending_statement(fake_site):
    _body_plugin(fake_site, "rawloc")
    (warning,) = discover(allow=["probe"]).warnings("rawloc")
    path = warning.impl_location.path
    line = Path(path).read_text(encoding="utf-8").splitlines()[warning.impl_location.line - 1]
    assert line.strip() == "self.get_key_buffer(layer.layer_id)[loc] = cache_k"


@pytest.mark.parametrize("key", sorted(BODY_CASES))
def test_strict_rejects_body_rule_findings_naming_the_rule(fake_site, key):
    _body_plugin(fake_site, key)
    _, _, rule, _ = BODY_CASES[key]
    with pytest.raises(PluginRejectedError) as info:
        discover(allow=["probe"], strict=True)
    (rejection,) = info.value.rejected
    assert rejection.pool == key
    assert rejection.reason.startswith(f"source findings (strict): [{rule}] ")
    assert f"[{rule}]" in str(info.value)


def test_unreadable_source_is_a_note_and_never_a_crash(fake_site):
    specs = (
        f"[{_spec('nosrc', pool_class='NoSourcePool')}, {_spec('lam', pool_class='LambdaPool')}]"
    )
    install(fake_site, _hook(specs, NO_SOURCE))
    registry = discover(allow=["probe"], strict=True)  # notes never reject
    assert set(registry.accepted) == {"nosrc", "lam"}
    for name, method in (("nosrc", "set_kv_buffer"), ("lam", "get_cpu_copy")):
        entry = registry.accepted[name]
        assert entry.warnings == ()
        (note,) = entry.notes
        assert str(note.severity) == "note" and note.rule == "load-error"
        assert f".{method}: its source cannot be read" in note.message


def test_builtin_pools_have_no_warnings_and_no_notes():
    registry = discover()
    assert {"dsa", "hisparse", "mamba", "mha", "mla", "swa"} <= set(registry.names())
    for name in registry.names():
        assert registry.accepted[name].source_findings == (), name


def test_warnings_of_an_unknown_pool_raise_unknown_pool():
    with pytest.raises(UnknownPoolError, match="no accepted pool named 'nope'"):
        discover(allow=["mha"]).warnings("nope")


ODD_LAYOUT = '''
class OddLayoutAllocator(PagedSlotAllocator):
    def get_cpu_copy(self, indices, mamba_indices=None):
        doc = """
a string at column 0 inside the body
"""
        return self.get_kvcache().get_cpu_copy(indices, doc and """
""")
'''


def test_body_rules_read_methods_whose_lines_end_at_column_0(fake_site):
    install(fake_site, _hook(f"[{_spec('odd', allocator_class='OddLayoutAllocator')}]", ODD_LAYOUT))
    registry = discover(allow=["probe"])
    entry = registry.accepted["odd"]
    assert entry.notes == ()
    (warning,) = entry.warnings
    assert (warning.rule, warning.method, warning.parameter) == (
        "parameter-not-forwarded",
        "get_cpu_copy",
        "mamba_indices",
    )
    path = Path(warning.impl_location.path)
    line = path.read_text(encoding="utf-8").splitlines()[warning.impl_location.line - 1]
    assert line.strip().startswith("return self.get_kvcache().get_cpu_copy(indices, doc and")


def test_identical_methods_in_two_files_each_point_at_their_own_file(fake_site):
    # Equal code objects compare equal whatever their file: the parse cache must not mix them.
    source = _hook(f"[{_spec('__NAME__', pool_class='RawLocPool')}]", WRITELOC)
    install(fake_site, source.replace("__NAME__", "left"), ep="left", dist="kv-left")
    install(fake_site, source.replace("__NAME__", "right"), ep="right", dist="kv-right")
    registry = discover(allow=["left", "right"])
    for name in ("left", "right"):
        (warning,) = registry.warnings(name)
        assert Path(warning.impl_location.path).name == f"kvprobe_{name}.py"
