"""Neuron grouping: reorder each layer's FFN neurons into equal-size groups, hot groups
first, for the hybrid runtime, which places and moves neurons group by group.

Two groupings are scored and the better one is kept:
- **frequency**: neurons sorted by profiled activation frequency and cut into consecutive
  groups. It needs nothing beyond numpy, and it is what the hybrid cache and the balancer
  use most: the hottest neurons share the first groups, the natural ones to keep resident.
- **METIS** (when the optional ``pymetis`` is installed, the ``grouping`` extra): a partition
  of the co-activation graph, so that neurons that fire together share a group and a token
  touches fewer groups. On real models its groups are barely better than random ones
  (Qwen2.5-Coder-1.5B: 0.0036 against 0.0035), so it has to earn its place.

Score: the share of off-diagonal co-activation weight that falls inside groups
(``intra_share``), with ``C = MᵀM`` of the profile's boolean masks. METIS is kept only where
it scores measurably higher (METIS_MIN_GAIN) than the frequency grouping; otherwise, or
without pymetis, the frequency grouping is used, so a plain install converts without the
extra. On the default model (8192 profiled tokens, groups of 32) the frequency grouping
scores 0.0215 on average, METIS 0.0214, random groups 0.0202.

Graph: nodes are neurons, the weight of edge (i, j) is the number of profiled tokens on
which both fire. For METIS the graph is sparsified to each neuron's ``k`` strongest
neighbours (symmetrised); the scores use the full matrix. METIS balances parts only up to a
tolerance, so its parts are repaired to exactly ``group_size`` neurons by moving the
least-attached members of oversize parts to the undersize part they are most attached to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KairoxError

MAX_GROUPS = 1024
DEFAULT_GROUP_SIZE = 32
NEIGHBOURS = 64
# METIS is kept only where it keeps this much more co-activation inside groups (relative)
# than the frequency grouping: on the default model its layers score within 0.5% of the
# frequency grouping's either way, a difference the next profile does not repeat, while the
# frequency grouping also gives the cache its hottest neurons first
METIS_MIN_GAIN = 0.01


METHOD_METIS = "metis"
METHOD_FREQUENCY = "frequency"
METHOD_IDENTITY = "identity"  # --no-reorder: the original order


@dataclass(frozen=True)
class LayerGrouping:
    perm: np.ndarray  # int32 (n_ff,): original index of each stored neuron
    group_freq: np.ndarray  # float32 (n_groups,): mean activation frequency per group
    intra: float  # share of co-activation weight inside groups: METIS (nan where it did not run)
    intra_random: float  # ... random equal groups
    intra_freq: float  # ... groups of consecutive neurons in frequency order
    method: str = METHOD_METIS  # the grouping kept: METHOD_METIS, METHOD_FREQUENCY or METHOD_IDENTITY

    @property
    def intra_kept(self) -> float:
        """The score of the grouping that was kept (nan for the original order)."""
        if self.method == METHOD_METIS:
            return self.intra
        if self.method == METHOD_FREQUENCY:
            return self.intra_freq
        return float("nan")

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


def metis_module() -> Any | None:
    """The pymetis module, or None where the optional `grouping` extra is not installed: the
    converter then keeps the frequency grouping instead of failing."""
    try:
        import pymetis
    except ImportError:
        return None
    return pymetis


def metis_available() -> bool:
    """Whether METIS groupings can be tried (pymetis importable)."""
    return metis_module() is not None


def _metis_labels(pymetis: Any, coact: np.ndarray, n_groups: int, seed: int) -> np.ndarray:
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


def frequency_labels(freq: np.ndarray, n_groups: int, size: int) -> np.ndarray:
    """Group of each neuron when neurons sorted by falling frequency are cut into consecutive
    groups (ties keep the original order)."""
    labels = np.empty(len(freq), dtype=np.int64)
    labels[np.argsort(-freq, kind="stable")] = np.repeat(np.arange(n_groups), size)
    return labels


def group_layer(mask: np.ndarray, group_size: int, *, seed: int = 0,
                use_metis: bool = True) -> LayerGrouping:
    """Partition one layer's neurons (mask: (n_tokens, n_ff) bool) into hot-first groups: the
    METIS partition where pymetis is installed (and `use_metis`) and it keeps measurably more
    co-activation inside groups than the frequency grouping, else the frequency grouping."""
    n_ff = mask.shape[1]
    n_groups = check_group_size(n_ff, group_size)
    freq = np.asarray(mask, dtype=np.float32).mean(axis=0)
    coact = coactivation(mask)
    freq_labels = frequency_labels(freq, n_groups, group_size)
    intra_freq = intra_share(coact, freq_labels)
    rng = np.random.default_rng(seed)
    random_labels = rng.permutation(np.repeat(np.arange(n_groups), group_size))
    pymetis = metis_module() if use_metis and n_groups > 1 else None
    intra_metis = float("nan")
    labels, method = freq_labels, METHOD_FREQUENCY
    if pymetis is not None:
        metis_labels = balance(_metis_labels(pymetis, coact, n_groups, seed), coact, n_groups,
                               group_size)
        intra_metis = intra_share(coact, metis_labels)
        if intra_metis > intra_freq * (1.0 + METIS_MIN_GAIN):
            labels, method = metis_labels, METHOD_METIS
    gfreq = np.array([freq[labels == g].mean() for g in range(n_groups)], dtype=np.float32)
    order = np.argsort(-gfreq, kind="stable")  # hot groups first
    members = [np.nonzero(labels == g)[0] for g in order]
    perm = np.concatenate([m[np.argsort(-freq[m], kind="stable")] for m in members]).astype(np.int32)
    return LayerGrouping(perm=perm, group_freq=gfreq[order], intra=intra_metis,
                         intra_random=intra_share(coact, random_labels), intra_freq=intra_freq,
                         method=method)


def identity_grouping(n_ff: int, group_size: int, freq: np.ndarray) -> LayerGrouping:
    """No reordering (the --no-reorder case): groups of consecutive original neurons."""
    n_groups = check_group_size(n_ff, group_size)
    gfreq = freq.reshape(n_groups, group_size).mean(axis=1).astype(np.float32)
    return LayerGrouping(np.arange(n_ff, dtype=np.int32), gfreq, float("nan"), float("nan"),
                         float("nan"), METHOD_IDENTITY)
