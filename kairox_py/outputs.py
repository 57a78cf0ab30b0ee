"""Checks on where a command will write, made before it spends minutes computing, and the
atomic writes themselves.

A command that profiles, trains or benchmarks for minutes and only then finds that it cannot
write its result wastes the user's time; one that replaces an output directory must never
delete files it did not write itself. Every command that writes goes through these two.

Every result is written to a temporary sibling named ``.NAME.tmp-PID`` and renamed into place
when complete, so a process stopped at any point (Ctrl-C, SIGTERM, SIGKILL, a full disk)
never leaves a partial NAME. Ctrl-C and SIGTERM remove the temporary on the way out; SIGKILL
cannot, so the next write of NAME removes the temporaries whose process is gone
(remove_stale_temporaries). A temporary whose PID a live, unrelated process has since taken
stays until that process ends: a little disk held, never a file lost.
"""
from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import KairoxError

#: the test-only hook of pause_point: the name of the stage to stop at
PAUSE_ENV = "KAIROX_PAUSE_AT"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: free bytes below which a short write is put down to a full disk (a few file system blocks)
_NEARLY_FULL = 1 << 20


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


def temp_sibling(path: str | os.PathLike[str], suffix: str = "") -> Path:
    """This process's temporary for `path`: hidden, beside it (so the final rename stays on one
    file system) and named with the PID, so the next run can tell a dead writer's leftovers
    from a live one's."""
    out = Path(path)
    return out.with_name(f".{out.name}.tmp-{os.getpid()}{suffix}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this machine (signal 0 checks, sends nothing)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of `path` (files or directories from temp_sibling) that a killed
    writer left: those whose PID no longer runs. This process's own and a live process's (a
    concurrent conversion of the same output) are kept. Returns what was removed."""
    out = Path(path)
    pattern = re.compile(re.escape(f".{out.name}.tmp-") + r"(\d+)(?:\.[a-z]+)?\Z")
    removed: list[Path] = []
    for name in glob.glob(glob.escape(str(out.parent / f".{out.name}.tmp-")) + "*"):
        p = Path(name)
        m = pattern.match(p.name)
        if m is None or int(m[1]) == os.getpid() or pid_alive(int(m[1])):
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:  # another run cleaned it first
            pass
        except OSError:  # not ours to remove after all (permissions): leave it
            continue
        removed.append(p)
    return removed


def _fsync(path: Path) -> None:
    """Flush a finished file to the disk before it is renamed into place, so a crash of the
    machine (not only of the process) leaves the old file or the whole new one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a file system without fsync (some FUSE mounts): the rename still holds
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The temporary sibling to write `path` through: renamed over it when the block ends
    normally, removed on any error or interruption, so a half-written file never takes the
    place of `path`. Temporaries of `path` that killed runs left are removed first."""
    out = Path(path)
    remove_stale_temporaries(out)
    tmp = temp_sibling(out)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _replace_dir(tmp: Path, out: Path) -> None:
    """Put the complete directory `tmp` in place of `out` by renames only: the old `out` is
    moved aside first and deleted last, so no moment shows a half-deleted `out` (a kill
    between the renames leaves no `out`, which the next run rebuilds, and an aside that it
    removes as stale)."""
    old = temp_sibling(out, ".old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _scratch_dir(out: Path) -> Iterator[Path]:
    """This process's fresh temporary directory for `out` (killed runs' ones removed first),
    removed if the block raises: the shared part of atomic_dir and atomic_files_into."""
    remove_stale_temporaries(out)
    tmp = temp_sibling(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh temporary sibling directory to fill in place of `path`: it replaces `path` (an
    earlier one is removed) when the block ends normally, and is removed on any error or
    interruption, so a half-written directory never takes the place of `path`. Temporaries
    of `path` that killed runs left are removed first."""
    out = Path(path)
    with _scratch_dir(out) as tmp:
        yield tmp
        _replace_dir(tmp, out)


@contextmanager
def atomic_files_into(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh temporary directory whose files are moved into `directory` (created if
    missing, its other files kept) one rename each when the block ends normally: each file
    there is then a whole old or a whole new one, never a half-written one. Removed on any
    error or interruption; killed runs' temporaries are removed first."""
    out = Path(directory)
    with _scratch_dir(out) as tmp:
        yield tmp
        out.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
        tmp.rmdir()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def is_disk_full(e: BaseException, directory: str | os.PathLike[str] | None = None) -> bool:
    """Whether `e` says the file system is full (or the user's quota spent). numpy's
    ``tofile`` reports a short write without an errno ("N requested and M written"): with
    `directory` given, such an error counts when that file system has (next to) nothing free."""
    if not isinstance(e, OSError):
        return False
    if e.errno in _DISK_FULL:
        return True
    if e.errno is None and directory is not None:
        free = free_bytes(directory)
        return free is not None and free < _NEARLY_FULL
    return False


def free_bytes(directory: str | os.PathLike[str]) -> int | None:
    """Space left to this user in `directory`'s file system; None where it cannot be told (a
    file system that reports no size at all)."""
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    return usage.free if usage.total > 0 else None


def disk_full_error(path: str | os.PathLike[str], needed: int | None = None) -> KairoxError:
    """The one-line error for a write to `path` that ran out of space: where, how much the
    whole write needs (when known) and how much is free."""
    p = Path(path)
    free = free_bytes(p.parent)
    need = f"; it needs about {_mb(needed)}" if needed else ""
    have = f", {_mb(free)} free there" if free is not None else ""
    return KairoxError(f"no space left on the device to write {p}{need}{have}: free some space "
                       "or write elsewhere")


def check_free_space(path: str | os.PathLike[str], needed: int) -> None:
    """Refuse now, not after minutes of work, a write of at least `needed` bytes beside
    `path` that its file system cannot hold (the temporary is whole before the rename, so an
    existing `path` frees nothing in time). Nothing is refused where the free space cannot be
    told."""
    p = Path(path)
    free = free_bytes(p.parent)
    if free is not None and free < needed:
        raise KairoxError(f"not enough space to write {p}: it needs at least {_mb(needed)}, "
                          f"{_mb(free)} free there; free some space or write elsewhere")


def pause_point(stage: str) -> None:
    """A test hook, inert unless $KAIROX_PAUSE_AT names `stage`: then the process says so on
    stderr and waits for a signal, so tests/test_convert_faults.py can interrupt (SIGINT) or
    kill (SIGKILL) a conversion at a known point of its writes instead of guessing from
    timing. Stages: profile, predictors, write, report, crossover."""
    if os.environ.get(PAUSE_ENV) != stage:
        return
    sys.stderr.write(f"kairox: paused at {stage} ({PAUSE_ENV})\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)
