"""What a careless command line must not do: delete files it did not write, reuse data the
user did not ask for, crash on absurd settings, leave temporary files behind when killed, or
ignore options in silence."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PACKAGE_PARENT
from kairox_py import KairoxError, Model
from kairox_py.offline.corpus import Corpus
from kairox_py.offline.profile import PROFILE_FILES, Profile, open_or_run_profile
from kairox_py.outputs import check_output_dir, check_output_file
from kairox_py.sim.traces import TRACE_FILES


def _corpus(text: str) -> Corpus:
    return Corpus(text=text, description="test text")


def test_output_dir_refuses_foreign_files(tmp_path: Path) -> None:
    d = tmp_path / "mydocs"
    d.mkdir()
    (d / "thesis.txt").write_text("years of work")
    for owned, cmd in ((PROFILE_FILES, "profile"), (TRACE_FILES, "trace")):
        with pytest.raises(KairoxError, match="thesis.txt"):
            check_output_dir(d, owned, cmd)
    assert (d / "thesis.txt").read_text() == "years of work"
    # an empty directory, a new one, or one holding only the command's own files are fine
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", PROFILE_FILES, "profile")
    check_output_dir(tmp_path / "new", PROFILE_FILES, "profile")
    own = tmp_path / "own"
    own.mkdir()
    (own / "meta.json").write_text("{}")
    (own / "hidden.npy").write_bytes(b"")
    check_output_dir(own, PROFILE_FILES, "profile")


def test_output_dir_refuses_cwd_parents_root_and_missing_parent(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for p in (".", "..", str(tmp_path), "/"):
        with pytest.raises(KairoxError, match="current directory|parents|root"):
            check_output_dir(p, PROFILE_FILES, "profile")
    with pytest.raises(KairoxError, match="does not exist"):
        check_output_dir(tmp_path / "missing" / "out", PROFILE_FILES, "profile")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(KairoxError, match="not a directory"):
        check_output_dir(f, PROFILE_FILES, "profile")


def test_output_file_checks(tmp_path: Path) -> None:
    with pytest.raises(KairoxError, match="does not exist"):
        check_output_file(tmp_path / "nope" / "x.gguf")
    with pytest.raises(KairoxError, match="is a directory"):
        check_output_file(tmp_path)
    assert check_output_file(tmp_path / "x.gguf") == tmp_path / "x.gguf"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_output_file_not_writable(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(KairoxError, match="cannot write"):
            check_output_file(ro / "x.gguf")
    finally:
        ro.chmod(0o700)


def test_profile_cli_keeps_foreign_files(run_cli, model_path: Path, tmp_path: Path) -> None:
    victim = tmp_path / "mydocs"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep me")
    corpus = tmp_path / "c.txt"
    corpus.write_text("A small corpus of plain words for a quick profile. " * 40)
    proc = run_cli("profile", str(model_path), "-o", str(victim), "--corpus", str(corpus), "--tokens", "16")
    assert proc.returncode == 1
    assert "refusing to replace" in proc.stderr and "notes.txt" in proc.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt"]
    # --generate's directory is checked before the profile runs, not after it
    t0 = time.monotonic()
    proc = run_cli("profile", str(model_path), "-o", str(tmp_path / "p"), "--corpus", str(corpus),
                   "--tokens", "16", "--generate", str(victim))
    assert proc.returncode == 1 and "notes.txt" in proc.stderr
    assert not (tmp_path / "p").exists()
    assert time.monotonic() - t0 < 60


def test_reused_profile_must_match_explicit_corpus_and_tokens(model_path: Path, tmp_path: Path) -> None:
    text = _corpus("Words about rivers, bridges and boats, written for this test only. " * 30)
    prof, reused = open_or_run_profile(model_path, text, tmp_path / "prof", n_tokens=24, threads=2)
    assert not reused and prof.meta.tokens_requested == 24
    # without explicit options the directory is simply reused
    _, reused = open_or_run_profile(model_path, _corpus("other text"), tmp_path / "prof", n_tokens=99)
    assert reused
    with pytest.raises(KairoxError, match="another corpus"):
        open_or_run_profile(model_path, _corpus("other text"), tmp_path / "prof", n_tokens=24,
                            match_corpus=True)
    with pytest.raises(KairoxError, match="--tokens 99"):
        open_or_run_profile(model_path, text, tmp_path / "prof", n_tokens=99, match_tokens=True)
    p, reused = open_or_run_profile(model_path, text, tmp_path / "prof", n_tokens=24,
                                    match_corpus=True, match_tokens=True)
    assert reused and isinstance(p, Profile)


def test_convert_cli_rejects_mismatched_profile(run_cli, model_path: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("Notes on gardening: soil, water, light and patience. " * 40)
    open_or_run_profile(model_path, _corpus(corpus.read_text()), tmp_path / "prof", n_tokens=24, threads=2)
    proc = run_cli("convert", str(model_path), str(tmp_path / "o.gguf"), "--profile", str(tmp_path / "prof"),
                   "--corpus", str(corpus), "--tokens", "4096", "--no-predictor", "--no-calibrate")
    assert proc.returncode == 1, proc.stderr
    assert "--tokens 4096" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_sigterm_cleans_up(tmp_path: Path, model_path: Path) -> None:
    """`timeout`/`kill` stop a long profile like Ctrl-C: exit 143, no temporary directory left."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("Lines of text about clocks, gears and springs for a long profile. " * 4000)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "kairox_py.cli", "profile", str(model_path), "-o",
                             str(tmp_path / "prof"), "--corpus", str(corpus), "--tokens", "100000",
                             "-t", "1"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # wait until the temporary sibling exists: the profile is being written
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(".prof.tmp-") for p in tmp_path.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "error: terminated" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_session_limits(model: Model) -> None:
    with pytest.raises(KairoxError, match="at most 512"):
        model.session(n_ctx=256, n_threads=100000)
    with model.session(n_ctx=256, n_threads=2) as s:
        g1 = s.generate("One, two,", 4)
        next(g1)
        with pytest.raises(KairoxError, match="still open"):
            s.generate("Red, green,", 4)
        g1.close()
        assert list(s.generate("Red, green,", 2))
        for _ in s.generate("Up, down,", 4):
            break  # a generator dropped by its loop is closed: the next call is fine
        assert list(s.generate("Left, right,", 2))


def test_run_warns_about_ignored_options(run_cli, model_path: Path) -> None:
    proc = run_cli("run", str(model_path), "-p", "Hello", "-n", "2", "--stats", "--policy", "lru",
                   "--lambda", "0.3")
    assert proc.returncode == 0, proc.stderr
    assert "not a Kairox GGUF" in proc.stderr
    for opt in ("--stats", "--policy", "--lambda"):
        assert opt in proc.stderr
    proc = run_cli("run", str(model_path), "-p", "Hello", "-n", "2", "--temp", "nan")
    assert proc.returncode == 2 and "--temp" in proc.stderr


def test_run_huge_n_predict_is_bounded_by_training_context(run_cli, model_path: Path) -> None:
    # the automatic context stops at the model's 8192 training tokens instead of trying to
    # allocate a billion-token KV cache; the chat answer ends long before that
    proc = run_cli("run", str(model_path), "--chat", "-p", "Reply with the single word: yes", "-n",
                   "999999999")
    assert proc.returncode == 0, proc.stderr
    assert "bad_alloc" not in proc.stderr and "cannot create a context" not in proc.stderr
