"""Predictor training on a synthetic problem (fast, no model)."""
from __future__ import annotations

import numpy as np

from kairox_py.offline.predictor import TrainConfig, outlier_neurons, train_layer


def test_learns_a_low_rank_rule_and_reaches_recall() -> None:
    rng = np.random.default_rng(0)
    n, d, n_ff = 3000, 32, 64
    x = rng.standard_normal((n, d)).astype(np.float32)
    a = rng.standard_normal((d, 8)) @ rng.standard_normal((8, n_ff))
    mag = np.abs(np.maximum(x @ a, 0)).astype(np.float32)
    thr = float(np.quantile(mag, 0.6))
    p = train_layer(x, mag, thr, TrainConfig(recall=0.9, ranks=(8, 16), epochs=6, max_train=2400))
    assert p.recall >= 0.87
    assert p.precision > p.target_density + 0.05  # better than guessing
    assert p.density < 0.95
    assert p.w1.shape == (p.rank, d) and p.w2.shape == (n_ff, p.rank)
    # the runtime form (raw inputs) gives the reported scores
    z = p.logits(x)
    assert z.shape == (n, n_ff)


def test_outliers_are_always_on() -> None:
    rng = np.random.default_rng(0)
    mag = np.abs(rng.standard_normal((1000, 50))).astype(np.float32)
    mag[3, 7] = 1000.0
    assert outlier_neurons(mag, 10.0).tolist() == [7]
    x = rng.standard_normal((1000, 16)).astype(np.float32)
    p = train_layer(x, mag, float(np.median(mag)), TrainConfig(ranks=(8,), epochs=1))
    assert (p.logits(x)[:, 7] > 20).all()
