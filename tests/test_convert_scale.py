"""A conversion that scales (issue 36, point 2), on synthetic profiles (fast, no real model):
streaming reads give what whole arrays give, bit for bit; predictors that select too many
neurons are not written (and predictor mode is refused); METIS runs past the sampled layers
only where it helps there; a layer's streaming passes hold about a chunk, not the layer."""
from __future__ import annotations

import hashlib
import json
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from kairox_py import KairoxError, Model
from kairox_py import format as fmt
from kairox_py.benchmark.synthetic import SHAPES, write_synthetic_llama
from kairox_py.offline.convert import (
    ConvertOptions,
    convert,
    group_layers,
    grouping_rows,
    probe_layers,
    summary_rows,
    train_predictors,
)
from kairox_py.offline.corpus import Corpus
from kairox_py.offline.grouping import (
    METHOD_FREQUENCY,
    METHOD_METIS,
    GroupScorer,
    coactivation,
    frequency_labels,
    group_layer,
    group_layer_stream,
    intra_share,
    metis_available,
)
from kairox_py.offline.predictor import (
    TrainConfig,
    gather_rows,
    layer_data,
    profile_layer_data,
    train_layer,
    train_on,
)
from kairox_py.offline.profile import (
    PROFILE_VERSION,
    MagnitudeAccumulator,
    Profile,
    ProfileMeta,
    RowWriter,
    file_sha256,
    magnitude_quantile,
)

FAST_TRAIN = TrainConfig(recall=0.9, ranks=(8, 16), epochs=1, max_train=1200)


def write_profile(d: Path, x: np.ndarray, h: np.ndarray, model: Path | None = None,
                  arch: str = "llama") -> Profile:
    """A profile directory holding inputs x (n_layer, n, n_embd) and hidden h (n_layer, n, n_ff),
    written as run_profile writes one (RowWriter), of `model` where given."""
    d.mkdir(parents=True)
    n_layer, n, n_embd = x.shape
    n_ff = h.shape[2]
    with RowWriter(d / "inputs.npy", (n_layer, n, n_embd)) as wx, \
            RowWriter(d / "hidden.npy", (n_layer, n, n_ff)) as wh:
        for il in range(n_layer):
            for pos in range(0, n, 300):  # in pieces, as the profiler's chunks come
                wx.write(il, pos, x[il, pos:pos + 300])
                wh.write(il, pos, h[il, pos:pos + 300])
    meta = ProfileMeta(version=PROFILE_VERSION, model_path=str(model or d), arch=arch,
                       model_sha256=file_sha256(model) if model else "0" * 64, activation="silu",
                       n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_tokens=n, ctx=512, corpus="synthetic",
                       corpus_sha256=hashlib.sha256(b"synthetic").hexdigest(), seconds=0.0,
                       tokens_requested=n)
    (d / "meta.json").write_text(json.dumps(meta.__dict__))
    return Profile(d)


def unpredictable(n_layer: int, n: int, n_embd: int, n_ff: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Activations independent of the inputs: no predictor can beat guessing."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_layer, n, n_embd)).astype(np.float16)
    h = rng.standard_normal((n_layer, n, n_ff)).astype(np.float16)
    return x, h


def predictable(n_layer: int, n: int, n_embd: int, n_ff: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Activations a low-rank function of the previous layer's input (adjacent prediction)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_layer, n, n_embd)).astype(np.float16)
    h = np.empty((n_layer, n, n_ff), np.float16)
    for il in range(n_layer):
        a = rng.standard_normal((n_embd, 4)) @ rng.standard_normal((4, n_ff))
        h[il] = np.maximum(x[max(il - 1, 0)].astype(np.float32) @ a, 0).astype(np.float16)
    return x, h


# ---- streaming reads and exact quantiles ----------------------------------------------------
def test_rows_and_chunks_match_the_arrays(tmp_path: Path) -> None:
    x, h = unpredictable(3, 700, 16, 64)
    prof = write_profile(tmp_path / "p", x, h)
    assert np.array_equal(prof.inputs, x) and np.array_equal(prof.hidden, h)
    assert np.array_equal(prof.rows("hidden", 2, 100, 350), h[2, 100:350])
    assert np.array_equal(prof.predictor_input(2), x[1]) and np.array_equal(prof.predictor_input(0), x[0])
    got = np.concatenate([c for _, c in prof.chunks("hidden", 1, size=256)])
    assert np.array_equal(got, h[1])
    assert [s for s, _ in prof.chunks("hidden", 1, size=256)] == [0, 256, 512]
    thr = float(prof.thresholds(0.5)[1])
    mask = np.concatenate(list(prof.mask_chunks(1, thr, size=256)))
    assert np.array_equal(mask, prof.mask(1, thr))


@pytest.mark.parametrize("q", [0.0, 0.001, 0.5, 0.9, 0.999, 0.9999999])
def test_histogram_quantile_is_exact(q: float) -> None:
    """The float16 histogram gives np.partition's k-th smallest |h|, to the bit."""
    rng = np.random.default_rng(1)
    h = (rng.standard_normal((900, 50)) * rng.lognormal(size=(1, 50))).astype(np.float16)
    h[0, 0], h[1, 1], h[2, 2] = 0.0, -0.0, 60000.0
    acc = MagnitudeAccumulator(50)
    for i in range(0, 900, 128):
        acc.add(h[i:i + 128])
    mags = acc.result()
    full = np.abs(h.astype(np.float32))
    assert mags.quantile(q) == magnitude_quantile(full, q)
    assert np.array_equal(mags.peak, full.max(axis=0))
    acc32 = MagnitudeAccumulator(50)  # not float16: kept as values, same answer
    acc32.add(h.astype(np.float32))
    assert acc32.result().quantile(q) == magnitude_quantile(full, q)


def test_gather_rows_keeps_each_index_order() -> None:
    a = np.arange(1000 * 3).reshape(1000, 3)
    idx = [np.array([999, 0, 500, 3]), np.array([7]), np.array([], dtype=np.int64)]
    chunks = ((s, a[s:s + 128]) for s in range(0, 1000, 128))
    got = gather_rows(chunks, idx, 3, a.dtype)
    for i, g in zip(idx, got):
        assert np.array_equal(g, a[i])


def test_predictor_from_float16_rows_is_bit_identical(tmp_path: Path) -> None:
    """Training from the profile (float16 rows gathered a chunk at a time, targets made per
    batch) gives the same predictor as from the whole float32 |h|."""
    x, h = predictable(2, 1500, 24, 96)
    prof = write_profile(tmp_path / "p", x, h)
    thr = float(prof.thresholds(0.6)[1])
    ref = train_layer(np.asarray(prof.predictor_input(1), np.float32), prof.magnitude(1), thr, FAST_TRAIN)
    streamed = train_on(profile_layer_data(prof, 1, prof.layer_magnitudes(1), FAST_TRAIN), thr, FAST_TRAIN)
    from_h = train_on(layer_data(prof.predictor_input(1), h[1], FAST_TRAIN), thr, FAST_TRAIN)
    for p in (streamed, from_h):
        for name in ("w1", "b1", "w2", "b2"):
            assert np.array_equal(getattr(p, name), getattr(ref, name)), name
        assert (p.recall, p.density, p.tried) == (ref.recall, ref.density, ref.tried)


# ---- grouping from chunks ------------------------------------------------------------------
def test_scorer_is_intra_share() -> None:
    rng = np.random.default_rng(2)
    mask = rng.random((600, 128)) < rng.beta(0.7, 1.4, size=128)
    labelings = [frequency_labels(mask.mean(axis=0), 8, 16), rng.permutation(np.repeat(np.arange(8), 16))]
    scorer = GroupScorer(labelings, 8)
    for i in range(0, 600, 100):
        scorer.add(mask[i:i + 100])
    coact = coactivation(mask)
    assert scorer.shares() == pytest.approx([intra_share(coact, lab) for lab in labelings], abs=1e-12)


@pytest.mark.parametrize("use_metis", [True, False])
def test_chunked_grouping_equals_whole(use_metis: bool) -> None:
    rng = np.random.default_rng(3)
    mask = rng.random((1000, 128)) < rng.beta(0.7, 1.4, size=128)
    whole = group_layer(mask, 16, use_metis=use_metis)
    chunked = group_layer_stream(lambda: (mask[i:i + 300] for i in range(0, 1000, 300)), 128, 16,
                                 use_metis=use_metis)
    assert np.array_equal(whole.perm, chunked.perm) and np.array_equal(whole.group_freq, chunked.group_freq)
    assert whole.method == chunked.method
    assert np.allclose([whole.intra, whole.intra_freq, whole.intra_random],
                       [chunked.intra, chunked.intra_freq, chunked.intra_random], equal_nan=True)
    assert np.isnan(chunked.intra) == (not use_metis or not metis_available())


def test_probe_layers_spread_over_the_depth() -> None:
    assert probe_layers(28) == [4, 14, 23]
    assert probe_layers(32) == [5, 16, 26]
    assert probe_layers(2) == [0, 1] and probe_layers(1) == [0]


@pytest.mark.skipif(not metis_available(), reason="pymetis not installed")
def test_metis_skipped_past_the_sample_where_it_does_not_help(tmp_path: Path) -> None:
    """Independent neurons: METIS is tried on the sampled layers, loses there, and the other
    layers are grouped without it; the summary says so."""
    rng = np.random.default_rng(4)
    n_layer, n, n_ff = 6, 800, 128
    x = rng.standard_normal((n_layer, n, 8)).astype(np.float16)
    h = (rng.random((n_layer, n, n_ff)) < rng.beta(0.7, 1.4, size=n_ff)).astype(np.float16)
    prof = write_profile(tmp_path / "p", x, h)
    thr = np.full(n_layer, 0.5, np.float32)
    gs = group_layers(prof, thr, ConvertOptions(group_size=16), n_ff, None)
    probe = probe_layers(n_layer)
    assert [i for i, g in enumerate(gs) if not np.isnan(g.intra)] == probe
    assert {g.method for g in gs} == {METHOD_FREQUENCY}
    assert "METIS tried on 3 sampled layers, better on none: not run on the other 3" in dict(grouping_rows(gs))["grouping"]


@pytest.mark.skipif(not metis_available(), reason="pymetis not installed")
def test_metis_runs_everywhere_where_it_helps(tmp_path: Path) -> None:
    """Clusters of equal rate (what METIS finds and sorting does not): every layer runs it."""
    rng = np.random.default_rng(5)
    n_layer, n, n_ff = 4, 1500, 128
    h = np.empty((n_layer, n, n_ff), np.float16)
    for il in range(n_layer):
        on = rng.random((n, 8)) < 0.3
        labels = rng.permutation(np.repeat(np.arange(8), 16))
        h[il] = on[:, labels] & (rng.random((n, n_ff)) < 0.9)
    prof = write_profile(tmp_path / "p", rng.standard_normal((n_layer, n, 8)).astype(np.float16), h)
    gs = group_layers(prof, np.full(n_layer, 0.5, np.float32), ConvertOptions(group_size=16), n_ff, None)
    assert all(g.method == METHOD_METIS for g in gs)


# ---- predictors that select too much -------------------------------------------------------
def _thresholds(prof: Profile) -> tuple[np.ndarray, list]:  # type: ignore[type-arg]
    return prof.thresholds(0.5), [prof.layer_magnitudes(il) for il in range(prof.n_layer)]


def test_predictors_dropped_after_the_sample(tmp_path: Path) -> None:
    """Unpredictable activations: the sampled layers' predictors select nearly every neuron, the
    other layers are not trained, and none is kept; the note says how many and why."""
    prof = write_profile(tmp_path / "p", *unpredictable(6, 1500, 16, 64))
    thr, mags = _thresholds(prof)
    trained: list[int] = []
    import kairox_py.offline.convert as conv

    real = conv.profile_layer_data

    def spy(p: Profile, il: int, *a: object) -> object:
        trained.append(il)
        return real(p, il, *a)  # type: ignore[arg-type]

    opts = ConvertOptions(recall=0.97, train=replace(FAST_TRAIN, recall=0.97))
    try:
        conv.profile_layer_data = spy  # type: ignore[assignment]
        preds, note = train_predictors(prof, mags, thr, opts, None)
    finally:
        conv.profile_layer_data = real
    assert trained == probe_layers(6)
    assert preds == [None] * 6
    assert note is not None and note.startswith("predictors select ") and note.endswith(": not used")
    assert "at recall 0.97 (3 sampled layers 1, 3, 5)" in note and "--max-pred-density 0.8" in note
    with pytest.raises(KairoxError, match="predictor mode would compute nearly every neuron"):
        train_predictors(prof, mags, thr, replace(opts, mode="predictor"), None)
    kept, note = train_predictors(prof, mags, thr, replace(opts, max_pred_density=1.0), None)
    assert note is None and all(p is not None for p in kept)


def test_predictors_kept_where_they_select_few(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p", *predictable(4, 3000, 16, 64))
    thr, mags = _thresholds(prof)
    opts = ConvertOptions(recall=0.9, train=replace(FAST_TRAIN, epochs=6, max_train=2400))
    preds, note = train_predictors(prof, mags, thr, opts, None)
    assert note is None, note
    assert all(p is not None and p.density < 0.8 for p in preds), [p.density for p in preds if p]


def test_conversion_without_predictors_loads(tmp_path: Path) -> None:
    """End to end on a tiny model with an unpredictable profile: OUT carries no predictor (rank 0
    everywhere), the library loads it without one, the summary says why; predictor mode is
    refused and leaves no OUT."""
    src = write_synthetic_llama(tmp_path / "tiny.gguf", SHAPES["tiny"], wtype="f16", seed=3)
    s = SHAPES["tiny"]
    prof = write_profile(tmp_path / "prof", *unpredictable(s.n_layer, 1200, s.n_embd, s.n_ff), model=src)
    opts = ConvertOptions(group_size=32, tokens=1200, train=FAST_TRAIN, recall=FAST_TRAIN.recall, fit_ppl=None)
    corpus = Corpus("synthetic", "synthetic")
    res = convert(src, tmp_path / "kx.gguf", corpus, opts, profile_dir=prof.dir)
    assert res.predictors == [None] * s.n_layer and res.predictor_note is not None
    assert dict(summary_rows(res))["predictors"] == res.predictor_note
    assert GGUFReader(res.output).get_field(fmt.KEY_PRED_RANK).contents() == [0] * s.n_layer
    with Model(res.output) as m:
        assert m.has_sparsity and not m.has_predictor
    with pytest.raises(KairoxError, match="predictor mode would compute"):
        convert(src, tmp_path / "kx-pred.gguf", corpus, replace(opts, mode="predictor"), profile_dir=prof.dir)
    assert not (tmp_path / "kx-pred.gguf").exists()


# ---- memory ----------------------------------------------------------------------------------
def test_written_data_is_released_before_the_fit(tmp_path: Path) -> None:
    """Once the file is written, neither the plan's makers nor the kept predictors hold weight
    data (the fit and the crossover then load the model as it runs, and a 7B conversion's peak
    is there); the predictors keep their ranks and scores for the summary and the report."""
    src = write_synthetic_llama(tmp_path / "tiny.gguf", SHAPES["tiny"], wtype="f16", seed=3)
    s = SHAPES["tiny"]
    prof = write_profile(tmp_path / "prof", *predictable(s.n_layer, 3000, s.n_embd, s.n_ff), model=src)
    opts = ConvertOptions(group_size=32, tokens=3000, recall=0.9, fit_ppl=None,
                          train=replace(FAST_TRAIN, epochs=6, max_train=2400), max_pred_density=1.0)
    res = convert(src, tmp_path / "kx.gguf", Corpus("synthetic", "synthetic"), opts, profile_dir=prof.dir)
    kept = [p for p in res.predictors if p is not None]
    assert kept, res.predictor_note
    assert all(p.w1.size == 0 and p.w2.size == 0 and p.rank > 0 for p in kept)
    ranks = GGUFReader(res.output).get_field(fmt.KEY_PRED_RANK).contents()
    assert ranks == [p.rank if p is not None else 0 for p in res.predictors]
    assert dict(summary_rows(res))["predictor rank (min/mean/max)"].startswith(str(min(p.rank for p in kept)))
    with Model(res.output) as m:
        assert m.has_predictor


def test_write_tensors_drops_each_maker(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    from kairox_py.offline.convert import NewTensor, write_tensors

    data = np.arange(8, dtype=np.float32)
    plan = [NewTensor(f"t{i}", (8,), np.float32, 32, None, lambda: data) for i in range(3)]
    w = GGUFWriter(tmp_path / "x.gguf", "llama")
    write_tensors(w, plan, None)
    for t in plan:
        with pytest.raises(KairoxError, match="written twice"):
            t.make()
    assert GGUFReader(tmp_path / "x.gguf").tensors[2].data.tolist() == data.tolist()


def test_layer_passes_hold_about_a_chunk(tmp_path: Path) -> None:
    """The streaming passes of one layer (thresholds, predictor outliers, frequency grouping and
    its scores) allocate a bounded multiple of one chunk of float32 rows, not the layer: here
    the layer is 16 chunks and the peak stays under 3 of them."""
    n_chunk, n_ff = 256, 2048
    n = 16 * n_chunk
    rng = np.random.default_rng(6)
    prof = write_profile(tmp_path / "p", rng.standard_normal((1, n, 8)).astype(np.float16),
                         rng.standard_normal((1, n, n_ff)).astype(np.float16))
    import kairox_py.offline.profile as profile_mod

    chunk_f32 = n_chunk * n_ff * 4
    old = profile_mod.CHUNK_TOKENS
    profile_mod.CHUNK_TOKENS = n_chunk
    try:
        tracemalloc.start()
        mags = prof.layer_magnitudes(0)
        thr = mags.quantile(0.5)
        group_layer_stream(lambda: prof.mask_chunks(0, thr, n_chunk), n_ff, 32, use_metis=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        profile_mod.CHUNK_TOKENS = old
    assert peak < 3 * chunk_f32, (peak, chunk_f32, n * n_ff * 4)
    assert sys.getsizeof(mags.hist) < 1 << 20
