"""Loader fuzzing (scripts/fuzz_loader.py): a short campaign and the regression corpus.

Why: a malformed Kairox GGUF, trace, workload or profile directory must be refused with an
error, never crash, hang or raise a traceback (issue 37, point 4). The long campaigns run by
hand (``python3 scripts/fuzz_loader.py --count 10000 --dir-count 1000``); here a fast run over
every mutation kind checks that nothing new has appeared, and tests/data/fuzz/ replays the
mutants that once failed or that exercise a distinct refusal (tiny patch JSONs applied to seeds
written at test time).

Failures already known (C++ aborts and segfaults in the loader, to be fixed in C++) are listed
in KNOWN_ISSUES with their signature: the tests accept them and nothing else, and the replay of
their reproducers fails once one no longer reproduces, so that its entry is removed with the
fix.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO

DATA = REPO / "tests" / "data" / "fuzz"


def _load_fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_loader", REPO / "scripts" / "fuzz_loader.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_loader"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


fz = _load_fuzzer()


@dataclass(frozen=True)
class KnownIssue:
    """An open crash: its signature (a substring of fuzz_loader.signature()), the mutations
    that reach it (a regex on the mutation's description; None: any), and what it is."""

    signature: str
    mutation: str | None
    what: str

    def matches(self, sig: str, desc: str) -> bool:
        return self.signature in sig and (self.mutation is None or re.search(self.mutation, desc) is not None)


#: open C++ failures found by the fuzzer on the normal build (remove an entry with its fix)
KNOWN_ISSUES: tuple[KnownIssue, ...] = ()


def known(sig: str, desc: str) -> KnownIssue | None:
    return next((k for k in KNOWN_ISSUES if k.matches(sig, desc)), None)


@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-seeds")
    fz.make_seeds(d)
    return d


@pytest.fixture(scope="module")
def campaign(seeds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Campaign with the test's seeds and one worker (closed at the end)."""
    out = tmp_path_factory.mktemp("fuzz-replay")
    gseeds, dseeds = fz.make_seeds(seeds_dir)
    worker = fz.Worker(fz.worker_env(), out / "worker-stderr.txt", 20.0)
    c = fz.Campaign(out, gseeds, dseeds, worker, minimize=False)
    yield c
    worker.close()


def test_seeds_load_and_decode(campaign: object) -> None:
    """Every unmutated seed loads and decodes (a refused seed would fuzz nothing)."""
    c = campaign
    for s in c.gseeds:  # type: ignore[attr-defined]
        o = c.run(fz.Mutant(0, "gguf", "none", s.name, "seed"))  # type: ignore[attr-defined]
        assert o.outcome == "ok", (s.name, o.detail, o.stderr[-2000:])
    for s in c.dseeds:  # type: ignore[attr-defined]
        o = c.run(fz.Mutant(0, s.target, "none", s.name, "seed"))  # type: ignore[attr-defined]
        assert o.outcome == "ok", (s.target, s.name, o.detail)


def test_mutants_are_deterministic(seeds_dir: Path) -> None:
    gseeds, dseeds = fz.make_seeds(seeds_dir)
    a = [m.to_json() for m in fz.plan_mutants(3, 30, 10, gseeds, dseeds)]
    b = [m.to_json() for m in fz.plan_mutants(3, 30, 10, gseeds, dseeds)]
    assert a == b
    assert {m["kind"] for m in a[:30]} == set(fz.GGUF_KINDS)


def test_patches_keep_the_data_aligned(seeds_dir: Path) -> None:
    """A spliced KV re-pads the data section: the mutant parses, tensors where they were."""
    gseeds, _ = fz.make_seeds(seeds_dir)
    seed = gseeds[0]
    lay = seed.layout
    new = fz._enc_kv("kairox.fuzz", 8, "abc")
    data = fz.apply_patches(seed.data, fz.splice(lay, lay.kv_end, lay.kv_end, new, (0, 1)))
    lay2 = fz.parse_gguf(data)
    assert lay2.n_kv == lay.n_kv + 1 and lay2.kv("kairox.fuzz") is not None
    assert lay2.data_start % lay.alignment == 0
    assert data[lay2.data_start:] == seed.data[lay.data_start:]


def test_fast_campaign(seeds_dir: Path, tmp_path: Path) -> None:
    """150 GGUF mutants over every kind and 50 directory mutants: no failure but known ones."""
    c = fz.run_campaign(tmp_path / "fuzz", seed=2026, count=165, dir_count=60, timeout=20.0,
                        minimize=False, progress=False, seeds_dir=seeds_dir)
    assert len(c.rows) == 225
    assert {r["kind"] for r in c.rows if r["target"] == "gguf"} == set(fz.GGUF_KINDS)
    assert {r["target"] for r in c.rows} == {"gguf", *fz.DIR_TARGETS}
    new = [f"#{r['index']} {r['target']}/{r['kind']} ({r['mutation']}): {r['signature']} "
           f"[{r['detail']}] {r['stderr_head']}"
           for r in c.rows if r["outcome"] in fz.BAD and known(r["signature"], r["mutation"]) is None]
    assert not new, "new loader failures:\n" + "\n".join(new)
    assert (tmp_path / "fuzz" / "summary.md").is_file() and (tmp_path / "fuzz" / "results.csv").is_file()


CORPUS = sorted(DATA.glob("*.json"))


def test_corpus_is_small() -> None:
    assert CORPUS, "tests/data/fuzz/ is empty"
    for p in DATA.iterdir():
        assert p.stat().st_size < 100_000, f"{p} is too big for the regression corpus"


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_regression_corpus(path: Path, campaign: object) -> None:
    """Each saved mutant is refused or loads; a known crash still reproduces its signature
    (or, fixed, is removed from KNOWN_ISSUES)."""
    rec = json.loads(path.read_text())
    m = fz.Mutant.from_json(rec)
    o = campaign.run(m)  # type: ignore[attr-defined]
    if o.outcome in fz.GOOD:
        issue = known(rec.get("signature", ""), m.desc) if rec.get("signature") else None
        assert issue is None, f"{path.name} no longer fails ({o.outcome}): remove '{issue.signature}' " \
                              f"from KNOWN_ISSUES and set its expect to '{o.outcome}'"
        return  # refused or loaded: either is good, whatever it was when recorded
    sig = fz.signature(o)
    assert known(sig, m.desc) is not None, f"{path.name}: {sig} [{o.detail}] {o.stderr[-1500:]}"


# ---- the Python readers' fixes, one test each -------------------------------------------
def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _cut_npy_header(p: Path) -> None:
    """An .npy whose header dict is cut in the middle (numpy's parser raises TokenError)."""
    raw = p.read_bytes()
    text = "{'descr': '|u1', 'fortran_order'"
    text += " " * ((-(10 + len(text) + 1)) % 64) + "\n"
    p.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + raw[128:])


@pytest.mark.parametrize("damage", ["empty_group_freq", "empty_active", "cut_header", "n_ff_list",
                                    "n_seq_string", "bool_masks", "float_tokens", "huge_group_freq"])
def test_trace_reader_refuses(damage: str, seeds_dir: Path, tmp_path: Path) -> None:
    """Trace (and so open_workload) refuses what the fuzzer once turned into tracebacks:
    EOFError from empty .npy files, TokenError from a cut header, TypeError from a non-integer
    dimension or non-uint8 masks, MemoryError from a header claiming terabytes."""
    import numpy as np

    from kairox_py.errors import KairoxError
    from kairox_py.sim.traces import Trace
    from kairox_py.workload.write import open_workload

    d = _copy(seeds_dir / "workload", tmp_path / "wl")
    meta = json.loads((d / "meta.json").read_text())
    if damage == "empty_group_freq":
        (d / "group_freq.npy").write_bytes(b"")
    elif damage == "empty_active":
        (d / "active.npy").write_bytes(b"")
    elif damage == "cut_header":
        _cut_npy_header(d / "active.npy")
    elif damage in ("n_ff_list", "n_seq_string"):
        meta["n_ff" if damage == "n_ff_list" else "n_seq"] = [1, 2] if damage == "n_ff_list" else "2"
        (d / "meta.json").write_text(json.dumps(meta))
    elif damage == "bool_masks":
        np.save(d / "predicted.npy", np.load(d / "predicted.npy").astype(bool))
    elif damage == "float_tokens":
        np.save(d / "tokens.npy", np.load(d / "tokens.npy").astype(np.float32))
    else:
        raw = (d / "group_freq.npy").read_bytes()
        text = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 8), }"
        text += " " * ((-(10 + len(text) + 1)) % 64) + "\n"
        (d / "group_freq.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little")
                                           + text.encode() + raw[128:])
    with pytest.raises(KairoxError):
        Trace(d)
    with pytest.raises(KairoxError):
        open_workload(d)


@pytest.mark.parametrize("damage", ["empty_inputs", "cut_header", "n_layer_string", "int_hidden"])
def test_profile_reader_refuses(damage: str, seeds_dir: Path, tmp_path: Path) -> None:
    """Profile (what `kairox convert --profile` opens) refuses empty or cut .npy files, a
    non-integer dimension and non-float arrays with a KairoxError."""
    import numpy as np

    from kairox_py.errors import KairoxError
    from kairox_py.offline.profile import Profile

    d = _copy(seeds_dir / "profile", tmp_path / "prof")
    if damage == "empty_inputs":
        (d / "inputs.npy").write_bytes(b"")
    elif damage == "cut_header":
        _cut_npy_header(d / "hidden.npy")
    elif damage == "n_layer_string":
        meta = json.loads((d / "meta.json").read_text())
        meta["n_layer"] = "4"
        (d / "meta.json").write_text(json.dumps(meta))
    else:
        np.save(d / "hidden.npy", np.load(d / "hidden.npy").astype(np.int16))
    with pytest.raises(KairoxError):
        Profile(d)
