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
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

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


def _train_mlp(x: np.ndarray, y: np.ndarray, pos_w: np.ndarray, rank: int, cfg: TrainConfig,
               rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Weighted-BCE training on standardised inputs; pos_w: per-pair weight of a positive.
    Returns (w1, b1, w2, b2)."""
    n, d = x.shape
    n_out = y.shape[1]
    w1 = (rng.standard_normal((rank, d)) * math.sqrt(2.0 / d)).astype(np.float32)
    b1 = np.zeros(rank, np.float32)
    w2 = (rng.standard_normal((n_out, rank)) * math.sqrt(1.0 / rank)).astype(np.float32)
    freq = np.clip(y.mean(axis=0), 1e-3, 1 - 1e-3)
    b2 = np.log(freq / (1 - freq)).astype(np.float32)
    params = [w1, b1, w2, b2]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    step = 0
    bs = cfg.batch_size
    n_batches = max(1, n // bs)
    total_steps = cfg.epochs * n_batches
    for _ in range(cfg.epochs):
        order = rng.permutation(n)
        for b in range(n_batches):
            sel = order[b * bs:(b + 1) * bs]
            xb, yb, wb = x[sel], y[sel], pos_w[sel]
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
            step += 1
            lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))  # cosine decay
            for p, g, mi, vi in zip(params, (g_w1, g_b1, g_w2, g_b2), m, v):
                mi *= beta1
                mi += (1 - beta1) * g
                vi *= beta2
                vi += (1 - beta2) * (g * g)
                mhat = mi / (1 - beta1 ** step)
                vhat = vi / (1 - beta2 ** step)
                p -= (lr * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)
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
    flat = mag.reshape(-1)
    k = min(int(0.999 * flat.size), flat.size - 1)
    q = float(np.partition(flat, k)[k])
    return np.nonzero(mag.max(axis=0) > factor * max(q, 1e-12))[0]


def train_layer(x: np.ndarray, mag: np.ndarray, threshold: float, cfg: TrainConfig,
                on_rank: Callable[[int], None] | None = None) -> LayerPredictor:
    """Train one layer's predictor. x: (n, n_embd) predictor inputs; mag: (n, n_ff)
    |act(gate)*up|; a neuron is a positive where mag > threshold."""
    n, d = x.shape
    x = np.asarray(x, dtype=np.float32)
    mag = np.asarray(mag, dtype=np.float32)
    y = mag > threshold
    ratio = np.clip(mag / max(threshold, 1e-12), 1.0, cfg.magnitude_cap)
    pos_w = (np.float32(cfg.pos_weight) * np.sqrt(ratio)).astype(np.float32)
    always = outlier_neurons(mag, cfg.outlier_factor)
    tr, va, te = split_indices(n, cfg.max_train, cfg.seed)
    mu = x[tr].mean(axis=0)
    sd = x[tr].std(axis=0) + 1e-6
    xs = (x - mu) / sd
    ytr = y[tr].astype(np.float32)
    lthr = logit(cfg.prob_threshold)
    ranks = sorted({min(r, d, y.shape[1]) for r in cfg.ranks if r > 0})
    rng = np.random.default_rng(cfg.seed)
    best: tuple[tuple[np.ndarray, ...], float] | None = None
    tried: list[tuple[int, float]] = []
    for rank in ranks:
        w1, b1, w2, b2 = _train_mlp(xs[tr], ytr, pos_w[tr], rank, cfg, rng)
        w2[always] = 0.0
        b2[always] = ALWAYS_ON_LOGIT
        zv = np.maximum(xs[va] @ w1.T + b1, 0.0) @ w2.T + b2
        off = recall_offset(zv, y[va], cfg.recall, lthr)
        _, _, dens = scores(zv + off, y[va], lthr)
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
    zt = np.maximum(x[te] @ w1_raw.T + b1_raw, 0.0) @ w2.T + b2
    rec, prec, dens = scores(zt, y[te], lthr)
    return LayerPredictor(w1_raw, b1_raw, w2.astype(np.float32), b2.astype(np.float32),
                          rec, prec, dens, float(y[te].mean()), tuple(tried))


