"""Finding libkairox: explicit override first, clear errors when it is wrong."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
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
    info = (_lib.llama_print_system_info() or b"").decode()
    assert "CPU" in info, info
    assert "AMX_INT8 = 1" not in info, info


def test_import_does_not_load_the_library() -> None:
    """Declaring the C functions needs no library: `kairox info` and the default-model download
    work before the C++ side is built."""
    code = ("import kairox_py, kairox_py.cli, kairox_py.llama, kairox_py.balancer\n"
            "from kairox_py import _lib\n"
            "assert _lib.lib.cache_info().currsize == 0\n"
            "assert _lib.llama_decode.__name__ == 'llama_decode'\n")
    env = {**os.environ, "PYTHONPATH": str(Path(_lib.__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_every_declaration_is_bound() -> None:
    """The library binds each declared function with its prototype (and only those)."""
    bound = _lib.lib().functions
    assert set(bound) == set(_lib._PROTOTYPES)
    for name, (argtypes, restype) in _lib._PROTOTYPES.items():
        fn = getattr(_lib, name)
        assert fn.__wrapped__.__name__ == name
        assert "return" in fn.__annotations__, name
        c_fn = bound[name]
        if isinstance(c_fn, ctypes._CFuncPtr):  # optional ones a stale build lacks are stubs
            assert tuple(c_fn.argtypes or ()) == argtypes and c_fn.restype is restype, name


def test_find_tool_next_to_the_library_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's tools are looked up in the library's own build first (same kernels), then
    on PATH; a tool in neither place is None, not an error."""
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    lib = build / "libkairox.so"
    lib.write_bytes(b"")
    tool = build / "bin" / "llama-bench"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    elsewhere = tmp_path / "path"
    elsewhere.mkdir()
    other = elsewhere / "llama-server"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("KAIROX_LIB", str(lib))
    monkeypatch.setenv("PATH", str(elsewhere))
    assert _lib.find_tool("llama-bench") == tool.resolve()
    assert _lib.find_tool("llama-server") == other
    assert _lib.find_tool("llama-nothing") is None
