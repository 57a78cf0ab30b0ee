"""Checks on where a command will write, made before it spends minutes computing.

A command that profiles, trains or benchmarks for minutes and only then finds that it cannot
write its result wastes the user's time; one that replaces an output directory must never
delete files it did not write itself. Every command that writes goes through these two.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import KairoxError


def _check_parent(path: Path) -> None:
    parent = path.parent
    if not parent.is_dir():
        raise KairoxError(f"directory does not exist: {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise KairoxError(f"cannot write into {parent} (permission denied or read-only file system)")


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """A file the command will create or replace (atomically, through a sibling temporary):
    its directory must exist and be writable, and the path must not be a directory."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise KairoxError(f"{p} is a directory, not a file")
    _check_parent(p)
    if p.exists() and not os.access(p, os.W_OK):
        raise KairoxError(f"cannot write {p} (permission denied or read-only file system)")
    return p


def check_output_into(path: str | os.PathLike[str]) -> Path:
    """A directory the command writes its files into (creating it, never its parents), keeping
    what else is there: eval, simulate and bench."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise KairoxError(f"{p} exists and is not a directory")
    if not p.is_dir():
        _check_parent(p)  # a new directory: its parent must exist and be writable
    elif not os.access(p, os.W_OK | os.X_OK):
        raise KairoxError(f"cannot write into {p} (permission denied or read-only file system)")
    return p


def check_output_dir(path: str | os.PathLike[str], owned: Iterable[str], command: str) -> Path:
    """A directory the command will create, or replace as a whole (written to a temporary
    sibling, then renamed over it). An existing directory is replaced only when everything in it
    is one of the names `owned` that the command itself writes: a typo in -o must not delete
    someone's documents, nor the current directory."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise KairoxError(f"{p} exists and is not a directory")
    resolved = p.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved.parent == resolved:
        raise KairoxError(f"refusing to replace {p}: it is the current directory, one of its "
                          "parents or the root; give a new or empty directory")
    _check_parent(resolved)
    if p.is_dir():
        allowed = set(owned)
        foreign = sorted(e.name for e in p.iterdir() if e.name not in allowed)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise KairoxError(f"refusing to replace {p}: it holds files that `kairox {command}` did not "
                              f"write ({shown}); give a new or empty directory")
    return p


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The temporary sibling to write `path` through: renamed over it when the block ends
    normally, removed on any error or interruption, so a half-written file never takes the
    place of `path`."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh temporary sibling directory to fill in place of `path`: it replaces `path` (an
    earlier one is removed) when the block ends normally, and is removed on any error or
    interruption, so a half-written directory never takes the place of `path`."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
