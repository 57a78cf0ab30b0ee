"""Co-activation grouping: reorder each layer's FFN neurons into equal-size groups of
neurons that tend to fire together (METIS partition of the co-activation graph).

Why: the hybrid runtime places and moves neurons group by group; when neurons that fire
together share a group, a token touches fewer groups. Groups are ordered hot-first (by
profiled activation frequency) so the first groups are the natural ones to keep resident.

Graph: nodes are neurons, the weight of edge (i, j) is the number of profiled tokens on
which both fire (``C = MᵀM`` of the boolean masks). For METIS the graph is sparsified to
each neuron's ``k`` strongest neighbours (symmetrised); the quality figures use the full
matrix. METIS balances parts only up to a tolerance, so its parts are repaired to exactly
``group_size`` neurons by moving the least-attached members of oversize parts to the
undersize part they are most attached to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KairoxError

MAX_GROUPS = 1024
DEFAULT_GROUP_SIZE = 32
NEIGHBOURS = 64


@dataclass(frozen=True)
class LayerGrouping:
    perm: np.ndarray  # int32 (n_ff,): original index of each stored neuron
    group_freq: np.ndarray  # float32 (n_groups,): mean activation frequency per group
    intra: float  # share of co-activation weight inside groups: METIS
    intra_random: float  # ... random equal groups
    intra_freq: float  # ... groups of consecutive neurons in frequency order

    @property
    def perm_inv(self) -> np.ndarray:
        inv = np.empty_like(self.perm)
        inv[self.perm] = np.arange(len(self.perm), dtype=self.perm.dtype)
        return inv


def check_group_size(n_ff: int, group_size: int) -> int:
    """The number of groups; KairoxError if group_size does not divide n_ff or gives more
    than MAX_GROUPS groups."""
    if group_size < 1:
        raise KairoxError(f"--group-size must be positive, got {group_size}")
    if n_ff % group_size:
        raise KairoxError(f"--group-size {group_size} does not divide the FFN width {n_ff}")
    n_groups = n_ff // group_size
    if n_groups > MAX_GROUPS:
        raise KairoxError(f"--group-size {group_size} gives {n_groups} groups for FFN width "
                          f"{n_ff}; at most {MAX_GROUPS} are allowed (use a group size of at "
                          f"least {-(-n_ff // MAX_GROUPS)})")
    return n_groups


def coactivation(mask: np.ndarray) -> np.ndarray:
    """float32 (n_ff, n_ff) co-activation counts (diagonal: activation counts)."""
    m = np.asarray(mask, dtype=np.float32)
    return m.T @ m


def intra_share(coact: np.ndarray, labels: np.ndarray) -> float:
    """Share of off-diagonal co-activation weight between neurons of the same group."""
    off = coact.sum() - np.trace(coact)
    if off <= 0:
        return 0.0
    same = labels[:, None] == labels[None, :]
    inside = coact[same].sum() - np.trace(coact)
    return float(inside / off)


def require_metis() -> Any:
    """The pymetis module (an optional dependency, the `grouping` extra); KairoxError without
    it. The converter calls it before profiling, so a missing extra fails at once rather
    than after minutes of work."""
    try:
        import pymetis
    except ImportError:
        raise KairoxError("co-activation grouping needs pymetis: pip install 'kairox[grouping]' "
                          "(or convert with --no-reorder)") from None
    return pymetis


def _metis_labels(coact: np.ndarray, n_groups: int, seed: int) -> np.ndarray:
    pymetis = require_metis()
    n = coact.shape[0]
    w = coact.copy()
    np.fill_diagonal(w, 0)
    k = min(NEIGHBOURS, n - 1)
    nbr = np.argpartition(-w, k - 1, axis=1)[:, :k]
    keep = np.zeros_like(w, dtype=bool)
    keep[np.repeat(np.arange(n), k), nbr.reshape(-1)] = True
    keep |= keep.T
    np.fill_diagonal(keep, False)
    xadj = np.zeros(n + 1, dtype=np.int64)
    xadj[1:] = np.cumsum(keep.sum(axis=1))
    adjncy = np.nonzero(keep)[1]
    ew = np.maximum(w[keep], 1).round().astype(np.int64)  # row-major, same order as adjncy
    opts = pymetis.Options(seed=seed, ufactor=1)
    graph = pymetis.CSRAdjacency(xadj.tolist(), adjncy.tolist())
    _, parts = pymetis.part_graph(n_groups, graph,
                                  eweights=ew.tolist(), options=opts)
    return np.asarray(parts, dtype=np.int64)


def balance(labels: np.ndarray, coact: np.ndarray, n_groups: int, size: int) -> np.ndarray:
    """Repair a partition to exactly `size` members per group.

    Oversize groups keep the `size` members most attached to them (co-activation with the
    group); the others are then placed, strongest affinity first, into groups with room."""
    labels = labels.copy()
    w = coact.copy()
    np.fill_diagonal(w, 0)
    onehot = np.zeros((len(labels), n_groups), dtype=np.float32)
    onehot[np.arange(len(labels)), labels] = 1.0
    aff = w @ onehot  # (n, n_groups): co-activation of each neuron with each group
    free: list[int] = []
    for g in range(n_groups):
        members = np.nonzero(labels == g)[0]
        if len(members) > size:
            order = members[np.argsort(-aff[members, g], kind="stable")]
            free.extend(order[size:].tolist())
    if not free:
        return labels
    free_a = np.asarray(free)
    labels[free_a] = -1
    room = size - np.bincount(labels[labels >= 0], minlength=n_groups)
    cand = aff[free_a]  # (n_free, n_groups)
    pairs = np.argsort(-cand, axis=None, kind="stable")
    placed = np.zeros(len(free_a), dtype=bool)
    for flat in pairs:
        i, g = divmod(int(flat), n_groups)
        if placed[i] or room[g] <= 0:
            continue
        labels[free_a[i]] = g
        room[g] -= 1
        placed[i] = True
        if placed.all():
            break
    assert (np.bincount(labels, minlength=n_groups) == size).all()
    return labels


def group_layer(mask: np.ndarray, group_size: int, *, seed: int = 0) -> LayerGrouping:
    """Partition one layer's neurons (mask: (n_tokens, n_ff) bool) into hot-first groups."""
    n_ff = mask.shape[1]
    n_groups = check_group_size(n_ff, group_size)
    freq = np.asarray(mask, dtype=np.float32).mean(axis=0)
    coact = coactivation(mask)
    if n_groups == 1:
        labels = np.zeros(n_ff, dtype=np.int64)
    else:
        labels = balance(_metis_labels(coact, n_groups, seed), coact, n_groups, group_size)
    rng = np.random.default_rng(seed)
    random_labels = rng.permutation(np.repeat(np.arange(n_groups), group_size))
    freq_labels = np.empty(n_ff, dtype=np.int64)
    freq_labels[np.argsort(-freq, kind="stable")] = np.repeat(np.arange(n_groups), group_size)
    gfreq = np.array([freq[labels == g].mean() for g in range(n_groups)], dtype=np.float32)
    order = np.argsort(-gfreq, kind="stable")  # hot groups first
    members = [np.nonzero(labels == g)[0] for g in order]
    perm = np.concatenate([m[np.argsort(-freq[m], kind="stable")] for m in members]).astype(np.int32)
    return LayerGrouping(perm=perm, group_freq=gfreq[order],
                         intra=intra_share(coact, labels),
                         intra_random=intra_share(coact, random_labels),
                         intra_freq=intra_share(coact, freq_labels))


def identity_grouping(n_ff: int, group_size: int, freq: np.ndarray) -> LayerGrouping:
    """No reordering (the --no-reorder case): groups of consecutive original neurons."""
    n_groups = check_group_size(n_ff, group_size)
    gfreq = freq.reshape(n_groups, group_size).mean(axis=1).astype(np.float32)
    return LayerGrouping(np.arange(n_ff, dtype=np.int32), gfreq, float("nan"), float("nan"),
                         float("nan"))
