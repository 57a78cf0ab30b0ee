"""Checks that `kairox eval` and `kairox bench` make before their minutes of work: where they
write, their list options, the arguments that exclude each other; and that `kairox eval`
scores at most --tokens tokens and titles its table with what ran.

Most tests run the CLI in-process with the long step replaced by one that fails the test, so
that a check made too late shows up as that failure instead of minutes of benchmarking.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from kairox_py import Model
from kairox_py.cli import _run
from kairox_py.offline.corpus import default_corpus
from kairox_py.offline.evaluate import eval_chunks


def _never(*_args: object, **_kw: object) -> None:
    raise AssertionError("the long computation started before the checks")


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kairox_py.commands.eval.run_sweep", _never)


@pytest.fixture
def no_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kairox_py.commands.bench.run_bench", _never)
    monkeypatch.setattr("kairox_py.commands.bench._bench_synthetic", _never)


# ---- kairox eval -------------------------------------------------------------------------
def test_eval_out_dir_checked_first(no_sweep: None, model_path: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing" / "out"
    assert _run(["eval", str(model_path), "-o", str(out)]) == 1
    assert f"directory does not exist: {out.parent}" in _one_error_line(capsys)
    assert not out.parent.exists()  # no parent created either


@pytest.mark.parametrize("args,hint", [
    (["--scales", "0,-1"], "--scales"),
    (["--scales", "1,x"], "--scales"),
    (["--pred-thresholds", "0.5,1.5"], "--pred-thresholds"),
])
def test_eval_list_options_checked_first(no_sweep: None, model_path: Path, args: list[str], hint: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["eval", str(model_path), *args]) == 2
    assert hint in _one_error_line(capsys)


@pytest.mark.parametrize("n_tokens,ctx", [(16, 32), (128, 512), (600, 512), (4096, 512)])
def test_eval_tokens_is_a_maximum(model_path: Path, n_tokens: int, ctx: int) -> None:
    with Model(model_path, vocab_only=True) as m:
        chunks = eval_chunks(m, default_corpus("eval"), n_tokens, ctx)
        bos = 1 if m.add_bos and m.bos >= 0 else 0
    assert all(len(c) <= ctx for c in chunks)
    text_tokens = sum(len(c) - bos for c in chunks)
    assert text_tokens <= n_tokens
    assert text_tokens >= min(n_tokens, ctx - bos) - 1  # and not far below it
    assert sum(len(c) - 1 for c in chunks) <= n_tokens  # positions scored


def test_eval_plain_gguf_says_dense(run_cli, model_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A plain GGUF runs the dense FFN: the title must not claim sparse tokens."""
    r = run_cli("eval", str(model_path), "--tokens", "16", "--ctx", "32", "-t", "2")
    assert r.returncode == 0, r.stderr
    title = next(line for line in r.stdout.splitlines() if line.startswith("### "))
    assert "dense FFN" in title and "every token sparse" not in title, title
    row = r.stdout.strip().splitlines()[-1].split("|")
    assert row[2].strip() == "dense" and int(row[5]) <= 16


# ---- kairox bench ------------------------------------------------------------------------
def test_bench_out_is_a_file(no_bench: None, model_path: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "smol-kx.gguf"
    out.write_bytes(b"GGUF")
    assert _run(["bench", str(model_path), "--out", str(out)]) == 1
    assert "is not a directory" in _one_error_line(capsys)
    missing = tmp_path / "missing" / "bench-out"
    assert _run(["bench", str(model_path), "--out", str(missing)]) == 1
    assert "directory does not exist" in _one_error_line(capsys)
    assert _run(["bench", "--synthetic", "tiny", "--out", str(missing)]) == 1
    assert "directory does not exist" in _one_error_line(capsys)


@pytest.mark.parametrize("args,msg", [
    (["{model}", "--synthetic", "tiny"], "SPARSE_MODEL"),
    (["--synthetic", "tiny", "--dense-model", "{model}"], "--dense-model"),
    (["--synthetic", "tiny", "--density", "0.1,1.5"], "--density"),
    (["--synthetic", "tiny", "--density", "x"], "--density"),
    (["{model}", "--gen-modes", "standard,fast"], "--gen-modes"),
])
def test_bench_usage_errors_first(no_bench: None, model_path: Path, tmp_path: Path, args: list[str],
                                  msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{model}", str(model_path)) for a in args]
    assert _run(["bench", *argv, "--out", str(tmp_path / "b")]) == 2
    assert msg in _one_error_line(capsys)
