"""Grouping on synthetic masks (fast, no model): planted co-activation structure that METIS
finds, masks without structure where the frequency grouping is kept, and the plain install
without pymetis."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from kairox_py import KairoxError
from kairox_py.offline.convert import grouping_rows
from kairox_py.offline.grouping import (
    METHOD_FREQUENCY,
    METHOD_METIS,
    balance,
    check_group_size,
    coactivation,
    group_layer,
    identity_grouping,
    intra_share,
    metis_available,
)


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
    # clusters of distinct rates: sorting by frequency finds them too, and a tie keeps it
    assert g.intra_kept >= intra_share(coactivation(mask), labels) - 1e-6
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


def equal_rate_clusters(n_groups: int = 8, size: int = 16, n_tok: int = 3000,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Hidden clusters that all fire at the same rate: neurons of one cluster fire together,
    but frequency cannot tell the clusters apart (what METIS finds and sorting does not)."""
    rng = np.random.default_rng(seed)
    cluster_on = rng.random((n_tok, n_groups)) < 0.3
    labels = rng.permutation(np.repeat(np.arange(n_groups), size))
    mask = cluster_on[:, labels] & (rng.random((n_tok, n_groups * size)) < 0.9)
    return mask, labels


def independent(n_ff: int = 256, n_tok: int = 3000, seed: int = 0) -> np.ndarray:
    """No co-activation structure: each neuron fires on its own, at its own rate (a spread of
    hot and cold neurons, as in real FFNs)."""
    rng = np.random.default_rng(seed)
    rates = rng.beta(0.7, 1.4, size=n_ff)
    return rng.random((n_tok, n_ff)) < rates


def test_metis_kept_where_it_finds_structure() -> None:
    """METIS recovers clusters of equal rate; the frequency grouping mixes them, scores lower,
    and is not kept."""
    mask, labels = equal_rate_clusters()
    g = group_layer(mask, 16)
    planted_share = intra_share(coactivation(mask), labels)
    assert g.method == METHOD_METIS
    assert g.intra >= planted_share - 1e-6
    assert g.intra_freq < 0.5 * g.intra, (g.intra_freq, g.intra)  # sorting does not find them
    assert g.intra_kept == g.intra
    assert sorted(g.perm.tolist()) == list(range(128))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_frequency_kept_without_structure(seed: int) -> None:
    """Independent neurons: the frequency grouping is at least as good as METIS (pooling the hot
    neurons is what maximises co-activation inside groups) and is the one kept."""
    mask = independent(seed=seed)
    g = group_layer(mask, 32, seed=seed)
    assert not np.isnan(g.intra)
    assert g.intra_freq >= g.intra, (g.intra_freq, g.intra)
    assert g.intra_freq > g.intra_random
    assert g.method == METHOD_FREQUENCY and g.intra_kept == g.intra_freq
    freq = mask.mean(axis=0)
    assert (np.diff(freq[g.perm]) <= 1e-6).all()  # stored hot-first, neuron by neuron
    assert (np.diff(g.group_freq) <= 1e-6).all()


def test_without_pymetis_frequency_grouping(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain install (no pymetis): grouping works, keeps the frequency grouping and says
    METIS did not run; the converter's check no longer asks for the extra."""
    monkeypatch.setitem(sys.modules, "pymetis", None)  # `import pymetis` raises ImportError
    assert not metis_available()
    mask, _ = equal_rate_clusters()
    g = group_layer(mask, 16)
    assert g.method == METHOD_FREQUENCY and np.isnan(g.intra)
    assert sorted(g.perm.tolist()) == list(range(128))
    rows = dict(grouping_rows([g, g]))
    assert "pymetis not installed" in rows["grouping"]
    assert rows["intra-group co-activation: frequency / METIS / random"].split(" / ")[1] == "-"


def test_grouping_rows_report_both_scores() -> None:
    mask, _ = equal_rate_clusters()
    gm = group_layer(mask, 16)
    gf = group_layer(independent(n_ff=128), 16)
    rows = dict(grouping_rows([gm, gf]))
    assert rows["grouping"].startswith("frequency in 1 layers, METIS in 1")
    freq_s, metis_s, random_s = rows["intra-group co-activation: frequency / METIS / random"].split(" / ")
    assert float(metis_s) == pytest.approx((gm.intra + gf.intra) / 2, abs=1e-4)
    assert float(freq_s) == pytest.approx((gm.intra_freq + gf.intra_freq) / 2, abs=1e-4)
    assert grouping_rows([identity_grouping(128, 16, np.zeros(128))]) == []
