"""``kvcache check --select/--deselect ID`` (behaviour check ids and rule ids, ruff-style), and
ids that name nothing are usage errors, in the options and in
``[tool.kvcache.expected-failures]``, at every level."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcache_core.conformance.results.battery_ids import battery_ids
from kvcache_core.conformance.results.model import Outcome
from kvcache_core.conformance.results.selection import parse_selection
from kvcache_core.conformance.results.usage import UsageError

DRIFTED = """
import torch


class DriftedAllocator:
    size = 4
    page_size = 1

    def available_size(self) -> int: return 0
    def alloc(self, need_size: int) -> torch.Tensor | None: return None
    def free(self, idx: torch.Tensor) -> None: pass
    def free_group_begin(self) -> None: pass
    def free_group_end(self) -> None: pass
    def backup_state(self) -> object: return None
    def restore_state(self, state: object) -> None: pass
    def clear(self, hard) -> None: pass
"""


@pytest.fixture
def drifted(tmp_path: Path) -> Path:
    path = tmp_path / "drifted_alloc.py"
    path.write_text(textwrap.dedent(DRIFTED), encoding="utf-8")
    return path


def _rules(run) -> set[str]:
    return {f.rule for r in run.results for f in r.findings}


def test_static_rules_are_selected_and_deselected(run_cli, drifted: Path) -> None:
    every = run_cli("check", str(drifted), "--level", "source", "--against", "MambaSlotAllocator")
    assert every.code == 1
    assert {"renamed-parameter", "extra-required-parameter"} <= _rules(every)
    only = run_cli(
        "check", str(drifted), "--level", "source", "--against", "MambaSlotAllocator",
        "--select", "renamed-parameter",
    )  # fmt: skip
    assert only.code == 1 and _rules(only) == {"renamed-parameter"}
    rest = run_cli(
        "check", str(drifted), "--level", "source", "--against", "MambaSlotAllocator",
        "--deselect", "renamed-parameter", "--deselect", "extra-required-parameter",
    )  # fmt: skip
    assert rest.code == 0 and _rules(rest) == set()
    assert all(r.outcome is Outcome.PASSED for r in rest.results)


def test_behaviour_checks_not_selected_do_not_run(run_cli) -> None:
    run = run_cli(
        "check", "mha", "--level", "behaviour",
        "--select", "behaviour/write-readback,kv-size-bytes,write-scales",
        "--deselect", "write-scales",
    )  # fmt: skip
    assert run.code == 0, run.err
    assert sorted(r.check for r in run.results) == [
        "behaviour/kv-size-bytes",
        "behaviour/write-readback",
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--select", "write-redback"], "unknown check or rule id 'write-redback'"),
        (["--deselect", "kv-size-bytes,nope"], "unknown check or rule id 'nope'"),
        (["--select", " , "], "--select names no check or rule id"),
    ],
)
def test_an_unknown_id_is_a_usage_error(run_cli, drifted: Path, argv, says) -> None:
    run = run_cli("check", str(drifted), "--level", "source", *argv)
    assert run.code == 2 and says in run.err and run.results == []
    if "unknown" in says:
        assert "write-readback" in run.err and "renamed-parameter" in run.err  # what is known


def test_an_unknown_expected_failure_check_is_a_usage_error_at_every_level(
    run_cli, drifted: Path, tmp_path: Path
) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.kvcache.expected-failures]\n"mha/write-redback" = "typo (#1)"\n')
    for level in ("source", "behaviour"):
        run = run_cli("check", "mha", "--level", level, "--config", str(config))
        assert run.code == 2, (level, run.err)
        assert "unknown behaviour check 'write-redback'" in run.err and run.results == []
    config.write_text('[tool.kvcache.expected-failures]\n"mha/write-readback" = "known (#1)"\n')
    assert run_cli("check", str(drifted), "--level", "source", "--config", str(config)).code == 1


def test_an_expected_failure_of_a_check_the_pool_never_runs_is_refused_by_the_battery(
    run_cli, tmp_path: Path
) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.kvcache.expected-failures]\n"mha/swa-loc-window" = "no (#1)"\n')
    run = run_cli("check", "mha", "--level", "behaviour", "--config", str(config))
    assert run.code == 2 and "does not run on pool 'mha'" in run.err, run.err
    assert run.results == []


def test_source_level_selection_imports_no_torch(drifted: Path, tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.kvcache.expected-failures]\n"mha/write-readback" = "known (#1)"\n')
    program = (
        "import sys; from kvcache_core.cli import main\n"
        f"code = main(['check', {str(drifted)!r}, '--level', 'source', '--config', "
        f"{str(config)!r}, '--select', 'write-readback,renamed-parameter'])\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split()[-2:] == ["1", "False"], done.stdout + done.stderr


def test_battery_ids_read_from_source_are_the_registered_battery() -> None:
    from kvcache_core.conformance.behaviour import BATTERY

    assert sorted(battery_ids()) == sorted(BATTERY)
    assert len(set(battery_ids())) == len(battery_ids())


def test_selection_semantics() -> None:
    battery = ("write-readback", "kv-size-bytes")
    everything = parse_selection(None, None, battery=battery)
    assert everything.everything and everything.behaviour_checks(battery) is None
    rule_only = parse_selection(["missing-parameter"], None, battery=battery)
    assert rule_only.behaviour_checks(battery) == []  # a static rule selects no behaviour check
    all_behaviour = parse_selection(["behaviour-failed"], ["kv-size-bytes"], battery=battery)
    assert all_behaviour.behaviour_checks(battery) == ["write-readback"]
    with pytest.raises(UsageError):
        parse_selection(["write-readbak"], None, battery=battery)
