"""README's first command, `kairox run` without a model: it runs the default model's Kairox
conversion (made once, cached next to the default model, never left half-written) and shows
its decode speed next to the original's, dense. The cache points at a temporary directory
and the conversion's options are cut down so the test takes seconds, not minutes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kairox_py.commands import run as run_mod
from kairox_py.default_model import DEFAULT_MODEL, ENV_CACHE
from kairox_py.errors import KairoxError
from kairox_py.gguf_info import inspect_gguf
from kairox_py.offline.convert import ConvertOptions
from kairox_py.outputs import atomic_file

# the shape of the real first-run conversion (threshold mode, no predictors) on a small sample,
# without grouping (tests/test_grouping_unit.py, test_pipeline.py) or the crossover's timing
FAST = run_mod.FirstRunConversion(
    ConvertOptions(mode="threshold", predictor=False, self_text=0, tokens=256, ctx=128,
                   reorder=False, fit_ppl=None),
    calibrate=False)
COMPARISON = re.compile(r"sparse ([\d.]+) tok/s vs dense ([\d.]+) tok/s \(([\d.]+)x")


@pytest.fixture
def cache(tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache directory holding only the default model (a link to the real one)."""
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    (models / DEFAULT_MODEL.filename).symlink_to(model_path)
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(run_mod, "FIRST_RUN", FAST)
    monkeypatch.setattr(run_mod, "COMPARE_STEPS", 8)  # a short comparison: its line is checked,
    monkeypatch.setattr(run_mod, "COMPARE_ROUNDS", 1)  # not its speeds
    return tmp_path / "cache"


def invoke(*args: str) -> Result:
    res = CliRunner().invoke(run_mod.run, ["-p", "The capital of France is", "-n", "4", "-t", "2",
                                           *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res


def conversions(cache: Path) -> list[Path]:
    return sorted((cache / "models").glob("*.kx-*.gguf"))


def test_run_without_model_converts_once_and_compares(cache: Path) -> None:
    first = invoke()
    assert "First run: converting" in first.stderr
    [kx] = conversions(cache)
    assert kx.name == f"{Path(DEFAULT_MODEL.filename).stem}.kx-{FAST.tag()}.gguf"
    assert not [p for p in (cache / "models").iterdir() if p.name.startswith(".")]  # no temporary left
    assert inspect_gguf(kx).has_kairox_data
    assert first.stdout.strip()
    assert "kairox run (threshold)" in first.stderr  # the sparse answer, in the model's mode
    m = COMPARISON.search(first.stderr)
    assert m, first.stderr
    assert all(float(v) > 0 for v in m.groups())  # sparse, dense, their ratio

    stat = kx.stat()
    second = invoke()
    assert "First run" not in second.stderr  # the cached conversion is reused as it is
    assert conversions(cache) == [kx]
    assert (kx.stat().st_ino, kx.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert COMPARISON.search(second.stderr), second.stderr


def test_dense_runs_the_original_without_converting(cache: Path) -> None:
    res = invoke("--dense")
    assert "kairox run (dense)" in res.stderr
    assert not COMPARISON.search(res.stderr) and "First run" not in res.stderr
    assert conversions(cache) == []


def test_other_settings_make_another_conversion() -> None:
    """The cache key covers the settings: a changed conversion is never taken for the old one."""
    assert FAST.tag() != run_mod.FirstRunConversion().tag()
    assert FAST.tag() == run_mod.FirstRunConversion(FAST.options, calibrate=False).tag()


@pytest.mark.parametrize("exc", [KairoxError("disk full"), KeyboardInterrupt()])
def test_interrupted_conversion_leaves_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                               exc: BaseException) -> None:
    """A conversion that fails half-way (an error, Ctrl-C) leaves no file a later run could
    take for a finished one."""
    def half_written(_in: Path, out: Path, *_a: object, **_k: object) -> None:
        with atomic_file(out) as tmp:  # as convert writes it
            tmp.write_bytes(b"GGUF" + b"\0" * 1024)
            raise exc

    monkeypatch.setattr(run_mod, "convert", half_written)
    with pytest.raises(type(exc)):
        run_mod.first_run_model(cache / "models" / DEFAULT_MODEL.filename, 2,
                                run_mod.stderr_console())
    assert conversions(cache) == []
    assert not [p for p in (cache / "models").iterdir() if p.name.startswith(".")]  # no temporary


def test_predictor_modes_need_an_explicit_conversion(cache: Path) -> None:
    res = CliRunner().invoke(run_mod.run, ["-p", "Hi", "--vram-budget", "0.1"])
    assert res.exit_code == 2 and "threshold mode (no predictors)" in res.output
    assert conversions(cache) == []
