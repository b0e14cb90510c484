"""Reading mypy's output and notes, without running mypy."""

from __future__ import annotations

from kvcache_core.conformance.results.model import Finding, Location
from kvcache_core.conformance.types._contract import contract_member
from kvcache_core.conformance.types._findings import member_finding, signature_from_note
from kvcache_core.conformance.types._mypy import _parse
from kvcache_core.contracts import OffloadablePool

MODULE = "_kvcache_types_check.py"


def test_parse_groups_notes_under_their_error() -> None:
    out = "\n".join(
        [
            f'{MODULE}:7: error: Incompatible types in assignment (expression has type "A", '
            'variable has type "_kvc_M1")  [assignment]',
            f'{MODULE}:7: note: Following member(s) of "A" have conflicts:',
            f"{MODULE}:7: note:     Expected:",
            f"{MODULE}:7: note:         def f(self, x: int) -> None",
            f'{MODULE}:9: error: Name "y" is not defined  [name-defined]',
            "other.py:3: error: invalid syntax  [syntax]",
        ]
    )
    messages, foreign = _parse(out, MODULE)
    assert [(m.line, m.code) for m in messages] == [(7, "assignment"), (9, "name-defined")]
    assert messages[0].text.endswith('variable has type "_kvc_M1")')
    assert messages[0].notes[1:] == ["    Expected:", "        def f(self, x: int) -> None"]
    assert foreign == ["other.py:3: error: invalid syntax  [syntax]"]


def test_signature_from_note() -> None:
    sig = signature_from_note("def [T] f(self, x: T, *, y: int | None = ...) -> T")
    assert sig is not None
    assert [(p.name, p.kind.value, p.default) for p in sig.params] == [
        ("x", "positional-or-keyword", None),
        ("y", "keyword-only", "..."),
    ]
    assert signature_from_note("@overload") is None
    assert signature_from_note("def broken(self, x: int") is None


def _finding(notes: list[str] | None) -> Finding:
    member = contract_member(OffloadablePool, "get_cpu_copy")
    return member_finding(
        member,
        notes,
        protocol="OffloadablePool",
        target="t",
        class_name="Pool",
        impl_location=Location("impl.py", 3),
        protocol_names={"_kvc_M0": member},
        contract_version=2,
    )


def test_kind_change_is_named() -> None:
    finding = _finding(
        [
            'Following member(s) of "Pool" have conflicts:',
            "    Expected:",
            "        def get_cpu_copy(self, indices: Tensor, mamba_indices: Tensor | None = ...) "
            "-> KVSnapshot",
            "    Got:",
            "        def get_cpu_copy(self, indices: Tensor, *, mamba_indices: Tensor | None = ...)"
            " -> KVSnapshot",
        ]
    )
    assert finding.parameter == "mamba_indices"
    assert "can no longer be passed" in finding.message


def test_unrecognised_notes_are_kept_verbatim() -> None:
    finding = _finding(["Protocol member _kvc_M0.get_cpu_copy expected something new"])
    message = finding.message
    assert "Protocol member OffloadablePool.get_cpu_copy expected something new" in message
    assert finding.rule == "type-error"


def test_missing_member_without_notes() -> None:
    finding = _finding([])
    assert "Pool does not define `get_cpu_copy`" in finding.message
    assert finding.contract_location is not None and finding.contract_location.line
