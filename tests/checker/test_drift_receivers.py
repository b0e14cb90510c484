"""``kvcache drift`` on what real engines write: receivers typed before calls are matched,
refusals, stubs and pass-through left alone, the real bugs kept, hints that are valid code.

Each case is the smallest tree that shows one rule of docs/checker.md ("Typing receivers",
"What a finding rests on", "Third-party layouts"), with the finding it must (or must not) give.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kvcache_core.conformance.results.model import Finding
from kvcache_core.conformance.source.drift import analyze

BASE = (
    "class Pool:\n"
    "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
    "        return (indices, mamba_indices)\n"
)


def _run(tmp_path: Path, text: str, **options: object) -> list[Finding]:
    (tmp_path / "pools.py").write_text(text, encoding="utf-8")
    return [f for r in analyze([str(tmp_path / "pools.py")], **options) for f in r.findings]  # type: ignore[arg-type]


def _keys(found: list[Finding]) -> set[tuple[str, str, str | None, str]]:
    return {(f.rule, f.target.rsplit(".", 1)[-1], f.parameter, str(f.severity)) for f in found}


NARROW = "\n\nclass Narrow(Pool):\n    def get_cpu_copy(self, indices):\n        return indices\n"


def test_a_typed_caller_makes_the_narrowing_an_error_with_the_call_attached(tmp_path):
    found = _run(
        tmp_path,
        BASE
        + NARROW
        + "\n\ndef retract(pool: Pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n",
    )
    assert _keys(found) == {("missing-parameter", "Narrow", "mamba_indices", "error")}
    (f,) = found
    assert [r.location.line for r in f.related] == [12]
    assert (
        "`retract` calls `pool.get_cpu_copy(i, mamba_indices=m)` (`pool: Pool`)"
        in f.related[0].message
    )


def test_without_a_call_the_narrowing_is_a_warning_and_against_a_stub_nothing(tmp_path):
    assert _keys(_run(tmp_path, BASE + NARROW)) == {
        ("missing-parameter", "Narrow", "mamba_indices", "warning")
    }
    stub = (
        "class Pool:\n"
        "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
        "        raise NotImplementedError\n"
    )
    assert _run(tmp_path, stub + NARROW) == []


def test_an_unrelated_class_with_the_same_method_name_is_not_a_receiver(tmp_path):
    other = "\n\nclass Queue:\n    def get_cpu_copy(self, n):\n        return n\n"
    found = _run(
        tmp_path,
        BASE
        + other
        + "\n\ndef retract(pool: Pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n",
    )
    assert found == []


def test_standard_library_and_module_receivers_are_never_matched(tmp_path):
    text = (
        "import asyncio\nimport queue\n\n\nclass Waiter:\n"
        "    def get(self, block):\n"
        "        return block\n"
        "\n"
        "    def wait(self, n):\n"
        "        return n\n"
        "\n"
        "\n"
        "def use(q: queue.Queue, aws):\n    q.get(timeout=1)\n    asyncio.wait(aws, timeout=2)\n"
    )
    assert _run(tmp_path, text, methods=["get", "wait"]) == []


def test_an_untyped_receiver_is_a_warning_and_only_for_families_declaring_the_keyword(tmp_path):
    other = "\n\nclass Mamba:\n    def get_cpu_copy(self, indices):\n        return indices\n"
    text = (
        BASE
        + NARROW
        + other
        + "\n\ndef retract(pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n"
    )
    found = _run(tmp_path, text)
    # Narrow is of the family that declares mamba_indices; Mamba's family never does
    assert _keys(found) == {("missing-parameter", "Narrow", "mamba_indices", "warning")}
    assert "The receiver is untyped" in found[0].message


def test_self_attribute_typed_in_init_and_isinstance_narrowing(tmp_path):
    text = (
        BASE
        + NARROW
        + (
            "\n"
            "\n"
            "class Allocator:\n"
            "    def __init__(self, kvcache: Pool):\n"
            "        self._kvcache = kvcache\n"
            "\n"
            "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
            "        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)\n"
        )
    )
    found = _run(tmp_path, text)
    assert _keys(found) == {("missing-parameter", "Narrow", "mamba_indices", "error")}
    assert "`self._kvcache = kvcache` (`kvcache: Pool`)" in found[0].related[0].message
    guarded = (
        BASE
        + NARROW
        + (
            "\n\ndef retract(pool, i, m):\n    if isinstance(pool, Pool):\n"
            "        return pool.get_cpu_copy(i, mamba_indices=m)\n"
        )
    )
    assert _keys(_run(tmp_path, guarded)) == {
        ("missing-parameter", "Narrow", "mamba_indices", "warning")  # a dispatch, no promise
    }


def test_a_subclass_that_overrides_the_calling_method_never_runs_the_self_call(tmp_path):
    text = (
        "class Pool:\n"
        "    def set_kv_buffer(self, layer, loc, layer_id_override=None):\n"
        "        return loc\n"
        "\n"
        "    def prefix(self, layer, loc):\n"
        "        return self.set_kv_buffer(layer, loc, layer_id_override=1)\n"
        "\n"
        "\n"
        "class Own(Pool):\n    def set_kv_buffer(self, layer, loc):\n        return loc\n\n"
        "    def prefix(self, layer, loc):\n        return self.set_kv_buffer(layer, loc)\n\n\n"
        "class Inherits(Pool):\n    def set_kv_buffer(self, layer, loc):\n        return loc\n"
    )
    found = _run(tmp_path, text)
    assert {(k[0], k[1], k[3]) for k in _keys(found)} == {
        ("missing-parameter", "Own", "warning"),  # its own prefix() passes nothing
        ("missing-parameter", "Inherits", "error"),  # runs Pool.prefix: breaks
    }


def test_a_refusal_is_no_drift_unless_a_caller_catches_it(tmp_path):
    refuses = (
        "\n"
        "\n"
        "class NoOp(Pool):\n"
        "    def get_cpu_copy(self, *args, **kwargs):\n"
        "        raise RuntimeError('never offloads')\n"
    )
    caller = (
        "\n\ndef retract(pool: Pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n"
    )
    assert _run(tmp_path, BASE + refuses + caller) == []
    narrow_refusal = (
        "\n"
        "\n"
        "class Refuses(Pool):\n"
        "    def get_cpu_copy(self, indices):\n"
        "        raise RuntimeError('no')\n"
    )
    catching = (
        "\n"
        "\n"
        "def retract(pool: Pool, i, m):\n"
        "    try:\n"
        "        return pool.get_cpu_copy(i, mamba_indices=m)\n"
        "    except RuntimeError:\n        return None\n"
    )
    assert _keys(_run(tmp_path, BASE + narrow_refusal + catching)) == {
        ("missing-parameter", "Refuses", "mamba_indices", "error")  # TypeError escapes the except
    }


def test_kwargs_forwarded_unchanged_is_pass_through_and_kwargs_swallowed_is_not(tmp_path):
    caller = (
        "\n\ndef retract(pool: Pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n"
    )
    through = (
        "\n"
        "\n"
        "class Through(Pool):\n"
        "    def get_cpu_copy(self, indices, **kwargs):\n"
        "        return super().get_cpu_copy(indices, **kwargs)\n"
    )
    assert _run(tmp_path, BASE + through + caller) == []
    swallows = (
        "\n"
        "\n"
        "class Swallows(Pool):\n"
        "    def get_cpu_copy(self, indices, **kwargs):\n"
        "        return super().get_cpu_copy(indices)\n"
    )
    assert ("kwargs-hides-parameter", "Swallows", "mamba_indices", "error") in _keys(
        _run(tmp_path, BASE + swallows + caller)
    )


def test_an_override_that_drops_what_the_ancestor_reads_and_a_misrouted_kwargs(tmp_path):
    caller = (
        "\n\ndef retract(pool: Pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n"
    )
    drops = (
        "\n"
        "\n"
        "class Drops(Pool):\n"
        "    def get_cpu_copy(self, indices, mamba_indices=None, **kwargs):\n"
        "        return super().get_cpu_copy(indices, mamba_indices=kwargs.get('mamba_indices'))\n"
    )
    found = [
        f for f in _run(tmp_path, BASE + drops + caller) if f.rule == "parameter-not-forwarded"
    ]
    (f,) = [f for f in found if f.parameter == "mamba_indices"]
    assert f.is_error
    assert "passes `mamba_indices=kwargs.get('mamba_indices')` instead of it" in f.message
    assert f.hint == "write `super().get_cpu_copy(indices, mamba_indices=mamba_indices)`"
    ast.parse(f.hint.removeprefix("write `").removesuffix("`"))  # valid code: one keyword
    misroutes = (
        "\n\nclass Misroutes(Pool):\n    def get_cpu_copy(self, indices, **kwargs):\n"
        "        return super().get_cpu_copy(indices, kwargs)\n"
    )
    found = _run(tmp_path, BASE + misroutes + caller)
    assert any(
        f.rule == "parameter-not-forwarded" and "as one argument" in f.message for f in found
    )


def test_a_class_in_a_patch_method_with_a_getattr_base_and_a_rebinding(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "pools.py").write_text(
        BASE
        + "\n\ndef retract(pool: Pool, i, m):\n    return pool.get_cpu_copy(i, mamba_indices=m)\n",
        encoding="utf-8",
    )
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "patch.py").write_text(
        "import types\n\n\nclass Patch:\n    target_module = 'engine.pools'\n\n"
        "    def apply(self, mod: types.ModuleType):\n        Base = getattr(mod, 'Pool')\n\n"
        "        class Elastic(Base):\n"
        "            def get_cpu_copy(self, indices):\n"
        "                return indices\n"
        "\n"
        "        mod.Pool = Elastic\n        return getattr(mod, 'gone_helper')\n",
        encoding="utf-8",
    )
    results = analyze([str(plugin), str(engine)], root="Elastic")
    found = {
        (f.rule, f.target.rsplit(".", 1)[-1], f.parameter, str(f.severity))
        for r in results
        for f in r.findings
    }
    assert ("missing-parameter", "Elastic", "mamba_indices", "error") in found
    assert ("missing-engine-name", "patch", "gone_helper", "error") in found
    (f,) = [f for r in results for f in r.findings if f.rule == "missing-parameter"]
    assert f.target.endswith("Patch.apply.Elastic")
