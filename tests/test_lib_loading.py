"""Finding libkairox: explicit override first, clear errors when it is wrong."""
from __future__ import annotations

from pathlib import Path

import pytest

from kairox_py import KairoxError, _lib


def test_env_override_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _lib.lib().path
    monkeypatch.setenv("KAIROX_LIB", str(real))
    assert _lib.find_library() == real
    assert _lib.library_candidates()[0] == real


def test_env_override_must_exist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KAIROX_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(KairoxError, match="KAIROX_LIB"):
        _lib.find_library()


def test_search_order_without_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAIROX_LIB", raising=False)
    candidates = _lib.library_candidates()
    package_lib = Path(_lib.__file__).resolve().parent / "lib" / _lib.LIB_NAME
    assert candidates[0] == package_lib
    assert any(p.parts[-3:-1] == ("build", "dev") for p in candidates)


def test_library_is_loaded_once() -> None:
    assert _lib.lib() is _lib.lib()


def test_no_amx_kernels() -> None:
    """ggml's AMX mat-mul segfaults on Sapphire-Rapids-class CPUs (llama.cpp#20824), and a
    native build there enables it unless CMakeLists.txt turns it off: the library must not
    report AMX kernels (on a CPU without AMX this holds either way)."""
    info = (_lib.lib().llama_print_system_info() or b"").decode()
    assert "CPU" in info, info
    assert "AMX_INT8 = 1" not in info, info
