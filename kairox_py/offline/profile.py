"""`kairox profile`: record per-layer FFN activations of the real model on text.

The model runs through libkairox in dense mode with the C profiler (an eval callback in
the library captures each layer's FFN input after its norm, ``ffn_norm-l``, and the hidden
activation act(gate)*up); nothing of the transformer is re-implemented here.

A profile directory holds

* ``meta.json``: model path/sha256, architecture, activation kind, dims, tokens, corpus;
* ``inputs.npy``: float16 (n_layer, n_tokens, n_embd), the FFN inputs (predictor inputs:
  layer l's predictor reads row l-1);
* ``hidden.npy``: float16 (n_layer, n_tokens, n_ff), act(gate)*up.

Both are plain .npy files, so a 7B profile does not have to fit in RAM. They are written
and read with positioned file I/O, a chunk of rows at a time (`Profile.rows`,
`Profile.chunks`), not through a memory map: pages touched through a map stay in the
process's resident set until the kernel reclaims them, and a 7B profile's hidden array alone
is 8 GB. (`Profile.inputs` / `.hidden` are still there as read-only maps for code that wants
array slices.) Masks, thresholds, frequencies and co-activation are *derived* on demand from
the hidden sample and a threshold (never stored): the same profile then serves every
sparsity setting, and there is one source of truth. Thresholds are exact quantiles computed
in one streaming pass per layer: |h| of a float16 profile takes at most 2^15 distinct values,
so a histogram of the float16 bit patterns gives the same k-th smallest value as sorting
(`LayerMagnitudes`).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np
from rich.console import Console

from ..errors import KairoxError
from ..format import SUPPORTED_ARCHES, activation_kind, ffn_input_kind
from ..llama import ContextParams, Model, Profiler
from ..outputs import atomic_dir, check_free_space, check_output_dir, disk_full_error, is_disk_full, pause_point
from ..progress import make_progress
from .corpus import Corpus

PROFILE_VERSION = 1
DEFAULT_TOKENS = 8192
DEFAULT_CTX = 512
#: everything run_profile writes into a profile directory (and so may replace there)
PROFILE_FILES = ("meta.json", "inputs.npy", "hidden.npy")
MIN_CHUNK = 16  # shorter tail chunks carry too little context to be representative
F16_MAX = 65504.0
#: token rows per read of the streaming passes (a few tens of MB at a 7B's widths)
CHUNK_TOKENS = 1024
#: tokens per decode call while profiling (a chunk of DEFAULT_CTX is two calls): the profiler's
#: buffers, the logits and the graph's scale with it. On Qwen2.5-Coder-1.5B (a 152k vocabulary)
#: 256 peaks 0.9 GB lower than one call of 512 and profiles about a sixth slower
#: (docs/benchmarks/convert): the peak of the whole conversion is here, the time is not.
DECODE_TOKENS = 256
#: profile array kinds (file stems)
KINDS = ("inputs", "hidden")
_F16_PATTERNS = 1 << 16
_F16_ABS_BITS = 0x7FFF  # the float16 bit pattern without its sign: |x|, ordered as an integer
_BINCOUNT_SLICE = 1 << 18


def file_sha256(path: Path, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ProfileMeta:
    version: int
    model_path: str
    model_sha256: str
    arch: str
    activation: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_tokens: int
    ctx: int
    corpus: str
    corpus_sha256: str
    seconds: float
    tokens_requested: int = 0  # --tokens (n_tokens is less when the corpus is shorter); 0: not recorded

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfileMeta:
        """The metadata of a meta.json; TypeError when a dimension is not a non-negative
        integer (shapes are computed from them)."""
        meta = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        for name in ("version", "n_layer", "n_embd", "n_ff", "n_tokens", "ctx", "tokens_requested"):
            v = getattr(meta, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TypeError(f"{name} must be a non-negative integer, got {v!r}")
        return meta


class Profile:
    """An opened profile directory (arrays memory-mapped read-only)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        meta_path = self.dir / "meta.json"
        if not meta_path.is_file():
            raise KairoxError(f"not a profile directory (no meta.json): {self.dir}")
        try:
            self.meta = ProfileMeta.from_dict(json.loads(meta_path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise KairoxError(f"bad profile metadata in {meta_path}: {e}") from None
        if self.meta.version != PROFILE_VERSION:
            raise KairoxError(f"profile {self.dir} has version {self.meta.version}, "
                              f"expected {PROFILE_VERSION}: profile again")
        try:
            self.inputs = np.load(self.dir / "inputs.npy", mmap_mode="r")
            self.hidden = np.load(self.dir / "hidden.npy", mmap_mode="r")
        except (OSError, ValueError, EOFError, TokenError) as e:
            # EOFError: an empty or cut .npy; TokenError: numpy's header parser on a cut header
            raise KairoxError(f"cannot read profile arrays in {self.dir}: {e}") from None
        m = self.meta
        if (self.inputs.shape != (m.n_layer, m.n_tokens, m.n_embd)
                or self.hidden.shape != (m.n_layer, m.n_tokens, m.n_ff)):
            raise KairoxError(f"profile arrays in {self.dir} do not match meta.json")
        if self.inputs.dtype.kind != "f" or self.hidden.dtype.kind != "f":
            raise KairoxError(f"profile arrays in {self.dir} are not floating point "
                              f"({self.inputs.dtype}, {self.hidden.dtype})")

    @property
    def n_layer(self) -> int:
        return self.meta.n_layer

    @property
    def n_tokens(self) -> int:
        return self.meta.n_tokens

    def rows(self, kind: str, layer: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A private copy of token rows [start, stop) of one layer of `kind` ("inputs" or
        "hidden"), in the file's dtype, read from the file rather than through the map (see the
        module docstring): the copy is freed with its last reference."""
        if kind not in KINDS:
            raise ValueError(f"profile arrays are {', '.join(KINDS)}, not {kind!r}")
        arr = self.inputs if kind == "inputs" else self.hidden
        stop = self.n_tokens if stop is None else min(stop, self.n_tokens)
        start = max(0, min(start, stop))
        if not arr.flags.c_contiguous:  # a Fortran-order .npy (not written by us): via the map
            return np.array(arr[layer, start:stop])
        width = arr.shape[2]
        offset = arr.offset + (layer * self.n_tokens + start) * width * arr.dtype.itemsize
        out = np.fromfile(self.dir / f"{kind}.npy", dtype=arr.dtype, count=(stop - start) * width,
                          offset=offset)
        return out.reshape(stop - start, width)

    def chunks(self, kind: str, layer: int, size: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(first token, rows) of one layer, `size` tokens at a time (default CHUNK_TOKENS)."""
        size = size or CHUNK_TOKENS
        for start in range(0, self.n_tokens, size):
            yield start, self.rows(kind, layer, start, start + size)

    def mask_chunks(self, layer: int, threshold: float,
                    size: int | None = None) -> Iterator[np.ndarray]:
        """The boolean mask (tokens, n_ff) of one layer at `threshold`, `size` tokens at a time:
        the rows of `mask()`."""
        for _, h in self.chunks("hidden", layer, size):
            mag = np.asarray(h, dtype=np.float32)
            del h  # each chunk's arrays go before the next is read
            np.abs(mag, out=mag)
            mask = mag > threshold
            del mag
            yield mask

    def layer_magnitudes(self, layer: int) -> LayerMagnitudes:
        """One streaming pass over a layer's |act(gate)*up| (LayerMagnitudes)."""
        acc = MagnitudeAccumulator(self.meta.n_ff)
        for _, h in self.chunks("hidden", layer):
            acc.add(h)
        return acc.result()

    def predictor_input(self, layer: int) -> np.ndarray:
        """(n_tokens, n_embd) input of layer `layer`'s predictor: the previous layer's FFN
        input (adjacent prediction); layer 0 reads its own. A private copy (Profile.rows)."""
        return self.rows("inputs", max(layer - 1, 0))

    def magnitude(self, layer: int) -> np.ndarray:
        """|act(gate)*up| of a layer as float32 (n_tokens, n_ff): a whole layer in float32, for
        callers that want it at once (the converter streams instead)."""
        return np.abs(np.asarray(self.rows("hidden", layer), dtype=np.float32))

    def thresholds(self, sparsity: float) -> np.ndarray:
        """Per-layer |act(gate)*up| thresholds that zero `sparsity` of the (token, neuron)
        pairs of the sample (TEAL/CATS-style magnitude calibration, same share per layer).
        ReLU models: 0 (a neuron is active iff its activation is > 0)."""
        if not 0.0 <= sparsity < 1.0:
            raise KairoxError(f"sparsity must be in [0, 1), got {sparsity}")
        out = np.zeros(self.n_layer, dtype=np.float32)
        if self.meta.activation == "relu":
            return out
        for layer in range(self.n_layer):
            out[layer] = self.layer_magnitudes(layer).quantile(sparsity)
        return out

    def mask(self, layer: int, threshold: float) -> np.ndarray:
        """Boolean (n_tokens, n_ff): neuron active for that token."""
        return self.magnitude(layer) > threshold


def magnitude_quantile(mag: np.ndarray, q: float) -> float:
    """The value below which a share q of `mag` lies (0 for q == 0)."""
    flat = mag.reshape(-1)
    if q <= 0 or flat.size == 0:
        return 0.0
    k = min(int(q * flat.size), flat.size - 1)
    return float(np.partition(flat, k)[k])


def _kth_index(size: int, q: float) -> int | None:
    """magnitude_quantile's rank k of the value returned (None: the quantile is 0)."""
    if q <= 0 or size == 0:
        return None
    return min(int(q * size), size - 1)


@dataclass(frozen=True)
class LayerMagnitudes:
    """A layer's |act(gate)*up| summarised in one pass: what thresholds and the predictor's
    outlier rule need, with no (tokens, n_ff) array kept. `hist` counts |h| per float16 bit
    pattern (float16 profiles); a profile of another float type keeps its `values` instead."""

    peak: np.ndarray  # float32 (n_ff,): max |h| of each neuron
    hist: np.ndarray | None  # int64 (65536,), indexed by the bit pattern of |h| as float16
    values: np.ndarray | None  # float32, every |h| (only without a histogram)

    @property
    def size(self) -> int:
        return int(self.hist.sum()) if self.hist is not None else int(self.values.size)  # type: ignore[union-attr]

    def quantile(self, q: float) -> float:
        """magnitude_quantile of the layer's |h|, exactly (the same k-th smallest value)."""
        if self.hist is None:
            assert self.values is not None
            return magnitude_quantile(self.values, q)
        k = _kth_index(self.size, q)
        if k is None:
            return 0.0
        bits = int(np.searchsorted(np.cumsum(self.hist), k, side="right"))
        return float(np.array(bits, dtype=np.uint16).view(np.float16))


class MagnitudeAccumulator:
    """Builds LayerMagnitudes from chunks of rows of h (any sign; |h| is taken here)."""

    def __init__(self, n_ff: int) -> None:
        self.peak = np.zeros(n_ff, dtype=np.float32)
        self.hist: np.ndarray | None = np.zeros(_F16_PATTERNS, dtype=np.int64)
        self.values: list[np.ndarray] = []

    def add(self, h: np.ndarray) -> None:
        if len(h) == 0:
            return
        if h.dtype == np.float16 and self.hist is not None:
            bits = (np.ascontiguousarray(h).view(np.uint16) & np.uint16(_F16_ABS_BITS)).reshape(-1)
            for i in range(0, bits.size, _BINCOUNT_SLICE):  # bincount makes an intp copy of its input
                self.hist += np.bincount(bits[i:i + _BINCOUNT_SLICE], minlength=_F16_PATTERNS)
            # |h|'s largest bit pattern is its largest value (a NaN's pattern is above every
            # number's, as np.max propagates NaN)
            top = bits.reshape(h.shape).max(axis=0).view(np.float16).astype(np.float32)
            np.maximum(self.peak, top, out=self.peak)
            return
        # not float16 (profiles are written in float16; this is a fallback): keep the values
        if self.hist is not None and self.hist.any():
            raise ValueError("a layer's chunks must share one dtype")
        self.hist = None
        mag = np.abs(np.asarray(h, dtype=np.float32))
        self.values.append(mag.reshape(-1))
        np.maximum(self.peak, mag.max(axis=0), out=self.peak)

    def result(self) -> LayerMagnitudes:
        if self.hist is not None:
            return LayerMagnitudes(self.peak, self.hist, None)
        vals = np.concatenate(self.values) if self.values else np.zeros(0, np.float32)
        return LayerMagnitudes(self.peak, None, vals)


def check_model_supported(model: Model) -> str:
    """The architecture name; KairoxError if the converter/profiler does not support it."""
    arch = model.arch
    if arch not in SUPPORTED_ARCHES:
        raise KairoxError(f"unsupported architecture '{arch}' (supported: "
                          f"{', '.join(sorted(SUPPORTED_ARCHES))})")
    return arch


def tokenize_chunks(model: Model, text: str, ctx: int) -> list[list[int]]:
    """Split the corpus into decode chunks of at most `ctx` tokens, each starting with BOS
    when the model wants one (so every chunk looks like the start of a document)."""
    if not text.strip():
        raise KairoxError("the corpus is empty")
    toks = model.tokenize(text, add_special=False)
    bos = [model.bos] if model.add_bos and model.bos >= 0 else []
    body = ctx - len(bos)
    chunks = [bos + toks[i:i + body] for i in range(0, len(toks), body)]
    chunks = [c for c in chunks if len(c) - len(bos) >= MIN_CHUNK]
    if not chunks:
        raise KairoxError(f"the corpus has only {len(toks)} tokens: too little text")
    return chunks


def pick_chunks(chunks: list[list[int]], n_tokens: int) -> list[list[int]]:
    """Chunks evenly spread over the corpus whose total reaches about n_tokens (all of
    them if the corpus is smaller): a bounded sample that still covers every part."""
    total = sum(len(c) for c in chunks)
    if total <= n_tokens:
        return chunks
    avg = total / len(chunks)
    k = max(1, min(len(chunks), int(np.ceil(n_tokens / avg))))
    idx = np.unique(np.linspace(0, len(chunks) - 1, k).round().astype(int))
    return [chunks[i] for i in idx]


def run_profile(model_path: str | os.PathLike[str], corpus: Corpus, out_dir: str | os.PathLike[str],
                *, n_tokens: int = DEFAULT_TOKENS, ctx: int = DEFAULT_CTX,
                threads: int | None = None, console: Console | None = None,
                activation: str = "model") -> Profile:
    """Profile the model on `corpus` into out_dir (written to a temporary sibling and
    renamed at the end, so an interrupted run never leaves a half profile). activation
    other than "model" runs the FFN with it (a ReLU-fied llama, whose GGUF cannot say so)."""
    if n_tokens < 1:
        raise KairoxError("--tokens must be at least 1")
    out = check_output_dir(out_dir, PROFILE_FILES, "profile")
    t0 = time.monotonic()
    model_path = Path(model_path)
    # weights read into the process (not mapped): a mapped file's pages that the CPU backend
    # copies into its repacked layout would stay resident next to the copies
    with Model(model_path, use_mmap=False) as model:
        arch = check_model_supported(model)
        n_layer, n_embd, n_ff = model.n_layer, model.n_embd, model.n_ff
        if model.n_ctx_train > 0:
            # chunks no longer than the model was trained on (learned positions, OPT's, end there)
            ctx = min(ctx, model.n_ctx_train)
        chunks = pick_chunks(tokenize_chunks(model, corpus.text, ctx), n_tokens)
        total = min(n_tokens, sum(len(c) for c in chunks))
        needed = 2 * n_layer * total * (n_embd + n_ff)  # the two float16 arrays
        check_free_space(out, needed)
        try:
            with atomic_dir(out) as tmp:
                with RowWriter(tmp / "inputs.npy", (n_layer, total, n_embd)) as inputs, \
                        RowWriter(tmp / "hidden.npy", (n_layer, total, n_ff)) as hidden:
                    _capture(model, chunks, inputs, hidden, total, ctx, threads, console, activation)
                meta = ProfileMeta(
                    version=PROFILE_VERSION, model_path=str(model_path.resolve()),
                    model_sha256=file_sha256(model_path), arch=arch,
                    activation=activation_kind(arch, activation if activation != "model"
                                               else model.metadata.get("kairox.activation")),
                    n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_tokens=total, ctx=ctx,
                    corpus=corpus.description,
                    corpus_sha256=hashlib.sha256(corpus.text.encode()).hexdigest(),
                    seconds=round(time.monotonic() - t0, 2), tokens_requested=n_tokens)
                # meta.json last: a directory with it is complete (and only renamed into place then)
                (tmp / "meta.json").write_text(meta.to_json())
        except OSError as e:
            if is_disk_full(e):
                raise disk_full_error(out, needed) from None
            raise
    return Profile(out)


def _open_array(path: Path, shape: tuple[int, ...]) -> np.memmap:
    """A float16 .npy memory-mapped for writing, its blocks reserved on the disk first: a full
    disk then fails here with ENOSPC (an error naming the profile), not later with SIGBUS
    from a page of the map that the file system cannot back (which kills the process)."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=shape)
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as e:
            if is_disk_full(e):
                raise
            # a file system without fallocate: the writes themselves find out
        finally:
            os.close(fd)
    return arr


class RowWriter:
    """A float16 (n_layer, n_tokens, width) .npy filled with positioned writes (os.pwrite), a
    layer's rows at a time. Not through a map: mapped pages written stay in the process's
    resident set until the kernel writes them back and reclaims them, which for a 7B profile
    is gigabytes. The file is reserved on the disk first (_open_array); closing it syncs it to
    the disk, as the map's flush did."""

    def __init__(self, path: Path, shape: tuple[int, int, int]) -> None:
        arr = _open_array(path, shape)
        self.offset = int(arr.offset)
        del arr
        self.shape = shape
        self.fd = os.open(path, os.O_WRONLY)

    def write(self, layer: int, pos: int, rows: np.ndarray) -> None:
        """Rows (take, width) of `layer` from token `pos` on, converted to float16."""
        _, n_tokens, width = self.shape
        data = np.ascontiguousarray(rows, dtype=np.float16)
        if data.ndim != 2 or data.shape[1] != width or pos + len(data) > n_tokens:
            raise ValueError(f"rows of shape {data.shape} at token {pos} do not fit {self.shape}")
        view = data.data.cast("B")
        at = self.offset + (layer * n_tokens + pos) * width * 2
        while view:
            n = os.pwrite(self.fd, view, at)
            view, at = view[n:], at + n

    def close(self, sync: bool = True) -> None:
        if self.fd < 0:
            return
        try:
            if sync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(sync=exc_type is None)


def _write_recorded(prof: Profiler, input_kind: str, n_layer: int, n: int, pos: int,
                    inputs: RowWriter, hidden: RowWriter) -> None:
    """The n tokens the profiler recorded in every layer, written from token `pos` on."""
    for layer in range(n_layer):
        x = prof.get(input_kind, layer)
        h = prof.get("hidden", layer)
        if x is None or h is None or len(x) < n or len(h) < n:
            raise KairoxError(f"the profiler recorded nothing for layer {layer}: this "
                              f"architecture's FFN is not visible to it")
        inputs.write(layer, pos, np.clip(x[:n], -F16_MAX, F16_MAX))
        hidden.write(layer, pos, np.clip(h[:n], -F16_MAX, F16_MAX))


def _capture(model: Model, chunks: list[list[int]], inputs: RowWriter, hidden: RowWriter,
             total: int, ctx: int, threads: int | None, console: Console | None,
             activation: str = "model") -> None:
    """Decode each chunk (a fresh context of up to `ctx` tokens) DECODE_TOKENS at a time and
    write what the profiler recorded. The later parts of a chunk attend to the earlier ones
    through the KV cache, as one decode's own tokens do; the profiler, the logits and the
    graph's buffers are then sized for DECODE_TOKENS tokens, not the whole chunk."""
    n_layer = model.n_layer
    input_kind = ffn_input_kind(model.arch)
    step = min(DECODE_TOKENS, ctx)
    with Profiler(model, step, kinds=(input_kind, "hidden")) as prof, \
            model.session(ContextParams(n_ctx=ctx, n_batch=step, mode="dense", profiler=prof,
                                        n_threads=threads, activation=activation)) as s, \
            make_progress(console) as bar:
        task = bar.add_task("profiling", total=total)
        pos = 0
        for chunk in chunks:
            take = min(len(chunk), total - pos)
            if take <= 0:
                break
            s.reset()
            for part in range(0, take, step):  # tokens past `take` cannot change those before
                prof.clear()
                toks = chunk[part:min(part + step, take)]
                s.decode(toks, all_logits=True)  # all outputs: the last layer keeps every token
                _write_recorded(prof, input_kind, n_layer, len(toks), pos + part, inputs, hidden)
            pos += take
            bar.update(task, completed=pos)
            pause_point("profile")  # test hook (outputs.pause_point): part of the arrays written


def default_profile_dir(model_sha256: str, corpus: Corpus, n_tokens: int, ctx: int,
                        activation: str = "model") -> Path:
    """Where `kairox convert` keeps a profile it made itself: the cache, keyed by model,
    corpus, sample size (and an activation override), so converting again at other settings
    reuses it."""
    from ..default_model import cache_dir

    corpus_sha = hashlib.sha256(corpus.text.encode()).hexdigest()
    act = "" if activation == "model" else f"-{activation}"
    return cache_dir() / "profiles" / f"{model_sha256[:16]}-{corpus_sha[:8]}-{n_tokens}-{ctx}{act}"


def open_or_run_profile(model_path: Path, corpus: Corpus, directory: Path, *, n_tokens: int,
                        ctx: int = DEFAULT_CTX, threads: int | None = None,
                        console: Console | None = None, match_corpus: bool = False,
                        match_tokens: bool = False, activation: str = "model") -> tuple[Profile, bool]:
    """The profile in `directory` if there is one (it must come from this model file, and with
    match_corpus / match_tokens from this corpus / token count: a user who names a corpus must
    not get a profile of another one without a word), else a new one profiled into it.
    Returns (profile, reused)."""
    if directory.exists():
        prof = Profile(directory)
        m = prof.meta
        if m.model_sha256 != file_sha256(model_path):
            raise KairoxError(f"profile {directory} was made from another model "
                              f"({m.model_path}); profile this one into another directory")
        again = "give another profile directory to profile again, or leave the option out to reuse it"
        if match_corpus and m.corpus_sha256 != hashlib.sha256(corpus.text.encode()).hexdigest():
            raise KairoxError(f"profile {directory} was made from another corpus ({m.corpus}) than "
                              f"--corpus; {again}")
        requested = m.tokens_requested or m.n_tokens
        if match_tokens and requested != n_tokens:
            raise KairoxError(f"profile {directory} holds {m.n_tokens} tokens (--tokens {requested}), not "
                              f"--tokens {n_tokens}; {again}")
        if activation != "model" and m.activation != activation:
            raise KairoxError(f"profile {directory} was made with the {m.activation} activation, not "
                              f"--activation {activation}; {again}")
        return prof, True
    return run_profile(model_path, corpus, directory, n_tokens=n_tokens, ctx=ctx,
                       threads=threads, console=console, activation=activation), False
