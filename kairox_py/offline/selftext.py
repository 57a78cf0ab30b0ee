"""Self-text: the model's own sampled answers as profiling text.

Why: predictors learn the activations of the profiling text. Trained on the default corpus
(Python documentation) alone they hold on held-out documentation but miss neurons that
other kinds of text activate (on the default model, +17% perplexity on general prose in
predictor mode, BENCHMARKS.md). The model's own answers to varied requests are text of the
kind it reads and writes in use, need no third-party data, and cost one generation pass.
The text is cached per model, prompt set, size and seed, so converting again reuses it.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rich.console import Console

from ..errors import KairoxError
from ..llama import ContextParams, Model, SamplingParams
from ..progress import make_progress
from .corpus import Corpus, prompt_lines
from .profile import file_sha256

#: tokens generated per prompt at the most (answers longer than this say little more)
MAX_PER_PROMPT = 256
TEMPERATURE = 0.8


def load_selftext_prompts(path: str | os.PathLike[str] | None = None) -> list[tuple[str, bool]]:
    """(prompt, chat) pairs: requests go through the chat template, lines marked '+ ' are
    document openings continued as plain text."""
    return [(s[2:].strip(), False) if s.startswith("+ ") else (s, True)
            for s in prompt_lines(path, "data/selftext_prompts.txt")]


def _cache_path(model_sha256: str, prompts: list[tuple[str, bool]], n_tokens: int, seed: int) -> Path:
    from ..default_model import cache_dir

    psha = hashlib.sha256(repr(prompts).encode()).hexdigest()[:8]
    return cache_dir() / "selftext" / f"{model_sha256[:16]}-{psha}-{n_tokens}-{seed}.txt"


def generate_self_text(model_path: str | os.PathLike[str], n_tokens: int, *, threads: int | None = None,
                       seed: int = 0, prompts: list[tuple[str, bool]] | None = None,
                       console: Console | None = None, model_sha256: str | None = None,
                       activation: str = "model") -> Corpus:
    """About n_tokens of the model's sampled continuations of the prompt set (each prompt's
    text followed by its answer), from the cache when this model, prompt set, size and seed
    were generated before. model_sha256: the file's hash if the caller has it (hashing a
    multi-GB model takes seconds)."""
    if n_tokens < 1:
        raise KairoxError("--self-text must be at least 1 token")
    model_path = Path(model_path)
    prompts = prompts or load_selftext_prompts()
    key = model_sha256 or file_sha256(model_path)
    cached = _cache_path(key if activation == "model" else f"{key}-{activation}", prompts, n_tokens, seed)
    if cached.is_file():
        text = cached.read_text(encoding="utf-8")
        return Corpus(text, f"self-text: {n_tokens} tokens sampled from the model (cached, {len(text)} chars)")
    per = min(MAX_PER_PROMPT, max(16, -(-n_tokens // len(prompts))))
    parts: list[str] = []
    done = 0
    with Model(model_path) as m, \
            m.session(ContextParams(n_ctx=512, n_threads=threads, mode="dense", activation=activation)) as s, \
            make_progress(console) as bar:
        task = bar.add_task("self-text", total=n_tokens)
        i = generated = 0
        while done < n_tokens:
            prompt, chat = prompts[i % len(prompts)]
            want = min(per, n_tokens - done)
            sampling = SamplingParams(temperature=TEMPERATURE, seed=seed + i)
            answer = "".join(s.generate(m.encode_prompt(prompt, chat), want, sampling))
            n = len(s.last_tokens)
            generated += n
            i += 1
            if i == len(prompts) and generated == 0:
                raise KairoxError("the model generated nothing for any self-text prompt")
            parts.append(prompt + ("\n\n" if chat else " ") + answer)
            done += max(n, 1)  # a prompt answered with nothing still counts: the loop ends
            bar.update(task, completed=min(done, n_tokens))
    text = "\n\n".join(parts)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, cached)
    return Corpus(text, f"self-text: {n_tokens} tokens sampled from the model ({len(text)} chars)")


def mix_corpora(base: Corpus, extra: Corpus, pieces: int = 16) -> Corpus:
    """Half and half: excerpts of `base` spread evenly over it, as many characters in all as
    `extra` has (all of base if it is shorter), followed by `extra`. A profile samples its
    tokens evenly over the text, so each half gets about half of them."""
    n = len(extra.text)
    if len(base.text) <= n:
        part = base.text
    else:
        size = max(1, n // pieces)
        step = (len(base.text) - size) / max(1, pieces - 1)
        part = "\n\n".join(base.text[int(i * step):int(i * step) + size] for i in range(pieces))
    return Corpus(part + "\n\n" + extra.text, f"{base.description} (excerpts, {len(part)} chars) + {extra.description}")


def with_self_text(corpus: Corpus, model_path: str | os.PathLike[str], n_tokens: int, *,
                   threads: int | None = None, console: Console | None = None,
                   model_sha256: str | None = None, activation: str = "model") -> Corpus:
    """`corpus` half and half with n_tokens of the model's self-text (the corpus as it is for 0)."""
    if not n_tokens:
        return corpus
    return mix_corpora(corpus, generate_self_text(model_path, n_tokens, threads=threads, console=console,
                                                  model_sha256=model_sha256, activation=activation))
