"""Faults in the offline pipeline (issue 37, point 5): `kairox convert` stopped at any stage
leaves no partial output, and a full disk gives one clear line and no file.

A tiny random-weight llama (no Kairox data) is converted by the CLI in a subprocess. The
test-only hook $KAIROX_PAUSE_AT (kairox_py.outputs.pause_point; inert when unset) makes the
conversion stop at a named stage and wait, so each kill lands at a known point of the writes
rather than at a guessed time. At each of five stages it is killed twice, SIGKILL (no cleanup
possible) then SIGINT (Ctrl-C): OUT never exists after a kill, the SIGINT run leaves no
temporary (it also removes what the SIGKILL run left), and the next, uninterrupted run leaves
none either and writes a file byte for byte equal to an uninterrupted conversion's, reusing
the profile cache where it was complete and rebuilding it where it was not.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import PACKAGE_PARENT
from kairox_py import cli
from kairox_py.benchmark.synthetic import SHAPES, write_synthetic_llama
from kairox_py.default_model import ENV_CACHE
from kairox_py.offline import convert as convert_mod
from kairox_py.offline.convert import ConvertOptions, min_output_bytes, open_input
from kairox_py.offline.corpus import default_corpus
from kairox_py.outputs import PAUSE_ENV

# a few seconds per conversion: a short corpus (tokenizing the whole default one with the
# tiny vocabulary is what would take long), a small sample, one epoch, no crossover timing;
# the random model's predictors kept whatever they select (they weigh in the disk-full tests)
FAST = ["--tokens", "256", "--epochs", "1", "--group-size", "32", "-t", "2", "--no-calibrate", "--no-fit",
        "--max-pred-density", "1"]
STAGES = ("profile", "predictors", "write", "report", "crossover")
WAIT_S = 120.0


def _temporaries(*roots: Path) -> list[Path]:
    """Every temporary of an atomic write under `roots` (outputs.temp_sibling's names)."""
    return sorted(p for r in roots if r.exists() for p in r.rglob("*")
                  if ".tmp-" in p.name or p.name.startswith(".convert-"))


def _env(cache: Path, pause: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_CACHE] = str(cache)
    env["COLUMNS"] = "200"
    env.pop("KAIROX_VERBOSE", None)
    env.pop(PAUSE_ENV, None)
    if pause:
        env[PAUSE_ENV] = pause
    return env


def _default_sigint() -> None:
    """Ctrl-C must raise KeyboardInterrupt in the child even where the test runner itself was
    started with SIGINT ignored (a background job), which the child would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _convert_cmd(src: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kairox_py.cli", "convert", str(src), str(out), "--corpus", str(corpus),
            *FAST, *extra]


def _convert(src: Path, corpus: Path, out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_convert_cmd(src, corpus, out, *extra), cwd=out.parent, env=_env(cache),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT_S)


def _kill_at(stage: str, sig: signal.Signals, src: Path, corpus: Path, out: Path, cache: Path,
             log: Path, *extra: str) -> tuple[int, str]:
    """Run a conversion until it pauses at `stage`, send it `sig`; its exit status and stderr."""
    with open(log, "w") as err:
        proc = subprocess.Popen(_convert_cmd(src, corpus, out, *extra), cwd=out.parent,
                                env=_env(cache, stage), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                preexec_fn=_default_sigint)
        try:
            deadline = time.monotonic() + WAIT_S
            marker = f"kairox: paused at {stage}"
            while marker not in log.read_text(errors="replace"):
                assert proc.poll() is None, f"ended before {stage}:\n{log.read_text(errors='replace')}"
                assert time.monotonic() < deadline, f"never reached {stage}"
                time.sleep(0.05)
            proc.send_signal(sig)
            rc = proc.wait(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rc, log.read_text(errors="replace")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny dense GGUF and a short corpus file."""
    d = tmp_path_factory.mktemp("faults-model")
    src = write_synthetic_llama(d / "tiny.gguf", SHAPES["tiny"], wtype="f16", seed=3)
    corpus = d / "corpus.txt"
    corpus.write_text(default_corpus("profile").text[:20000])
    return src, corpus


@pytest.fixture(scope="module")
def reference(model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An uninterrupted conversion (OUT, and the cache holding its profile)."""
    d = tmp_path_factory.mktemp("faults-ref")
    out, cache = d / "ref.gguf", d / "cache"
    res = _convert(*model, out, cache)
    assert res.returncode == 0, res.stderr
    assert _temporaries(d) == []
    return out, cache


def _profiles(cache: Path) -> list[Path]:
    d = cache / "profiles"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


@pytest.mark.parametrize("stage", STAGES)
def test_killed_convert_leaves_no_partial_output(stage: str, model: tuple[Path, Path],
                                                 reference: tuple[Path, Path], tmp_path: Path) -> None:
    src, corpus = model
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    out = work / "out.gguf"
    # the crossover stage exists only with --calibrate; the uninterrupted run below leaves it out
    extra = ("--calibrate",) if stage == "crossover" else ()
    for sig in (signal.SIGKILL, signal.SIGINT):
        rc, err = _kill_at(stage, sig, src, corpus, out, cache, tmp_path / f"{sig.name}.log", *extra)
        assert not out.exists(), f"{sig.name} at {stage} left OUT"
        assert not (work / "out.gguf.report").exists()  # nor its report
        if sig == signal.SIGKILL:
            assert rc == -signal.SIGKILL, err
        else:  # Ctrl-C: one line, status 130, and no temporary: neither its own nor SIGKILL's
            assert rc == 130, err
            assert "error: interrupted" in err and "Traceback" not in err
            assert _temporaries(work, cache) == []
    kept = [(p, p.stat().st_ino) for p in _profiles(cache)]
    assert len(kept) == (0 if stage == "profile" else 1)  # a profile exists only once complete

    res = _convert(src, corpus, out, cache)
    assert res.returncode == 0, res.stderr
    assert _temporaries(work, cache) == []
    assert out.read_bytes() == reference[0].read_bytes()
    assert sorted(p.name for p in (work / "out.gguf.report").iterdir())[:2] == ["layers.csv", "layers.md"]
    assert [(p, p.stat().st_ino) for p in _profiles(cache)] == kept or stage == "profile"  # reused
    assert len(_profiles(cache)) == 1


def test_unreadable_cached_profile_is_rebuilt(model: tuple[Path, Path], reference: tuple[Path, Path],
                                              tmp_path: Path) -> None:
    """A damaged cache entry (a cut array) is profiled again, not an error on every run."""
    cache = tmp_path / "cache"
    shutil.copytree(reference[1], cache)
    [prof] = _profiles(cache)
    hidden = prof / "hidden.npy"
    hidden.write_bytes(hidden.read_bytes()[:1000])
    out = tmp_path / "out.gguf"
    res = _convert(*model, out, cache)
    assert res.returncode == 0, res.stderr
    assert "cached profile cannot be read" in res.stderr
    assert out.read_bytes() == reference[0].read_bytes()
    assert _profiles(cache) == [prof] and _temporaries(tmp_path) == []


@pytest.fixture
def cached(reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the reference's cache as this process's cache: conversions reuse its profile."""
    cache = tmp_path / "cache"
    shutil.copytree(reference[1], cache)
    monkeypatch.setenv(ENV_CACHE, str(cache))
    monkeypatch.delenv(PAUSE_ENV, raising=False)
    return cache


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err and "Exception ignored" not in err, err
    return lines[0]


def test_disk_full_while_writing(model: tuple[Path, Path], cached: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC in the middle of the tensor data (the disk filled after the checks passed)."""
    src, corpus = model
    out = tmp_path / "work" / "out.gguf"
    out.parent.mkdir()
    real = convert_mod.GGUFWriter.write_tensor_data
    calls: list[int] = []

    def fill_up(self: convert_mod.GGUFWriter, *a: object, **k: object) -> None:
        calls.append(1)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(convert_mod.GGUFWriter, "write_tensor_data", fill_up)
    rc = cli._run(["convert", str(src), str(out), "--corpus", str(corpus), *FAST])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 1
    assert "no space left" in line and str(out) in line and "MB" in line, line
    assert list(out.parent.iterdir()) == [] and _temporaries(cached) == []


def _mount_tmpfs(d: Path, size: int) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[tuple[Path, list[int]]]:
    """A directory to mount a small tmpfs on (mount_tmpfs), unmounted afterwards."""
    d = tmp_path / "disk"
    sizes: list[int] = []
    yield d, sizes
    if sizes:
        subprocess.run(["umount", str(d)], capture_output=True)


@pytest.mark.parametrize("room", ["none", "almost"])
def test_full_tmpfs(room: str, model: tuple[Path, Path], reference: tuple[Path, Path],
                    small_disk: tuple[Path, list[int]], tmp_path: Path) -> None:
    """A real full disk: with too little room for even the copied tensors the conversion is
    refused before profiling; with room for those but not for the predictors (f32 here, so
    they weigh) it is refused when the whole output's size is known, before writing. Either
    way: one line naming OUT and the sizes, status 1, nothing left on the disk. (ENOSPC in the
    middle of the write itself: test_disk_full_while_writing.)"""
    src, corpus = model
    disk, mounted = small_disk
    cache = tmp_path / "cache"
    shutil.copytree(reference[1], cache)
    floor = min_output_bytes(open_input(src), ConvertOptions(down_type="q8_0"))
    size = (1 << 20) if room == "none" else (floor + (256 << 10) + 4095) // 4096 * 4096
    _mount_tmpfs(disk, size)
    mounted.append(size)
    out = disk / "out.gguf"
    res = _convert(src, corpus, out, cache, "--pred-type", "f32")
    line = _one_error_line(res.stderr)
    assert res.returncode == 1, res.stderr
    assert str(out) in line and "MB" in line, line
    assert "not enough space" in line, line
    assert list(disk.iterdir()) == [] and _temporaries(cache) == []


def test_full_tmpfs_while_writing(model: tuple[Path, Path], cached: Path, small_disk: tuple[Path, list[int]],
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A real ENOSPC in the middle of the tensor data: the checks before the write are switched
    off (as if another program filled the disk after them), on a tmpfs with room for about
    the copied tensors only."""
    src, corpus = model
    disk, mounted = small_disk
    floor = min_output_bytes(open_input(src), ConvertOptions(down_type="q8_0"))
    size = (floor + 4095) // 4096 * 4096
    _mount_tmpfs(disk, size)
    mounted.append(size)
    monkeypatch.setattr(convert_mod, "check_free_space", lambda *_a: None)
    out = disk / "out.gguf"
    rc = cli._run(["convert", str(src), str(out), "--corpus", str(corpus), *FAST, "--pred-type", "f32"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 1
    assert "no space left" in line and str(out) in line and "MB" in line, line
    assert list(disk.iterdir()) == [] and _temporaries(cached) == []
