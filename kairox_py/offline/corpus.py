"""Text corpora for profiling and evaluation.

The default corpus is CPython's ``pydoc_data.topics`` (always installed, English prose
about Python). It is split *by topic key* with a hash, so the split is deterministic,
independent of dict order or Python version additions, and a topic's text is never in
both parts: evaluation perplexity is measured on text the profile (thresholds,
predictors, grouping) never saw.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import KairoxError

#: one topic in EVAL_MODULUS goes to the held-out evaluation part
EVAL_MODULUS = 5


@dataclass(frozen=True)
class Corpus:
    """Text plus a one-line description for profile metadata and reports."""

    text: str
    description: str


def _is_eval_topic(key: str) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return digest[0] % EVAL_MODULUS == 0


def default_topics(part: str) -> dict[str, str]:
    """The pydoc topics of one part ("profile" or "eval"), by key."""
    if part not in ("profile", "eval"):
        raise ValueError(f"part must be 'profile' or 'eval', got {part!r}")
    from pydoc_data import topics

    items = sorted(topics.topics.items())
    # some topics share one text (e.g. "if" and "else"): such a text goes to the profiling
    # part whenever any of its keys does, so no evaluation text is ever profiled
    profiled = {v for k, v in items if not _is_eval_topic(k)}
    if part == "profile":
        return {k: v for k, v in items if not _is_eval_topic(k)}
    return {k: v for k, v in items if _is_eval_topic(k) and v not in profiled}


def default_corpus(part: str) -> Corpus:
    """The default profiling or evaluation text (see the module docstring)."""
    chosen = default_topics(part)
    text = "\n\n".join(chosen.values())
    return Corpus(text, f"pydoc_data.topics ({part} split: {len(chosen)} topics, "
                        f"{len(text)} chars)")


def fit_corpora() -> list[Corpus]:
    """The texts the converter's quality fit scores by default, one per kind of text a model
    meets: documentation (pydoc topics, held-out split), narrative prose (written for the
    project, kairox_py/data/fit_prose.txt, not the prose that evaluations use) and Python
    source (CPython's textwrap module, which no evaluation reads). Thresholds that cost
    little on one kind can cost several times more on another, so the fit holds each to the
    budget."""
    import textwrap

    prose = resources.files("kairox_py").joinpath("data/fit_prose.txt").read_text(encoding="utf-8")
    texts = [default_corpus("eval"), Corpus(prose, "narrative prose (kairox_py/data/fit_prose.txt)")]
    source = Path(textwrap.__file__)
    if source.suffix == ".py" and source.is_file():  # a frozen or zipped stdlib has no source
        texts.append(Corpus(source.read_text(encoding="utf-8"), f"Python source ({source.name})"))
    return texts


def read_corpus(paths: Sequence[str | os.PathLike[str]]) -> Corpus:
    """Concatenate UTF-8 text files; KairoxError if one is missing or all are empty."""
    if not paths:
        raise KairoxError("no corpus files given")
    parts = []
    for p in map(Path, paths):
        if not p.is_file():
            raise KairoxError(f"corpus file not found: {p}")
        try:
            parts.append(p.read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            raise KairoxError(f"cannot read corpus file {p}: {e.strerror or e}") from None
    text = "\n\n".join(t for t in parts if t.strip())
    if not text.strip():
        raise KairoxError("the corpus is empty (no text in " + ", ".join(map(str, paths)) + ")")
    return Corpus(text, ", ".join(str(p) for p in paths) + f" ({len(text)} chars)")


def prompt_lines(path: str | os.PathLike[str] | None, default: str) -> list[str]:
    """The non-empty, non-comment (#) lines of a prompt file, or of the package's data file
    `default` when path is None; KairoxError if the file is missing or holds no prompts."""
    if path is None:
        text = resources.files("kairox_py").joinpath(default).read_text(encoding="utf-8")
    else:
        p = Path(path)
        if not p.is_file():
            raise KairoxError(f"prompt file not found: {p}")
        text = p.read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise KairoxError("the prompt file holds no prompts")
    return lines


def load_corpus(paths: Sequence[str | os.PathLike[str]] | None, part: str) -> Corpus:
    """User files if given, else the default corpus's `part`."""
    return read_corpus(paths) if paths else default_corpus(part)
