"""Adjacent activation predictors: per layer, a low-rank MLP trained in NumPy.

For layer l the predictor reads the previous layer's FFN input (what the runtime has in
hand one layer ahead) and outputs one logit per neuron:
``logits = W2 · relu(W1 · x + b1) + b2``; a neuron is predicted active iff
sigmoid(logit) > p, the model's ``kairox.predictor.threshold``.

Training: weighted BCE (positives weigh ``pos_weight`` times more, recall first), Adam,
mini-batches, a few epochs on a few thousand profiled tokens. Inputs are standardised
for training and the scaling is folded back into W1/b1 on export, so the runtime sees a
plain MLP on the raw FFN input.

Size: every candidate rank is brought to the requested recall on held-out *validation*
tokens by one per-layer logit offset folded into b2 (so "reaches --recall" holds by
construction); what a larger rank buys is precision, i.e. fewer neurons predicted for the
same recall. The rank kept is the smallest one beyond which the next candidate lowers the
predicted density by less than ``min_gain`` (PowerInfer-style adaptive size: small where
the layer is easy to predict). Recall/precision/density are reported on separate *test*
tokens that neither training nor calibration saw.

Massive activations: a few neurons reach 100-1000x the usual magnitudes on rare tokens
(the BOS token above all, where they form the attention sink). Missing one of them costs
far more than its share of the recall count (measured on the default model: 0.6% of
neurons missed, +7% perplexity), so such *outlier* neurons (max |h| over the profile
above ``outlier_factor`` times the layer's 99.9th percentile) are always predicted active
(zero W2 row, large b2), and positives are weighted by sqrt(|h| / threshold) (capped) so
the rest of the training also favours the neurons that matter most.

Memory: a layer's training keeps its inputs (tokens x n_embd, float32) and the rows of h it
trains, validates and tests on in the profile's float16 (`LayerData`); targets and weights
are made a mini-batch at a time, so nothing of tokens x n_ff is held in float32. The
converter gathers those rows from the profile a chunk at a time (`gather_rows`) and takes
the outlier rule's quantile and maxima from its streaming pass (`profile.LayerMagnitudes`);
`train_layer` does the same from whole arrays, with the same result bit for bit.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .profile import LayerMagnitudes, MagnitudeAccumulator, Profile

DEFAULT_RANKS: tuple[int, ...] = (64, 128, 256)
DEFAULT_PROB_THRESHOLD = 0.5
ALWAYS_ON_LOGIT = 30.0  # sigmoid(30) = 1 - 1e-13: above any probability threshold


@dataclass(frozen=True)
class TrainConfig:
    # 0.97: trained on the profile, predictors lose recall on other kinds of text; at 0.95 the
    # default model's predictor mode cost +4.9% perplexity on general prose, at 0.97 +2.6%
    # (and +1.45% / +0.51% on docs / legal text) for 90% instead of 86% of gate/up rows
    recall: float = 0.97
    ranks: tuple[int, ...] = DEFAULT_RANKS
    epochs: int = 4
    batch_size: int = 64
    lr: float = 1e-2
    pos_weight: float = 3.0
    min_gain: float = 0.02  # predicted-density gain (absolute) that justifies a larger rank
    prob_threshold: float = DEFAULT_PROB_THRESHOLD
    max_train: int = 6144  # training tokens per layer (the rest of the sample: val/test)
    magnitude_cap: float = 16.0  # positives weigh up to sqrt(cap) more when |h| >> threshold
    outlier_factor: float = 10.0  # neurons whose max |h| > this x the layer's p99.9: always on
    seed: int = 0


@dataclass
class LayerPredictor:
    """A trained predictor in runtime form (raw-input W1/b1, shifted b2) and its scores."""

    w1: np.ndarray  # (rank, n_embd)
    b1: np.ndarray  # (rank,)
    w2: np.ndarray  # (n_ff, rank)
    b2: np.ndarray  # (n_ff,)
    recall: float  # on test tokens
    precision: float
    density: float  # predicted share of neurons (the FFN work in predictor mode)
    target_density: float  # share of active neurons in the profile mask
    tried: tuple[tuple[int, float], ...] = ()  # (rank, validation density) per candidate

    @property
    def rank(self) -> int:
        return int(self.w1.shape[0])

    def drop_weights(self) -> None:
        """Free W1 and W2 once written, keeping their shapes' rank and the scores (what the
        report and the summary read)."""
        self.w1 = np.empty((self.rank, 0), dtype=self.w1.dtype)
        self.w2 = np.empty((0, self.rank), dtype=self.w2.dtype)

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = np.maximum(x @ self.w1.T + self.b1, 0.0)
        return h @ self.w2.T + self.b2

    def permuted(self, perm: np.ndarray) -> LayerPredictor:
        """The same predictor with its outputs in stored (permuted) neuron order."""
        return LayerPredictor(self.w1, self.b1, self.w2[perm], self.b2[perm], self.recall,
                              self.precision, self.density, self.target_density, self.tried)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def split_indices(n: int, max_train: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shuffled train / validation / test token indices (test and val: 10% each, at least
    one token each, the rest for training up to max_train)."""
    rng = np.random.default_rng(seed)
    idx = rng.permutation(n)
    n_hold = max(1, n // 10)
    test, val, rest = idx[:n_hold], idx[n_hold:2 * n_hold], idx[2 * n_hold:]
    return rest[:max_train], val, test


def _abs32(h: np.ndarray) -> np.ndarray:
    """|h| in float32 (exact from float16)."""
    return np.abs(np.asarray(h, dtype=np.float32))


def _targets(mag: np.ndarray, threshold: float, cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """(y as float32 0/1, the weight of a positive) of |h| rows: a positive weighs
    pos_weight x sqrt(|h| / threshold), the ratio clipped to [1, magnitude_cap]."""
    ratio = np.clip(mag / max(threshold, 1e-12), 1.0, cfg.magnitude_cap)
    pos_w = (np.float32(cfg.pos_weight) * np.sqrt(ratio)).astype(np.float32)
    return (mag > threshold).astype(np.float32), pos_w


def _active_share(h: np.ndarray, threshold: float) -> np.ndarray:
    """float32 share of rows where each neuron is active, as float32 `y.mean(axis=0)` rounds
    it (a float64 division of the exact count), counted a chunk of rows at a time."""
    count = np.zeros(h.shape[1], dtype=np.int64)
    for i in range(0, len(h), 1024):
        count += np.count_nonzero(_abs32(h[i:i + 1024]) > threshold, axis=0)
    return (count.astype(np.float64) / np.intp(len(h))).astype(np.float32)


class _Adam:
    """Adam on float32 parameters, updated in place with two scratch buffers per parameter
    (the same operations, in the same order, as the textbook expression: same bits, fewer
    temporaries)."""

    def __init__(self, params: Sequence[np.ndarray], beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8) -> None:
        self.params = list(params)
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t1 = [np.empty_like(p) for p in params]
        self.t2 = [np.empty_like(p) for p in params]
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.step = 0

    def update(self, grads: Sequence[np.ndarray], lr: float) -> None:
        b1, b2 = self.beta1, self.beta2
        c1, c2 = 1 - b1 ** self.step, 1 - b2 ** self.step
        for p, g, mi, vi, t1, t2 in zip(self.params, grads, self.m, self.v, self.t1, self.t2):
            mi *= b1
            np.multiply(g, 1 - b1, out=t1)
            mi += t1
            vi *= b2
            np.multiply(g, g, out=t1)
            t1 *= 1 - b2
            vi += t1
            np.divide(mi, c1, out=t1)  # mhat
            t1 *= lr
            np.divide(vi, c2, out=t2)  # vhat
            np.sqrt(t2, out=t2)
            t2 += self.eps
            t1 /= t2
            p -= t1


def _train_mlp(x: np.ndarray, target: np.ndarray, threshold: float, rank: int, cfg: TrainConfig,
               rng: np.random.Generator, freq: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Weighted-BCE training on standardised inputs x against the rows `target` of
    act(gate)*up (its sign ignored; targets and weights made per mini-batch, _targets). freq:
    the active share per neuron (_active_share; computed if not given). Returns (w1, b1, w2, b2)."""
    n, d = x.shape
    n_out = target.shape[1]
    w1 = (rng.standard_normal((rank, d)) * math.sqrt(2.0 / d)).astype(np.float32)
    b1 = np.zeros(rank, np.float32)
    w2 = (rng.standard_normal((n_out, rank)) * math.sqrt(1.0 / rank)).astype(np.float32)
    freq = np.clip(_active_share(target, threshold) if freq is None else freq, 1e-3, 1 - 1e-3)
    b2 = np.log(freq / (1 - freq)).astype(np.float32)
    adam = _Adam([w1, b1, w2, b2])
    bs = cfg.batch_size
    n_batches = max(1, n // bs)
    total_steps = cfg.epochs * n_batches
    for _ in range(cfg.epochs):
        order = rng.permutation(n)
        for b in range(n_batches):
            sel = order[b * bs:(b + 1) * bs]
            xb = x[sel]
            yb, wb = _targets(_abs32(target[sel]), threshold, cfg)
            pre = xb @ w1.T + b1
            h = np.maximum(pre, 0.0)
            z = h @ w2.T + b2
            s = _sigmoid(z)
            # d/dz of -w*y*log(s) - (1-y)*log(1-s) = s*(w*y + 1 - y) - w*y
            wy = wb * yb
            dz = (s * (wy + 1.0 - yb) - wy) / np.float32(len(sel) * n_out)
            g_w2 = dz.T @ h
            g_b2 = dz.sum(axis=0)
            dh = dz @ w2
            dh[pre <= 0] = 0.0
            g_w1 = dh.T @ xb
            g_b1 = dh.sum(axis=0)
            adam.step += 1
            lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * adam.step / total_steps))  # cosine decay
            adam.update((g_w1, g_b1, g_w2, g_b2), lr)
    return w1, b1, w2, b2


def recall_offset(z: np.ndarray, y: np.ndarray, recall: float, lthr: float) -> float:
    """The logit offset after which a share `recall` of the positives lies above lthr."""
    pos = z[y]
    if pos.size == 0:
        return 0.0
    k = math.floor((1.0 - recall) * pos.size)
    k = min(max(k, 0), pos.size - 1)
    q = float(np.partition(pos, k)[k])  # the k-th smallest positive logit must clear lthr
    return lthr - q + 1e-4


def scores(z: np.ndarray, y: np.ndarray, lthr: float) -> tuple[float, float, float]:
    """(recall, precision, predicted density) of logits z against mask y."""
    pred = z > lthr
    tp = float(np.count_nonzero(pred & y))
    n_pred = float(np.count_nonzero(pred))
    n_pos = float(np.count_nonzero(y))
    recall = tp / n_pos if n_pos else 1.0
    precision = tp / n_pred if n_pred else 1.0
    return recall, precision, n_pred / y.size


def outlier_neurons(mag: np.ndarray, factor: float) -> np.ndarray:
    """Neurons whose largest |h| exceeds `factor` x the layer's 99.9th percentile."""
    acc = MagnitudeAccumulator(mag.shape[1])
    acc.add(mag)
    return outliers_of(acc.result(), factor)


def outliers_of(mags: LayerMagnitudes, factor: float) -> np.ndarray:
    """outlier_neurons from a layer's streaming summary."""
    q = mags.quantile(0.999)
    return np.nonzero(mags.peak > factor * max(q, 1e-12))[0]


@dataclass
class LayerData:
    """What training one layer reads: the predictor inputs of every token (standardisation
    and held-out scores; tokens x n_embd), the rows of h (sign ignored; the profile's float16
    kept) of the train / validation / test tokens, and the neurons always predicted on."""

    x: np.ndarray  # float32 (n, n_embd)
    tr: np.ndarray
    va: np.ndarray
    te: np.ndarray
    h_tr: np.ndarray  # (len(tr), n_ff), rows in tr's order
    h_va: np.ndarray
    h_te: np.ndarray
    always: np.ndarray  # outlier neurons (outliers_of)


def gather_rows(chunks: Iterable[tuple[int, np.ndarray]], index_sets: Sequence[np.ndarray],
                width: int, dtype: np.dtype | type) -> list[np.ndarray]:
    """For each index array, those rows (in its order) of a (n, width) array given as
    (first row, rows) chunks: one pass, no more than a chunk besides the results."""
    outs = [np.empty((len(idx), width), dtype=dtype) for idx in index_sets]
    for start, rows in chunks:
        stop = start + len(rows)
        for idx, out in zip(index_sets, outs):
            sel = (idx >= start) & (idx < stop)
            if sel.any():
                out[sel] = rows[idx[sel] - start]
    return outs


def profile_layer_data(prof: Profile, layer: int, mags: LayerMagnitudes, cfg: TrainConfig) -> LayerData:
    """LayerData of one layer of a profile: its predictor inputs, and its rows of h gathered a
    chunk of tokens at a time (float16 as profiled)."""
    tr, va, te = split_indices(prof.n_tokens, cfg.max_train, cfg.seed)
    h_tr, h_va, h_te = gather_rows(prof.chunks("hidden", layer), (tr, va, te), prof.meta.n_ff,
                                   prof.hidden.dtype)
    x = np.asarray(prof.predictor_input(layer), dtype=np.float32)
    return LayerData(x, tr, va, te, h_tr, h_va, h_te, outliers_of(mags, cfg.outlier_factor))


def layer_data(x: np.ndarray, h: np.ndarray, cfg: TrainConfig,
               mags: LayerMagnitudes | None = None) -> LayerData:
    """LayerData of whole arrays (x (n, n_embd), h (n, n_ff) or |h|); mags: h's streaming
    summary where the caller has it (else computed here)."""
    tr, va, te = split_indices(len(x), cfg.max_train, cfg.seed)
    if mags is None:
        acc = MagnitudeAccumulator(h.shape[1])
        acc.add(np.asarray(h))
        mags = acc.result()
    return LayerData(np.asarray(x, dtype=np.float32), tr, va, te, h[tr], h[va], h[te],
                     outliers_of(mags, cfg.outlier_factor))


def train_layer(x: np.ndarray, mag: np.ndarray, threshold: float, cfg: TrainConfig,
                on_rank: Callable[[int], None] | None = None) -> LayerPredictor:
    """Train one layer's predictor. x: (n, n_embd) predictor inputs; mag: (n, n_ff)
    |act(gate)*up| (or act(gate)*up: the sign is ignored); a neuron is a positive where
    |h| > threshold."""
    return train_on(layer_data(x, mag, cfg), threshold, cfg, on_rank)


def train_on(data: LayerData, threshold: float, cfg: TrainConfig,
             on_rank: Callable[[int], None] | None = None) -> LayerPredictor:
    """Train one layer's predictor from its LayerData (train_layer's work)."""
    x, tr = data.x, data.tr
    d = x.shape[1]
    n_ff = data.h_tr.shape[1]
    always = data.always
    y_va = _abs32(data.h_va) > threshold
    mu = x[tr].mean(axis=0)
    sd = x[tr].std(axis=0) + 1e-6
    xs = (x - mu) / sd
    xs_tr = xs[tr]
    freq = _active_share(data.h_tr, threshold)
    lthr = logit(cfg.prob_threshold)
    ranks = sorted({min(r, d, n_ff) for r in cfg.ranks if r > 0})
    rng = np.random.default_rng(cfg.seed)
    best: tuple[tuple[np.ndarray, ...], float] | None = None
    tried: list[tuple[int, float]] = []
    for rank in ranks:
        w1, b1, w2, b2 = _train_mlp(xs_tr, data.h_tr, threshold, rank, cfg, rng, freq)
        w2[always] = 0.0
        b2[always] = ALWAYS_ON_LOGIT
        zv = np.maximum(xs[data.va] @ w1.T + b1, 0.0) @ w2.T + b2
        off = recall_offset(zv, y_va, cfg.recall, lthr)
        _, _, dens = scores(zv + off, y_va, lthr)
        tried.append((rank, dens))
        if on_rank:
            on_rank(rank)
        if best is not None and tried[-2][1] - dens < cfg.min_gain:
            break  # the larger rank does not pay for itself: keep the previous one
        best = ((w1, b1, w2, b2 + off), dens)
    assert best is not None
    w1, b1, w2, b2 = best[0]
    # fold the standardisation into the first layer: W1 (x - mu)/sd = (W1/sd) x - W1 (mu/sd)
    w1_raw = (w1 / sd).astype(np.float32)
    b1_raw = (b1 - w1 @ (mu / sd)).astype(np.float32)
    y_te = _abs32(data.h_te) > threshold
    zt = np.maximum(x[data.te] @ w1_raw.T + b1_raw, 0.0) @ w2.T + b2
    rec, prec, dens = scores(zt, y_te, lthr)
    return LayerPredictor(w1_raw, b1_raw, w2.astype(np.float32), b2.astype(np.float32),
                          rec, prec, dens, float(y_te.mean()), tuple(tried))


