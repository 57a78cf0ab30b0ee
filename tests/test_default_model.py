"""The default model: cache location rules and the pinned file."""
from __future__ import annotations

from pathlib import Path

import pytest

from kairox_py import DEFAULT_MODEL, cache_dir
from kairox_py.default_model import model_path, sha256_file


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KAIROX_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("KAIROX_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "kairox"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "kairox"
    assert model_path() == cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_default_model_is_the_pinned_file(model_path: Path) -> None:
    assert model_path.stat().st_size == DEFAULT_MODEL.size
    assert sha256_file(model_path) == DEFAULT_MODEL.sha256
    assert not list(model_path.parent.glob(".fetch-*")), "temporary download left behind"
