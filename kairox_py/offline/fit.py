"""Fit a converted model's thresholds to a quality budget.

`kairox convert` calibrates each layer's threshold to a target share of skipped neurons
(--sparsity), but how much quality a given share costs differs widely between models: on one
SiLU model half the neurons go at no measurable perplexity, on another a third already
costs several percent. So the converter measures it. On the complete model (under its
temporary name) it scores held-out text dense and in the model's own sparse mode at a ladder
of threshold scales (the runtime's threshold_scale: every layer's threshold times the same
factor), keeps the largest scale whose perplexity stays within `max_increase` of dense, and
writes the thresholds times that scale into the file, with kairox.sparsity set to the share of
neurons the sparse down skipped on that text. Perplexity grows with the scale, so the search
walks the ladder from 1 (the calibration) upwards while the budget holds and downwards until
it holds; a few evaluations of ~1.5k tokens each.

The budget holds on every text scored, not on their mean: by default documentation, narrative
prose and Python source (corpus.fit_corpora), since a scale that costs 0.7% on documentation
can cost 4% on a story (Qwen2.5-Coder-0.5B at 68% of the neurons skipped).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType
from rich.console import Console

from .. import format as fmt
from ..errors import KairoxError
from ..llama import Model
from .corpus import Corpus
from .evaluate import DEFAULT_CTX, EvalResult, EvalSetting, eval_chunks, evaluate

#: relative perplexity increase over dense allowed on the fit text
DEFAULT_MAX_PPL_INCREASE = 0.02
#: tokens of each held-out text scored per setting (one chunk of FIT_CTX)
DEFAULT_FIT_TOKENS = 512
#: tokens of context per scored chunk: kairox eval's, so that the budget means what its
#: perplexity figures mean (a shorter context raises dense perplexity and shrinks the ratio)
FIT_CTX = DEFAULT_CTX
#: threshold scales tried (factors of the calibrated thresholds), in increasing sparsity:
#: quarter octaves from 1/4 to 4, fine enough that a step moves perplexity by well under
#: a typical budget near the calibration
FIT_SCALES: tuple[float, ...] = tuple(round(2.0 ** (k / 4), 2) for k in range(-8, 9))


@dataclass
class FitStep:
    scale: float
    ppl: float       # of the text with the largest increase
    increase: float  # ppl / dense ppl - 1, the largest over the texts
    active: float    # share of neurons the sparse down computed (mean over the texts)
    by_text: tuple[float, ...] = ()  # the increase on each text, in QualityFit.texts' order


@dataclass
class QualityFit:
    mode: str
    max_increase: float
    tokens: int        # scored per setting, all texts together
    dense_ppl: float   # of the first text
    scale: float          # the scale written into the thresholds (1: unchanged)
    met: bool             # whether some scale met the budget (else the smallest tried is kept)
    steps: list[FitStep] = field(default_factory=list)
    texts: tuple[str, ...] = ()  # short names of the texts scored

    @property
    def chosen(self) -> FitStep:
        return next(s for s in self.steps if s.scale == self.scale)

    def describe(self) -> str:
        c = self.chosen
        worst = (f" (the most of {len(self.texts)} texts; "
                 + ", ".join(f"{t} {v:+.2%}" for t, v in zip(self.texts, c.by_text)) + ")"
                 if len(self.texts) > 1 and len(c.by_text) == len(self.texts) else "")
        head = (f"threshold scale {self.scale:g}: {1.0 - c.active:.0%} of neurons skipped, perplexity "
                f"{c.increase:+.2%} vs dense on {self.tokens} held-out tokens{worst}")
        if not self.met:
            head += f" (over the {self.max_increase:.1%} budget at every scale tried: the smallest is kept)"
        else:
            head += f" (budget {self.max_increase:.1%})"
        tried = ", ".join(f"x{s.scale:g} {s.increase:+.2%}" for s in sorted(self.steps, key=lambda s: s.scale))
        return f"{head}; tried {tried}"


def search_scale(ppl_increase_at: Callable[[float], float], max_increase: float,
                 scales: Sequence[float] = FIT_SCALES, start: float = 1.0) -> tuple[float, bool]:
    """The largest scale in `scales` whose increase is within max_increase, walking from
    `start` up while it holds and down until it holds (increase grows with the scale);
    (smallest scale, False) where none does. ppl_increase_at is called once per scale tried."""
    i = scales.index(start)
    if ppl_increase_at(scales[i]) <= max_increase:
        while i + 1 < len(scales) and ppl_increase_at(scales[i + 1]) <= max_increase:
            i += 1
        return scales[i], True
    while i > 0:
        i -= 1
        if ppl_increase_at(scales[i]) <= max_increase:
            return scales[i], True
    return scales[0], False


def fit_thresholds(path: Path, corpus: Corpus | Sequence[Corpus], max_increase: float, *,
                   tokens: int = DEFAULT_FIT_TOKENS, threads: int | None = None,
                   console: Console | None = None) -> QualityFit:
    """Measure (see the module docstring) and write the fitted thresholds into `path`. `corpus`:
    one text or several (each scored on `tokens` tokens and held to the budget on its own)."""
    corpora = [corpus] if isinstance(corpus, Corpus) else list(corpus)
    if not corpora:
        raise KairoxError("the fit needs at least one text")
    if not (max_increase > 0 and math.isfinite(max_increase)):
        raise KairoxError(f"the perplexity budget must be > 0, got {max_increase}")
    modes: set[str] = set()
    # weights read into the library's buffers, not mapped: the mapped file's pages that the
    # loader repacked from would stay in this process's resident set next to their copies
    with Model(path, use_mmap=False) as model:
        texts = [eval_chunks(model, c, tokens, FIT_CTX) for c in corpora]
        dense = [evaluate(EvalSetting(str(path), "dense", label="fit dense"), chunks, threads=threads,
                          console=console, model=model)[0] for chunks in texts]
        steps: dict[float, FitStep] = {}

        def increase_at(scale: float) -> float:
            # the model's own sparse mode ("auto"), as a context without a mode runs it
            rs: list[EvalResult] = [
                evaluate(EvalSetting(str(path), "auto", threshold_scale=scale, label=f"fit x{scale:g}"),
                         chunks, threads=threads, console=console, model=model)[0] for chunks in texts]
            modes.update(r.mode for r in rs)
            by_text = tuple(r.ppl / d.ppl - 1.0 for r, d in zip(rs, dense))
            worst = int(np.argmax(by_text))
            steps[scale] = FitStep(scale, rs[worst].ppl, by_text[worst], float(np.mean([r.active for r in rs])),
                                   by_text)
            return steps[scale].increase

        scale, met = search_scale(increase_at, max_increase)
    fit = QualityFit(modes.pop(), max_increase, sum(d.tokens for d in dense), dense[0].ppl, scale, met,
                     list(steps.values()), tuple(_short_name(c) for c in corpora))
    write_fit(path, fit)
    return fit


def _short_name(corpus: Corpus) -> str:
    """A text's name for the fit's summary: its description up to the first parenthesis."""
    return corpus.description.split(" (")[0] if corpus.description else "text"


def write_fit(path: Path, fit: QualityFit) -> None:
    """Scale kairox.threshold and kairox.cats_threshold by fit.scale and set kairox.sparsity to
    the skipped share measured there, in place (fixed-size values: the file's layout does not
    change)."""
    rw = GGUFReader(path, "r+")
    for key in (fmt.KEY_THRESHOLD, fmt.KEY_CATS_THRESHOLD):
        f = rw.get_field(key)
        if f is None:
            continue
        if f.types[-1] != GGUFValueType.FLOAT32:
            raise KairoxError(f"{path}: {key} is not an f32 array")
        for idx in f.data:
            f.parts[idx][0] = np.float32(f.parts[idx][0] * fit.scale)
    f = rw.get_field(fmt.KEY_SPARSITY)
    if f is not None and f.types == [GGUFValueType.FLOAT32]:
        f.parts[f.data[0]][0] = np.float32(1.0 - fit.chosen.active)
    rw.data.flush()
    del rw
