"""(c) tokenize/detokenize round trips and (d) chat template formatting (SmolLM2, ChatML)."""
from __future__ import annotations

import pytest

from kairox_py import KairoxError, Model

TEXTS = [
    "Hello, world!",
    " leading and trailing spaces ",
    "line one\nline two\ttabbed",
    "naïve café, Straße, Ελληνικά, русский",
    "日本語のテキスト and 中文",
    "emoji 🙂👍🏽 and symbols ∑∂√ ©®",
    "code: def f(x):\n    return x ** 2  # comment",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(model: Model, text: str) -> None:
    tokens = model.tokenize(text, add_special=False)
    assert tokens and all(0 <= t < model.n_vocab for t in tokens)
    assert model.detokenize(tokens) == text
    # the pieces, as raw bytes, concatenate to the text even where a character is split
    assert b"".join(model.token_to_piece(t) for t in tokens) == text.encode("utf-8")


def test_empty_text(model: Model) -> None:
    assert model.tokenize("", add_special=False) == []
    assert model.detokenize([]) == ""


def test_special_tokens_parse_only_when_asked(model: Model) -> None:
    assert len(model.tokenize("<|im_start|>", add_special=False, parse_special=True)) == 1
    assert len(model.tokenize("<|im_start|>", add_special=False, parse_special=False)) > 1


def test_model_properties(model: Model) -> None:
    assert (model.n_layer, model.n_embd, model.n_vocab) == (30, 576, 49152)
    assert model.n_head == 9 and model.n_head_kv == 3
    assert model.n_ctx_train == 8192
    assert model.metadata["general.architecture"] == "llama"
    assert "Q4_1" in model.desc
    assert model.size > 90_000_000 and model.n_params > 130_000_000
    assert model.is_eog(model.eos)


def test_chat_template_from_model(model: Model) -> None:
    assert model.chat_template is not None and "<|im_start|>" in model.chat_template


def test_apply_chat_template(model: Model) -> None:
    text = model.apply_chat_template([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        ("assistant", "Hello!"),
        {"role": "user", "content": "Bye"},
    ])
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi there<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n"
                    "<|im_start|>user\nBye<|im_end|>\n"
                    "<|im_start|>assistant\n")
    no_asst = model.apply_chat_template([{"role": "user", "content": "Hi"}], add_assistant=False)
    assert no_asst == "<|im_start|>user\nHi<|im_end|>\n"


def test_apply_chat_template_rejects_bad_messages(model: Model) -> None:
    with pytest.raises(KairoxError):
        model.apply_chat_template([])
    with pytest.raises(KairoxError):
        model.apply_chat_template([{"role": "user"}])


def test_vocab_only_model_tokenizes(model_path, model: Model) -> None:  # type: ignore[no-untyped-def]
    with Model(model_path, vocab_only=True) as vocab:
        assert vocab.tokenize(TEXTS[3]) == model.tokenize(TEXTS[3])
        with pytest.raises(KairoxError):
            vocab.session()
