"""``kvcache demo --engine transformers``: identical tokens on a checkpoint loaded by path,
exit 1 when a pool breaks them, exit 2 on usage errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcache_core import discover
from kvcache_core.cli import main
from kvcache_core.integrations import transformers as integration

from . import hf_broken_pools


def test_a_checkpoint_directory_loads_offline_and_matches(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny("qwen2-swa").save_pretrained(tmp_path / "ckpt")
    code = main(["demo", "--engine", "transformers", "--model", str(tmp_path / "ckpt")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Qwen2ForCausalLM" in out and "pool: swa (chosen by capabilities)" in out
    assert "tokens identical: yes" in out and "logits identical: yes" in out
    assert "retractions: 3, bytes offloaded: " in out and "time: DynamicCache" in out


def test_exit_1_when_the_pool_breaks_the_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = discover(plugins=[hf_broken_pools], allow=[])
    monkeypatch.setattr(integration, "discover", lambda: registry)
    argv = ["demo", "--engine", "transformers", "--pool", "mha-skips-load", "--page-size", "4"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "pool: mha-skips-load (named), page size 4" in out and "tokens identical: NO" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/no/such/dir"], "neither one of llama, qwen2-swa"),
        (["--format", "json"], "prints text only"),
        (["--page-size", "0"], "--page-size must be positive"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--engine", "transformers", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_pool_that_cannot_serve_the_model_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["demo", "--engine", "transformers", "--model", "deepseek-v3", "--pool", "mha"]) == 1
    )
    assert "MissingCapabilityError" in capsys.readouterr().out
