"""Grouping on synthetic masks with planted co-activation structure (fast, no model)."""
from __future__ import annotations

import numpy as np
import pytest

from kairox_py import KairoxError
from kairox_py.offline.grouping import balance, check_group_size, coactivation, group_layer, intra_share


def planted(n_groups: int = 8, size: int = 16, n_tok: int = 2000,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Neurons of a hidden cluster fire together; clusters fire with different rates.
    Returns (mask, the planted labels)."""
    rng = np.random.default_rng(seed)
    cluster_on = rng.random((n_tok, n_groups)) < np.linspace(0.1, 0.6, n_groups)
    labels = rng.permutation(np.repeat(np.arange(n_groups), size))
    mask = cluster_on[:, labels] & (rng.random((n_tok, n_groups * size)) < 0.9)
    return mask, labels


def test_metis_finds_planted_groups() -> None:
    mask, labels = planted()
    g = group_layer(mask, 16)
    assert sorted(g.perm.tolist()) == list(range(128))
    assert g.intra >= intra_share(coactivation(mask), labels) - 1e-6  # as good as the plant
    assert g.intra > g.intra_random and g.intra >= g.intra_freq
    assert (np.diff(g.group_freq) <= 1e-6).all()  # hot groups first
    assert (g.perm_inv[g.perm] == np.arange(128)).all()


def test_balance_repairs_to_equal_sizes() -> None:
    rng = np.random.default_rng(1)
    mask = rng.random((500, 64)) < 0.3
    labels = np.zeros(64, dtype=np.int64)
    labels[40:] = 1  # 40 / 24 / 0 / 0
    out = balance(labels, coactivation(mask), 4, 16)
    assert (np.bincount(out, minlength=4) == 16).all()


@pytest.mark.parametrize("n_ff,size,msg", [(1536, 100, "does not divide"), (4096, 2, "at most 1024"),
                                           (64, 0, "positive")])
def test_bad_group_sizes(n_ff: int, size: int, msg: str) -> None:
    with pytest.raises(KairoxError, match=msg):
        check_group_size(n_ff, size)
