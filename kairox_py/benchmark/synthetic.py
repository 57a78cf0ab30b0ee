"""Synthetic llama models with real shapes and random weights, for speed measurements only.

The default model is small (135M) and its tied 49k-token output layer weighs more than half
as much as all its FFNs, so it says little about speed at the sizes the papers use. A
synthetic model with LLaMA-2-7B shapes (hidden 4096, FFN 11008, 32 layers, Q4_0) can be
written on any machine in a minute: its weights are random quantized blocks (no
quantization pass), and its Kairox data selects a chosen share of the FFN neurons, either
as a fixed mask ("masks given": rank 0 with fixed per-neuron scores, so the graph does no
predictor work at all; see docs/FORMAT.md) or
through a real low-rank predictor of a chosen rank and type. The share is chosen at run time
with the predictor threshold (:func:`pred_threshold_for`), so one file serves every density.
Its text output is meaningless: speed only.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from .. import format as fmt
from ..errors import KairoxError
from ..outputs import atomic_file

#: bumped whenever the weights a given shape/spec produces change, so that cached files are
#: rewritten (2: zero-mean random codes; 3: kairox.synthetic, so that a workload can run)
SYNTHETIC_VERSION = 3

#: block layouts of the types written here: (elements per block, bytes per block)
_BLOCKS = {QT.Q4_0: (32, 18), QT.Q8_0: (32, 34), QT.F16: (1, 2), QT.F32: (1, 4)}
_TYPES = {"q4_0": QT.Q4_0, "q8_0": QT.Q8_0, "f16": QT.F16, "f32": QT.F32}


@dataclass(frozen=True)
class LlamaShape:
    """Dimensions of a llama-architecture model (defaults: LLaMA-2-7B)."""

    n_embd: int = 4096
    n_ff: int = 11008
    n_layer: int = 32
    n_head: int = 32
    n_head_kv: int = 32
    n_vocab: int = 32000
    n_ctx: int = 4096


SHAPES = {
    "7b": LlamaShape(),
    "1b": LlamaShape(n_embd=2048, n_ff=5632, n_layer=22, n_head=32, n_head_kv=4),
    "tiny": LlamaShape(n_embd=256, n_ff=768, n_layer=4, n_head=4, n_head_kv=4, n_vocab=512, n_ctx=512),
}


@dataclass(frozen=True)
class SparseSpec:
    """Kairox data of a synthetic model.

    pred_rank 0: masks given: each neuron's logit is a fixed bias logit(u), u uniform in
    (0, 1), so that threshold p selects a fixed random share 1 - p of the neurons with no
    predictor work; pred_rank > 0: a random predictor of that rank and type runs in the
    graph, its logits ~ N(0, 1) per token, so threshold p selects about 1 - Phi(logit(p)).
    """

    pred_rank: int = 0
    pred_type: str = "q4_0"

    def __post_init__(self) -> None:
        if self.pred_rank < 0:
            raise KairoxError("pred_rank must be >= 0")
        if self.pred_type not in _TYPES:
            raise KairoxError(f"pred_type must be one of {', '.join(_TYPES)}")


def pred_threshold_for(density: float, spec: SparseSpec) -> float:
    """The predictor probability threshold that makes about `density` of the neurons fire."""
    if not 0.0 < density < 1.0:
        raise KairoxError(f"density must be in (0, 1), got {density}")
    if spec.pred_rank == 0:
        return 1.0 - density
    z = _normal_ppf(1.0 - density)
    return 1.0 / (1.0 + math.exp(-z))


def _random_matrix(rng: np.random.Generator, rows: int, cols: int, qtype: QT, std: float) -> np.ndarray:
    """A (rows, bytes per row) uint8 array of random blocks of qtype with about this std."""
    per, nbytes = _BLOCKS[qtype]
    if cols % per:
        raise KairoxError(f"{cols} columns do not fit {qtype.name} blocks of {per}")
    if qtype in (QT.F16, QT.F32):
        dt = np.float16 if qtype == QT.F16 else np.float32
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(dt).view(np.uint8)
    nb = cols // per
    # codes symmetric around zero: uniform 0..15 nibbles (Q4_0 value d (q - 8)) would have mean
    # -d/2, which adds up over a long dot product (a rank-1024 predictor's logits sat at -2 sigma
    # and selected nothing); 4-bit codes 1..15 have std ~4.32, int8 codes -127..127 ~73.6
    out = np.empty((rows, nb, nbytes), dtype=np.uint8)
    if qtype == QT.Q4_0:
        lo = rng.integers(1, 16, size=(rows, nb, nbytes - 2), dtype=np.uint8)
        hi = rng.integers(1, 16, size=(rows, nb, nbytes - 2), dtype=np.uint8)
        out[:, :, 2:] = lo | (hi << 4)
    else:
        out[:, :, 2:] = rng.integers(-127, 128, size=(rows, nb, nbytes - 2), dtype=np.int8).view(np.uint8)
    scale = std / (4.32 if qtype == QT.Q4_0 else 73.6)
    d = np.full((rows, nb), scale, dtype=np.float16)
    out[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    return out.reshape(rows, nb * nbytes)


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: specials, 256 byte tokens, then filler words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    tokens += [f"\u2581w{i}" for i in range(n_vocab - len(tokens))]
    types += [1] * (n_vocab - len(types))
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, types


@dataclass(frozen=True)
class _Layout:
    """How an architecture's tensors differ from llama's (RMS norms, separate q/k/v, gated FFN,
    no biases, an output matrix of its own)."""

    layer_norm: bool = False   # LayerNorms (with zero biases unless `biases`)
    biases: bool = False       # a random bias on every norm and projection (OPT)
    qkv_bias: bool = False     # q/k/v biases
    fused_qkv: bool = False    # one attn_qkv (Falcon)
    qk_norm: bool = False      # q/k norms (Qwen3)
    post_norms: bool = False   # post-attention and post-FFN norms (Gemma 2)
    tied_output: bool = False  # the output is the token embedding (Gemma)
    parallel_ffn: bool = False  # the FFN reads the attention's norm: no FFN norm, no gate (Falcon)
    learned_pos: bool = False  # learned absolute positions, multi-head attention, no RoPE (OPT)
    sliding_window: int = 0    # local attention window of most layers (Gemma 3: 5 of every 6)


_LAYOUTS = {
    "llama": _Layout(),
    "falcon": _Layout(layer_norm=True, fused_qkv=True, parallel_ffn=True),
    "opt": _Layout(layer_norm=True, biases=True, qkv_bias=True, learned_pos=True),
    "qwen2": _Layout(qkv_bias=True),
    "qwen3": _Layout(qk_norm=True),
    "gemma": _Layout(tied_output=True),
    "gemma2": _Layout(tied_output=True, post_norms=True),
    "gemma3": _Layout(tied_output=True, post_norms=True, qk_norm=True, sliding_window=16),
}

#: the architectures write_synthetic_llama writes
SYNTHETIC_ARCHES = tuple(_LAYOUTS)


def write_synthetic_llama(path: str | os.PathLike[str], shape: LlamaShape = LlamaShape(),
                          wtype: str = "q4_0", sparse: SparseSpec | None = None,
                          seed: int = 0, group_size: int = 0, arch: str = "llama",
                          activation: str | None = None, group_freq: np.ndarray | None = None) -> Path:
    """Write a random-weight llama GGUF (with Kairox data when `sparse` is given), atomically.

    group_size > 0 also declares neuron groups of that size (no profiled frequencies), which
    the hybrid runtime needs; the benchmark files do without. arch: llama or another
    architecture the converter accepts, as llama's tensors with that architecture's differences
    (_LAYOUTS): Falcon's parallel, ungated GELU FFN; OPT's biases (its fc1 bias, which the sparse
    paths must add to the selected neurons only) and learned positions; Qwen2's q/k/v biases,
    Qwen3's q/k norms, Gemma's tied output and Gemma 2's post norms.
    activation ("relu", ...) writes kairox.activation, as a ReLU-fied llama's GGUF carries it.
    group_freq (n_layer, n_ff / group_size): the groups' profiled frequencies (kx_group_freq),
    e.g. a workload's base rates, from which the hybrid runtime places its cache at start.
    Every file declares kairox.synthetic, the one kind of model that runs a workload.
    """
    if arch not in SYNTHETIC_ARCHES:
        raise KairoxError(f"synthetic models are {', '.join(SYNTHETIC_ARCHES)}, not {arch!r}")
    if wtype not in ("q4_0", "q8_0", "f16"):
        raise KairoxError("synthetic weights must be q4_0, q8_0 or f16")
    qt = _TYPES[wtype]
    if shape.n_vocab < 300:
        raise KairoxError("the vocabulary needs at least 300 tokens")
    if group_size < 0 or (group_size and shape.n_ff % group_size):
        raise KairoxError(f"group_size must divide n_ff ({shape.n_ff}), got {group_size}")
    if group_freq is not None:
        group_freq = np.asarray(group_freq, dtype=np.float32)
        if sparse is None or not group_size or group_freq.shape != (shape.n_layer, shape.n_ff // group_size):
            raise KairoxError("group_freq needs Kairox data and group_size, shaped (n_layer, n_ff / group_size)")
    out = Path(path)
    if not out.parent.is_dir():
        raise KairoxError(f"output directory does not exist: {out.parent}")
    rng = np.random.default_rng(seed)
    e, f, L = shape.n_embd, shape.n_ff, shape.n_layer
    head_dim = e // shape.n_head
    lay = _LAYOUTS[arch]
    n_head_kv = shape.n_head if lay.learned_pos else shape.n_head_kv
    kv = head_dim * n_head_kv
    gated = not (lay.parallel_ffn or lay.biases)  # Falcon's and OPT's FFNs have no gate

    # (name, rows, cols, type, maker) in file order; makers run while writing, one at a time
    tensors: list[tuple[str, int, int, QT, object]] = []

    def mat(name: str, rows: int, cols: int, t: QT, std: float) -> None:
        tensors.append((name, rows, cols, t, lambda: _random_matrix(rng, rows, cols, t, std)))

    def ones(name: str, n: int) -> None:
        tensors.append((name, 1, n, QT.F32, lambda: np.ones((1, n), np.float32).view(np.uint8)))

    def const(name: str, arr: np.ndarray, t: QT) -> None:
        tensors.append((name, arr.shape[0] if arr.ndim == 2 else 1, arr.shape[-1], t,
                        lambda: np.atleast_2d(arr).view(np.uint8)))

    def zeros(name: str, n: int) -> None:
        tensors.append((name, 1, n, QT.F32, lambda: np.zeros((1, n), np.float32).view(np.uint8)))

    def vec(name: str, n: int, std: float, mean: float = 0.0) -> None:
        tensors.append((name, 1, n, QT.F32,
                        lambda: (mean + std * rng.standard_normal((1, n))).astype(np.float32).view(np.uint8)))

    def norm(name: str, n: int) -> None:
        ones(name + ".weight", n)
        if lay.biases:
            vec(name + ".bias", n, 0.05)
        elif lay.layer_norm:
            zeros(name + ".bias", n)

    mat("token_embd.weight", shape.n_vocab, e, qt, 1.0)
    if lay.learned_pos:
        mat("position_embd.weight", shape.n_ctx, e, QT.F32, 0.1)
    ones("output_norm.weight", e)
    if lay.layer_norm:
        zeros("output_norm.bias", e)
    if not lay.tied_output:
        mat("output.weight", shape.n_vocab, e, qt, 1.0 / math.sqrt(e))
    pred_qt = _TYPES[sparse.pred_type] if sparse else qt
    for i in range(L):
        p = f"blk.{i}."
        norm(p + "attn_norm", e)
        if lay.fused_qkv:
            mat(p + "attn_qkv.weight", e + 2 * kv, e, qt, 1.0 / math.sqrt(e))
        else:
            for proj, rows in (("attn_q", e), ("attn_k", kv), ("attn_v", kv)):
                mat(p + proj + ".weight", rows, e, qt, 1.0 / math.sqrt(e))
                if lay.qkv_bias:
                    vec(p + proj + ".bias", rows, 0.05)
            if lay.qk_norm:
                ones(p + "attn_q_norm.weight", head_dim)
                ones(p + "attn_k_norm.weight", head_dim)
        mat(p + "attn_output.weight", e, e, qt, 0.5 / math.sqrt(e))
        if lay.biases:
            vec(p + "attn_output.bias", e, 0.05)
        if lay.post_norms:
            ones(p + "post_attention_norm.weight", e)
            ones(p + "post_ffw_norm.weight", e)
        if not lay.parallel_ffn:
            norm(p + "ffn_norm", e)
        if gated:
            mat(p + "ffn_gate.weight", f, e, qt, 1.0 / math.sqrt(e))
        mat(p + "ffn_up.weight", f, e, qt, 1.0 / math.sqrt(e))
        if lay.biases:
            # a negative mean, as trained OPT fc1 biases have: most neurons below ReLU's zero
            vec(p + "ffn_up.bias", f, 0.3, -0.3)
        mat(p + "ffn_down.weight", e, f, qt, 0.5 / math.sqrt(f))
        if lay.biases:
            vec(p + "ffn_down.bias", e, 0.05)
        if sparse is None:
            continue
        down_t, pred_up, pred_down = (fmt.TENSOR_DOWN_T % i, fmt.TENSOR_PRED_UP % i, fmt.TENSOR_PRED_DOWN % i)
        mat(down_t + ".weight", f, e, qt, 0.5 / math.sqrt(f))
        if sparse.pred_rank == 0:
            # masks given: rank 0 with fixed scores (only the bias; the graph does no predictor
            # work), logit = bias = logit(u), u uniform: threshold p keeps a share 1 - p
            u = (rng.permutation(f).astype(np.float64) + 0.5) / f
            bias = np.log(u / (1.0 - u)).astype(np.float32)
            const(pred_down + ".bias", bias, QT.F32)
        else:
            # z = W2 relu(W1 x) ~ N(0, 1) for unit-RMS x; the bias puts the wanted share above 0
            r = sparse.pred_rank
            mat(pred_up + ".weight", r, e, pred_qt, 1.0 / math.sqrt(e))
            mat(pred_down + ".weight", f, r, pred_qt, math.sqrt(2.0 / r))
            const(pred_down + ".bias", np.zeros(f, np.float32), QT.F32)
        if group_freq is not None:
            const(fmt.TENSOR_GROUP_FREQ % i, group_freq[i], QT.F32)

    with atomic_file(out) as tmp:
        w = GGUFWriter(tmp, arch)
        w.add_name(f"kairox-synthetic-{wtype}")
        w.add_context_length(shape.n_ctx)
        w.add_embedding_length(e)
        w.add_block_count(L)
        w.add_feed_forward_length(f)
        w.add_head_count(shape.n_head)
        w.add_head_count_kv(n_head_kv)
        if not lay.learned_pos:
            w.add_rope_dimension_count(head_dim)
        if lay.layer_norm:
            w.add_layer_norm_eps(1e-5)
        else:
            w.add_layer_norm_rms_eps(1e-5)
        if lay.sliding_window:
            w.add_sliding_window(lay.sliding_window)
        w.add_file_type({"q4_0": 2, "q8_0": 7, "f16": 1}[wtype])
        w.add_vocab_size(shape.n_vocab)
        tokens, scores, types = _vocab(shape.n_vocab)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        if activation is not None:
            w.add_string(fmt.KEY_ACTIVATION, activation)
        if sparse is not None:
            w.add_uint32(fmt.KEY_FORMAT_VERSION, fmt.FORMAT_VERSION)
            w.add_string(fmt.KEY_MODE, "predictor")
            w.add_bool(fmt.KEY_SYNTHETIC, True)
            w.add_array(fmt.KEY_PRED_RANK, [sparse.pred_rank] * L)
            w.add_float32(fmt.KEY_PRED_THRESHOLD, 0.5)
            if group_size:
                w.add_uint32(fmt.KEY_GROUP_SIZE, group_size)
            w.add_string("general.description", "synthetic, predictor "
                         f"{'rank %d %s' % (sparse.pred_rank, sparse.pred_type) if sparse.pred_rank else 'none (masks given)'}")
        for name, rows, cols, t, _ in tensors:
            per, nbytes = _BLOCKS[t]
            w.add_tensor_info(name, (rows, cols // per * nbytes), np.dtype(np.uint8),
                              rows * cols // per * nbytes, raw_dtype=t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, _, _, _, make in tensors:
            w.write_tensor_data(make())  # type: ignore[operator]
        w.close()
    return out


def _normal_ppf(p: float) -> float:
    """Inverse standard normal CDF (bias that makes a N(0,1) logit exceed 0 with probability p)."""
    if p <= 0.0:
        return -30.0
    if p >= 1.0:
        return 30.0
    # bisection on the CDF: exact enough, and no scipy dependency
    lo, hi = -40.0, 40.0
    x = 0.0
    for _ in range(100):
        x = 0.5 * (lo + hi)
        if 0.5 * math.erfc(-x / math.sqrt(2.0)) < p:
            lo = x
        else:
            hi = x
    return x


def _kairox_tensor(name: str) -> bool:
    """A tensor a Kairox file adds to its original (down_t, predictors, permutations, group tables)."""
    return name.split(".")[2].startswith(("ffn_down_t", "kx_")) if name.startswith("blk.") else False


def write_original(kairox_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Write the original GGUF of a synthetic Kairox model, atomically: every key outside
    `kairox.` and every tensor the Kairox format does not add, byte for byte.

    A head-to-head needs llama.cpp to run the very weights Kairox runs, as a plain model of
    that architecture (upstream's kernels, its repacked layouts, its `-ngl` offload), not the
    Kairox file's dense mode."""
    src = Path(kairox_path)
    r = GGUFReader(src)
    if fmt.KEY_SYNTHETIC not in r.fields:
        raise KairoxError(f"{src} is not a synthetic Kairox model")
    arch = str(r.fields["general.architecture"].contents())
    with atomic_file(Path(out_path)) as tmp:
        w = GGUFWriter(tmp, arch)
        for f in r.fields.values():
            if f.name.startswith(("GGUF.", "kairox.")) or f.name in ("general.architecture", "general.description"):
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
        for t in r.tensors:
            if not _kairox_tensor(t.name):
                w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return Path(out_path)


def set_group_freq(path: str | os.PathLike[str], group_freq: np.ndarray) -> None:
    """Overwrite, in place, the profiled group frequencies of a synthetic model written with
    group_freq (same shape): one model file serves several workloads, each placed by its own
    frequencies when the model is next loaded."""
    r = GGUFReader(Path(path), "r+")
    freq = np.asarray(group_freq, dtype=np.float32)
    tables = {t.name: t for t in r.tensors if t.name.endswith(".kx_group_freq")}
    if freq.ndim != 2 or len(tables) != freq.shape[0]:
        raise KairoxError(f"{path} has group frequencies for {len(tables)} layers, got shape {freq.shape}")
    for i in range(freq.shape[0]):
        t = tables.get(fmt.TENSOR_GROUP_FREQ % i)
        if t is None or t.data.size != freq[i].size:
            raise KairoxError(f"{path} has no group frequencies of {freq.shape[1]} groups for layer {i}")
        t.data.reshape(-1)[:] = freq[i]
    r.data.flush()
