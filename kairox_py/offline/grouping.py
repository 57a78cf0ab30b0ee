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

Cost: scores need no n_ff x n_ff matrix. With a_tg the active neurons of group g at token t
and n_t those of the whole layer, the co-activation inside groups is Σ_t Σ_g a_tg² and all of
it Σ_t n_t², each less the activations themselves (the diagonal), so a streaming pass over
the masks scores any grouping exactly (``GroupScorer``). Only METIS needs C (n_ff² float32,
accumulated a chunk of tokens at a time) and its graph; `group_layer_stream(use_metis=False)`
skips both, which is what the converter does on the layers after its sampled ones when METIS
helps on none of them (convert.py).

Graph: nodes are neurons, the weight of edge (i, j) is the number of profiled tokens on
which both fire. For METIS the graph is sparsified to each neuron's ``k`` strongest
neighbours (symmetrised); the scores use the full matrix. METIS balances parts only up to a
tolerance, so its parts are repaired to exactly ``group_size`` neurons by moving the
least-attached members of oversize parts to the undersize part they are most attached to.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
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
    """Share of off-diagonal co-activation weight between neurons of the same group (summed in
    float64: exact for counts, as GroupScorer's)."""
    diag = float(np.trace(coact, dtype=np.float64))
    off = float(coact.sum(dtype=np.float64)) - diag
    if off <= 0:
        return 0.0
    same = labels[:, None] == labels[None, :]
    inside = float(coact[same].sum(dtype=np.float64)) - diag
    return inside / off


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


_ROW_BLOCK = 512  # rows of C handled at a time where a whole-matrix temporary is not needed


def _strongest_neighbours(coact: np.ndarray, k: int) -> np.ndarray:
    """bool (n, n): each neuron's k strongest co-activation partners (the diagonal left out),
    symmetrised. Row blocks at a time: no n x n copy or index matrix."""
    n = coact.shape[0]
    keep = np.zeros((n, n), dtype=bool)
    for r0 in range(0, n, _ROW_BLOCK):
        rows = np.arange(r0, min(r0 + _ROW_BLOCK, n))
        neg = -coact[r0:r0 + len(rows)]
        neg[np.arange(len(rows)), rows] = -0.0  # the diagonal as 0 (np.fill_diagonal's w, negated)
        nbr = np.argpartition(neg, k - 1, axis=1)[:, :k]
        keep[np.repeat(rows, k), nbr.reshape(-1)] = True
    keep |= keep.T
    np.fill_diagonal(keep, False)
    return keep


def _metis_labels(pymetis: Any, coact: np.ndarray, n_groups: int, seed: int) -> np.ndarray:
    n = coact.shape[0]
    k = min(NEIGHBOURS, n - 1)
    keep = _strongest_neighbours(coact, k)
    xadj = np.zeros(n + 1, dtype=np.int64)
    xadj[1:] = np.cumsum(keep.sum(axis=1))
    adjncy = np.nonzero(keep)[1]
    # row-major, same order as adjncy (the diagonal is not in `keep`)
    ew = np.maximum(coact[keep], 1).round().astype(np.int64)
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
    n = len(labels)
    onehot = np.zeros((n, n_groups), dtype=np.float32)
    onehot[np.arange(n), labels] = 1.0
    # (n, n_groups): co-activation of each neuron with each group, itself left out (C's
    # counts are integers, so taking the diagonal off afterwards is exact)
    aff = coact @ onehot
    aff[np.arange(n), labels] -= np.diagonal(coact)
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


class GroupScorer:
    """intra_share of several groupings into equal-size groups, exactly, from chunks of a
    layer's masks (see the module docstring): Σ_t Σ_g a_tg² against Σ_t n_t², less the
    activations, in integers."""

    def __init__(self, labelings: list[np.ndarray], n_groups: int) -> None:
        self.n_groups = n_groups
        # each labeling's neurons sorted by group: a row's group counts are then sums of
        # consecutive columns
        self.orders = [np.argsort(lab, kind="stable") for lab in labelings]
        for lab in labelings:
            if (np.bincount(lab, minlength=n_groups) != len(lab) // n_groups).any():
                raise ValueError("GroupScorer needs groups of equal size")
        self.inside = [0] * len(labelings)
        self.total = 0
        self.active = 0

    def add(self, mask: np.ndarray) -> None:
        n_t = np.count_nonzero(mask, axis=1).astype(np.int64)
        self.total += int(np.dot(n_t, n_t))
        self.active += int(n_t.sum())
        for i, order in enumerate(self.orders):
            a = mask[:, order].reshape(len(mask), self.n_groups, -1).sum(axis=2, dtype=np.int64)
            self.inside[i] += int(np.einsum("ij,ij->", a, a))

    def shares(self) -> list[float]:
        off = self.total - self.active
        if off <= 0:
            return [0.0] * len(self.inside)
        return [(inside - self.active) / off for inside in self.inside]


def _layer_pass(chunks: Iterable[np.ndarray], n_ff: int,
                with_coact: bool) -> tuple[np.ndarray, int, np.ndarray | None]:
    """(activation count per neuron, tokens, C or None) in one pass over the mask chunks. C is
    float32 (exact integer counts below 2^24 tokens), summed a chunk at a time into one
    product buffer."""
    counts = np.zeros(n_ff, dtype=np.int64)
    n = 0
    coact = buf = None
    for m in chunks:
        counts += np.count_nonzero(m, axis=0)
        n += len(m)
        if with_coact:
            mf = np.asarray(m, dtype=np.float32)
            if coact is None:
                coact = mf.T @ mf
            else:
                if buf is None:
                    buf = np.empty_like(coact)
                np.matmul(mf.T, mf, out=buf)
                coact += buf
    if with_coact and coact is None:
        coact = np.zeros((n_ff, n_ff), dtype=np.float32)
    return counts, n, coact


def _frequency(counts: np.ndarray, n: int) -> np.ndarray:
    """float32 activation frequency, rounded as float32 `mask.mean(axis=0)` rounds it."""
    return (counts.astype(np.float64) / np.intp(max(n, 1))).astype(np.float32)


def activation_frequency(mask_chunks: Iterable[np.ndarray], n_ff: int) -> np.ndarray:
    """float32 (n_ff,) share of tokens on which each neuron is active, from mask chunks."""
    counts, n, _ = _layer_pass(mask_chunks, n_ff, False)
    return _frequency(counts, n)


def group_layer(mask: np.ndarray, group_size: int, *, seed: int = 0,
                use_metis: bool = True) -> LayerGrouping:
    """Partition one layer's neurons (mask: (n_tokens, n_ff) bool) into hot-first groups: the
    METIS partition where pymetis is installed (and `use_metis`) and it keeps measurably more
    co-activation inside groups than the frequency grouping, else the frequency grouping."""
    return group_layer_stream(lambda: [mask], mask.shape[1], group_size, seed=seed,
                              use_metis=use_metis)


def group_layer_stream(mask_chunks: Callable[[], Iterable[np.ndarray]], n_ff: int, group_size: int,
                       *, seed: int = 0, use_metis: bool = True) -> LayerGrouping:
    """group_layer over a layer's masks given as chunks of token rows; `mask_chunks()` is
    called once per pass (two passes: counts, and C where METIS runs; then the scores).
    Without METIS nothing of n_ff x n_ff is made (intra is then nan)."""
    n_groups = check_group_size(n_ff, group_size)
    pymetis = metis_module() if use_metis and n_groups > 1 else None
    counts, n, coact = _layer_pass(mask_chunks(), n_ff, pymetis is not None)
    freq = _frequency(counts, n)
    freq_labels = frequency_labels(freq, n_groups, group_size)
    rng = np.random.default_rng(seed)
    random_labels = rng.permutation(np.repeat(np.arange(n_groups), group_size))
    labelings = [freq_labels, random_labels]
    if pymetis is not None:
        assert coact is not None
        labelings.append(balance(_metis_labels(pymetis, coact, n_groups, seed), coact, n_groups,
                                 group_size))
        del coact
    scorer = GroupScorer(labelings, n_groups)
    for m in mask_chunks():
        scorer.add(m)
    intra = scorer.shares()
    intra_freq, intra_random = intra[0], intra[1]
    intra_metis = intra[2] if pymetis is not None else float("nan")
    labels, method = freq_labels, METHOD_FREQUENCY
    if pymetis is not None and intra_metis > intra_freq * (1.0 + METIS_MIN_GAIN):
        labels, method = labelings[2], METHOD_METIS
    return _hot_first(labels, freq, n_groups, intra_metis, intra_random, intra_freq, method)


def _hot_first(labels: np.ndarray, freq: np.ndarray, n_groups: int, intra_metis: float,
               intra_random: float, intra_freq: float, method: str) -> LayerGrouping:
    """The LayerGrouping of `labels`: hot groups first, each group's neurons hot first."""
    gfreq = np.array([freq[labels == g].mean() for g in range(n_groups)], dtype=np.float32)
    order = np.argsort(-gfreq, kind="stable")  # hot groups first
    members = [np.nonzero(labels == g)[0] for g in order]
    perm = np.concatenate([m[np.argsort(-freq[m], kind="stable")] for m in members]).astype(np.int32)
    return LayerGrouping(perm=perm, group_freq=gfreq[order], intra=intra_metis,
                         intra_random=intra_random, intra_freq=intra_freq, method=method)


def identity_grouping(n_ff: int, group_size: int, freq: np.ndarray) -> LayerGrouping:
    """No reordering (the --no-reorder case): groups of consecutive original neurons."""
    n_groups = check_group_size(n_ff, group_size)
    gfreq = freq.reshape(n_groups, group_size).mean(axis=1).astype(np.float32)
    return LayerGrouping(np.arange(n_ff, dtype=np.int32), gfreq, float("nan"), float("nan"),
                         float("nan"), METHOD_IDENTITY)
