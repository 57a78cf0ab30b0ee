"""The `kairox` command line: (f) bad input gives one `error:` line and no traceback,
(g) `kairox run --dense` on the default model, (i) `kairox info` on the real model."""
from __future__ import annotations

import re
from pathlib import Path

import pytest


def assert_one_line_error(proc) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")


@pytest.mark.parametrize("kind", ["missing", "not_gguf", "directory", "empty", "truncated_1mb",
                                  "truncated_tensor_data"])
def test_run_bad_model_file(run_cli, bad_files: dict[str, Path], kind: str) -> None:
    proc = run_cli("run", str(bad_files[kind]), "-p", "Hello", "-n", "4")
    assert_one_line_error(proc)
    assert proc.stdout == ""


@pytest.mark.parametrize("kind", ["missing", "not_gguf", "truncated_1mb",
                                  "truncated_tensor_data"])
def test_info_bad_model_file(run_cli, bad_files: dict[str, Path], kind: str) -> None:
    assert_one_line_error(run_cli("info", str(bad_files[kind])))


@pytest.mark.parametrize("args", [
    ["-p", ""],
    ["-p", "   "],
    ["-p", "Hello", "-n", "0"],
    ["-p", "Hello", "-n", "-3"],
    ["-p", "Hello", "-t", "0"],
    ["-p", "Hello", "-t", "many"],
    ["-p", "Hello", "--seed", "-7"],
    ["-p", "Hello", "--top-p", "0"],
    ["-n", "4"],
], ids=lambda a: " ".join(a) or "none")
def test_run_bad_arguments(run_cli, model_path: Path, args: list[str]) -> None:
    proc = run_cli("run", str(model_path), *args)
    assert_one_line_error(proc)
    assert proc.returncode == 2


def test_unknown_command(run_cli) -> None:
    assert_one_line_error(run_cli("no-such-command"))


def test_run_default_model(run_cli, model_path: Path) -> None:
    """The original default model, dense (without --dense a run converts it first:
    test_first_run.py)."""
    proc = run_cli("run", "--dense", "-p", "The capital of France is", "-n", "8")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip()
    for col in ("prompt tokens", "prompt tok/s", "generated tokens", "decode tok/s"):
        assert col in proc.stderr
    assert re.search(r"│\s*5\s*│\s*[\d.]+\s*│\s*8\s*│\s*[\d.]+\s*│", proc.stderr), proc.stderr


def test_run_chat(run_cli, model_path: Path) -> None:
    proc = run_cli("run", str(model_path), "--chat", "-p", "What is 2+2?", "-n", "16", "-t", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "<|im_start|>" not in proc.stdout


def test_info_real_model(run_cli, model_path: Path) -> None:
    proc = run_cli("info", str(model_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"architecture\s*│\s*llama\s", out), out
    assert re.search(r"Kairox sparsity data\s*│\s*no\s", out), out
    for text in ("Q4_1", "Q8_0", "49152", "576", "1536"):
        assert text in out


def test_help_and_version(run_cli) -> None:
    for args in (["--help"], ["run", "--help"], ["info", "--help"], ["--version"]):
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout
