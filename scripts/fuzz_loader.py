#!/usr/bin/env python3
"""Fuzz the Kairox GGUF loader and the trace, workload and profile directory readers.

    python3 scripts/fuzz_loader.py [--count 10000] [--dir-count 1000] [--seed 0]
        [--out bench-out/fuzz] [--timeout 10] [--lib PATH [--preload auto]] [--gdb]
    python3 scripts/fuzz_loader.py --run-one bench-out/fuzz/crashes/NAME/repro.json

Why: a server or an application that embeds libkairox dies with any abort or segfault the
loader hits on a malformed file (issue 37, point 4): every mutant must be refused with an error
or load and decode. Random bytes alone rarely get past the GGUF header, so the mutator parses
each seed (header, KV pairs, tensor infos, data offsets) and changes one structure at a time:

* GGUF kinds (``GGUF_KINDS``): ``header`` (magic, version, counts), ``kv_value`` and ``kv_type``
  (a value or its type code), ``kv_struct`` (a KV removed, duplicated, added or re-encoded, the
  data section re-aligned), ``kairox_meta`` and ``hparams`` (chosen values of ``kairox.*`` and
  architecture keys), ``tokenizer`` (duplicated token strings, ids, types, model), ``tensor_info``
  (shapes, types, offsets, names, tensors removed or doubled), ``tensor_data`` (kx_perm and
  kx_perm_inv with duplicates and out-of-range entries, group_freq and predictor biases NaN or
  negative, NaN block scales), ``truncate`` and ``byteflip``;
* directory kinds (``DIR_KINDS``) for trace and workload directories (``Trace``,
  ``open_workload`` and the statistics ``kairox workload`` measures) and for profile directories
  (what ``kairox convert --profile`` reads): JSON values and structure, .npy headers and data,
  files deleted or replaced by directories.

Seeds are small Kairox GGUFs written here (synthetic tiny llama with masks given, a rank-32
predictor with group frequencies, OPT, a permuted copy with kx_perm/kx_perm_inv; with
``--converted`` also a real ``kairox convert`` of a tiny synthetic model and its profile, about
a minute once, cached under OUT/seeds). A mutant is the seed plus a list of byte patches, so it
is stored as a few hundred bytes of JSON (the regression corpus in tests/data/fuzz/).

Each mutant runs in one worker subprocess that takes mutants one after another over a pipe
(no interpreter start-up per mutant): a GGUF is loaded with ``Model(path)``, then a session in
the model's own sparse mode decodes a prompt and three tokens. The parent restarts a worker that
died and records per mutant: ``refused`` (KairoxError: good), ``ok`` (loaded and decoded, or
read: good), ``crash`` (a signal or a non-zero exit), ``hang`` (no answer in --timeout s),
``traceback`` (a Python exception other than KairoxError) or ``sanitizer`` (an ASan/UBSan report
in stderr), with the first stderr lines. Failures are grouped by signature (signal plus the
assert or error line, or the exception and its innermost kairox_py frame); the first mutant of
each is minimised (patches reverted while the signature holds) and saved under OUT/crashes/.

Writes under --out: ``results.csv`` (one row per mutant), ``summary.md`` (outcomes per target
and kind, every failure signature with its count, mutation and reproducer), ``crashes/NAME/``
(``mutant.gguf`` or ``mutant/``, ``patch.json``, ``repro.json``, ``stderr.txt``, with --gdb
``gdb.txt``), ``corpus/`` (patch JSONs of refused mutants with distinct errors, one per error).

Sanitizer builds: a Python host needs the sanitizer runtime preloaded, e.g. for an ASan+UBSan
build at build/asan::

    python3 scripts/fuzz_loader.py --lib build/asan/libkairox.so --preload auto

(``--preload auto`` takes libasan/libubsan from ``ldd`` of the library; the worker runs with
``ASAN_OPTIONS=detect_leaks=0:abort_on_error=1`` because CPython itself leaks at exit, and
``UBSAN_OPTIONS=print_stacktrace=1``; a report in stderr counts as a failure even when the
mutant went on to load).

Deterministic per --seed: mutant i of a target draws from its own generator seeded with
(seed, target, i). One worker at a time at normal priority (the library runs one thread).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

GGUF_KINDS = ("header", "kv_value", "kv_type", "kv_struct", "kairox_meta", "hparams", "tokenizer",
              "tensor_info", "tensor_data", "truncate", "byteflip")
DIR_KINDS = ("json_value", "json_struct", "npy_header", "npy_data", "files")
DIR_TARGETS = ("trace", "workload", "profile")
GOOD = ("refused", "ok")
#: outcomes that are failures
BAD = ("crash", "hang", "traceback", "sanitizer")
SANITIZER_RE = re.compile(r"ERROR: (Address|Leak|Memory|Thread)Sanitizer|runtime error:|"
                          r"SUMMARY: (Address|Undefined)")
#: stderr lines that say why a process died, best first
REASON_RES = (re.compile(r"ERROR: \w+Sanitizer.*"), re.compile(r".*runtime error:.*"),
              re.compile(r".*GGML_ASSERT.*"), re.compile(r".*Assertion .*"),
              re.compile(r".*GGML_ABORT.*|.*\bfatal error\b.*"),
              re.compile(r"terminate called.*"), re.compile(r".*what\(\):.*"),
              re.compile(r"Fatal Python error.*"), re.compile(r".*\berror\b.*", re.I))

# ---------------------------------------------------------------------------------------
# GGUF layout
# ---------------------------------------------------------------------------------------
#: GGUF value types: code -> struct format of a scalar (8: string, 9: array)
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
              10: "<Q", 11: "<q", 12: "<d"}
T_STRING, T_ARRAY = 8, 9
FLOAT_TYPES = (6, 12)


@dataclass(frozen=True)
class KV:
    """One metadata pair, by absolute byte offsets into the file."""

    key: str
    start: int  # the key's length field
    type_off: int  # the value type (u32)
    vtype: int
    value_off: int  # the value (for arrays: the element type)
    end: int
    elem_type: int | None  # arrays only
    count_off: int | None  # arrays only: the element count (u64)
    elems: tuple[tuple[int, int], ...]  # each element's (start, end) (a string's includes its length)
    value: Any  # decoded: scalar, str, or list (arrays of strings / numbers)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor info and where its data lies."""

    name: str
    start: int
    ndim_off: int
    dims: tuple[int, ...]
    type_off: int
    ggml_type: int
    offset_off: int
    rel_offset: int
    end: int
    data_start: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """A parsed GGUF: header, KV pairs, tensor infos, data section."""

    n_tensors: int
    n_kv: int
    kvs: tuple[KV, ...]
    tensors: tuple[TensorInfo, ...]
    kv_end: int
    ti_end: int
    data_start: int
    alignment: int
    size: int

    def kv(self, key: str) -> KV | None:
        return next((k for k in self.kvs if k.key == key), None)

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


def _tensor_nbytes(ggml_type: int, dims: Sequence[int]) -> int:
    """Bytes of a tensor of this type and shape (0 for an unknown type)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return 0
    n = math.prod(dims)
    return n // block * size


def parse_gguf(data: bytes) -> Layout:
    """The layout of a well-formed GGUF (the seeds): every field with its offset."""
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", errors="replace")
        pos += n
        return s

    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF")
    pos = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    kvs = []
    for _ in range(n_kv):
        start = pos
        key = string()
        type_off = pos
        vtype = take("<I")
        value_off = pos
        elem_type = count_off = None
        elems: list[tuple[int, int]] = []
        if vtype == T_ARRAY:
            elem_type = take("<I")
            count_off = pos
            count = take("<Q")
            vals: Any = []
            for _ in range(count):
                e0 = pos
                vals.append(string() if elem_type == T_STRING else take(SCALAR_FMT[elem_type]))
                elems.append((e0, pos))
        elif vtype == T_STRING:
            vals = string()
            elems.append((value_off, pos))
        else:
            vals = take(SCALAR_FMT[vtype])
            elems.append((value_off, pos))
        kvs.append(KV(key, start, type_off, vtype, value_off, pos, elem_type, count_off,
                      tuple(elems), vals))
    kv_end = pos
    align_kv = next((k for k in kvs if k.key == "general.alignment"), None)
    alignment = int(align_kv.value) if align_kv else 32
    infos = []
    for _ in range(n_tensors):
        start = pos
        name = string()
        ndim_off = pos
        nd = take("<I")
        dims = tuple(take("<Q") for _ in range(nd))
        type_off = pos
        gt = take("<I")
        offset_off = pos
        rel = take("<Q")
        infos.append((name, start, ndim_off, dims, type_off, gt, offset_off, rel, pos))
    ti_end = pos
    data_start = ti_end + (-ti_end) % alignment
    tensors = tuple(TensorInfo(n, s, nd, d, to, gt, oo, rel, e, data_start + rel, _tensor_nbytes(gt, d))
                    for n, s, nd, d, to, gt, oo, rel, e in infos)
    return Layout(n_tensors, n_kv, tuple(kvs), tensors, kv_end, ti_end, data_start, alignment, len(data))


# ---------------------------------------------------------------------------------------
# patches: a mutant is its seed plus byte replacements
# ---------------------------------------------------------------------------------------
Patch = tuple[int, int, bytes]  # replace data[start:end] with bytes


def apply_patches(data: bytes, patches: Sequence[Patch]) -> bytes:
    """The seed with the patches applied (patches address the seed's offsets and must not
    overlap; they are applied from the end so that earlier offsets stay valid)."""
    out = bytearray(data)
    for start, end, new in sorted(patches, key=lambda p: (p[0], p[1]), reverse=True):
        out[start:end] = new
    return bytes(out)


def patches_to_json(patches: Sequence[Patch]) -> list[list[Any]]:
    return [[s, e, b.hex()] for s, e, b in patches]


def patches_from_json(items: Sequence[Sequence[Any]]) -> list[Patch]:
    return [(int(s), int(e), bytes.fromhex(h)) for s, e, h in items]


def _enc_str(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _enc_value(vtype: int, value: Any, elem_type: int | None = None) -> bytes:
    """A GGUF value (type code not included)."""
    if vtype == T_STRING:
        return _enc_str(value)
    if vtype == T_ARRAY:
        assert elem_type is not None
        body = b"".join(_enc_value(elem_type, v) for v in value)
        return struct.pack("<IQ", elem_type, len(value)) + body
    fmt = SCALAR_FMT[vtype]
    if vtype in FLOAT_TYPES:
        return struct.pack(fmt, value)
    bits = struct.calcsize(fmt) * 8
    return struct.pack(fmt.upper() if fmt[-1] != "B" else fmt, int(value) & ((1 << bits) - 1))


def _enc_kv(key: str, vtype: int, value: Any, elem_type: int | None = None) -> bytes:
    return _enc_str(key) + struct.pack("<I", vtype) + _enc_value(vtype, value, elem_type)


def splice(lay: Layout, start: int, end: int, new: bytes, counts: tuple[int, int] = (0, 0)) -> list[Patch]:
    """Patches that replace [start, end) of the metadata or tensor infos with `new`, keep the
    data section aligned (its padding re-computed, so tensor offsets stay valid) and add
    counts = (tensors, KVs) to the header's counts."""
    assert end <= lay.ti_end
    delta = len(new) - (end - start)
    new_end = lay.ti_end + delta
    pad = b"\0" * ((-new_end) % lay.alignment)
    out: list[Patch] = [(start, end, new), (lay.ti_end, lay.data_start, pad)]
    if counts[0]:
        out.append((8, 16, struct.pack("<Q", (lay.n_tensors + counts[0]) & (2**64 - 1))))
    if counts[1]:
        out.append((16, 24, struct.pack("<Q", (lay.n_kv + counts[1]) & (2**64 - 1))))
    # a zero-length splice at ti_end would collide with the padding patch
    if start == end == lay.ti_end:
        out = [(lay.ti_end, lay.data_start, new + pad)] + out[2:]
    return out


# ---------------------------------------------------------------------------------------
# interesting values
# ---------------------------------------------------------------------------------------
INTS = (0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 255, 256, 511, 512, 513, 767, 768, 769, 1536, 65535,
        65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -1, -2)
FLOATS = (math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, 1.0, 2.0, 0.5, 1e30, -1e30, 1e-45, 65504.0)


def _interesting(rng: random.Random, vtype: int, orig: Any = None) -> bytes:
    """An edge value of a scalar type, packed (integers wrap to the type's width)."""
    if vtype in FLOAT_TYPES:
        return _enc_value(vtype, rng.choice(FLOATS))
    choices = list(INTS)
    if isinstance(orig, int) and not isinstance(orig, bool):
        choices += [orig - 1, orig + 1, orig * 2, orig // 2]
    return _enc_value(vtype, rng.choice(choices))


# ---------------------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GgufSeed:
    name: str
    path: Path
    data: bytes
    layout: Layout


@dataclass(frozen=True)
class DirSeed:
    name: str
    target: str  # trace | workload | profile
    path: Path
    files: dict[str, bytes]
    model: Path | None = None  # profile: the model it was made from


def _add_permutation(src: Path, dst: Path, seed: int) -> None:
    """A permuted copy of a Kairox GGUF: kx_perm / kx_perm_inv per layer and kairox.permuted
    (weights left in place: the loader cannot tell, and speed or quality do not matter here)."""
    from gguf import GGUFReader, GGUFValueType

    from kairox_py import format as fmt
    from kairox_py.offline.convert import _array_tensor, _input_tensor, write_gguf

    reader = GGUFReader(src, "r")
    fields = {f.name: f for f in reader.fields.values()}
    n_layer = int(fields["llama.block_count"].contents())
    n_ff = int(fields["llama.feed_forward_length"].contents())
    rng = np.random.default_rng(seed)
    plan = [_input_tensor(t) for t in reader.tensors]
    for il in range(n_layer):
        perm = rng.permutation(n_ff).astype(np.int32)
        plan.append(_array_tensor(fmt.tensor_name(fmt.TENSOR_PERM, il, ""), perm))
        plan.append(_array_tensor(fmt.tensor_name(fmt.TENSOR_PERM_INV, il, ""),
                                  np.argsort(perm).astype(np.int32)))
    kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = [
        (fmt.KEY_PERMUTED, True, GGUFValueType.BOOL, None)]
    write_gguf(reader, "llama", dst, kv, plan, None, frozenset({fmt.KEY_PERMUTED}))


def _write_profile_dir(d: Path, model: Path, n_tokens: int = 48) -> None:
    """A profile directory of the tiny llama seed (what `kairox profile` writes, random values,
    the model's sha256 so that `convert --profile`'s checks pass)."""
    from kairox_py.benchmark.synthetic import SHAPES
    from kairox_py.offline.profile import PROFILE_VERSION, ProfileMeta, file_sha256

    s = SHAPES["tiny"]
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    np.save(d / "inputs.npy", rng.standard_normal((s.n_layer, n_tokens, s.n_embd)).astype(np.float16))
    np.save(d / "hidden.npy", rng.standard_normal((s.n_layer, n_tokens, s.n_ff)).astype(np.float16))
    meta = ProfileMeta(version=PROFILE_VERSION, model_path=str(model), model_sha256=file_sha256(model),
                       arch="llama", activation="silu", n_layer=s.n_layer, n_embd=s.n_embd,
                       n_ff=s.n_ff, n_tokens=n_tokens, ctx=128, corpus="fuzz",
                       corpus_sha256="0" * 64, seconds=0.0, tokens_requested=n_tokens)
    (d / "meta.json").write_text(meta.to_json())


def _write_converted(d: Path) -> tuple[Path, Path, Path]:
    """A real `kairox convert` of a tiny dense synthetic llama (threshold mode, predictors,
    permuted) and its profile: (input model, Kairox GGUF, profile directory)."""
    from kairox_py.benchmark.synthetic import SHAPES, write_synthetic_llama
    from kairox_py.offline.convert import ConvertOptions, convert
    from kairox_py.offline.corpus import Corpus
    from kairox_py.offline.predictor import TrainConfig

    d.mkdir(parents=True, exist_ok=True)
    src, out, prof = d / "dense.gguf", d / "converted.gguf", d / "converted-profile"
    if out.is_file() and prof.is_dir():
        return src, out, prof
    write_synthetic_llama(src, SHAPES["tiny"], seed=1)
    words = " ".join(f"word{i % 97} token{i % 13}" for i in range(3000))
    opts = ConvertOptions(sparsity=0.5, group_size=32, tokens=384, ctx=128, threads=1, self_text=0,
                          train=TrainConfig(ranks=(32,), epochs=1), fit_ppl=None)
    convert(src, out, Corpus(words, "fuzz words"), opts, profile_dir=prof)
    return src, out, prof


def make_seeds(d: Path, converted: bool = False) -> tuple[list[GgufSeed], list[DirSeed]]:
    """Write (or reuse) the seed files under d: small Kairox GGUFs and one directory per
    directory target. Deterministic: the same files every time."""
    from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, write_synthetic_llama
    from kairox_py.workload import resolve, write_workload

    d.mkdir(parents=True, exist_ok=True)
    tiny = SHAPES["tiny"]
    gfreq = np.linspace(0.9, 0.05, tiny.n_ff // 32, dtype=np.float32)[None].repeat(tiny.n_layer, 0)
    specs: dict[str, Callable[[Path], Any]] = {
        "llama-masks": lambda p: write_synthetic_llama(p, tiny, sparse=SparseSpec(), group_size=32),
        "llama-rank32": lambda p: write_synthetic_llama(p, tiny, sparse=SparseSpec(32, "q8_0"),
                                                        group_size=32, group_freq=gfreq, seed=2),
        "opt-rank32": lambda p: write_synthetic_llama(p, tiny, sparse=SparseSpec(32, "f16"),
                                                      group_size=32, arch="opt", seed=3),
    }
    paths: dict[str, Path] = {}
    for name, make in specs.items():
        p = d / f"{name}.gguf"
        if not p.is_file():
            make(p)
        paths[name] = p
    perm = d / "llama-permuted.gguf"
    if not perm.is_file():
        _add_permutation(paths["llama-rank32"], perm, seed=4)
    paths["llama-permuted"] = perm
    dirs: list[DirSeed] = []
    wl = d / "workload"
    if not wl.is_dir():
        write_workload(resolve("relu-7b", n_layer=2, n_embd=64, n_ff=256, n_seq=2, n_steps=16,
                               group_size=32, topic_size=32), wl)
    dense = d / "llama-dense.gguf"  # what a profile is made from: a model without Kairox data
    if not dense.is_file():
        write_synthetic_llama(dense, tiny, seed=6)
    prof = d / "profile"
    if not prof.is_dir():
        _write_profile_dir(prof, dense)
    wl_files = _read_dir(wl)
    dirs += [DirSeed("workload", "trace", wl, wl_files), DirSeed("workload", "workload", wl, wl_files),
             DirSeed("profile", "profile", prof, _read_dir(prof), dense)]
    if converted:
        src, out, cprof = _write_converted(d / "converted")
        paths["converted"] = out
        dirs.append(DirSeed("converted-profile", "profile", cprof, _read_dir(cprof), src))
    seeds = []
    for name, p in paths.items():
        data = p.read_bytes()
        seeds.append(GgufSeed(name, p, data, parse_gguf(data)))
    return seeds, dirs


def _read_dir(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


# ---------------------------------------------------------------------------------------
# GGUF mutators: each returns (patches, description)
# ---------------------------------------------------------------------------------------
class Skip(Exception):
    """The mutator does not apply to this seed (the caller draws again)."""


Mut = tuple[list[Patch], str]


def _pick_kv(rng: random.Random, lay: Layout, prefixes: Sequence[str] = ()) -> KV:
    kvs = [k for k in lay.kvs if not prefixes or k.key.startswith(tuple(prefixes))]
    if not kvs:
        raise Skip
    return rng.choice(kvs)


def _weighted_kv(rng: random.Random, lay: Layout) -> KV:
    """KVs under kairox., general., tokenizer. and the architecture's, kairox ones most often."""
    r = rng.random()
    prefixes = (("kairox.",) if r < 0.4 else ("tokenizer.",) if r < 0.6 else
                ("general.",) if r < 0.7 else ())
    return _pick_kv(rng, lay, prefixes)


def m_header(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    what = rng.choice(("magic", "version", "n_tensors", "n_kv", "n_kv", "n_tensors"))
    if what == "magic":
        new = rng.choice((b"GGUG", b"FUGG", b"\0\0\0\0", bytes(rng.randrange(256) for _ in range(4))))
        return [(0, 4, new)], f"magic -> {new!r}"
    if what == "version":
        v = rng.choice((0, 1, 2, 4, 5, 2**31, 2**32 - 1, 0x03000000))
        return [(4, 8, struct.pack("<I", v))], f"version -> {v}"
    off, orig = (8, lay.n_tensors) if what == "n_tensors" else (16, lay.n_kv)
    v = rng.choice((0, 1, orig - 1, orig + 1, orig + 2, orig * 2, 2**31, 2**32, 2**60, 2**63, 2**64 - 1))
    return [(off, off + 8, struct.pack("<Q", v & (2**64 - 1)))], f"{what} {orig} -> {v}"


def m_kv_value(rng: random.Random, seed: GgufSeed) -> Mut:
    kv = _weighted_kv(rng, seed.layout)
    if kv.vtype == T_STRING:
        s, e = kv.elems[0]
        if rng.random() < 0.5:
            n = e - s - 8
            v = rng.choice((0, n - 1, n + 1, n + 100, 2**31, 2**63, 2**64 - 1))
            return [(s, s + 8, struct.pack("<Q", v & (2**64 - 1)))], f"{kv.key}: string length {n} -> {v}"
        body = bytes(rng.choice((0, 0xFF, 0xC3, 0x80, 0x25, rng.randrange(256))) for _ in range(e - s - 8))
        return [(s + 8, e, body)], f"{kv.key}: string bytes -> {body[:16]!r}"
    if kv.vtype == T_ARRAY:
        assert kv.count_off is not None and kv.elem_type is not None
        if rng.random() < 0.4 or not kv.elems:
            n = len(kv.elems)
            v = rng.choice((0, 1, n - 1, n + 1, n * 2, 2**31, 2**62, 2**64 - 1))
            return ([(kv.count_off, kv.count_off + 8, struct.pack("<Q", v & (2**64 - 1)))],
                    f"{kv.key}: array count {n} -> {v}")
        i = rng.randrange(len(kv.elems))
        s, e = kv.elems[i]
        if kv.elem_type == T_STRING:
            n = e - s - 8
            v = rng.choice((0, n + 1, 2**32, 2**64 - 1))
            return [(s, s + 8, struct.pack("<Q", v))], f"{kv.key}[{i}]: string length {n} -> {v}"
        new = _interesting(rng, kv.elem_type, kv.value[i])
        return [(s, e, new)], f"{kv.key}[{i}] -> {_show(kv.elem_type, new)}"
    s, e = kv.elems[0]
    new = _interesting(rng, kv.vtype, kv.value)
    return [(s, e, new)], f"{kv.key}: {kv.value} -> {_show(kv.vtype, new)}"


def _show(vtype: int, b: bytes) -> str:
    return str(struct.unpack(SCALAR_FMT[vtype], b)[0]) if vtype in SCALAR_FMT else b.hex()


def m_kv_type(rng: random.Random, seed: GgufSeed) -> Mut:
    kv = _weighted_kv(rng, seed.layout)
    v = rng.choice(tuple(range(13)) + (13, 99, 2**31, 2**32 - 1))
    if kv.vtype == T_ARRAY and rng.random() < 0.5:
        return ([(kv.value_off, kv.value_off + 4, struct.pack("<I", v))],
                f"{kv.key}: array element type {kv.elem_type} -> {v}")
    return [(kv.type_off, kv.type_off + 4, struct.pack("<I", v))], f"{kv.key}: type {kv.vtype} -> {v}"


#: KVs the structure mutator adds: (key, type, value, element type)
NEW_KVS: tuple[tuple[str, int, Any, int | None], ...] = (
    ("general.alignment", 4, 0, None), ("general.alignment", 4, 3, None), ("general.alignment", 4, 1 << 30, None),
    ("general.alignment", 4, 64, None), ("kairox.permuted", 7, 1, None), ("kairox.permuted", 8, "yes", None),
    ("kairox.threshold", T_ARRAY, [0.1] * 4, 6), ("kairox.threshold", T_ARRAY, [math.nan] * 4, 6),
    ("kairox.threshold", T_ARRAY, [0.1] * 3, 6), ("kairox.threshold", T_ARRAY, [], 6),
    ("kairox.threshold", T_ARRAY, [0.1] * 9, 6), ("kairox.threshold", T_ARRAY, ["a"] * 4, T_STRING),
    ("kairox.cats_threshold", T_ARRAY, [0.2] * 4, 6), ("kairox.cats_threshold", T_ARRAY, [-1.0] * 2, 6),
    ("kairox.activation", T_STRING, "relu", None), ("kairox.activation", T_STRING, "tanh", None),
    ("kairox.activation", T_STRING, "", None), ("kairox.activation", 4, 1, None),
    ("kairox.down_dense_share", 6, math.nan, None), ("kairox.down_dense_share", 6, 2.0, None),
    ("kairox.down_dense_share", 6, -math.inf, None), ("kairox.sparsity", 6, math.nan, None),
    ("kairox.sparsity", 6, 1.0, None), ("kairox.predictor.down_scale", 6, math.nan, None),
    ("kairox.predictor.down_scale", 6, -1.0, None), ("kairox.predictor.down_scale", 6, math.inf, None),
    ("kairox.mode", T_STRING, "threshold", None), ("kairox.mode", T_STRING, "cats", None),
    ("kairox.group_size", 4, 0, None), ("kairox.group_size", 4, 7, None), ("kairox.group_size", 4, 2**31, None),
    ("kairox.format_version", 4, 2, None), ("kairox.predictor.rank", T_ARRAY, [7] * 4, 5),
    ("kairox.predictor.rank", T_ARRAY, [-1] * 4, 5), ("kairox.predictor.rank", T_ARRAY, [64] * 4, 5),
    ("tokenizer.ggml.merges", T_ARRAY, ["a b", "x", ""], T_STRING), ("tokenizer.ggml.pre", T_STRING, "zzz", None),
    ("tokenizer.chat_template", T_STRING, "{% for %}", None), ("tokenizer.ggml.padding_token_id", 4, 99999, None),
    ("tokenizer.ggml.add_bos_token", 7, 1, None), ("general.architecture", T_STRING, "llama", None),
)


def m_kv_struct(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    op = rng.choice(("remove", "remove", "duplicate", "add", "add", "add", "reencode"))
    if op == "remove":
        kv = _weighted_kv(rng, lay)
        keep = rng.random() < 0.2  # the count left as it was: the parser reads past the KVs
        return (splice(lay, kv.start, kv.end, b"", (0, 0 if keep else -1)),
                f"remove KV {kv.key}" + (" (n_kv kept)" if keep else ""))
    if op == "duplicate":
        kv = _weighted_kv(rng, lay)
        raw = seed.data[kv.start:kv.end]
        return splice(lay, kv.end, kv.end, raw, (0, 1)), f"duplicate KV {kv.key}"
    if op == "add":
        key, vt, val, et = rng.choice(NEW_KVS)
        if vt == T_ARRAY and et != T_STRING and len(val) == 4:
            val = val[:1] * _n_layer(lay)
        at = lay.kv_end if rng.random() < 0.7 else lay.kvs[0].start
        return splice(lay, at, at, _enc_kv(key, vt, val, et), (0, 1)), f"add KV {key} ({vt}) = {val!r}"
    kv = _pick_kv(rng, lay, ("kairox.", "general.architecture", "tokenizer.ggml.model"))
    if kv.vtype == T_ARRAY and kv.elem_type != T_STRING:
        n = rng.choice((0, 1, len(kv.value) - 1, len(kv.value) + 1, 3 * len(kv.value)))
        vals = (list(kv.value) * 4)[:n] if kv.value else [0] * n
        new = _enc_value(T_ARRAY, vals, kv.elem_type)
        return splice(lay, kv.value_off, kv.end, new), f"{kv.key}: array of {len(kv.value)} -> {n} entries"
    vt = rng.choice((4, 5, 6, 7, 8, 10, 12))
    new_val: Any = rng.choice(("predictor", "x", "")) if vt == T_STRING else (
        rng.choice(FLOATS) if vt in FLOAT_TYPES else rng.choice((0, 1, 32, 2**31 - 1)))
    new = struct.pack("<I", vt) + _enc_value(vt, new_val)
    return splice(lay, kv.type_off, kv.end, new), f"{kv.key}: re-encoded as type {vt} = {new_val!r}"


def _n_layer(lay: Layout) -> int:
    kv = next((k for k in lay.kvs if k.key.endswith(".block_count")), None)
    return int(kv.value) if kv else 4


def _set_string(lay: Layout, kv: KV, s: str | bytes) -> list[Patch]:
    """Patches that make a string KV `s` (in place when the length is the same)."""
    b = s.encode() if isinstance(s, str) else s
    st, e = kv.elems[0]
    if len(b) == e - st - 8:
        return [(st + 8, e, b)]
    return splice(lay, st, e, _enc_str(b))


def m_kairox_meta(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    kx = [k for k in lay.kvs if k.key.startswith("kairox.")]
    if not kx:
        raise Skip
    kv = rng.choice(kx)
    if kv.key == "kairox.mode":
        name = rng.choice(("threshold", "cats", "dense", "", "predictorx", "PREDICTOR", "pred\0ctor", "hybrid"))
        return _set_string(lay, kv, name), f"kairox.mode -> {name!r}"
    if kv.vtype == T_ARRAY and kv.elem_type is not None and kv.elems and kv.elem_type != T_STRING:
        if rng.random() < 0.3:
            return m_kv_struct_reencode(rng, lay, kv)
        picks = ((-1, 0, 1, 31, 33, 256, 768, 769, 2**31 - 1, -2**31) if kv.elem_type in (4, 5, 10, 11)
                 else FLOATS)
        v = rng.choice(picks)
        idx = range(len(kv.elems)) if rng.random() < 0.3 else [rng.randrange(len(kv.elems))]
        new = _enc_value(kv.elem_type, v)
        return [(kv.elems[i][0], kv.elems[i][1], new) for i in idx], f"{kv.key}[{list(idx)}] -> {v}"
    if kv.vtype == T_STRING:
        name = rng.choice(("relu", "silu", "gelu", "", "xx", "relu\0"))
        return _set_string(lay, kv, name), f"{kv.key} -> {name!r}"
    if kv.vtype in SCALAR_FMT:
        s, e = kv.elems[0]
        new = _interesting(rng, kv.vtype, kv.value)
        return [(s, e, new)], f"{kv.key}: {kv.value} -> {_show(kv.vtype, new)}"
    raise Skip


def m_kv_struct_reencode(rng: random.Random, lay: Layout, kv: KV) -> Mut:
    n = rng.choice((0, 1, len(kv.value) - 1, len(kv.value) + 1, 2 * len(kv.value)))
    vals = (list(kv.value) * 4)[:n]
    return splice(lay, kv.value_off, kv.end, _enc_value(T_ARRAY, vals, kv.elem_type)), \
        f"{kv.key}: array of {len(kv.value)} -> {n} entries"


def m_hparams(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    arch = lay.kv("general.architecture")
    if arch is not None and rng.random() < 0.15:
        name = rng.choice(("opt", "llama", "falcon", "gemma2", "qwen3", "bert", "", "xx", "mamba"))
        return _set_string(lay, arch, name), f"general.architecture -> {name!r}"
    prefix = f"{arch.value}." if arch is not None else "llama."
    kv = _pick_kv(rng, lay, (prefix,))
    if kv.vtype in SCALAR_FMT:
        s, e = kv.elems[0]
        new = _interesting(rng, kv.vtype, kv.value)
        return [(s, e, new)], f"{kv.key}: {kv.value} -> {_show(kv.vtype, new)}"
    raise Skip


def m_tokenizer(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    toks = lay.kv("tokenizer.ggml.tokens")
    if toks is None:
        raise Skip
    op = rng.choice(("dup", "dup", "types", "scores", "ids", "model", "shrink", "empty"))
    if op == "dup":
        n = len(toks.value)
        # same-length pairs (byte tokens, filler words) are copied in place
        i = rng.randrange(3, n)
        same = [j for j in range(n) if j != i and len(toks.value[j]) == len(toks.value[i])]
        j = rng.choice(same) if same and rng.random() < 0.8 else rng.randrange(n)
        si, ei = toks.elems[i]
        sj, ej = toks.elems[j]
        raw = seed.data[sj:ej]
        if ei - si == ej - sj:
            return [(si, ei, raw)], f"token {i} {toks.value[i]!r} -> copy of token {j} {toks.value[j]!r}"
        return splice(lay, si, ei, raw), f"token {i} {toks.value[i]!r} -> copy of token {j} {toks.value[j]!r}"
    if op == "types":
        kv = lay.kv("tokenizer.ggml.token_type")
        if kv is None or kv.elem_type is None:
            raise Skip
        i = rng.randrange(len(kv.elems))
        v = rng.choice((0, 7, 99, -1, 2**31 - 1, 3, 6))
        s, e = kv.elems[i]
        return [(s, e, _enc_value(kv.elem_type, v))], f"token_type[{i}] -> {v}"
    if op == "scores":
        kv = lay.kv("tokenizer.ggml.scores")
        if kv is None or kv.elem_type is None:
            raise Skip
        fv = rng.choice((math.nan, math.inf, -math.inf, 1e30))
        idx = range(len(kv.elems)) if rng.random() < 0.3 else [rng.randrange(len(kv.elems))]
        return [(kv.elems[i][0], kv.elems[i][1], _enc_value(kv.elem_type, fv)) for i in idx], \
            f"scores[{len(list(idx))} entries] -> {fv}"
    if op == "ids":
        kv = _pick_kv(rng, lay, ("tokenizer.ggml.bos", "tokenizer.ggml.eos", "tokenizer.ggml.unk"))
        v = rng.choice((-1, len(toks.value), len(toks.value) + 1, 2**31 - 1, 2**32 - 1, 2**31))
        s, e = kv.elems[0]
        return [(s, e, _enc_value(kv.vtype, v))], f"{kv.key} -> {v}"
    if op == "model":
        kv = lay.kv("tokenizer.ggml.model")
        if kv is None:
            raise Skip
        name = rng.choice(("gpt2", "bert", "t5", "rwkv", "plamo2", "none", "no_vocab", "", "zzz", "ugm"))
        return _set_string(lay, kv, name), f"tokenizer.ggml.model -> {name!r}"
    if op == "shrink":
        k = rng.choice((1, 2, 10, 200, len(toks.value) - 1, len(toks.value)))
        start = toks.elems[len(toks.elems) - k][0]
        new_count = struct.pack("<Q", len(toks.value) - k)
        p = splice(lay, start, toks.end, b"")
        assert toks.count_off is not None
        return p + [(toks.count_off, toks.count_off + 8, new_count)], f"tokens: last {k} removed"
    i = rng.randrange(len(toks.elems))
    s, e = toks.elems[i]
    return splice(lay, s, e, _enc_str(b"")), f"token {i} {toks.value[i]!r} -> ''"


def _pick_tensor(rng: random.Random, lay: Layout) -> TensorInfo:
    kx = [t for t in lay.tensors if ".kx_" in t.name or "ffn_down_t" in t.name]
    if kx and rng.random() < 0.5:
        return rng.choice(kx)
    return rng.choice(lay.tensors)


GGML_TYPES = (0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
              25, 26, 27, 28, 29, 30, 31, 34, 35, 36, 39, 40, 41, 99, 2**31, 2**32 - 1)


def m_tensor_info(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    t = _pick_tensor(rng, lay)
    op = rng.choice(("dim", "dim", "ndim", "type", "type", "offset", "offset", "rename", "remove", "duplicate"))
    if op == "dim":
        i = rng.randrange(len(t.dims))
        d = t.dims[i]
        v = rng.choice((0, 1, d - 1, d + 1, d * 2, d // 2, 32, 2**32, 2**62, 2**63, 2**64 - 1))
        off = t.ndim_off + 4 + 8 * i
        return [(off, off + 8, struct.pack("<Q", v & (2**64 - 1)))], f"{t.name}: dim {i} {d} -> {v}"
    if op == "ndim":
        v = rng.choice((0, 1, 2, 3, 4, 5, 255, 2**32 - 1))
        return [(t.ndim_off, t.ndim_off + 4, struct.pack("<I", v))], f"{t.name}: n_dims {len(t.dims)} -> {v}"
    if op == "type":
        v = rng.choice(GGML_TYPES)
        return [(t.type_off, t.type_off + 4, struct.pack("<I", v))], f"{t.name}: type {t.ggml_type} -> {v}"
    if op == "offset":
        other = rng.choice(lay.tensors)
        v = rng.choice((t.rel_offset + 1, t.rel_offset + lay.alignment, t.rel_offset - lay.alignment,
                        other.rel_offset, lay.size - lay.data_start, lay.size, 2**40, 2**63, 2**64 - 1,
                        (lay.size - lay.data_start) - lay.alignment))
        return ([(t.offset_off, t.offset_off + 8, struct.pack("<Q", v & (2**64 - 1)))],
                f"{t.name}: offset {t.rel_offset} -> {v}")
    if op == "rename":
        other = rng.choice(lay.tensors)
        name = rng.choice((other.name, "blk.99.kx_perm", "blk.3.kx_perm", "blk.0.kx_group_freq",
                           "blk.1.ffn_down_t.weight", "", "output.weight", "blk.0.kx_pred_up.weight"))
        return splice(lay, t.start, t.ndim_off, _enc_str(name)), f"{t.name}: renamed {name!r}"
    if op == "remove":
        return splice(lay, t.start, t.end, b"", (-1, 0)), f"tensor info {t.name} removed"
    raw = seed.data[t.start:t.end]
    return splice(lay, t.end, t.end, raw, (1, 0)), f"tensor info {t.name} duplicated"


def _f16_nan_scales(rng: random.Random, t: TensorInfo) -> Mut:
    """NaN/inf in the f16 block scales of a Q4_0/Q8_0 tensor, or in an F16/F32 tensor."""
    if t.ggml_type in (2, 8):  # Q4_0, Q8_0: a block starts with its f16 scale
        bsize = 18 if t.ggml_type == 2 else 34
        n_blocks = t.nbytes // bsize
        v = rng.choice((b"\x00\x7e", b"\x00\x7c", b"\x00\xfc", b"\xff\x7b"))
        blocks = range(n_blocks) if rng.random() < 0.2 else rng.sample(range(n_blocks), min(4, n_blocks))
        return [(t.data_start + b * bsize, t.data_start + b * bsize + 2, v) for b in blocks], \
            f"{t.name}: {len(blocks)} block scales -> {v.hex()}"
    if t.ggml_type in (0, 1):
        w = 4 if t.ggml_type == 0 else 2
        fv = rng.choice(FLOATS)
        with np.errstate(over="ignore"):  # 1e30 as float16 is inf: wanted
            raw = struct.pack("<f", fv) if w == 4 else np.float16(fv).tobytes()
        n = t.nbytes // w
        idx = range(n) if rng.random() < 0.3 else rng.sample(range(n), min(3, n))
        return [(t.data_start + i * w, t.data_start + (i + 1) * w, raw) for i in idx], \
            f"{t.name}: {len(idx)} values -> {fv}"
    raise Skip


def m_tensor_data(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    perms = [t for t in lay.tensors if t.name.endswith(("kx_perm", "kx_perm_inv"))]
    freqs = [t for t in lay.tensors if t.name.endswith("kx_group_freq")]
    biases = [t for t in lay.tensors if ".kx_pred" in t.name and t.name.endswith(".bias")]
    mats = [t for t in lay.tensors if ".kx_pred" in t.name and t.name.endswith(".weight")
            or "ffn_down_t" in t.name]
    r = rng.random()
    if perms and r < 0.45:
        t = rng.choice(perms)
        n = t.nbytes // 4
        op = rng.choice(("dup", "range", "range", "swap", "zero"))
        if op == "dup":
            i, j = rng.sample(range(n), 2)
            v = struct.unpack_from("<i", seed.data, t.data_start + 4 * j)[0]
            return [(t.data_start + 4 * i, t.data_start + 4 * i + 4, struct.pack("<i", v))], \
                f"{t.name}[{i}] -> {v} (a duplicate of [{j}])"
        if op == "range":
            i = rng.randrange(n)
            v = rng.choice((n, n + 1, -1, 2**31 - 1, -2**31, 4 * n))
            return [(t.data_start + 4 * i, t.data_start + 4 * i + 4, struct.pack("<i", v))], f"{t.name}[{i}] -> {v}"
        if op == "swap":
            i, j = rng.sample(range(n), 2)
            a = seed.data[t.data_start + 4 * i:t.data_start + 4 * i + 4]
            b = seed.data[t.data_start + 4 * j:t.data_start + 4 * j + 4]
            return [(t.data_start + 4 * i, t.data_start + 4 * i + 4, b),
                    (t.data_start + 4 * j, t.data_start + 4 * j + 4, a)], \
                f"{t.name}: [{i}] and [{j}] swapped (inverse no longer matches)"
        return [(t.data_start, t.data_start + t.nbytes, bytes(t.nbytes))], f"{t.name}: all zero"
    if freqs and r < 0.65:
        t = rng.choice(freqs)
        v = rng.choice((math.nan, -1.0, math.inf, -math.inf, 1e30, 2.0, -0.0))
        n = t.nbytes // 4
        idx = range(n) if rng.random() < 0.4 else [rng.randrange(n)]
        return [(t.data_start + 4 * i, t.data_start + 4 * i + 4, struct.pack("<f", v)) for i in idx], \
            f"{t.name}: {len(idx)} entries -> {v}"
    if biases and r < 0.85:
        t = rng.choice(biases)
        return _f16_nan_scales(rng, t)
    pool = mats or list(lay.tensors)
    return _f16_nan_scales(rng, rng.choice(pool))


def m_truncate(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    region = rng.choice(("header", "kv", "kv", "ti", "data", "data", "end"))
    lo, hi = {"header": (0, 24), "kv": (24, lay.kv_end), "ti": (lay.kv_end, lay.data_start),
              "data": (lay.data_start, lay.size), "end": (lay.size - 64, lay.size)}[region]
    cut = rng.randrange(lo, hi)
    return [(cut, lay.size, b"")], f"truncated at {cut} of {lay.size} ({region})"


def m_byteflip(rng: random.Random, seed: GgufSeed) -> Mut:
    lay = seed.layout
    n = rng.choice((1, 1, 2, 4, 8, 16))
    hi = lay.data_start if rng.random() < 0.75 else lay.size
    offs = sorted(set(rng.randrange(4, hi) for _ in range(n)))  # the magic is checked in Python
    patches = []
    for o in offs:
        b = seed.data[o]
        how = rng.random()
        nb = (b ^ (1 << rng.randrange(8)) if how < 0.5 else rng.choice((0, 0xFF, 0x7F, 0x80, 0x01))
              if how < 0.8 else rng.randrange(256))
        patches.append((o, o + 1, bytes([nb])))
    return patches, f"{len(patches)} byte(s) changed at {offs[:8]}"


GGUF_MUTATORS: dict[str, Callable[[random.Random, GgufSeed], Mut]] = {
    "header": m_header, "kv_value": m_kv_value, "kv_type": m_kv_type, "kv_struct": m_kv_struct,
    "kairox_meta": m_kairox_meta, "hparams": m_hparams, "tokenizer": m_tokenizer,
    "tensor_info": m_tensor_info, "tensor_data": m_tensor_data, "truncate": m_truncate,
    "byteflip": m_byteflip,
}


# ---------------------------------------------------------------------------------------
# directory mutators: each returns ({file: change}, description); a change is
# {"patches": [...]} (byte patches of the seed's file), {"content": hex}, {"delete": true}
# or {"dir": true}
# ---------------------------------------------------------------------------------------
DirMut = tuple[dict[str, dict[str, Any]], str]
JSON_FILES = ("meta.json", "workload.json")
WEIRD_VALUES: tuple[Any, ...] = (None, -1, 0, 1, 2**31, 2**63, 10**30, 1e308, math.nan, math.inf, "", "x",
                                 "1", [], {}, True, False, [1, 2], -0.5, 3.5, [[0]], {"a": 1})


def _json_paths(v: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _json_paths(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v[:8]):
            yield from _json_paths(x, path + (i,))


def _json_files(seed: DirSeed) -> list[str]:
    return [f for f in JSON_FILES if f in seed.files]


def d_json_value(rng: random.Random, seed: DirSeed) -> DirMut:
    name = rng.choice(_json_files(seed))
    doc = json.loads(seed.files[name])
    paths = [p for p in _json_paths(doc) if p]
    top = [p for p in paths if len(p) == 1 and not isinstance(doc[p[0]], (dict, list))]
    path = rng.choice(top if top and rng.random() < 0.6 else paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    old = parent[path[-1]]
    choices = list(WEIRD_VALUES)
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        choices += [old * 2, old + 1, -old, str(old)]
    new = rng.choice(choices)
    parent[path[-1]] = new
    where = ".".join(map(str, path))
    return {name: {"content": json.dumps(doc).encode().hex()}}, f"{name}: {where} {old!r:.40} -> {new!r}"


def d_json_struct(rng: random.Random, seed: DirSeed) -> DirMut:
    name = rng.choice(_json_files(seed))
    raw = seed.files[name]
    doc = json.loads(raw)
    op = rng.choice(("delete", "delete", "add", "toplevel", "truncate", "bytes", "nested"))
    if op == "delete":
        k = rng.choice(list(doc))
        del doc[k]
        return {name: {"content": json.dumps(doc).encode().hex()}}, f"{name}: key {k!r} removed"
    if op == "add":
        doc[rng.choice(("extra", "n_ff", "version", "__class__", ""))] = rng.choice(WEIRD_VALUES)
        return {name: {"content": json.dumps(doc).encode().hex()}}, f"{name}: a key added"
    if op == "toplevel":
        new = rng.choice(([], [doc], 1, "x", None, math.nan, [1, 2, 3]))
        return {name: {"content": json.dumps(new).encode().hex()}}, f"{name}: top level -> {new!r:.40}"
    if op == "truncate":
        cut = rng.randrange(len(raw))
        return {name: {"patches": patches_to_json([(cut, len(raw), b"")])}}, f"{name}: truncated at {cut}"
    if op == "bytes":
        o = rng.randrange(len(raw))
        b = rng.choice((b"\xff", b"\x00", b"\xc3", b"}", b"\"", b"9"))
        return {name: {"patches": patches_to_json([(o, o + 1, b)])}}, f"{name}: byte {o} -> {b!r}"
    paths = [p for p in _json_paths(doc) if p and isinstance(_get(doc, p), dict)]
    if not paths:
        raise Skip
    p = rng.choice(paths)
    d = _get(doc, p)
    if d:
        k = rng.choice(list(d))
        del d[k]
    return {name: {"content": json.dumps(doc).encode().hex()}}, f"{name}: {'.'.join(map(str, p))} lost a key"


def _get(doc: Any, path: Sequence[Any]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _npy_files(seed: DirSeed) -> list[str]:
    return [f for f in seed.files if f.endswith(".npy")]


def _npy_header(raw: bytes) -> tuple[int, dict[str, Any]]:
    """(data offset, header dict) of a version 1/2 .npy."""
    import ast

    major = raw[6]
    if major == 1:
        hlen, hstart = struct.unpack_from("<H", raw, 8)[0], 10
    else:
        hlen, hstart = struct.unpack_from("<I", raw, 8)[0], 12
    return hstart + hlen, ast.literal_eval(raw[hstart:hstart + hlen].decode("latin1"))


def _npy_header_bytes(h: dict[str, Any], raw_text: str | None = None) -> bytes:
    text = raw_text if raw_text is not None else repr(h)
    text += " " * ((-(10 + len(text) + 1)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def d_npy_header(rng: random.Random, seed: DirSeed) -> DirMut:
    name = rng.choice(_npy_files(seed))
    raw = seed.files[name]
    off, h = _npy_header(raw)
    op = rng.choice(("descr", "descr", "shape", "shape", "fortran", "text", "magic"))
    if op == "descr":
        h["descr"] = rng.choice(("<f4", "<f2", "<i4", "|u1", "<u2", "|b1", "<f8", ">f4", "|O", "<c8",
                                 "|V8", "<U4", "<i8", "|i1", "<M8[s]"))
        what = f"dtype -> {h['descr']}"
    elif op == "shape":
        shape = list(h["shape"])
        r = rng.random()
        if r < 0.3 and shape:
            shape[rng.randrange(len(shape))] = rng.choice((0, 1, 2**40, 2**31))
        elif r < 0.5:
            shape = shape[:-1]
        elif r < 0.7:
            shape = shape + [1]
        elif r < 0.85 and shape:
            i = rng.randrange(len(shape))
            shape[i] = max(shape[i] + rng.choice((-1, 1, -8, 8)), 0)
        else:
            shape = []
        h["shape"] = tuple(shape)
        what = f"shape -> {h['shape']}"
    elif op == "fortran":
        h["fortran_order"] = not h["fortran_order"]
        what = f"fortran_order -> {h['fortran_order']}"
    elif op == "text":
        text = repr(h)
        text = rng.choice((text.replace("'shape'", "'shap'"), text[: len(text) // 2], "{}", "[1]",
                           text.replace("(", "[").replace(")", "]"), text.replace("False", "'no'"),
                           "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
                           "__import__('os')"))
        return {name: {"patches": patches_to_json([(0, off, _npy_header_bytes(h, text))])}}, \
            f"{name}: header text -> {text[:60]!r}"
    else:
        new = rng.choice((b"\x93NUMPX", b"\x93NUMPY\x09\x00", b"\x93NUMPY\x03\x00", b"\x93NUMPY\x02\x00"))
        return {name: {"patches": patches_to_json([(0, len(new), new)])}}, f"{name}: magic -> {new!r}"
    return {name: {"patches": patches_to_json([(0, off, _npy_header_bytes(h))])}}, f"{name}: {what}"


def d_npy_data(rng: random.Random, seed: DirSeed) -> DirMut:
    name = rng.choice(_npy_files(seed))
    raw = seed.files[name]
    off, h = _npy_header(raw)
    op = rng.choice(("truncate", "values", "values", "empty", "extra"))
    if op == "truncate" or len(raw) == off:
        cut = rng.randrange(0, len(raw))
        return {name: {"patches": patches_to_json([(cut, len(raw), b"")])}}, f"{name}: truncated at {cut}"
    if op == "empty":
        return {name: {"content": ""}}, f"{name}: empty file"
    if op == "extra":
        return {name: {"patches": patches_to_json([(len(raw), len(raw), b"\0" * rng.choice((1, 7, 4096)))])}}, \
            f"{name}: trailing bytes"
    dt = np.dtype(h["descr"])
    n = (len(raw) - off) // dt.itemsize
    if dt.kind == "f":
        v = rng.choice((math.nan, math.inf, -math.inf, -1.0, 1e30, 65504.0, -0.0))
    elif dt.kind in "iu":
        v = rng.choice((-1, -5, 2**31 - 1, 255, 0, 10**6))
    else:
        raise Skip
    with np.errstate(over="ignore"):  # 1e30 as float16 is inf: wanted
        b = np.array([v]).astype(dt).tobytes() if dt.kind == "f" else \
            np.array([v], dtype=np.int64).astype(dt).tobytes()
    idx = range(n) if rng.random() < 0.3 else rng.sample(range(n), min(n, 5))
    return {name: {"patches": patches_to_json([(off + i * dt.itemsize, off + (i + 1) * dt.itemsize, b)
                                               for i in idx])}}, f"{name}: {len(idx)} values -> {v}"


def d_files(rng: random.Random, seed: DirSeed) -> DirMut:
    name = rng.choice(list(seed.files))
    op = rng.choice(("delete", "delete", "dir", "garbage", "swap"))
    if op == "delete":
        return {name: {"delete": True}}, f"{name} deleted"
    if op == "dir":
        return {name: {"dir": True}}, f"{name} replaced by a directory"
    if op == "garbage":
        g = rng.choice((b"garbage\n", b"\x93NUMPY", b"{", b"\0" * 128))
        return {name: {"content": g.hex()}}, f"{name} -> {g[:10]!r}"
    other = rng.choice([f for f in seed.files if f != name] or [name])
    return {name: {"content": seed.files[other].hex()}}, f"{name} -> a copy of {other}"


DIR_MUTATORS: dict[str, Callable[[random.Random, DirSeed], DirMut]] = {
    "json_value": d_json_value, "json_struct": d_json_struct, "npy_header": d_npy_header,
    "npy_data": d_npy_data, "files": d_files,
}


def write_dir_mutant(seed: DirSeed, changes: dict[str, dict[str, Any]], dst: Path) -> None:
    """The seed's directory with `changes` applied, at dst (replaced)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name, data in seed.files.items():
        ch = changes.get(name)
        if ch is None:
            (dst / name).write_bytes(data)
        elif ch.get("dir"):
            (dst / name).mkdir()
        elif ch.get("delete"):
            continue
        elif "content" in ch:
            (dst / name).write_bytes(bytes.fromhex(ch["content"]))
        else:
            (dst / name).write_bytes(apply_patches(data, patches_from_json(ch["patches"])))


# ---------------------------------------------------------------------------------------
# mutants
# ---------------------------------------------------------------------------------------
@dataclass
class Mutant:
    """One mutant: its recipe (seed + patches), kept as JSON, and where it was written."""

    index: int
    target: str  # gguf | trace | workload | profile
    kind: str
    seed: str
    desc: str
    patches: list[Patch] = field(default_factory=list)  # gguf
    changes: dict[str, dict[str, Any]] = field(default_factory=dict)  # directories

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"target": self.target, "kind": self.kind, "seed": self.seed, "desc": self.desc}
        if self.target == "gguf":
            d["patches"] = patches_to_json(self.patches)
        else:
            d["changes"] = self.changes
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], index: int = 0) -> Mutant:
        return cls(index, d["target"], d["kind"], d["seed"], d.get("desc", ""),
                   patches_from_json(d.get("patches", [])), d.get("changes", {}))


def make_gguf_mutant(rng: random.Random, index: int, kind: str, seeds: Sequence[GgufSeed]) -> Mutant:
    """Mutant `index` of `kind`, drawn with rng (a mutator that does not apply to the drawn seed
    is tried on another)."""
    for _ in range(50):
        seed = rng.choice(seeds)
        try:
            patches, desc = GGUF_MUTATORS[kind](rng, seed)
        except (Skip, ValueError, IndexError):
            continue
        return Mutant(index, "gguf", kind, seed.name, desc, patches)
    raise RuntimeError(f"mutator {kind} applies to no seed")


def make_dir_mutant(rng: random.Random, index: int, target: str, kind: str,
                    seeds: Sequence[DirSeed]) -> Mutant:
    pool = [s for s in seeds if s.target == target]
    for _ in range(50):
        seed = rng.choice(pool)
        try:
            changes, desc = DIR_MUTATORS[kind](rng, seed)
        except (Skip, ValueError, IndexError, KeyError):
            continue
        return Mutant(index, target, kind, seed.name, desc, changes=changes)
    raise RuntimeError(f"mutator {kind} applies to no {target} seed")


def mutant_rng(seed: int, target: str, index: int) -> random.Random:
    """The generator of one mutant: independent of every other mutant's draws."""
    return random.Random(f"{seed}:{target}:{index}")


def plan_mutants(seed: int, count: int, dir_count: int, gseeds: Sequence[GgufSeed],
                 dseeds: Sequence[DirSeed], gguf_kinds: Sequence[str] = GGUF_KINDS,
                 dir_kinds: Sequence[str] = DIR_KINDS) -> Iterator[Mutant]:
    """count GGUF mutants (kinds in turn) then dir_count directory mutants (targets and kinds
    in turn), each from its own generator."""
    for i in range(count):
        yield make_gguf_mutant(mutant_rng(seed, "gguf", i), i, gguf_kinds[i % len(gguf_kinds)], gseeds)
    targets = sorted({s.target for s in dseeds}, key=DIR_TARGETS.index)
    for i in range(dir_count):
        target = targets[i % len(targets)]
        kind = dir_kinds[(i // len(targets)) % len(dir_kinds)]
        yield make_dir_mutant(mutant_rng(seed, "dir", i), count + i, target, kind, dseeds)


# ---------------------------------------------------------------------------------------
# the worker: runs ops one after another, answers on its own pipe
# ---------------------------------------------------------------------------------------
def _traceback_summary(e: BaseException) -> str:
    """The exception and its innermost frame in kairox_py (or the innermost at all)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "kairox_py" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno} {ours[-1].name}" if ours else "?"
    return f"{type(e).__name__} at {where}: {str(e)[:200]}"


def run_op(op: dict[str, Any], cache: dict[str, Any]) -> dict[str, str]:
    """Load one mutant as the library's users do; {"outcome": refused|ok|traceback, "detail"}.
    cache keeps per-worker objects that do not change between mutants (the profile's model)."""
    from kairox_py.errors import KairoxError

    try:
        detail = _OPS[op["target"]](op, cache)
        return {"outcome": "ok", "detail": detail}
    except KairoxError as e:
        return {"outcome": "refused", "detail": str(e).splitlines()[0][:300] if str(e) else ""}
    except Exception as e:  # anything else is a bug in a reader: reported, not raised
        return {"outcome": "traceback", "detail": _traceback_summary(e)}


def _op_gguf(op: dict[str, Any], cache: dict[str, Any]) -> str:
    from kairox_py.llama import Model

    with Model(op["path"]) as m:
        with m.session(n_ctx=64, n_batch=32, n_threads=1) as s:
            toks = m.tokenize("hello world", add_special=True)[:16] or [0]
            s.decode(toks)
            out = []
            for _ in range(3):
                t = int(np.argmax(s.logits()))
                out.append(t)
                s.decode([t])
            m.detokenize(out)
            return f"{s.mode}, {len(toks)}+3 tokens"


def _op_trace(op: dict[str, Any], cache: dict[str, Any]) -> str:
    from kairox_py.sim.traces import Trace
    from kairox_py.workload.stats import measure

    tr = Trace(op["path"])
    _read_trace(tr)
    st = measure(tr)
    return f"trace {tr.n_seq}x{tr.n_steps}, {len(st.summary())} stats"


def _read_trace(tr: Any) -> None:
    """What `kairox simulate` reads of a trace: every kind's masks and group counts."""
    for kind in tr.kinds():
        tr.bits(0, kind)
        tr.mask(0, kind)
        tr.group_counts(0, kind, max(int(tr.meta.group_size), 1))


def _op_workload(op: dict[str, Any], cache: dict[str, Any]) -> str:
    from kairox_py.workload.stats import measure
    from kairox_py.workload.write import open_workload, workload_info

    tr, params = open_workload(op["path"])
    _read_trace(tr)
    measure(tr)
    workload_info(op["path"]).get("expected", {})
    return f"workload {params.preset} {tr.n_seq}x{tr.n_steps}"


def _op_profile(op: dict[str, Any], cache: dict[str, Any]) -> str:
    """What `kairox convert --profile DIR` does with the directory before training."""
    from kairox_py.errors import KairoxError
    from kairox_py.offline.convert import open_input
    from kairox_py.offline.corpus import Corpus
    from kairox_py.offline.profile import magnitude_quantile, open_or_run_profile

    model = Path(op["model"])
    key = f"input:{model}"
    if key not in cache:
        cache[key] = open_input(model)
    inp = cache[key]
    d = Path(op["path"])
    if not d.exists():  # open_or_run_profile would profile into it: not what is fuzzed
        raise KairoxError("no profile directory")
    prof, reused = open_or_run_profile(model, Corpus("fuzz", "fuzz"), d, n_tokens=64, ctx=64)
    if not reused:
        raise RuntimeError("the profile was run, not read")
    if (prof.meta.n_layer, prof.meta.n_embd, prof.meta.n_ff) != (inp.n_layer, inp.n_embd, inp.n_ff):
        raise KairoxError("profile does not match the model's dimensions")
    thr = prof.thresholds(0.5)
    for il in range(prof.n_layer):
        magnitude_quantile(prof.magnitude(il), 0.5)
        prof.mask(il, float(thr[il])).mean(axis=0)
        np.asarray(prof.predictor_input(il), dtype=np.float32)
    return f"profile {prof.n_layer} layers x {prof.n_tokens} tokens"


_OPS: dict[str, Callable[[dict[str, Any], dict[str, Any]], str]] = {
    "gguf": _op_gguf, "trace": _op_trace, "workload": _op_workload, "profile": _op_profile}


def worker_main() -> None:
    """Serve ops from stdin (one JSON per line) until EOF; answers go to a private copy of
    stdout so that whatever the library prints cannot corrupt them (fd 1 joins stderr)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cache: dict[str, Any] = {}
    from kairox_py import _lib
    _lib.lib()  # load the library before the first op: a broken build fails here, not per mutant
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        op = json.loads(line)
        print(f"=== op {op.get('index')}", file=sys.stderr, flush=True)
        res = run_op(op, cache)
        sys.stderr.flush()
        proto.write(json.dumps(res) + "\n")


# ---------------------------------------------------------------------------------------
# the parent: one worker, restarted after a crash or hang
# ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    outcome: str
    detail: str
    stderr: str
    seconds: float
    signal: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in BAD


def _preload_for(lib: Path) -> str:
    """The sanitizer runtimes `lib` links (ldd), for LD_PRELOAD into a Python host."""
    try:
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    libs = re.findall(r"=>\s*(\S*lib(?:asan|ubsan|hwasan|tsan)\S*)", out)
    return ":".join(dict.fromkeys(libs))


def worker_env(lib: Path | None = None, preload: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env["GGML_NO_BACKTRACE"] = "1"  # ggml would attach gdb to itself on an abort
    env.pop("KAIROX_VERBOSE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if lib is not None:
        env["KAIROX_LIB"] = str(lib)
        if preload == "auto":
            preload = _preload_for(lib)
    if preload:
        env["LD_PRELOAD"] = preload
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    return env


class Worker:
    """One worker subprocess and its stderr file; `run` sends one op and waits for the answer
    or the worker's death or the timeout (then the worker is killed)."""

    def __init__(self, env: dict[str, str], stderr_path: Path, timeout: float) -> None:
        self.env, self.stderr_path, self.timeout = env, stderr_path, timeout
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def _start(self) -> None:
        self.err = open(self.stderr_path, "w+b")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     env=self.env, text=True, bufsize=1, start_new_session=True)
        self.starts += 1
        line = self._read_line(120.0)
        if line is None or "ready" not in line:
            err = self._stderr(0)[-2000:]
            self.close()
            raise RuntimeError(f"the worker did not start: {err}")

    def _read_line(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        return self.proc.stdout.readline()

    def _stderr(self, start: int) -> str:
        self.err.flush()
        with open(self.stderr_path, "rb") as f:
            f.seek(start)
            return f.read(64 * 1024).decode("utf-8", errors="replace")

    def run(self, op: dict[str, Any]) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        start = os.fstat(self.err.fileno()).st_size
        t0 = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps(op) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read_line(self.timeout)
        secs = time.monotonic() - t0
        if line:
            res = json.loads(line)
            err = _strip_marker(self._stderr(start))
            outcome = "sanitizer" if SANITIZER_RE.search(err) else res["outcome"]
            return Outcome(outcome, res["detail"], err, secs)
        if line is None:  # timeout: the worker hangs
            self._kill()
            err = _strip_marker(self._stderr(start))
            self.close()
            return Outcome("hang", f"no answer in {self.timeout:.0f} s", err, secs)
        rc = self.proc.wait()
        err = _strip_marker(self._stderr(start))
        self.close()
        if rc < 0:
            sig = signal.Signals(-rc).name
        else:
            sig = f"exit {rc}"
        outcome = "sanitizer" if SANITIZER_RE.search(err) else "crash"
        return Outcome(outcome, sig, err, secs, sig)

    def _kill(self) -> None:
        """SIGKILL the worker's process group (it runs in a session of its own) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        """End the worker (EOF on its input; killed if it does not exit) and its stderr file."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._kill()
        self.proc = None
        self.err.close()


def _strip_marker(err: str) -> str:
    return "\n".join(line for line in err.splitlines() if not line.startswith("=== op "))


def reason_line(stderr: str) -> str:
    """The stderr line that best says why the process failed ('' if none)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for rx in REASON_RES:
        for ln in lines:
            if rx.match(ln):
                return ln
    return ""


def normalize(line: str) -> str:
    """A stderr line without what varies between mutants: directories, addresses, numbers
    (but a file's line number stays)."""
    line = re.sub(r"(/[\w.+-]+)+/([\w.+-]+\.(c|cc|cpp|h|hpp|py))", r"\2", line)
    line = re.sub(r"0x[0-9a-fA-F]+", "0x?", line)
    if re.search(r"GGML_ASSERT|Assertion|GGML_ABORT|fatal error", line):
        return line[:200]  # the assert's text is fixed: its numbers are part of it
    line = re.sub(r"(?<![:\w.])-?\d+(\.\d+)?(e[+-]?\d+)?(?!\w*\.(cpp|c|h|py):)", "N", line)
    line = re.sub(r"'[^']*'", "'…'", line)
    return line[:200]


def signature(o: Outcome) -> str:
    """What identifies a failure: outcome and signal, and the assert or error line (for a
    traceback: the exception type and its innermost kairox_py frame)."""
    if o.outcome == "traceback":
        m = re.match(r"(\w+) at (\S+ \S+)", o.detail)
        return f"traceback | {m.group(1)} at {m.group(2)}" if m else f"traceback | {normalize(o.detail)}"
    head = f"{o.outcome} {o.signal}" if o.signal else o.outcome
    return f"{head} | {normalize(reason_line(o.stderr))}"


def _slug(sig: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", sig).strip("-")[:60]
    return f"{s}-{hashlib.sha1(sig.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------------------------------
# campaign
# ---------------------------------------------------------------------------------------
@dataclass
class Campaign:
    """Seeds, the worker, and where mutants are written; runs mutants and keeps results."""

    out: Path
    gseeds: list[GgufSeed]
    dseeds: list[DirSeed]
    worker: Worker
    minimize: bool = True
    gdb: bool = False
    env: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    sigs: dict[str, dict[str, Any]] = field(default_factory=dict)
    corpus_keys: set[str] = field(default_factory=set)

    @property
    def work(self) -> Path:
        return self.out / "work"

    def materialize(self, m: Mutant, where: Path) -> dict[str, Any]:
        """Write the mutant at `where` (a file, or a directory for the directory targets)
        and return the worker's op."""
        if m.target == "gguf":
            seed = next(s for s in self.gseeds if s.name == m.seed)
            where.write_bytes(apply_patches(seed.data, m.patches))
            return {"target": "gguf", "path": str(where), "index": m.index}
        ds = next(s for s in self.dseeds if s.name == m.seed and s.target == m.target)
        write_dir_mutant(ds, m.changes, where)
        op = {"target": m.target, "path": str(where), "index": m.index}
        if ds.model is not None:
            op["model"] = str(ds.model)
        return op

    def run(self, m: Mutant) -> Outcome:
        self.work.mkdir(parents=True, exist_ok=True)
        where = self.work / ("mutant.gguf" if m.target == "gguf" else "mutant")
        o = self.worker.run(self.materialize(m, where))
        sig = signature(o) if o.failed else ""
        self.rows.append({"index": m.index, "target": m.target, "kind": m.kind, "seed": m.seed,
                          "mutation": m.desc, "outcome": o.outcome, "signal": o.signal,
                          "signature": sig, "detail": o.detail[:200],
                          "stderr_head": " / ".join(o.stderr.strip().splitlines()[:3])[:300],
                          "seconds": round(o.seconds, 3)})
        if o.failed:
            self._record_failure(m, o, sig)
        elif o.outcome == "refused":
            self._record_corpus(m, o)
        return o

    def _record_failure(self, m: Mutant, o: Outcome, sig: str) -> None:
        entry = self.sigs.get(sig)
        if entry is not None:
            entry["count"] += 1
            entry["kinds"][m.kind] += 1
            return
        if self.minimize:
            m = self._minimize(m, sig)
        d = self.out / "crashes" / _slug(sig)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        where = d / ("mutant.gguf" if m.target == "gguf" else "mutant")
        op = self.materialize(m, where)
        (d / "patch.json").write_text(json.dumps(m.to_json(), indent=1))
        (d / "repro.json").write_text(json.dumps(op, indent=1))
        (d / "stderr.txt").write_text(o.stderr[-20000:])
        entry = {"signature": sig, "count": 1, "kinds": Counter({m.kind: 1}), "first": m, "outcome": o,
                 "dir": d, "reason": reason_line(o.stderr) or o.detail, "gdb": ""}
        if self.gdb and o.outcome in ("crash", "sanitizer"):
            entry["gdb"] = run_gdb(d / "repro.json", self.env, d / "gdb.txt")
        self.sigs[sig] = entry

    def _minimize(self, m: Mutant, sig: str) -> Mutant:
        """Drop patches (GGUF) or file changes (directories) one at a time while the mutant
        still fails with the same signature."""
        items: list[Any] = list(m.patches) if m.target == "gguf" else list(m.changes.items())

        def build(kept: list[Any], desc: str) -> Mutant:
            if m.target == "gguf":
                return Mutant(m.index, m.target, m.kind, m.seed, desc, patches=kept)
            return Mutant(m.index, m.target, m.kind, m.seed, desc, changes=dict(kept))

        n0 = len(items)
        i = 0
        while i < len(items) and len(items) > 1:
            trial_items = items[:i] + items[i + 1:]
            where = self.work / ("min.gguf" if m.target == "gguf" else "min")
            o = self.worker.run(self.materialize(build(trial_items, m.desc), where))
            if o.failed and signature(o) == sig:
                items = trial_items
            else:
                i += 1
        return build(items, m.desc + " (minimised)") if len(items) < n0 else m

    def _record_corpus(self, m: Mutant, o: Outcome) -> None:
        """Keep one refused mutant per (target, kind, error text with numbers removed)."""
        key = f"{m.target}|{m.kind}|{normalize(o.detail)[:80]}"
        if key in self.corpus_keys or len(self.corpus_keys) >= 300:
            return
        self.corpus_keys.add(key)
        d = self.out / "corpus"
        d.mkdir(parents=True, exist_ok=True)
        rec = m.to_json()
        rec["expect"] = o.outcome
        rec["detail"] = o.detail
        (d / f"{m.target}-{m.kind}-{m.index:06d}.json").write_text(json.dumps(rec, indent=1))


def run_gdb(repro: Path, env: dict[str, str], out: Path) -> str:
    """`gdb -batch -ex run -ex bt` on one reproducer (python running it once); the backtrace
    is written to `out`, its first frames returned."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return ""
    cmd = [gdb, "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 25", "--args",
           sys.executable, str(Path(__file__).resolve()), "--run-one", str(repro)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        text = "gdb timed out"
    out.write_text(text)
    frames = [ln for ln in text.splitlines() if re.match(r"#\d+ ", ln)]
    # the abort machinery (raise, abort, ggml_abort) says nothing about where it was called
    skip = re.compile(r"pthread_kill|__GI_raise|__GI_abort|ggml_abort|raise \(|abort \(")
    while frames and skip.search(frames[0]):
        frames.pop(0)
    return "\n".join(re.sub(r" from /\S+| at /tmp/python-build\S+", "", f)[:220] for f in frames[:6])


def write_reports(c: Campaign, out: Path, meta: dict[str, Any]) -> tuple[Path, Path]:
    """results.csv and summary.md."""
    csv_path = out / "results.csv"
    cols = ["index", "target", "kind", "seed", "mutation", "outcome", "signal", "signature", "detail",
            "stderr_head", "seconds"]
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(c.rows)
    outcomes = ("refused", "ok", *BAD)
    table: dict[tuple[str, str], Counter[str]] = {}
    for r in c.rows:
        table.setdefault((r["target"], r["kind"]), Counter())[r["outcome"]] += 1
    lines = ["# Loader fuzzing", "", f"- {meta['date']}, seed {meta['seed']}, library `{meta['lib']}`"
             f"{' (preload ' + meta['preload'] + ')' if meta.get('preload') else ''}",
             f"- {len(c.rows)} mutants in {meta['seconds']:.0f} s, {c.worker.starts} worker start(s), "
             f"timeout {meta['timeout']} s",
             f"- failures: {sum(1 for r in c.rows if r['outcome'] in BAD)} mutants, "
             f"{len(c.sigs)} distinct signature(s)", "",
             "## Outcomes per target and mutation kind", "",
             "| target | kind | " + " | ".join(outcomes) + " |", "|---|---|" + "---:|" * len(outcomes)]
    for (t, k), cnt in sorted(table.items(), key=lambda x: (_target_order(x[0][0]), x[0][1])):
        lines.append(f"| {t} | {k} | " + " | ".join(str(cnt.get(o, 0)) for o in outcomes) + " |")
    tot: Counter[str] = Counter(r["outcome"] for r in c.rows)
    lines.append("| **all** | | " + " | ".join(f"**{tot.get(o, 0)}**" for o in outcomes) + " |")
    lines += ["", "## Failure signatures", ""]
    if not c.sigs:
        lines.append("None.")
    for i, e in enumerate(sorted(c.sigs.values(), key=lambda e: -e["count"]), 1):
        m: Mutant = e["first"]
        lines += [f"### {i}. `{e['signature']}`", "",
                  f"- count: {e['count']} ({', '.join(f'{k} {n}' for k, n in e['kinds'].most_common())})",
                  f"- first mutant: #{m.index}, seed `{m.seed}`, {m.kind}: {m.desc}",
                  f"- reason: `{e['reason'][:300]}`",
                  f"- reproducer: `{_rel(e['dir'])}/` (`python3 scripts/fuzz_loader.py --run-one "
                  f"{_rel(e['dir'] / 'repro.json')}`)"]
        if e["gdb"]:
            lines += ["- backtrace (gdb):", "", "```", e["gdb"], "```"]
        lines.append("")
    md_path = out / "summary.md"
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def _target_order(t: str) -> int:
    return (("gguf",) + DIR_TARGETS).index(t)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def snapshot_library(lib: Path | None, d: Path) -> Path:
    """A copy of the library under test (`lib`, else the one kairox_py would load) in d: a
    rebuild of the tree during a campaign must not change, or for a moment remove, the library
    that workers restarted after a crash load."""
    from kairox_py import _lib

    src = lib if lib is not None else _lib.find_library()
    d.mkdir(parents=True, exist_ok=True)
    dst = d / src.name
    tmp = d / f".{src.name}.tmp"
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    return dst


def run_campaign(out: Path, *, seed: int = 0, count: int = 1000, dir_count: int = 100,
                 timeout: float = 10.0, lib: Path | None = None, preload: str = "", gdb: bool = False,
                 converted: bool = False, minimize: bool = True, gguf_kinds: Sequence[str] = GGUF_KINDS,
                 dir_kinds: Sequence[str] = DIR_KINDS, progress: bool = True,
                 seeds_dir: Path | None = None, snapshot: bool = True) -> Campaign:
    """Seeds (written to seeds_dir, default OUT/seeds, or reused from there), mutants, the
    worker, the reports: the whole campaign; returns it for inspection."""
    from rich.console import Console

    from kairox_py.progress import make_progress

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    gseeds, dseeds = make_seeds(seeds_dir or out / "seeds", converted=converted)
    built = lib
    if snapshot:
        lib = snapshot_library(lib, out / "lib")
    env = worker_env(lib, preload)
    worker = Worker(env, out / "worker-stderr.txt", timeout)
    c = Campaign(out, gseeds, dseeds, worker, minimize=minimize, gdb=gdb, env=env)
    shutil.rmtree(out / "crashes", ignore_errors=True)
    shutil.rmtree(out / "corpus", ignore_errors=True)
    console = Console(stderr=True) if progress else None
    total = count + dir_count
    try:
        with make_progress(console) as bar:
            task = bar.add_task("fuzzing", total=total)
            for m in plan_mutants(seed, count, dir_count, gseeds, dseeds, gguf_kinds, dir_kinds):
                c.run(m)
                n_bad = sum(e["count"] for e in c.sigs.values())
                bar.update(task, advance=1, description=f"fuzzing {m.target} ({n_bad} failed, {len(c.sigs)} sigs)")
    finally:
        worker.close()
        lib_desc = str(built) if built else "default (kairox_py's)"
        if snapshot and lib is not None:
            lib_desc += f", run from a copy (sha256 {_sha256(lib)[:16]})"
        meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "seed": seed, "timeout": timeout,
                "lib": lib_desc,
                "preload": env.get("LD_PRELOAD", ""),
                "seconds": time.monotonic() - t0}
        write_reports(c, out, meta)
        shutil.rmtree(out / "work", ignore_errors=True)
    return c


def run_one(repro: Path) -> int:
    """Run one saved reproducer in this process (for gdb): its op, then the outcome printed."""
    op = json.loads(repro.read_text())
    p = Path(op["path"])
    if not p.exists():  # the crash directory was moved: the mutant sits next to repro.json
        op["path"] = str(repro.parent / p.name)
    res = run_op(op, {})
    print(json.dumps(res))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for the mutation kinds and sanitizer builds.")
    ap.add_argument("--count", type=int, default=1000, help="GGUF mutants (default 1000)")
    ap.add_argument("--dir-count", type=int, default=100,
                    help="trace/workload/profile directory mutants (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    ap.add_argument("--out", type=Path, default=Path("bench-out/fuzz"), help="output directory")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per mutant before a hang (default 10)")
    ap.add_argument("--lib", type=Path, help="libkairox to load (e.g. an ASan build); default kairox_py's")
    ap.add_argument("--preload", default="", help="LD_PRELOAD for the worker ('auto': the sanitizer "
                    "runtimes --lib links)")
    ap.add_argument("--kinds", help=f"GGUF kinds, comma-separated (default all: {','.join(GGUF_KINDS)})")
    ap.add_argument("--dir-kinds", help=f"directory kinds (default all: {','.join(DIR_KINDS)})")
    ap.add_argument("--converted", action="store_true",
                    help="also a real `kairox convert` of a tiny model and its profile as seeds (~1 min once)")
    ap.add_argument("--gdb", action="store_true", help="backtrace the first reproducer of each crash under gdb")
    ap.add_argument("--no-minimize", action="store_true", help="keep reproducers as drawn")
    ap.add_argument("--no-snapshot", action="store_true",
                    help="load the library where it is, not a copy under OUT/lib (a rebuild then changes it mid-run)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-one", type=Path, metavar="REPRO_JSON", help="run one saved reproducer in this process")
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.run_one:
        return run_one(args.run_one)
    kinds = tuple(args.kinds.split(",")) if args.kinds else GGUF_KINDS
    dkinds = tuple(args.dir_kinds.split(",")) if args.dir_kinds else DIR_KINDS
    bad = [k for k in kinds if k not in GGUF_KINDS] + [k for k in dkinds if k not in DIR_KINDS]
    if bad:
        ap.error(f"unknown kind(s): {', '.join(bad)}")
    c = run_campaign(args.out, seed=args.seed, count=args.count, dir_count=args.dir_count,
                     timeout=args.timeout, lib=args.lib.resolve() if args.lib else None, preload=args.preload,
                     gdb=args.gdb, converted=args.converted, minimize=not args.no_minimize,
                     gguf_kinds=kinds, dir_kinds=dkinds, progress=not args.no_progress,
                     snapshot=not args.no_snapshot)
    n_bad = sum(e["count"] for e in c.sigs.values())
    print(f"{len(c.rows)} mutants: {n_bad} failed, {len(c.sigs)} distinct signature(s); "
          f"see {args.out / 'summary.md'}")
    return 1 if c.sigs else 0


if __name__ == "__main__":
    sys.exit(main())
