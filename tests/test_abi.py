"""(a) The ctypes struct mirrors match the library's own layout, byte for byte.

A mismatch here means kairox_py/_lib.py no longer mirrors include/llama.h of the vendored
llama.cpp, and every call passing that struct would corrupt memory.
"""
from __future__ import annotations

import ctypes

import pytest

from kairox_py import _lib

# structs whose every field the library describes (kairox-abi.cpp)
FULLY_DESCRIBED = {"llama_model_params", "llama_context_params", "llama_batch",
                   "llama_perf_context_data"}


def test_library_identifies_itself() -> None:
    assert _lib.version().startswith("kairox ")
    assert _lib.lib().path.is_file()


@pytest.mark.parametrize("name", sorted(_lib.STRUCTS))
def test_struct_size(name: str) -> None:
    assert _lib.abi_sizeof(name) == ctypes.sizeof(_lib.STRUCTS[name]), name


@pytest.mark.parametrize("name", sorted(_lib.STRUCTS))
def test_field_offsets(name: str) -> None:
    cls = _lib.STRUCTS[name]
    undescribed = []
    for field, *_ in cls._fields_:
        off = _lib.abi_offsetof(name, field)
        if off is None:
            undescribed.append(field)
        else:
            assert off == getattr(cls, field).offset, f"{name}.{field}"
    if name in FULLY_DESCRIBED:
        assert not undescribed, f"{name}: fields unknown to the library: {undescribed}"


def test_unknown_names_are_reported() -> None:
    assert _lib.abi_sizeof("no_such_struct") is None
    assert _lib.abi_offsetof("llama_batch", "no_such_field") is None
