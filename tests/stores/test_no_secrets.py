"""No secret in any output: a password planted in a store URL and one planted in the
environment appear in no format of ``kvcache check --store``, ``kvcache list`` or ``kvcache
demo --instances 2``, in no file they write and in no log record, and the demo fails loudly
when the store refuses it or is not there."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvcache_core.cli import main
from kvcache_core.stores import redact_url
from kvcache_core.stores.local_redis import LocalRedis

URL_SECRET = "Url-Pl4nted-S3cret"
ENV_SECRET = "Env-Pl4nted-S3cret"
FORMATS = ["text", "json", "junit", "sarif", "github"]


@pytest.fixture
def protected(redis_server: LocalRedis) -> LocalRedis:
    """A real server that wants a password other than the planted one."""
    import redis as redis_py

    with redis_py.Redis(host="127.0.0.1", port=redis_server.port) as admin:
        admin.config_set("requirepass", "the-real-one")
    return redis_server


def _outputs(
    argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> tuple[int, str]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        code = main(argv)
    out = capsys.readouterr()
    logs = "\n".join(
        f"{r.name} {r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records
    )
    return code, f"{out.out}\n{out.err}\n{logs}"


def _clean(text: str) -> None:
    assert URL_SECRET not in text, text[-3000:]
    assert ENV_SECRET not in text, text[-3000:]


def test_redact_url() -> None:
    assert redact_url(f"redis://u:{URL_SECRET}@h:1/0?timeout=1") == "redis://u:***@h:1/0?timeout=1"
    assert redact_url("s3://bucket/x?token=abc&region=eu") == "s3://bucket/x?token=***&region=eu"
    assert redact_url("redis://h/0?password_env=KVCACHE_X") == "redis://h/0?password_env=KVCACHE_X"
    assert redact_url("dir:/var/kv") == "dir:/var/kv"


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_store_prints_no_secret_in_any_format(
    fmt: str,
    protected: LocalRedis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KVCACHE_REDIS_PASSWORD", ENV_SECRET)
    in_url = f"redis://user:{URL_SECRET}@127.0.0.1:{protected.port}/0?timeout=2"
    from_env = protected.url
    report = tmp_path / f"report.{fmt}"
    code, text = _outputs(
        [
            "check",
            "--store",
            in_url,
            "--store",
            from_env,
            "--select",
            "round-trip,outage",
            "--format",
            fmt,
            "--output",
            str(report),
        ],
        capsys,
        caplog,
    )
    written = report.read_text()
    assert code == 1
    assert "carries a password" in written and "authentication failed" in written
    assert "redis://user:***@127.0.0.1" in written
    _clean(text + written)


def test_a_usage_error_about_a_url_prints_no_secret(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    code, text = _outputs(["check", "--store", f"ftp://u:{URL_SECRET}@host/x"], capsys, caplog)
    assert code == 2 and "ftp://u:***@host/x" in text
    _clean(text)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_list_prints_no_secret(
    fmt: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KVCACHE_REDIS_PASSWORD", ENV_SECRET)
    _, text = _outputs(["list", "--format", fmt], capsys, caplog)
    _clean(text)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_demo_with_a_refused_password_fails_saying_so_and_prints_no_secret(
    fmt: str,
    protected: LocalRedis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KVCACHE_REDIS_PASSWORD", ENV_SECRET)
    argv = ["demo", "--instances", "2", "--pool", "mha", "--requests", "4", "--format", fmt]
    code, text = _outputs([*argv, "--store", protected.url], capsys, caplog)
    assert code == 1 and "authentication failed" in text, text[-2000:]
    assert "all tokens identical" not in text
    _clean(text)
    url = f"redis://u:{URL_SECRET}@127.0.0.1:{protected.port}/0"
    code, text = _outputs([*argv, "--store", url], capsys, caplog)
    assert code == 2 and "carries a password" in text
    _clean(text)


def test_demo_without_a_server_fails(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with LocalRedis() as gone:
        url = gone.url
    argv = ["demo", "--instances", "2", "--pool", "mha", "--requests", "4", "--store", url]
    code, text = _outputs(argv, capsys, caplog)
    assert code == 1 and "does not answer" in text and "all tokens identical" not in text


def test_a_demo_whose_store_moved_nothing_says_so_and_fails(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An ample budget: nothing is retracted, so no snapshot crosses the store."""
    argv = ["demo", "--instances", "2", "--pool", "mha", "--requests", "2", "--budget", "4096"]
    code, text = _outputs([*argv, "--store", "memory:nothing-moved"], capsys, caplog)
    assert code == 1, text
    assert "no request was retracted, so none moved" in text
    assert "FAILED: mha" in text
