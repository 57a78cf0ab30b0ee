"""Generation through kairox_py: (b) greedy output identical to llama-completion from the
same tree, (e) seeded sampling reproducible, plus streaming, logits, timings, lifetime."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import find_tool

from kairox_py import KairoxError, Model, SamplingParams

# long enough to span several n_batch chunks, so chunked prompt decoding is compared too
PROMPT = ("The history of the printing press begins in the fifteenth century, when "
          "Johannes Gutenberg combined movable metal type, oil-based ink and a wooden "
          "screw press. Within fifty years")
N_PREDICT = 48
N_CTX = 256
N_BATCH = 16
THREADS = 2


def find_llama_completion() -> Path | None:
    return find_tool("llama-completion")


def test_greedy_matches_llama_completion(model_path: Path, model: Model) -> None:
    exe = find_llama_completion()
    if exe is None:
        pytest.skip("llama-completion not found (built with KAIROX_TOOLS=OFF?)")
    proc = subprocess.run(
        [str(exe), "-m", str(model_path), "-p", PROMPT, "-n", str(N_PREDICT),
         "-t", str(THREADS), "-c", str(N_CTX), "-b", str(N_BATCH), "--temp", "0",
         "--seed", "1", "-no-cnv", "--simple-io", "--no-display-prompt"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    expected = proc.stdout.decode("utf-8")
    assert expected.endswith("\n\n")  # llama-completion closes its output with "\n\n"
    expected = expected[:-2]

    with model.session(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS) as s:
        assert len(model.tokenize(PROMPT)) > 2 * N_BATCH
        text = "".join(s.generate(PROMPT, N_PREDICT))
        assert s.stop_reason == "length"
        assert len(s.last_tokens) == N_PREDICT
        assert model.detokenize(s.last_tokens) == text
    assert text == expected


def _sample(model: Model, seed: int) -> str:
    sp = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=seed)
    with model.session(n_ctx=128, n_threads=THREADS) as s:
        return "".join(s.generate("Once upon a time", 24, sp))


def test_seeded_sampling_is_reproducible(model: Model) -> None:
    a, b = _sample(model, 7), _sample(model, 7)
    assert a == b
    others = {_sample(model, seed) for seed in (8, 9, 10)}
    assert others - {a}, "four different seeds gave the same text"


def test_generate_is_repeatable_in_one_session(model: Model) -> None:
    with model.session(n_ctx=128, n_threads=THREADS) as s:
        first = "".join(s.generate("The capital of France is", 12))
        second = "".join(s.generate("The capital of France is", 12))
    assert first == second


def test_streaming_keeps_multibyte_characters_whole(model: Model) -> None:
    prompt = "Translate to Japanese: Hello -> こんにちは\nTranslate to Japanese: Thank you ->"
    with model.session(n_ctx=128, n_threads=THREADS) as s:
        pieces = list(s.generate(prompt, 10))
        tokens = s.last_tokens
    split = []
    for t in tokens:
        try:
            model.token_to_piece(t).decode("utf-8")
        except UnicodeDecodeError:
            split.append(t)
    assert split, "no token split a character: this prompt no longer tests streaming"
    text = "".join(pieces)
    assert text == model.detokenize(tokens)
    assert "\ufffd" not in text and all(pieces)


def test_ignore_eos_runs_to_length(model: Model) -> None:
    chat = model.apply_chat_template([{"role": "user", "content": "Say OK."}])
    with model.session(n_ctx=512, n_threads=THREADS) as s:
        "".join(s.generate(chat, 200))
        assert s.stop_reason == "eog" and len(s.last_tokens) < 200
        "".join(s.generate(chat, 40, SamplingParams(ignore_eos=True)))
        assert s.stop_reason == "length" and len(s.last_tokens) == 40
        assert not any(model.is_eog(t) for t in s.last_tokens)


def test_context_full_stops_generation(model: Model) -> None:
    with model.session(n_ctx=16, n_threads=THREADS) as s:
        assert s.n_ctx >= 16  # llama.cpp may round the size up
        "".join(s.generate("One two three four", s.n_ctx + 8, SamplingParams(ignore_eos=True)))
        assert s.stop_reason == "context"
        assert s.n_past == s.n_ctx
        with pytest.raises(KairoxError):
            s.generate("word " * (s.n_ctx + 1), 4)


def test_timings(model: Model) -> None:
    with model.session(n_ctx=128, n_threads=THREADS) as s:
        "".join(s.generate(PROMPT, 8))
        t = s.timings()
    assert t.prompt_tokens == len(model.tokenize(PROMPT))
    assert t.decode_tokens == 7  # the last token is sampled, not decoded
    assert t.prompt_tps > 0 and t.decode_tps > 0


def test_logits_match_greedy_choice_and_chunking(model: Model) -> None:
    tokens = model.tokenize(PROMPT)
    with model.session(n_ctx=128, n_batch=512, n_threads=THREADS) as s:
        all_rows = s.decode(tokens, all_logits=True)
        assert all_rows is not None and all_rows.shape == (len(tokens), model.n_vocab)
        assert all_rows.dtype == np.float32
        last = s.logits()
        np.testing.assert_allclose(last, all_rows[-1], atol=1e-3)
        s.reset()
        "".join(s.generate(tokens, 1))
        assert s.last_tokens == [int(np.argmax(last))]
    with model.session(n_ctx=128, n_batch=7, n_threads=THREADS) as s:
        s.decode(tokens)
        chunked = s.logits()
        assert s.n_past == len(tokens)
    assert int(np.argmax(chunked)) == int(np.argmax(last))
    np.testing.assert_allclose(chunked, last, atol=0.05)


def test_weights_read_or_mapped_give_the_same_logits(model_path: Path, model: Model) -> None:
    """use_mmap=False reads the weights into the library's (huge-page-backed) buffers: a
    different home for the same bytes, so every logit must be bit-identical."""
    tokens = model.tokenize(PROMPT)
    rows = []
    with Model(model_path, use_mmap=False) as read:
        for m in (model, read):
            with m.session(n_ctx=128, n_threads=THREADS) as s:
                rows.append(s.decode(tokens, all_logits=True))
    np.testing.assert_array_equal(rows[0], rows[1])


def test_bad_arguments_raise(model: Model) -> None:
    with model.session(n_ctx=64, n_threads=THREADS) as s:
        with pytest.raises(KairoxError):
            s.generate("", 4)
        with pytest.raises(KairoxError):
            s.generate("hi", -1)
        with pytest.raises(KairoxError):
            s.generate([model.n_vocab + 5], 4)
        with pytest.raises(KairoxError):
            s.generate("hi", 4, SamplingParams(temperature=0.5, top_p=0.0))
        with pytest.raises(KairoxError):
            s.decode([])
    with pytest.raises(KairoxError):
        model.session(n_ctx=0)


def test_close_releases_sessions(model_path: Path) -> None:
    m = Model(model_path)
    s = m.session(n_ctx=64, n_threads=THREADS)
    m.close()
    assert s.closed and m.closed
    with pytest.raises(KairoxError):
        s.generate("hi", 2)
    with pytest.raises(KairoxError):
        m.tokenize("hi")
    m.close()  # idempotent


@pytest.mark.parametrize("kind", ["missing", "not_gguf", "directory", "truncated_1mb",
                                  "truncated_tensor_data", "empty"])
def test_model_load_errors(bad_files: dict[str, Path], kind: str) -> None:
    with pytest.raises(KairoxError):
        Model(bad_files[kind])
