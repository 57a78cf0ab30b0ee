"""Decode traces: per generated token and layer, which FFN neurons fire and which the
predictor selects (the paper's 256-step activation sequences, section 6).

The real model generates a continuation of every prompt of a prompt set, one token per
decode call, in dense mode with the C profiler (so nothing of the transformer is
re-implemented here). After each single-token decode the profiler holds, per layer, the FFN
input and the hidden activation act(gate)*up of that step:

* a neuron is *active* when |hidden| exceeds the layer's threshold (``kairox.threshold`` of
  the Kairox GGUF; without one, thresholds calibrated on the trace itself to a sparsity);
* the *predicted* set is the Kairox GGUF's adjacent predictor evaluated in NumPy on the
  recorded inputs: layer l's predictor reads layer l-1's FFN input, layer 0 its own.

Neurons are stored in the Kairox GGUF's order (``kx_perm``: groups contiguous, hot first),
so group g of a layer is neurons [g*GS, (g+1)*GS). A trace directory holds

* ``meta.json``: models, prompts, sampling, thresholds, densities, recall, and the byte sizes
  the simulator's cost model needs (rows of gate/up/down_t, attention, output);
* ``active.npy`` / ``predicted.npy``: uint8 (n_seq, n_steps, n_layer, n_ff/8), one bit per
  neuron (``np.packbits(..., bitorder="little")``), opened memory-mapped;
* ``tokens.npy``: int32 (n_seq, n_steps), the token decoded at each step;
* ``group_freq.npy``: float32 (n_layer, n_groups), the profiled group frequency
  (``kx_group_freq``; without a Kairox GGUF, measured on the trace).

Generation samples (temperature, top-p, fixed seed per prompt) with end-of-generation tokens
banned, so every sequence has exactly n_steps decode steps, like the paper's sequences.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np
from gguf import GGUFReader
from rich.console import Console

from .. import format as fmt
from ..errors import KairoxError
from ..llama import ContextParams, Model, Profiler
from ..offline.profile import file_sha256, magnitude_quantile
from ..offline.quant import dequantize, down_t_size
from ..outputs import atomic_dir, check_output_dir
from ..progress import make_progress

TRACE_VERSION = 1
DEFAULT_STEPS = 256
#: everything record_traces writes into a trace directory (and so may replace there)
TRACE_FILES = ("meta.json", "active.npy", "predicted.npy", "tokens.npy", "group_freq.npy")
DEFAULT_SPARSITY = 0.5


# ---------------------------------------------------------------------------------------
# the Kairox GGUF side: thresholds, permutation, predictors, group frequencies, sizes
# ---------------------------------------------------------------------------------------
@dataclass
class KairoxData:
    """What a trace needs from a Kairox GGUF (all per layer, stored neuron order)."""

    path: Path
    group_size: int
    thresholds: np.ndarray  # f32 (n_layer,)
    pred_threshold: float
    perm: list[np.ndarray]  # int (n_ff,): original index of each stored neuron
    group_freq: np.ndarray  # f32 (n_layer, n_groups)
    pred: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None]  # w1, b1, w2, b2
    down_t_row_bytes: int
    down_t_type: str

    @property
    def has_predictor(self) -> bool:
        return any(p is not None for p in self.pred)

    def predict(self, layer: int, x: np.ndarray) -> np.ndarray:
        """bool (n, n_ff): predicted active neurons of `layer` for predictor inputs x (n, n_embd)."""
        p = self.pred[layer]
        if p is None:
            raise KairoxError(f"layer {layer} has no predictor")
        w1, b1, w2, b2 = p
        h = np.maximum(x @ w1.T + b1, 0.0)
        logits = h @ w2.T + b2
        # sigmoid(z) > p  <=>  z > logit(p)
        pt = min(max(self.pred_threshold, 1e-6), 1 - 1e-6)
        return logits > np.log(pt / (1.0 - pt))


def _field(reader: GGUFReader, key: str) -> Any:
    f = reader.get_field(key)
    return f.contents() if f is not None else None


def _tensor(tensors: dict[str, Any], name: str) -> np.ndarray | None:
    t = tensors.get(name)
    return None if t is None else dequantize(t.data, t.tensor_type)


def read_kairox(path: Path, n_layer: int, n_ff: int) -> KairoxData:
    """Read a Kairox GGUF's sparsity data; KairoxError if it is not one or does not fit."""
    if not path.is_file():
        raise KairoxError(f"Kairox GGUF not found: {path}")
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # the gguf reader raises many kinds on bad files
        raise KairoxError(f"cannot read {path} as GGUF: {e}") from None
    if _field(reader, fmt.KEY_FORMAT_VERSION) is None:
        raise KairoxError(f"{path} is not a Kairox GGUF (no {fmt.KEY_FORMAT_VERSION}): "
                          f"make one with `kairox convert`")
    gs = int(_field(reader, fmt.KEY_GROUP_SIZE) or 0)
    thr = np.asarray(_field(reader, fmt.KEY_THRESHOLD) or [], dtype=np.float32)
    if gs <= 0 or n_ff % gs or len(thr) != n_layer:
        raise KairoxError(f"{path} does not match the model (group size {gs}, "
                          f"{len(thr)} thresholds for {n_layer} layers, n_ff {n_ff})")
    tensors = {t.name: t for t in reader.tensors}
    perm, freq, pred = [], [], []
    for il in range(n_layer):
        p = tensors.get(fmt.tensor_name(fmt.TENSOR_PERM, il, ""))
        perm.append(np.asarray(p.data, dtype=np.int64).reshape(-1) if p is not None
                    else np.arange(n_ff))
        if len(perm[-1]) != n_ff:
            raise KairoxError(f"{path}: kx_perm of layer {il} has {len(perm[-1])} entries, not {n_ff}")
        f = tensors.get(fmt.tensor_name(fmt.TENSOR_GROUP_FREQ, il, ""))
        freq.append(np.asarray(f.data, dtype=np.float32).reshape(-1) if f is not None
                    else np.zeros(n_ff // gs, dtype=np.float32))
        w1 = _tensor(tensors, fmt.tensor_name(fmt.TENSOR_PRED_UP, il))
        w2 = _tensor(tensors, fmt.tensor_name(fmt.TENSOR_PRED_DOWN, il))
        if w1 is not None and w2 is not None:
            b1 = _tensor(tensors, fmt.tensor_name(fmt.TENSOR_PRED_UP, il, "bias"))
            b2 = _tensor(tensors, fmt.tensor_name(fmt.TENSOR_PRED_DOWN, il, "bias"))
            pred.append((w1, b1.reshape(-1) if b1 is not None else np.zeros(w1.shape[0], np.float32),
                         w2, b2.reshape(-1) if b2 is not None else np.zeros(w2.shape[0], np.float32)))
        else:
            pred.append(None)
    up = tensors.get("blk.0.ffn_up.weight")
    n_embd = int(up.shape[0]) if up is not None else 0
    dt_bytes, dt_type = down_t_size(reader, 0, n_embd, n_ff)
    return KairoxData(path, gs, thr, float(_field(reader, fmt.KEY_PRED_THRESHOLD) or 0.5),
                      perm, np.stack(freq), pred, dt_bytes // n_ff, dt_type)


def model_costs(path: Path, n_layer: int, n_ff: int, down_t_row_bytes: int,
                down_t_type: str = "") -> dict[str, Any]:
    """Byte sizes of the weights the simulator's cost model moves or reads, from the GGUF
    header: per-neuron rows of gate/up/down (down_t, as the hybrid runtime stores it),
    per-layer attention weights, and the rest of the per-token GPU work (output, norms)."""
    reader = GGUFReader(path, "r")
    t = {x.name: x for x in reader.tensors}

    def nbytes(name: str) -> int:
        return int(t[name].n_bytes) if name in t else 0

    gate = nbytes("blk.0.ffn_gate.weight") // n_ff
    up = nbytes("blk.0.ffn_up.weight") // n_ff
    down = down_t_row_bytes or nbytes("blk.0.ffn_down.weight") // n_ff
    attn = [sum(nbytes(f"blk.{il}.{n}.weight") for n in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output"))
            for il in range(n_layer)]
    out = nbytes("output.weight") or nbytes("token_embd.weight")
    def tname(name: str) -> str:
        return t[name].tensor_type.name.lower() if name in t else ""

    return {"row_bytes": {"gate": gate, "up": up, "down": down}, "attn_bytes": attn,
            "output_bytes": out,
            "types": {"gate": tname("blk.0.ffn_gate.weight"), "up": tname("blk.0.ffn_up.weight"),
                      "down": down_t_type or tname("blk.0.ffn_down.weight")}}


# ---------------------------------------------------------------------------------------
# trace directory
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceMeta:
    version: int
    model_path: str
    model_sha256: str
    kairox_path: str | None
    n_layer: int
    n_embd: int
    n_ff: int
    group_size: int
    n_seq: int
    n_steps: int
    thresholds: list[float]
    threshold_source: str
    has_predicted: bool
    pred_threshold: float
    chat: bool
    temperature: float
    top_p: float
    seed: int
    prompts: list[str]
    costs: dict[str, Any]
    active_density: list[float] = field(default_factory=list)  # per layer
    predicted_density: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)  # predicted among active, per layer
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceMeta:
        """The metadata of a meta.json; TypeError when a dimension is not a non-negative
        integer (the readers compute shapes from them, and a string or a list there would
        fail far from the file)."""
        meta = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        for name in _META_INTS:
            v = getattr(meta, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TypeError(f"{name} must be a non-negative integer, got {v!r}")
        return meta


#: TraceMeta fields that give array shapes and must be plain integers
_META_INTS = ("version", "n_layer", "n_embd", "n_ff", "group_size", "n_seq", "n_steps")


class Trace:
    """An opened trace directory (bit arrays memory-mapped read-only)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        meta_path = self.dir / "meta.json"
        if not meta_path.is_file():
            raise KairoxError(f"not a trace directory (no meta.json): {self.dir}")
        try:
            self.meta = TraceMeta.from_dict(json.loads(meta_path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise KairoxError(f"bad trace metadata in {meta_path}: {e}") from None
        if self.meta.version != TRACE_VERSION:
            raise KairoxError(f"trace {self.dir} has version {self.meta.version}, expected "
                              f"{TRACE_VERSION}: record it again")
        m = self.meta
        shape = (m.n_seq, m.n_steps, m.n_layer, m.n_ff // 8)
        try:
            self._bits = {"active": np.load(self.dir / "active.npy", mmap_mode="r")}
            if m.has_predicted:
                self._bits["predicted"] = np.load(self.dir / "predicted.npy", mmap_mode="r")
            self.tokens = np.load(self.dir / "tokens.npy", mmap_mode="r")
            # memory-mapped first: a header that claims more than the file holds is refused
            # here instead of allocating what it claims
            self.group_freq = np.array(np.load(self.dir / "group_freq.npy", mmap_mode="r"))
        except (OSError, ValueError, EOFError, TokenError) as e:
            # EOFError: an empty or cut .npy; TokenError: numpy's header parser on a cut header
            raise KairoxError(f"cannot read trace arrays in {self.dir}: {e}") from None
        if any(b.shape != shape for b in self._bits.values()) or self.tokens.shape != shape[:2]:
            raise KairoxError(f"trace arrays in {self.dir} do not match meta.json")
        if any(b.dtype != np.uint8 for b in self._bits.values()):
            raise KairoxError(f"trace masks in {self.dir} are not bit-packed uint8 arrays")
        if self.tokens.dtype.kind not in "iu" or self.group_freq.dtype.kind not in "fiu":
            raise KairoxError(f"tokens.npy or group_freq.npy in {self.dir} has the wrong type "
                              f"({self.tokens.dtype}, {self.group_freq.dtype})")

    @property
    def n_seq(self) -> int:
        return self.meta.n_seq

    @property
    def n_steps(self) -> int:
        return self.meta.n_steps

    @property
    def n_layer(self) -> int:
        return self.meta.n_layer

    @property
    def n_ff(self) -> int:
        return self.meta.n_ff

    def kinds(self) -> list[str]:
        return list(self._bits)

    def bits(self, seq: int, kind: str = "active") -> np.ndarray:
        """uint8 (n_steps, n_layer, n_ff / 8) of one sequence, packed as stored (what the
        runtime takes as a workload: `Session.set_workload`)."""
        if kind not in self._bits:
            raise KairoxError(f"the trace has no '{kind}' masks (it has {', '.join(self._bits)})")
        return np.ascontiguousarray(self._bits[kind][seq])

    def mask(self, seq: int, kind: str = "active") -> np.ndarray:
        """bool (n_steps, n_layer, n_ff) of one sequence: "active" or "predicted"."""
        if kind not in self._bits:
            raise KairoxError(f"the trace has no '{kind}' masks (it has {', '.join(self._bits)})")
        bits = np.asarray(self._bits[kind][seq])
        return np.unpackbits(bits, axis=-1, bitorder="little").astype(bool)

    def group_counts(self, seq: int, kind: str, group_size: int) -> np.ndarray:
        """uint16 (n_steps, n_layer, n_groups): active neurons per group and step."""
        if group_size < 1 or self.n_ff % group_size:
            raise KairoxError(f"group size {group_size} does not divide the FFN width {self.n_ff}")
        m = self.mask(seq, kind)
        s, L, n = m.shape
        return m.reshape(s, L, n // group_size, group_size).sum(axis=-1, dtype=np.uint16)


def pack(mask: np.ndarray) -> np.ndarray:
    """bool (..., n) -> uint8 (..., n/8), little bit order (neuron i = bit i % 8 of byte i // 8)."""
    return np.packbits(mask, axis=-1, bitorder="little")


# ---------------------------------------------------------------------------------------
# recording
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceOptions:
    n_steps: int = DEFAULT_STEPS
    chat: bool = True
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int = 0
    sparsity: float = DEFAULT_SPARSITY  # only without a Kairox GGUF
    threads: int | None = None


def sample_token(logits: np.ndarray, rng: np.random.Generator, temperature: float, top_p: float,
                 banned: Sequence[int]) -> int:
    """Temperature + nucleus sampling in NumPy (greedy at temperature <= 0); banned tokens
    (end of generation) never come out."""
    z = np.asarray(logits, dtype=np.float64).copy()
    if len(banned):
        z[list(banned)] = -np.inf
    if temperature <= 0:
        return int(np.argmax(z))
    z = (z - z.max()) / temperature
    p = np.exp(z)
    p /= p.sum()
    order = np.argsort(-p)
    cum = np.cumsum(p[order])
    keep = order[: int(np.searchsorted(cum, top_p) + 1)]
    q = p[keep] / p[keep].sum()
    return int(keep[rng.choice(len(keep), p=q)])


def _check_model(model: Model) -> None:
    if model.metadata.get(fmt.KEY_FORMAT_VERSION) is not None:
        raise KairoxError("MODEL is a Kairox GGUF: pass the original model and the Kairox GGUF "
                          "with --kairox")


def record_traces(model_path: str | os.PathLike[str], prompts: Sequence[str],
                  out_dir: str | os.PathLike[str], *, kairox_path: str | os.PathLike[str] | None = None,
                  opts: TraceOptions | None = None, console: Console | None = None) -> Trace:
    """Generate opts.n_steps tokens after every prompt and record the trace into out_dir
    (written to a temporary sibling and renamed at the end)."""
    opts = opts or TraceOptions()
    if opts.n_steps < 2:
        raise KairoxError("--steps must be at least 2")
    if not prompts:
        raise KairoxError("no prompts")
    out = check_output_dir(out_dir, TRACE_FILES, "trace")
    t0 = time.monotonic()
    model_path = Path(model_path)
    with Model(model_path) as model:
        _check_model(model)
        n_layer, n_embd, n_ff = model.n_layer, model.n_embd, model.n_ff
        kx = read_kairox(Path(kairox_path), n_layer, n_ff) if kairox_path else None
        gs = kx.group_size if kx else 32
        if n_ff % 8 or n_ff % gs:
            raise KairoxError(f"FFN width {n_ff} is not a multiple of 8 and of group size {gs}")
        encoded = [model.encode_prompt(p, opts.chat) for p in prompts]
        n_seq, n_steps = len(prompts), opts.n_steps
        with atomic_dir(out) as tmp:
            shape = (n_seq, n_steps, n_layer, n_ff // 8)
            act_bits = np.lib.format.open_memmap(tmp / "active.npy", "w+", np.uint8, shape)
            pred_bits = (np.lib.format.open_memmap(tmp / "predicted.npy", "w+", np.uint8, shape)
                         if kx and kx.has_predictor else None)
            tokens = np.lib.format.open_memmap(tmp / "tokens.npy", "w+", np.int32, shape[:2])
            # without a Kairox GGUF the thresholds come from the whole trace: keep |hidden|
            # (float16, memory-mapped scratch removed with the temporary directory)
            hidden_abs = None if kx else np.lib.format.open_memmap(
                tmp / "hidden_abs.scratch.npy", "w+", np.float16, (n_seq, n_steps, n_layer, n_ff))
            stats = np.zeros((3, n_layer))  # active, predicted, predicted & active counts
            with make_progress(console) as bar:
                task = bar.add_task("tracing", total=n_seq * n_steps)
                for i, prompt in enumerate(encoded):
                    inputs, hidden, toks = decode_with_profile(model, prompt, n_steps, opts, seed=opts.seed + i,
                                                     tick=lambda: bar.advance(task))
                    tokens[i] = toks
                    if kx is None:
                        hidden_abs[i] = np.minimum(np.abs(hidden), 65504.0)
                        continue
                    act = np.stack([np.abs(hidden[:, il, kx.perm[il]]) > kx.thresholds[il]
                                    for il in range(n_layer)], axis=1)
                    act_bits[i] = pack(act)
                    stats[0] += act.sum(axis=(0, 2))
                    if pred_bits is not None:
                        pred = np.stack([kx.predict(il, inputs[:, max(il - 1, 0)])
                                         for il in range(n_layer)], axis=1)
                        pred_bits[i] = pack(pred)
                        stats[1] += pred.sum(axis=(0, 2))
                        stats[2] += (pred & act).sum(axis=(0, 2))
            if kx is None:
                thr, group_freq = _calibrate(hidden_abs, act_bits, stats, opts.sparsity, gs)
                source = f"calibrated on the trace at sparsity {opts.sparsity}"
            else:
                thr, group_freq = kx.thresholds, kx.group_freq
                source = f"{fmt.KEY_THRESHOLD} of {kx.path.name}"
            if hidden_abs is not None:
                del hidden_abs
                (tmp / "hidden_abs.scratch.npy").unlink()
            np.save(tmp / "group_freq.npy", np.asarray(group_freq, dtype=np.float32))
            n_pairs = n_seq * n_steps * n_ff
            has_pred = pred_bits is not None
            for arr in (act_bits, pred_bits, tokens):
                if arr is not None:
                    arr.flush()
            del act_bits, pred_bits, tokens
            meta = TraceMeta(
                version=TRACE_VERSION, model_path=str(model_path.resolve()),
                model_sha256=file_sha256(model_path),
                kairox_path=str(Path(kairox_path).resolve()) if kairox_path else None,
                n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, group_size=gs, n_seq=n_seq,
                n_steps=n_steps, thresholds=[float(v) for v in thr], threshold_source=source,
                has_predicted=has_pred, pred_threshold=kx.pred_threshold if kx else 0.5,
                chat=opts.chat, temperature=opts.temperature, top_p=opts.top_p, seed=opts.seed,
                prompts=list(prompts),
                costs=model_costs(model_path, n_layer, n_ff, kx.down_t_row_bytes if kx else 0,
                                  kx.down_t_type if kx else ""),
                active_density=[round(float(v), 5) for v in stats[0] / n_pairs],
                predicted_density=[round(float(v), 5) for v in stats[1] / n_pairs] if has_pred else [],
                recall=[round(float(v), 5) for v in stats[2] / np.maximum(stats[0], 1)] if has_pred else [],
                seconds=round(time.monotonic() - t0, 2))
            (tmp / "meta.json").write_text(meta.to_json())
    return Trace(out)


def decode_with_profile(model: Model, prompt: list[int], n_steps: int, opts: TraceOptions, seed: int,
              tick: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefill the prompt, then n_steps single-token decodes; returns per step the FFN inputs
    (n_steps, n_layer, n_embd), hidden activations (n_steps, n_layer, n_ff) and tokens."""
    n_layer = model.n_layer
    n_ctx = len(prompt) + n_steps + 8
    rng = np.random.default_rng(seed)
    banned = model.eog_tokens
    inputs = np.empty((n_steps, n_layer, model.n_embd), np.float32)
    hidden = np.empty((n_steps, n_layer, model.n_ff), np.float32)
    toks = np.empty(n_steps, np.int32)
    input_kind = fmt.ffn_input_kind(model.arch)
    with Profiler(model, max(len(prompt), 1), kinds=(input_kind, "hidden")) as prof, \
            model.session(ContextParams(n_ctx=n_ctx, n_batch=max(len(prompt), 8), mode="dense",
                                        profiler=prof, n_threads=opts.threads)) as s:
        s.decode(prompt)
        for t in range(n_steps):
            tok = sample_token(s.logits(), rng, opts.temperature, opts.top_p, banned)
            prof.clear()
            s.decode([tok])
            toks[t] = tok
            for il in range(n_layer):
                x, h = prof.get(input_kind, il), prof.get("hidden", il)
                if x is None or h is None:
                    raise KairoxError(f"the profiler recorded nothing for layer {il}: this "
                                      f"architecture's FFN is not visible to it")
                inputs[t, il], hidden[t, il] = x[-1], h[-1]
            tick()
    return inputs, hidden, toks


def _calibrate(hidden_abs: np.ndarray, act_bits: np.ndarray, stats: np.ndarray, sparsity: float,
               gs: int) -> tuple[np.ndarray, np.ndarray]:
    """Without a Kairox GGUF: per-layer thresholds at `sparsity` over the whole trace, the
    masks from them (identity neuron order) and measured group frequencies."""
    n_seq, n_steps, n_layer, n_ff = hidden_abs.shape
    thr = np.zeros(n_layer, dtype=np.float32)
    freq = np.zeros((n_layer, n_ff // gs), dtype=np.float32)
    for il in range(n_layer):
        mag = np.asarray(hidden_abs[:, :, il], dtype=np.float32)
        thr[il] = magnitude_quantile(mag, sparsity)
        act = mag > thr[il]
        act_bits[:, :, il] = pack(act)
        stats[0, il] = act.sum()
        freq[il] = act.reshape(n_seq * n_steps, n_ff // gs, gs).mean(axis=(0, 2))
    return thr, freq


def trace_digest(trace: Trace) -> str:
    """Short content id of a trace (for caching simulator inputs)."""
    return hashlib.sha256(trace.meta.to_json().encode()).hexdigest()[:12]
