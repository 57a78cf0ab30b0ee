"""Shared fixtures: the real default model (fetched on first use) and CLI helpers.

The suite runs against whatever `kairox_py` imports here: the installed package in CI
(`pip install '.[test]' && pytest -q`), or the source tree with a developer build
(`python -m pytest` from the repository, library from build/dev or $KAIROX_LIB).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kairox_py
from kairox_py import ContextParams, Model, _lib, ensure_default_model
from kairox_py.benchmark.synthetic import LlamaShape
from kairox_py.models import DownloadError
from kairox_py.models import fetch as fetch_model
from kairox_py.offline.convert import ConvertOptions, ConvertResult, convert
from kairox_py.offline.corpus import default_corpus
from kairox_py.offline.predictor import TrainConfig
from kairox_py.offline.profile import Profile, run_profile

REPO = Path(__file__).resolve().parent.parent
PACKAGE_PARENT = Path(kairox_py.__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model's GGUF (downloaded and verified the first time)."""
    return ensure_default_model()


@pytest.fixture(scope="session")
def real_model() -> Callable[[str], Path]:
    """The cached GGUF of a model of kairox_py.models by key, fetched if missing; skips the
    test when it is neither cached nor downloadable (offline). A download that arrives but
    fails verification is an error, not a skip. Tests using it are marked `slow`: the
    downloads are hundreds of MB."""

    def get(key: str) -> Path:
        try:
            return fetch_model(key)
        except DownloadError as e:
            pytest.skip(f"{key} is not cached and cannot be fetched: {e}")

    return get


@pytest.fixture(scope="session")
def model(model_path: Path) -> Iterator[Model]:
    m = Model(model_path)
    yield m
    m.close()


@pytest.fixture(scope="session")
def cli_cwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A neutral working directory, so `-m kairox_py.cli` imports the package under test
    (via PYTHONPATH) rather than whatever sits in the current directory."""
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="session")
def run_cli(cli_cwd: Path):  # type: ignore[no-untyped-def]
    """Run `kairox ARGS...` as a subprocess (`python -m kairox_py.cli`)."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PACKAGE_PARENT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.pop("KAIROX_VERBOSE", None)
        env["COLUMNS"] = "120"
        return subprocess.run([sys.executable, "-m", "kairox_py.cli", *args], cwd=cli_cwd,
                              env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def bad_files(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> dict[str, Path]:
    """Broken model files, by kind (see make_bad_files)."""
    return make_bad_files(tmp_path_factory.mktemp("bad"), model_path)


def make_bad_files(d: Path, model_path: Path) -> dict[str, Path]:
    """Broken inputs: missing, not a GGUF, truncated in the header/metadata and in the
    middle of the tensor data (cut from the real model)."""
    data = model_path.read_bytes()
    files = {
        "missing": d / "no-such-model.gguf",
        "not_gguf": d / "not-a-model.gguf",
        "directory": d / "a-directory.gguf",
        "empty": d / "empty.gguf",
        "truncated_1mb": d / "truncated-1mb.gguf",
        "truncated_tensor_data": d / "truncated-tensors.gguf",
    }
    files["not_gguf"].write_text("this is plain text, not a GGUF model\n")
    files["directory"].mkdir(exist_ok=True)
    files["empty"].write_bytes(b"")
    files["truncated_1mb"].write_bytes(data[: 1 << 20])
    files["truncated_tensor_data"].write_bytes(data[: int(len(data) * 0.6)])
    return files


def find_tool(name: str) -> Path | None:
    """An upstream tool (llama-completion, llama-server, ...) built from the same tree as the
    loaded library: next to it (build dir), the environment's scripts, PATH, then build/dev."""
    lib_path = _lib.lib().path
    dirs = [lib_path.parent / "bin", Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    which = shutil.which(name)
    if which:
        dirs.append(Path(which).parent)
    dirs.append(REPO / "build" / "dev" / "bin")
    for d in dirs:
        exe = d / name
        if exe.is_file():
            return exe
    return None


# ---- one small Kairox conversion of the default model per session ----------------------
PIPELINE_RECALL = 0.9
# max_pred_density 1: these conversions test what predictors do, so they keep them whatever they
# select (a real conversion drops predictors that select most neurons; test_convert_scale.py)
PIPELINE_OPTS = ConvertOptions(sparsity=0.5, recall=PIPELINE_RECALL, group_size=64, mode="threshold",
                               tokens=1024, threads=2, max_pred_density=1.0, fit_ppl=None,
                               train=TrainConfig(recall=PIPELINE_RECALL, ranks=(32, 64), epochs=2))


@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="session")
def profile(pipeline_dir: Path, model_path: Path) -> Profile:
    return run_profile(model_path, default_corpus("profile"), pipeline_dir / "profile", n_tokens=1024,
                       threads=2)


@pytest.fixture(scope="session")
def converted(pipeline_dir: Path, model_path: Path, profile: Profile) -> ConvertResult:
    return convert(model_path, pipeline_dir / "kx.gguf", default_corpus("profile"), PIPELINE_OPTS,
                   profile_dir=profile.dir)


# ---- small random-weight GGUFs of the other FFN shapes (test_falcon.py, test_relu.py) -----
SMALL_SHAPE = LlamaShape(n_embd=256, n_ff=1024, n_layer=4, n_head=4, n_head_kv=4, n_vocab=512, n_ctx=512)
SMALL_OPTS = ConvertOptions(sparsity=0.5, recall=PIPELINE_RECALL, group_size=32, mode="threshold",
                            tokens=768, ctx=256, threads=2, max_pred_density=1.0, fit_ppl=None,
                            train=TrainConfig(recall=PIPELINE_RECALL, ranks=(32, 64), epochs=2))
SMALL_TOKENS = 48  # one decode call of this many tokens, all through the sparse FFN


def small_tokens(path: Path, text: str) -> list[int]:
    """SMALL_TOKENS tokens of `text` (repeated) in the vocabulary of the GGUF at `path`."""
    with Model(path, vocab_only=True) as m:
        toks = m.tokenize(text)
    return (toks * (SMALL_TOKENS // len(toks) + 1))[:SMALL_TOKENS]


def small_profile(path: Path) -> Profile:
    """A profile of the small GGUF at `path` (SMALL_OPTS' sample), next to it."""
    return run_profile(path, default_corpus("profile"), path.parent / f"{path.stem}-profile",
                       n_tokens=SMALL_OPTS.tokens, ctx=SMALL_OPTS.ctx, threads=2)


def small_convert(path: Path, prof: Profile, opts: ConvertOptions) -> ConvertResult:
    """The small GGUF at `path` converted with `opts` from `prof`, next to it (STEM-kx.gguf)."""
    return convert(path, path.parent / f"{path.stem}-kx.gguf", default_corpus("profile"), opts,
                   profile_dir=prof.dir)


def all_logits(path: Path, toks: list[int], **kw: object) -> np.ndarray:
    """The logits of every token of one decode call; in a sparse mode every token goes
    through the sparse FFN with its own mask (max_sparse_tokens = the call's size)."""
    with Model(path) as m, m.session(ContextParams(n_ctx=256, n_batch=len(toks), max_sparse_tokens=len(toks),
                                                   n_threads=2, **kw)) as s:  # type: ignore[arg-type]
        out = s.decode(toks, all_logits=True)
        assert out is not None
        return out


def stepwise_logits(path: Path, toks: list[int], **kw: object) -> tuple[np.ndarray, object]:
    """Predictor mode, the first 8 tokens as a prompt and then one token per decode: the logits
    of each step (as generation sees them) and the session's hybrid_info (None on the CPU only);
    kw: ContextParams fields (vram_budget_gib for the hybrid runtime)."""
    with Model(path) as m, m.session(ContextParams(n_ctx=256, n_threads=2, mode="predictor",
                                                   **kw)) as s:  # type: ignore[arg-type]
        s.decode(toks[:8])
        out = [s.logits()]
        for t in toks[8:]:
            s.decode([t])
            out.append(s.logits())
        return np.stack(out), s.hybrid_info()
