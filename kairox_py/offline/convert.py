"""`kairox convert IN.gguf OUT.gguf`: a GGUF plus Kairox sparsity data (docs/FORMAT.md).

Steps: read the input (any quantization) with the ``gguf`` reader; run or reuse a profile;
calibrate per-layer thresholds for the target sparsity (|act(gate)*up| and, for CATS,
|act(gate)|); train adjacent predictors; group neurons (the better of a frequency grouping
and, with pymetis, a METIS co-activation partition; grouping.py) and reorder gate/up rows,
down_t rows and predictor outputs consistently; write the new GGUF.

Scale: every stage works a layer at a time and reads the profile a chunk of tokens at a time
(profile.Profile.rows), so what it holds is about one layer's share of the profile (in
float16 where that suffices) and nothing grows with the number of layers but the results.
Two decisions are made on a sample of layers (probe_layers) before the rest is done:
predictors are trained on the sampled layers first, and where they select more than
``max_pred_density`` of the neurons (at the recall asked for) the rest is not trained and the
file is written without predictors (a predictor that computes nearly every neuron saves
nothing and costs its own reads; predictor mode is then refused); METIS is tried on the
sampled layers, and where it keeps measurably more co-activation inside groups on none of
them, the other layers take the frequency grouping without it (grouping.py). The input's
weights are read from the file where the conversion computes with them (CATS thresholds),
and the pages the writer reads through the reader's map are dropped once the file is
written, before the crossover calibration maps the output.

The output is written to a temporary file in the output's directory (``.OUT.tmp-PID``) and
renamed into place only when complete (``os.replace``; `before_publish` runs on the finished
temporary first, e.g. the CLI's crossover calibration), so an error, Ctrl-C or a kill never
leaves a partial OUT. The temporary is removed on every failure path Python sees; one a
SIGKILL leaves is removed by the next conversion to OUT (outputs.remove_stale_temporaries).
The profile cache is written the same way (profile.run_profile), and a cache entry that
cannot be read is profiled again rather than failing every later conversion. A full disk is
refused before profiling where the output cannot fit, and otherwise ends in a one-line error
naming the path and the space needed. ``ffn_down`` is copied
untouched (the dense path un-permutes the hidden state with ``kx_perm_inv``), so the
converted model run dense gives the original logits bit for bit.
"""
from __future__ import annotations

import ctypes
import gc
import math
import mmap
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFEndian,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    ReaderTensor,
)
from rich.console import Console

from .. import format as fmt
from .._lib import KAIROX_ACTIVATIONS
from ..errors import KairoxError
from ..outputs import (
    atomic_file,
    check_free_space,
    check_output_file,
    disk_full_error,
    is_disk_full,
    pause_point,
    remove_stale_temporaries,
    temp_sibling,
)
from ..progress import make_progress
from .blas import blas_threads
from .corpus import Corpus, fit_corpora
from .fit import DEFAULT_FIT_TOKENS, DEFAULT_MAX_PPL_INCREASE, QualityFit, fit_thresholds
from .grouping import (
    DEFAULT_GROUP_SIZE,
    METHOD_FREQUENCY,
    METHOD_IDENTITY,
    METHOD_METIS,
    LayerGrouping,
    activation_frequency,
    check_group_size,
    group_layer_stream,
    identity_grouping,
    metis_available,
)
from .predictor import LayerPredictor, TrainConfig, profile_layer_data, train_on
from .profile import (
    DEFAULT_CTX,
    DEFAULT_TOKENS,
    LayerMagnitudes,
    Profile,
    default_profile_dir,
    file_sha256,
    magnitude_quantile,
    open_or_run_profile,
)
from .quant import check_quantizable, dequantize, ggml_type, quantize, row_nbytes
from .selftext import with_self_text

DEFAULT_SPARSITY = 0.5
DEFAULT_RECALL = TrainConfig.recall
DEFAULT_MODE = "threshold"
# `kairox convert` profiles this many tokens of the model's own sampled answers next to the
# default corpus: on the default model threshold mode then costs +1.75% perplexity instead of
# +2.43% on held-out docs and +1.43% instead of +1.97% on general prose, and predictor mode
# +4.9% instead of +17% on prose (BENCHMARKS.md); about 80 s on 2 cores, cached
DEFAULT_SELF_TEXT = 12288
# ...for models up to this size: generation runs at decode speed (a 7B model at ~7 tok/s on
# 2 cores would take half an hour), so larger models get it only when asked (--self-text N)
SELF_TEXT_MAX_PARAMS = 1_000_000_000
# ffn_down_t's type: "auto" picks it from the original's ffn_down (resolve_down_type)
DEFAULT_DOWN_TYPE = "auto"
# original ffn_down types of at most 6 bits per weight: a Q6_K down_t holds them without
# measurable loss and its rows are 25% fewer bytes than Q8_0's, which moves the share of
# active neurons up to which the sparse down beats reading ffn_down in order (BENCHMARKS.md)
_UP_TO_6_BITS = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                           "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                           "IQ1_S", "IQ1_M"})
# Predictor mode's down projection keeps a predicted neuron where |act(gate)*up| exceeds this
# share of the calibrated threshold: on the default model x0.5 costs +2% perplexity for 1.2x
# decode, x1 (threshold mode's bar) +2.9% (BENCHMARKS.md, issue 5).
DEFAULT_PRED_DOWN_SCALE = 0.5
# "auto": Q8_0 where the rows are whole Q8_0 blocks (half the bytes of F16 for the same
# predictions on the default model), else F16
PRED_TYPES = ("auto", "f16", "f32", "q8_0", "q4_0")
_FLOAT_PRED_TYPES = {"f16": np.float16, "f32": np.float32}
# Predictors that select more than this share of the neurons (on held-out tokens, at the
# recall asked for) are not written: predictor mode would compute nearly every neuron and
# read the predictors besides. 1 keeps them whatever they select.
DEFAULT_MAX_PRED_DENSITY = 0.8
# Layers sampled, evenly over the depth, for the decisions made before the other layers are
# done (predictors kept or not; METIS tried or not)
PROBE_LAYERS = 3
# CATS thresholds are the quantile of |act(gate)| over at most this many profiled tokens
# (evenly spaced): gate is recomputed there, a matmul per token, and the quantile of millions
# of values does not need every token
CATS_TOKENS = 2048


@dataclass(frozen=True)
class ConvertOptions:
    sparsity: float = DEFAULT_SPARSITY
    recall: float = DEFAULT_RECALL
    group_size: int = DEFAULT_GROUP_SIZE
    down_type: str = DEFAULT_DOWN_TYPE
    # write ffn_down_t into the file (a second copy of every ffn_down, in down_type); without
    # it the file names down_type (KEY_DOWN_T_TYPE) and the loader derives down_t at load
    down_t_in_file: bool = False
    mode: str = DEFAULT_MODE
    predictor: bool = True
    pred_type: str = "auto"
    pred_down_scale: float = DEFAULT_PRED_DOWN_SCALE
    # reorder neurons into hot-first co-activation groups; None: where predictors are written
    # (predictor mode and the hybrid runtime's group cache read groups), else keep the original
    # order, which spares dense prefill the un-permute before ffn_down (resolve_reorder)
    reorder: bool | None = None
    tokens: int = DEFAULT_TOKENS
    # tokens of the model's own sampled text profiled with the corpus (selftext.py); None:
    # DEFAULT_SELF_TEXT for models up to SELF_TEXT_MAX_PARAMS parameters, else 0
    self_text: int | None = 0
    ctx: int = DEFAULT_CTX
    threads: int | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    # an existing --profile directory is reused only if it was made from this corpus / with
    # this many tokens (set when the user gave --corpus / --tokens explicitly)
    profile_match_corpus: bool = False
    profile_match_tokens: bool = False
    # the FFN activation: "model" (the GGUF's kairox.activation, else the architecture's) or
    # an override ("relu" for a ReLU-fied llama), profiled with and written as kairox.activation
    activation: str = "model"
    # predictors selecting more of the neurons than this are not written (DEFAULT_MAX_PRED_DENSITY)
    max_pred_density: float = DEFAULT_MAX_PRED_DENSITY
    # fit the thresholds to a quality budget on the finished model (fit.py): the largest
    # threshold scale whose held-out perplexity is within this share of dense; None keeps the
    # calibration to `sparsity`. fit_corpus None: corpus.fit_corpora (documentation, prose, source)
    fit_ppl: float | None = DEFAULT_MAX_PPL_INCREASE
    fit_tokens: int = DEFAULT_FIT_TOKENS
    fit_corpus: Corpus | None = None


@dataclass
class ConvertResult:
    output: Path
    profile_dir: Path
    profile_reused: bool
    thresholds: np.ndarray
    cats_thresholds: np.ndarray
    predictors: list[LayerPredictor | None]
    groupings: list[LayerGrouping]
    seconds: dict[str, float]
    input_bytes: int
    output_bytes: int
    mode: str  # the model's default sparse mode as written (kairox.mode)
    # why trained predictors were not written (they selected too many neurons); None otherwise
    predictor_note: str | None = None
    # the thresholds' fit to the quality budget (ConvertOptions.fit_ppl); None where not run
    fit: QualityFit | None = None


# ---------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputModel:
    reader: GGUFReader
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    tensors: dict[str, Any]


def _field(reader: GGUFReader, key: str) -> Any:
    f = reader.get_field(key)
    return f.contents() if f is not None else None


def open_input(path: Path) -> InputModel:
    """Read and validate the input GGUF's header (no weights loaded)."""
    if not path.is_file():
        raise KairoxError(f"model file not found: {path}")
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - the gguf reader raises ValueError, IndexError, ...
        raise KairoxError(f"cannot read {path} as GGUF: {e}") from None
    arch = _field(reader, "general.architecture")
    if arch not in fmt.SUPPORTED_ARCHES:
        raise KairoxError(f"unsupported architecture '{arch}' (supported: "
                          f"{', '.join(sorted(fmt.SUPPORTED_ARCHES))})")
    if _field(reader, fmt.KEY_FORMAT_VERSION) is not None:
        raise KairoxError(f"{path} already carries Kairox data: convert the original model")
    n_layer = _field(reader, f"{arch}.block_count")
    n_embd = _field(reader, f"{arch}.embedding_length")
    n_ff = _field(reader, f"{arch}.feed_forward_length")
    if not all(isinstance(v, int) for v in (n_layer, n_embd, n_ff)):
        raise KairoxError(f"{path}: missing or per-layer {arch} dimensions (only uniform "
                          f"dense FFNs are supported)")
    tensors = {t.name: t for t in reader.tensors}
    gated = arch not in fmt.UNGATED_ARCHES
    kinds = ("ffn_gate", "ffn_up", "ffn_down") if gated else ("ffn_up", "ffn_down")
    for il in range(n_layer):
        for kind in kinds:
            name = f"blk.{il}.{kind}.weight"
            if name not in tensors:
                raise KairoxError(f"{path}: tensor {name} is missing (a "
                                  f"{'gated ' if gated else ''}dense FFN is needed)")
        if not gated and f"blk.{il}.ffn_gate.weight" in tensors:
            raise KairoxError(f"{path}: an {arch} model with an FFN gate is not supported")
        # biases: down's is added after the sparse down; up's (an ungated FFN's, OPT's fc1) is
        # permuted with the neurons and added to the selected ones only; a gated FFN's are not
        # run by the sparse path
        for kind in ("ffn_gate", "ffn_up") if gated else ("ffn_gate",):
            if f"blk.{il}.{kind}.bias" in tensors:
                raise KairoxError(f"{path}: a bias on {kind} is not supported by the sparse path")
    return InputModel(reader, arch, n_layer, n_embd, n_ff, tensors)


def default_self_text(inp: InputModel) -> int:
    """Self-text tokens for a conversion that did not ask: DEFAULT_SELF_TEXT up to
    SELF_TEXT_MAX_PARAMS parameters, none above."""
    n_params = sum(int(t.n_elements) for t in inp.reader.tensors)
    return DEFAULT_SELF_TEXT if n_params <= SELF_TEXT_MAX_PARAMS else 0


def resolve_down_type(name: str, inp: InputModel) -> str:
    """`name`, or for "auto" the type ffn_down_t is written or derived in: q6_k where every
    layer's ffn_down has at most 6 bits per weight and Q6_K's 256-wide blocks fit a row of
    down_t (n_embd), else q8_0 (8-bit or float originals, or widths K-quants cannot block)."""
    if name != "auto":
        return name
    types = {inp.tensors[f"blk.{il}.ffn_down.weight"].tensor_type.name for il in range(inp.n_layer)
             if f"blk.{il}.ffn_down.weight" in inp.tensors}
    if types and types <= _UP_TO_6_BITS and inp.n_embd % 256 == 0:
        return "q6_k"
    return "q8_0"


def check_options(opts: ConvertOptions, inp: InputModel) -> None:
    if not 0.0 <= opts.sparsity < 1.0:
        raise KairoxError(f"--sparsity must be in [0, 1), got {opts.sparsity}")
    if not 0.0 < opts.recall < 1.0:
        raise KairoxError(f"--recall must be in (0, 1), got {opts.recall}")
    if opts.mode not in fmt.MODES:
        raise KairoxError(f"--mode must be one of {', '.join(fmt.MODES)}")
    if opts.self_text is not None and opts.self_text < 0:
        raise KairoxError(f"--self-text must be >= 0, got {opts.self_text}")
    if not (opts.pred_down_scale >= 0.0 and math.isfinite(opts.pred_down_scale)):
        raise KairoxError(f"--pred-down-scale must be finite and >= 0, got {opts.pred_down_scale}")
    if opts.activation not in KAIROX_ACTIVATIONS:
        raise KairoxError(f"--activation must be one of {', '.join(KAIROX_ACTIVATIONS)}, got {opts.activation!r}")
    if opts.mode == "cats" and inp.arch in fmt.UNGATED_ARCHES:
        raise KairoxError(f"--mode cats needs a gated FFN (|act(gate)|); {inp.arch} has none: "
                          f"use --mode predictor or threshold")
    if opts.mode == "predictor" and not opts.predictor:
        raise KairoxError("--mode predictor needs predictors (drop --no-predictor)")
    if not 0.0 < opts.max_pred_density <= 1.0:
        raise KairoxError(f"--max-pred-density must be in (0, 1], got {opts.max_pred_density}")
    if opts.pred_type not in PRED_TYPES:
        raise KairoxError(f"predictor type must be one of {', '.join(PRED_TYPES)}")
    if opts.fit_ppl is not None and not (0.0 < opts.fit_ppl < 10.0):
        raise KairoxError(f"--max-ppl-increase must be in (0, 10), got {opts.fit_ppl}")
    if opts.fit_tokens < 64:
        raise KairoxError(f"--fit-tokens must be at least 64, got {opts.fit_tokens}")
    check_group_size(inp.n_ff, opts.group_size)
    check_quantizable(ggml_type(opts.down_type), inp.n_embd)
    if opts.pred_type not in _FLOAT_PRED_TYPES and opts.pred_type != "auto":
        check_quantizable(ggml_type(opts.pred_type), inp.n_embd, "--pred-type")


def check_output(out: Path, inp_path: Path) -> None:
    if not out.parent.is_dir():
        raise KairoxError(f"output directory does not exist: {out.parent}")
    if out.exists() and out.resolve() == inp_path.resolve():
        raise KairoxError("the output would overwrite the input")
    if out.is_dir():
        raise KairoxError(f"output is a directory: {out}")
    check_output_file(out)  # writable: found now, not after minutes of profiling and training
    remove_stale_temporaries(out)  # what killed conversions to OUT left


# ---------------------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------------------
def _act(name: str, x: np.ndarray) -> np.ndarray:
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu":  # ggml's tanh approximation
        return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
    return np.maximum(x, 0.0)


def read_tensor(inp: InputModel, t: ReaderTensor) -> np.ndarray:
    """A tensor's data as a private copy read from the file, not through the reader's map:
    pages read through the map would stay in the resident set, a model's worth by the end."""
    data = t.data
    path = inp.reader.data.filename
    assert path is not None  # the reader maps a file
    return np.fromfile(path, dtype=data.dtype, count=data.size,
                       offset=t.data_offset).reshape(data.shape)


def sample_tokens(n_tokens: int, limit: int) -> np.ndarray:
    """At most `limit` token indices evenly spread over the sample (all of them if fewer)."""
    if n_tokens <= limit:
        return np.arange(n_tokens)
    return np.unique(np.linspace(0, n_tokens - 1, limit).round().astype(np.int64))


def cats_thresholds(inp: InputModel, prof: Profile, sparsity: float, activation: str,
                    tick: Callable[[], None] | None = None, max_tokens: int = CATS_TOKENS) -> np.ndarray:
    """Per-layer |act(gate)| thresholds over at most `max_tokens` profiled tokens. The profiler
    records the FFN input, so gate is recomputed here as one matmul with the dequantized gate
    weights (no transformer re-implementation: just that layer's gate projection of recorded
    inputs)."""
    out = np.zeros(inp.n_layer, dtype=np.float32)
    rows = sample_tokens(prof.n_tokens, max_tokens)
    for il in range(inp.n_layer):
        if activation != "relu" and inp.arch not in fmt.UNGATED_ARCHES:  # no gate: no CATS
            t = inp.tensors[f"blk.{il}.ffn_gate.weight"]
            wg = dequantize(read_tensor(inp, t), t.tensor_type)  # (n_ff, n_embd)
            x = np.asarray(prof.rows("inputs", il)[rows], dtype=np.float32)
            out[il] = magnitude_quantile(np.abs(_act(activation, x @ wg.T)), sparsity)
        if tick:
            tick()
    return out


def probe_layers(n_layer: int, k: int = PROBE_LAYERS) -> list[int]:
    """k layers spread evenly over the depth (the middle of k equal spans): the sample the
    predictor and METIS decisions are made on."""
    k = max(1, min(k, n_layer))
    return sorted({int((i + 0.5) * n_layer / k) for i in range(k)})


def _layer_list(layers: Sequence[int]) -> str:
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(str(il) for il in layers)


def predictor_verdict(preds: Sequence[LayerPredictor], opts: ConvertOptions, where: str) -> str | None:
    """Why predictors are not worth writing (their mean predicted density exceeds
    opts.max_pred_density), or None where they are."""
    dens = float(np.mean([p.density for p in preds]))
    if dens <= opts.max_pred_density:
        return None
    return (f"predictors select {dens:.0%} of the neurons at recall {opts.recall:g} ({where}), over "
            f"--max-pred-density {opts.max_pred_density:g}: not used")


def train_predictors(prof: Profile, mags: Sequence[LayerMagnitudes], thr: np.ndarray,
                     opts: ConvertOptions, console: Console | None
                     ) -> tuple[list[LayerPredictor | None], str | None]:
    """Every layer's predictor, or none with the reason (predictor_verdict): the sampled
    layers (probe_layers) are trained first and decide whether the rest is trained at all;
    then all layers together decide. Predictor mode asked for with predictors that are not
    used is an error, raised as soon as that is known."""
    n_layer = prof.n_layer
    probe = probe_layers(n_layer)
    rest = [il for il in range(n_layer) if il not in probe]
    out: list[LayerPredictor | None] = [None] * n_layer
    n_ranks = len(opts.train.ranks)
    # one BLAS thread: mini-batch products gain little from more, and lose much on busy cores
    with make_progress(console) as bar, blas_threads(1):
        task = bar.add_task("training predictors", total=n_layer * n_ranks)
        done = 0

        def train(layers: Sequence[int]) -> list[LayerPredictor]:
            nonlocal done
            for il in layers:
                data = profile_layer_data(prof, il, mags[il], opts.train)
                out[il] = train_on(data, float(thr[il]), opts.train, lambda _rank: bar.advance(task))
                done += n_ranks  # ranks not tried (a larger one that did not pay) count as done
                bar.update(task, completed=done)
            return [p for p in (out[il] for il in layers) if p is not None]

        note = predictor_verdict(train(probe), opts, f"{len(probe)} sampled {_layer_list(probe)}")
        if note is None:
            train(rest)
            note = predictor_verdict([p for p in out if p is not None], opts, "all layers")
        else:
            bar.update(task, total=done)  # the other layers are not trained: the bar ends here
    if note is None:
        return out, None
    if opts.mode == "predictor":
        raise KairoxError(f"{note.removesuffix(': not used')}: predictor mode would compute nearly "
                          f"every neuron; convert with --mode threshold (written without "
                          f"predictors), or keep them with --max-pred-density 1")
    if console is not None:
        console.print(f"[yellow]note:[/] {note}")
    return [None] * n_layer, note


def group_layers(prof: Profile, thr: np.ndarray, opts: ConvertOptions, n_ff: int,
                 console: Console | None) -> list[LayerGrouping]:
    """Every layer's grouping (grouping.py), from the masks a chunk of tokens at a time. METIS
    is tried on the sampled layers (probe_layers) and on the others only if it was kept on
    one of those; the original order where opts.reorder is False (None groups: convert()
    resolves it first, resolve_reorder)."""
    n_layer = prof.n_layer
    out: list[LayerGrouping | None] = [None] * n_layer
    reorder = opts.reorder is not False
    probe = probe_layers(n_layer) if reorder else []
    with make_progress(console) as bar:
        task = bar.add_task("grouping" if reorder else "group frequencies", total=n_layer)
        for il in probe:
            out[il] = _group_one(prof, il, float(thr[il]), opts, n_ff, True)
            bar.advance(task)
        use_metis = any(g is not None and g.method == METHOD_METIS for g in out)
        for il in range(n_layer):
            if out[il] is None:
                out[il] = _group_one(prof, il, float(thr[il]), opts, n_ff, use_metis)
                bar.advance(task)
    return [g for g in out if g is not None]


def _group_one(prof: Profile, il: int, thr: float, opts: ConvertOptions, n_ff: int,
               use_metis: bool) -> LayerGrouping:
    def chunks() -> Iterator[np.ndarray]:
        return prof.mask_chunks(il, thr)

    if opts.reorder is False:
        return identity_grouping(n_ff, opts.group_size, activation_frequency(chunks(), n_ff))
    return group_layer_stream(chunks, n_ff, opts.group_size, use_metis=use_metis)


def resolve_reorder(opts: ConvertOptions, predictors: Sequence[LayerPredictor | None]) -> bool:
    """opts.reorder, or where it is None (the default) whether any predictor is written: groups
    serve predictor mode and the hybrid runtime's cache, while a model without predictors runs
    threshold/CATS on the CPU, where a reordered file only adds the un-permute of the hidden
    state before ffn_down (a gather over every prefill token) to the dense path."""
    if opts.reorder is not None:
        return opts.reorder
    return any(p is not None for p in predictors)


def release_pages(reader: GGUFReader) -> None:
    """Drop the pages of the input that were read through the reader's map from this process's
    resident set (MADV_DONTNEED on a read-only file map: the page cache keeps them, and a later
    read faults them back in). Where the platform has no madvise this does nothing."""
    mm = getattr(reader.data, "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mm is not None and advice is not None and hasattr(mm, "madvise"):
        try:
            mm.madvise(advice)
        except (OSError, ValueError):
            pass  # only a memory optimisation


def release_metadata(reader: GGUFReader) -> None:
    """Drop the reader's parsed metadata once it is in the output: GGUFReader keeps numpy views
    of every value, which for a 150k-token vocabulary hold hundreds of MB of Python objects that
    the fit and the crossover, loading the finished model, do not need next to it."""
    reader.fields.clear()


def release_heap() -> None:
    """Collect garbage and hand the C heap's free pages back to the system (glibc's
    malloc_trim), so that what a finished stage freed does not stay in the resident set while
    the next stage loads the model. Elsewhere this only collects."""
    gc.collect()
    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        trim = None
    if trim is not None:
        trim(0)


def _written() -> np.ndarray:
    raise KairoxError("internal error: a planned tensor was written twice")


# ---------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------
@dataclass
class NewTensor:
    name: str
    shape: tuple[int, ...]  # numpy shape of `make()`'s result
    dtype: Any
    nbytes: int
    raw_dtype: GGMLQuantizationType | None
    make: Callable[[], np.ndarray]


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter, skip_keys: frozenset[str] = frozenset()) -> None:
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF.") or f.name in skip_keys:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)


def _constant(arr: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: arr


def _input_tensor(t: ReaderTensor, perm: np.ndarray | None = None) -> NewTensor:
    """A tensor of the input written again (its rows in `perm` order, if given)."""
    data = t.data
    raw = None if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else t.tensor_type
    return NewTensor(t.name, tuple(data.shape), data.dtype, int(data.nbytes), raw, _rows(data, perm))


def _array_tensor(name: str, arr: np.ndarray) -> NewTensor:
    return NewTensor(name, arr.shape, arr.dtype, arr.nbytes, None, _constant(arr))


def _rows(data: np.ndarray, perm: np.ndarray | None) -> Callable[[], np.ndarray]:
    """The tensor's data, rows permuted if perm is given (raw bytes rows for quantized
    types: a row of a quantized matrix is whole blocks, so no requantization is needed)."""
    if perm is None:
        return lambda: np.asarray(data)
    if data.ndim == 1 or data.shape[0] == 1:  # a vector (a bias, maybe stored as 1 x n): its entries
        if data.dtype not in (np.float32, np.float16):
            raise KairoxError("a quantized bias cannot be permuted")
        return lambda: np.ascontiguousarray(np.asarray(data).reshape(-1)[perm].reshape(data.shape))
    return lambda: np.ascontiguousarray(np.asarray(data)[perm])


def _pred_matrix(name: str, w: np.ndarray, pred_type: str) -> NewTensor:
    """A predictor weight matrix (rows, cols) in its type. Quantized predictors exist because
    on a small model F16 predictors read a third as many bytes per token as the FFN they prune;
    Q8_0 halves that for a negligible change of the logits."""
    if pred_type in _FLOAT_PRED_TYPES:
        return _array_tensor(name, w.astype(_FLOAT_PRED_TYPES[pred_type]))
    qtype = ggml_type(pred_type)
    rows, cols = w.shape
    check_quantizable(qtype, cols, "--pred-type")  # W2's rows are rank long
    nb = row_nbytes(qtype, cols)
    data = quantize(w, qtype)
    return NewTensor(name, (rows, nb), np.uint8, rows * nb, qtype, _constant(data))


def pred_layer_type(pred_type: str, n_embd: int, rank: int) -> str:
    """The type one layer's predictor is stored in ("auto" resolved; W1 and W2 share it)."""
    if pred_type != "auto":
        return pred_type
    block, _ = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
    return "q8_0" if n_embd % block == 0 and rank % block == 0 else "f16"


def _pred_tensors(il: int, p: LayerPredictor, pred_type: str) -> list[NewTensor]:
    pred_type = pred_layer_type(pred_type, p.w1.shape[1], p.rank)
    return [
        _pred_matrix(fmt.tensor_name(fmt.TENSOR_PRED_UP, il), p.w1, pred_type),
        _array_tensor(fmt.tensor_name(fmt.TENSOR_PRED_UP, il, "bias"), p.b1.astype(np.float32)),
        _pred_matrix(fmt.tensor_name(fmt.TENSOR_PRED_DOWN, il), p.w2, pred_type),
        _array_tensor(fmt.tensor_name(fmt.TENSOR_PRED_DOWN, il, "bias"), p.b2.astype(np.float32)),
    ]


def _down_t_tensor(inp: InputModel, il: int, perm: np.ndarray,
                   qtype: GGMLQuantizationType) -> NewTensor:
    src = inp.tensors[f"blk.{il}.ffn_down.weight"]

    def make() -> np.ndarray:
        w = dequantize(src.data, src.tensor_type)  # (n_embd, n_ff): one row per output
        return quantize(np.ascontiguousarray(w.T[perm]), qtype)  # (n_ff, n_embd) permuted

    n_ff, n_embd = inp.n_ff, inp.n_embd
    if qtype == GGMLQuantizationType.F32:
        return NewTensor("", (n_ff, n_embd), np.float32, n_ff * n_embd * 4, None, make)
    if qtype == GGMLQuantizationType.F16:
        return NewTensor("", (n_ff, n_embd), np.float16, n_ff * n_embd * 2, None, make)
    nb = row_nbytes(qtype, n_embd)
    return NewTensor("", (n_ff, nb), np.uint8, n_ff * nb, qtype, make)


def plan_tensors(inp: InputModel, opts: ConvertOptions, groupings: list[LayerGrouping],
                 predictors: list[LayerPredictor | None]) -> list[NewTensor]:
    """Every tensor of the output, in order: the input's (gate/up rows permuted), then the
    Kairox tensors per layer."""
    plan: list[NewTensor] = []
    for t in inp.reader.tensors:
        parts = t.name.split(".")
        # gate/up rows and the up bias (an ungated FFN's) follow the neuron order
        permute = (opts.reorder and len(parts) == 4 and parts[0] == "blk"
                   and parts[2] in ("ffn_gate", "ffn_up") and parts[3] in ("weight", "bias"))
        plan.append(_input_tensor(t, groupings[int(parts[1])].perm if permute else None))
    qtype = ggml_type(opts.down_type)
    for il in range(inp.n_layer):
        g = groupings[il]
        if opts.down_t_in_file:
            dt = _down_t_tensor(inp, il, g.perm, qtype)
            dt.name = fmt.tensor_name(fmt.TENSOR_DOWN_T, il)
            plan.append(dt)
        p = predictors[il]
        if p is not None:
            plan.extend(_pred_tensors(il, p.permuted(g.perm), opts.pred_type))
        plan.append(_array_tensor(fmt.tensor_name(fmt.TENSOR_PERM, il, ""), g.perm.astype(np.int32)))
        plan.append(_array_tensor(fmt.tensor_name(fmt.TENSOR_PERM_INV, il, ""),
                                  g.perm_inv.astype(np.int32)))
        plan.append(_array_tensor(fmt.tensor_name(fmt.TENSOR_GROUP_FREQ, il, ""),
                                  g.group_freq.astype(np.float32)))
    return plan


def kairox_metadata(opts: ConvertOptions, n_layer: int, thresholds: np.ndarray,
                    cats: np.ndarray, predictors: list[LayerPredictor | None],
                    activation_override: str | None) -> list[tuple[str, Any, GGUFValueType,
                                                              GGUFValueType | None]]:
    ranks = [p.rank if p is not None else 0 for p in predictors]
    kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = [
        (fmt.KEY_FORMAT_VERSION, fmt.FORMAT_VERSION, GGUFValueType.UINT32, None),
        (fmt.KEY_MODE, opts.mode, GGUFValueType.STRING, None),
        (fmt.KEY_GROUP_SIZE, opts.group_size, GGUFValueType.UINT32, None),
        (fmt.KEY_SPARSITY, float(opts.sparsity), GGUFValueType.FLOAT32, None),
        (fmt.KEY_THRESHOLD, [float(v) for v in thresholds], GGUFValueType.ARRAY,
         GGUFValueType.FLOAT32),
        (fmt.KEY_CATS_THRESHOLD, [float(v) for v in cats], GGUFValueType.ARRAY,
         GGUFValueType.FLOAT32),
        (fmt.KEY_PRED_RANK, ranks, GGUFValueType.ARRAY, GGUFValueType.INT32),
        (fmt.KEY_PRED_THRESHOLD, float(opts.train.prob_threshold), GGUFValueType.FLOAT32, None),
        (fmt.KEY_PRED_DOWN_SCALE, float(opts.pred_down_scale), GGUFValueType.FLOAT32, None),
        (fmt.KEY_PERMUTED, bool(opts.reorder), GGUFValueType.BOOL, None),
        # not measured yet (the library's built-in crossover); kairox calibrate fills it in
        # place on the machine that runs the model
        (fmt.KEY_DOWN_DENSE_SHARE, -1.0, GGUFValueType.FLOAT32, None),
        (fmt.KEY_GATE_UP_ROWS, -1, GGUFValueType.INT32, None),
    ]
    if not opts.down_t_in_file:
        kv.append((fmt.KEY_DOWN_T_TYPE, opts.down_type.lower(), GGUFValueType.STRING, None))
    if activation_override:
        kv.append((fmt.KEY_ACTIVATION, activation_override, GGUFValueType.STRING, None))
    assert len(thresholds) == len(cats) == len(ranks) == n_layer
    return kv


def min_output_bytes(inp: InputModel, opts: ConvertOptions) -> int:
    """A lower bound of the output's size known before profiling: every input tensor is
    copied, and each layer adds two permutations and its down_t where the file holds it
    (predictors and metadata come on top). A disk that cannot hold this much is refused
    before minutes of work."""
    row = row_nbytes(ggml_type(opts.down_type), inp.n_embd) if opts.down_t_in_file else 0
    copied = sum(int(t.n_bytes) for t in inp.reader.tensors)
    return copied + inp.n_layer * inp.n_ff * (row + 8)


def write_gguf(reader: GGUFReader, arch: str, out: Path,
               kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]],
               plan: list[NewTensor], console: Console | None, skip_keys: frozenset[str] = frozenset(),
               before_publish: Callable[[Path], None] | None = None) -> int:
    """Write atomically: a temporary file beside `out`, renamed when complete (after
    `before_publish` has run on it, so what it adds in place is there before anyone can open
    `out`). The metadata is `reader`'s (but `skip_keys`) followed by `kv`. A full disk is a
    KairoxError naming `out` and the size, with no file left behind."""
    needed = sum(t.nbytes for t in plan)
    check_free_space(out, needed)
    full = False
    try:
        with atomic_file(out) as tmp:
            writer = GGUFWriter(tmp, arch)
            try:
                _copy_metadata(reader, writer, skip_keys)
                for key, val, vtype, sub in kv:
                    writer.add_key_value(key, val, vtype, sub_type=sub)
                write_tensors(writer, plan, console, endianess=reader.endianess)
            except BaseException as e:
                _close_quietly(writer)
                # judged while the temporary still fills the disk (atomic_file removes it next)
                full = is_disk_full(e, out.parent)
                raise
            size = tmp.stat().st_size
            if before_publish is not None:
                before_publish(tmp)
    except OSError:
        if full:  # reported once the temporary is gone, so the free space shown is the real one
            raise disk_full_error(out, needed) from None
        raise
    return size


def _close_quietly(writer: GGUFWriter) -> None:
    """Close a writer that failed: its buffered bytes cannot reach a full disk either, and a
    second ENOSPC from the close (or later from the garbage collector, as a stray warning)
    must not hide the first error."""
    for f in writer.fout or []:
        try:
            f.close()
        except OSError:
            pass
    writer.fout = None


def write_tensors(writer: GGUFWriter, plan: Sequence[NewTensor], console: Console | None,
                  label: str = "writing", endianess: GGUFEndian | None = None) -> None:
    """Finish a GGUF whose metadata `writer` holds: the tensor infos of `plan`, then each
    tensor's data, made only as it is written (one tensor in memory at a time, whatever the
    model's size), with a progress bar; closes the writer."""
    for t in plan:
        writer.add_tensor_info(t.name, t.shape, np.dtype(t.dtype), t.nbytes, raw_dtype=t.raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    for kv in writer.kv_data:  # written: a large vocabulary's values need not stay in memory
        kv.clear()
    writer.write_ti_data_to_file()
    with make_progress(console) as bar:
        task = bar.add_task(label, total=len(plan))
        for i, t in enumerate(plan):
            data = t.make()
            if data.shape != t.shape or data.nbytes != t.nbytes:
                raise KairoxError(f"internal error: tensor {t.name} has shape {data.shape}, "
                                  f"planned {t.shape}")
            writer.write_tensor_data(data, tensor_endianess=endianess)
            t.make = _written  # what made the data (quantized predictors, ...) can go now
            del data
            bar.advance(task)
            if i == len(plan) // 2:
                pause_point("write")  # test hook (outputs.pause_point): half the tensors written
    writer.close()


def rewrite_metadata(reader: GGUFReader, path: Path,
                     kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]],
                     skip_keys: frozenset[str], console: Console | None = None) -> None:
    """Rewrite the GGUF `reader` reads (at `path`) atomically with `kv` added and `skip_keys`
    left out, its tensors unchanged (e.g. a key added to GGUFs written before it existed)."""
    arch = reader.get_field("general.architecture")
    if arch is None:
        raise KairoxError(f"{path}: no general.architecture")
    write_gguf(reader, arch.contents(), path, kv, [_input_tensor(t) for t in reader.tensors], console, skip_keys)


# ---------------------------------------------------------------------------------------
# the whole conversion
# ---------------------------------------------------------------------------------------
def convert(in_path: str | os.PathLike[str], out_path: str | os.PathLike[str], corpus: Corpus,
            opts: ConvertOptions, *, profile_dir: str | os.PathLike[str] | None = None,
            console: Console | None = None,
            before_publish: Callable[[Path, ConvertResult], None] | None = None) -> ConvertResult:
    """Convert `in_path` into a Kairox GGUF at `out_path` (see the module docstring).
    before_publish(tmp, result) runs on the complete temporary file before it is renamed to
    `out_path`: work that finishes the file (the crossover calibration) or belongs with it
    (the report) is then part of the conversion, and a kill during it leaves no OUT."""
    in_p, out_p = Path(in_path), Path(out_path)
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    with _status(console, f"reading {in_p.name}"):  # a large vocabulary's metadata takes seconds
        inp = open_input(in_p)
    opts = replace(opts, down_type=resolve_down_type(opts.down_type, inp))
    check_options(opts, inp)
    check_output(out_p, in_p)
    check_free_space(out_p, min_output_bytes(inp, opts))
    with _status(console, f"hashing {in_p.name}"):
        model_sha = None if profile_dir else file_sha256(in_p)  # keys the cached profile (and self-text)
    n_self = opts.self_text if opts.self_text is not None else default_self_text(inp)
    if n_self and not (profile_dir and Path(profile_dir).exists()):
        t = time.monotonic()
        corpus = with_self_text(corpus, in_p, n_self, threads=opts.threads, console=console,
                                model_sha256=model_sha, activation=opts.activation)
        seconds["self-text"] = time.monotonic() - t
    t = time.monotonic()
    pdir = (Path(profile_dir) if model_sha is None
            else default_profile_dir(model_sha, corpus, opts.tokens, opts.ctx, opts.activation))
    pdir.parent.mkdir(parents=True, exist_ok=True)
    if model_sha is not None:
        _drop_unreadable_cache_entry(pdir, console)
    prof, reused = open_or_run_profile(in_p, corpus, pdir, n_tokens=opts.tokens, ctx=opts.ctx,
                                       threads=opts.threads, console=console,
                                       match_corpus=opts.profile_match_corpus,
                                       match_tokens=opts.profile_match_tokens,
                                       activation=opts.activation)
    if (prof.meta.n_layer, prof.meta.n_embd, prof.meta.n_ff) != (inp.n_layer, inp.n_embd, inp.n_ff):
        raise KairoxError(f"profile {pdir} does not match the model's dimensions")
    seconds["profile"] = time.monotonic() - t
    activation = prof.meta.activation
    n_layer = inp.n_layer

    t = time.monotonic()
    thr, cats, mags = calibrate_thresholds(inp, prof, opts, activation, console)
    seconds["calibrate"] = time.monotonic() - t

    predictors: list[LayerPredictor | None] = [None] * n_layer
    pred_note = None
    pause_point("predictors")  # test hook (outputs.pause_point): the profile is complete
    if opts.predictor:
        t = time.monotonic()
        predictors, pred_note = train_predictors(prof, mags, thr, opts, console)
        seconds["predictors"] = time.monotonic() - t
    del mags

    opts = replace(opts, reorder=resolve_reorder(opts, predictors))
    t = time.monotonic()
    groupings = group_layers(prof, thr, opts, inp.n_ff, console)
    seconds["grouping"] = time.monotonic() - t

    t = time.monotonic()
    override = None if opts.activation == "model" else opts.activation
    kv = kairox_metadata(opts, n_layer, thr, cats, predictors, override)
    plan = plan_tensors(inp, opts, groupings, predictors)
    res = ConvertResult(out_p, pdir, reused, thr, cats, predictors, groupings, seconds,
                        in_p.stat().st_size, 0, opts.mode, pred_note)

    def finish(tmp: Path) -> None:
        res.output_bytes = tmp.stat().st_size
        seconds["write"] = time.monotonic() - t
        release_pages(inp.reader)  # before the crossover maps the output
        release_metadata(inp.reader)
        # the fit and the crossover load the finished model as it runs: what the earlier
        # stages hold goes first (the predictors' weights are in the file; the report and
        # the summary read their scores only)
        for p in predictors:
            if p is not None:
                p.drop_weights()
        release_heap()
        if opts.fit_ppl is not None and activation != "relu":  # ReLU: exact zeros, nothing to fit
            t_fit = time.monotonic()
            res.fit = fit_thresholds(tmp, opts.fit_corpus or fit_corpora(), opts.fit_ppl,
                                     tokens=opts.fit_tokens, threads=opts.threads, console=console)
            res.thresholds, res.cats_thresholds = thr * res.fit.scale, cats * res.fit.scale
            seconds["fit"] = time.monotonic() - t_fit
            release_heap()  # what the fit's evaluations freed, before the crossover loads the model
        if before_publish is not None:
            before_publish(tmp, res)

    write_gguf(inp.reader, inp.arch, out_p, kv, plan, console,
               frozenset({fmt.KEY_ACTIVATION}) if override else frozenset(), before_publish=finish)
    seconds["total"] = time.monotonic() - t0
    return res


def _status(console: Console | None, what: str) -> AbstractContextManager[Any]:
    """A spinner with `what` on the console for a step without a progress bar (nothing
    without a console)."""
    return console.status(what) if console is not None else nullcontext()


def calibrate_thresholds(inp: InputModel, prof: Profile, opts: ConvertOptions, activation: str,
                         console: Console | None
                         ) -> tuple[np.ndarray, np.ndarray, list[LayerMagnitudes]]:
    """(|act(gate)*up| thresholds, CATS thresholds, each layer's LayerMagnitudes) at
    opts.sparsity: one streaming pass per layer gives the exact quantile (and what the
    predictors' outlier rule needs). ReLU: thresholds 0."""
    n_layer = inp.n_layer
    thr = np.zeros(n_layer, dtype=np.float32)
    mags: list[LayerMagnitudes] = []
    need = activation != "relu" or opts.predictor
    with make_progress(console) as bar:
        task = bar.add_task("calibrating", total=2 * n_layer)
        for il in range(n_layer):
            if need:
                mags.append(prof.layer_magnitudes(il))
                if activation != "relu":
                    thr[il] = mags[il].quantile(opts.sparsity)
            bar.advance(task)
        cats = cats_thresholds(inp, prof, opts.sparsity, activation, lambda: bar.advance(task))
    return thr, cats, mags


def _drop_unreadable_cache_entry(pdir: Path, console: Console | None) -> None:
    """Remove a cached profile that cannot be opened, so that it is profiled again: the cache
    is ours to rebuild, and one damaged entry (written by an older version that replaced
    profiles in place, or damaged on the disk) must not fail every later conversion. A
    --profile directory the user named is never removed: its errors are reported."""
    if not pdir.exists():
        return
    try:
        Profile(pdir)
    except KairoxError as e:
        if console is not None:
            console.print(f"[yellow]note:[/] the cached profile cannot be read ({e}); profiling again")
        aside = temp_sibling(pdir, ".old")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(pdir, aside)  # out of the way at once; its files go next
        shutil.rmtree(aside, ignore_errors=True)


def grouping_rows(groupings: Sequence[LayerGrouping]) -> list[tuple[str, str]]:
    """Which grouping each layer kept and the scores behind the choice (mean over layers of the
    share of co-activation inside groups), so a conversion shows whether METIS earned its
    place; nothing for the original order (--no-reorder)."""
    g = [x for x in groupings if x.method in (METHOD_METIS, METHOD_FREQUENCY)]
    if not g:
        return []
    n_metis = sum(x.method == METHOD_METIS for x in g)
    metis = [x.intra for x in g if not math.isnan(x.intra)]
    if not metis:
        why = "pymetis not installed" if not metis_available() else "one group per layer"
        kept = f"frequency in all {len(g)} layers (METIS not tried: {why})"
        metis_s = "-"
    else:
        kept = (f"frequency in {len(g) - n_metis} layers, METIS in {n_metis} "
                "(where it keeps measurably more co-activation inside groups)")
        if len(metis) < len(g):
            kept += (f"; METIS tried on {len(metis)} sampled layers, better on none: not run on "
                     f"the other {len(g) - len(metis)}")
        metis_s = f"{np.mean(metis):.4f}"
    scores = (f"{np.mean([x.intra_freq for x in g]):.4f} / {metis_s} / "
              f"{np.mean([x.intra_random for x in g]):.4f}")
    return [("grouping", kept),
            ("intra-group co-activation: frequency / METIS / random", scores)]


def summary_rows(res: ConvertResult) -> list[tuple[str, str]]:
    """(label, value) pairs for the summary table."""
    preds = [p for p in res.predictors if p is not None]
    size = f"{res.input_bytes / 1e6:.1f} MB -> {res.output_bytes / 1e6:.1f} MB"
    rows = [("output", str(res.output)), ("size", size),
            ("profile", f"{res.profile_dir} ({'reused' if res.profile_reused else 'new'})"),
            ("default mode", res.mode)]
    if res.predictor_note:
        rows.append(("predictors", res.predictor_note))
    if preds:
        ranks = [p.rank for p in preds]
        rows += [("predictor rank (min/mean/max)",
                  f"{min(ranks)}/{np.mean(ranks):.0f}/{max(ranks)}"),
                 ("predictor recall (mean, min)",
                  f"{np.mean([p.recall for p in preds]):.3f}, {min(p.recall for p in preds):.3f}"),
                 ("predictor precision (mean)", f"{np.mean([p.precision for p in preds]):.3f}"),
                 ("predicted density (mean)", f"{np.mean([p.density for p in preds]):.3f}")]
    if all(g.method == METHOD_IDENTITY for g in res.groupings):
        rows.append(("neuron order", "original (no predictors: no groups to gather; --reorder "
                                     "forces co-activation groups)" if not preds else "original"))
    if res.fit is not None:
        rows.append(("sparsity fit", res.fit.describe()))
    rows += grouping_rows(res.groupings)
    rows.append(("time", ", ".join(f"{k} {v:.1f}s" for k, v in res.seconds.items())))
    return rows
