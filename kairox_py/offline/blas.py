"""The thread count of numpy's BLAS, set for a block of work (`blas_threads`).

OpenBLAS's threads wait for each other by spinning. Where the cores are busy with other work
(another process, a shared machine), a small matrix product split over two threads waits for
the one that was descheduled, and predictor training's mini-batch products ran tens of times
slower on two BLAS threads than on one (docs/benchmarks/convert). Products that small gain
little from a second thread even on an idle machine, so the converter trains on one.

Best effort: the OpenBLAS builds loaded in this process are found in /proc/self/maps (Linux)
and set through their own functions; elsewhere (another BLAS, another platform) nothing
changes and the work runs as before.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# (set, get) function names of the OpenBLAS builds numpy ships or links
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


@functools.lru_cache(maxsize=1)
def _controls() -> tuple[tuple[Any, Any], ...]:
    """(set, get) of every OpenBLAS loaded in this process (numpy imported first)."""
    import numpy  # noqa: F401 - loads numpy's BLAS, whose functions are looked up here

    maps = Path("/proc/self/maps")
    if not maps.is_file():
        return ()
    paths = sorted({line.split()[-1] for line in maps.read_text().splitlines()
                    if "openblas" in line.lower() and line.split()[-1].startswith("/")})
    found = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                setter, getter = getattr(lib, set_name), getattr(lib, get_name)
                setter.argtypes, setter.restype = [ctypes.c_int], None
                getter.argtypes, getter.restype = [], ctypes.c_int
                found.append((setter, getter))
                break
    return tuple(found)


def get_blas_threads() -> int | None:
    """The thread count of the first OpenBLAS found, or None where none is."""
    ctl = _controls()
    return int(ctl[0][1]()) if ctl else None


@contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run the block with numpy's BLAS on at most `n` threads (never more than it had), and
    restore the previous counts after it."""
    ctl = _controls()
    before = [int(get()) for _, get in ctl]
    try:
        for (setter, _), b in zip(ctl, before):
            setter(max(1, min(n, b)))
        yield
    finally:
        for (setter, _), b in zip(ctl, before):
            setter(b)
