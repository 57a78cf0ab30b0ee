"""kairox_py.chat: llama-cpp-python's create_chat_completion on Kairox, checked for the promises an
app relies on: OpenAI-shaped results, streaming that adds up to the same text, stop strings that
never leak, whole characters only, cancellation that frees the session, and two threads at once."""
from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest

from kairox_py import ChatModel, ChatRequestError, KairoxError, Model
from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, write_synthetic_llama

# one thread per call: on a busy 2-core machine two ggml threads per call wait on each other
THREADS = 1
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "Describe the sea in two sentences."}]
CHINESE = [{"role": "user", "content": "Say hello in Chinese."}]
EMOJI = [{"role": "user", "content": "Give me three emoji."}]


@pytest.fixture(scope="module")
def chat(model: Model) -> ChatModel:
    """A ChatModel borrowing the suite's default model (it stays open for the other tests)."""
    return ChatModel(model, n_threads=THREADS)


def content_of(reply: dict[str, Any]) -> str:
    return str(reply["choices"][0]["message"]["content"])


def stream_deltas(chat: ChatModel, messages: list[dict[str, str]], **kw: Any) -> tuple[list[str], str]:
    """The content deltas of a streamed completion and its finish_reason, with the chunks' shape checked."""
    chunks = list(chat.create_chat_completion(messages, stream=True, **kw))
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and len(c["choices"]) == 1 for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {}
    middle = [c["choices"][0] for c in chunks[1:-1]]
    assert all(ch["finish_reason"] is None and set(ch["delta"]) == {"content"} for ch in middle)
    deltas = [ch["delta"]["content"] for ch in middle]
    assert all(isinstance(d, str) and d for d in deltas)
    return deltas, chunks[-1]["choices"][0]["finish_reason"]


def test_completion_is_openai_shaped(chat: ChatModel, model: Model) -> None:
    reply = chat.create_chat_completion(ASK, max_tokens=8, temperature=0)
    assert set(reply) == {"id", "object", "created", "model", "choices", "usage"}
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["model"] == model.path.name and isinstance(reply["created"], int)
    (choice,) = reply["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length" and content_of(reply).strip()
    prompt = model.tokenize(model.apply_chat_template(ASK), add_special=True, parse_special=True)
    assert reply["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 8, "total_tokens": len(prompt) + 8}
    named = chat.create_chat_completion(ASK, max_tokens=2, temperature=0, model="my-model")
    assert named["model"] == "my-model"


def test_streaming_adds_up_to_the_completion(chat: ChatModel) -> None:
    for n, finish_reason in ((12, "length"), (64, "stop")):  # 64: room for the model to end its turn
        reply = chat.create_chat_completion(ASK, max_tokens=n, temperature=0)
        deltas, finish = stream_deltas(chat, ASK, max_tokens=n, temperature=0)
        assert "".join(deltas) == content_of(reply)
        assert finish == reply["choices"][0]["finish_reason"] == finish_reason


def test_seeded_sampling_repeats(chat: ChatModel) -> None:
    a, b = (content_of(chat.create_chat_completion(ASK, max_tokens=12, temperature=0.9, seed=3)) for _ in "ab")
    assert a == b


def test_stop_strings_end_the_answer_and_never_leak(chat: ChatModel) -> None:
    deltas, natural = stream_deltas(chat, ASK, max_tokens=24, temperature=0)
    text = "".join(deltas)
    # a stop string that spans two deltas (so two tokens): its first half must be held back
    i = next(i for i in range(2, len(deltas) - 1) if len(deltas[i]) >= 2 and len(deltas[i + 1]) >= 2)
    stop = deltas[i][-2:] + deltas[i + 1][:2]
    want = text[:text.index(stop)]
    for stops in (stop, ["no such text", stop]):
        reply = chat.create_chat_completion(ASK, max_tokens=24, temperature=0, stop=stops)
        assert content_of(reply) == want and reply["choices"][0]["finish_reason"] == "stop"
        assert reply["usage"]["completion_tokens"] < 24
        got, finish = stream_deltas(chat, ASK, max_tokens=24, temperature=0, stop=stops)
        assert "".join(got) == want and finish == "stop"
    # a string that starts like the text but never occurs: what was held back comes out in the end
    near = text[5:12] + "\x01"
    got, finish = stream_deltas(chat, ASK, max_tokens=24, temperature=0, stop=[near])
    assert "".join(got) == text and finish == natural
    # the stop at the very start: an empty answer
    reply = chat.create_chat_completion(ASK, max_tokens=24, temperature=0, stop=text[:3])
    assert content_of(reply) == "" and reply["choices"][0]["finish_reason"] == "stop"


def test_multibyte_text_comes_in_whole_characters(chat: ChatModel, model: Model) -> None:
    # the answer's tokens, from the session API the chat runs on (greedy: the same tokens)
    with model.session(n_ctx=256, n_threads=THREADS) as s:
        full = "".join(s.generate(model.apply_chat_template(EMOJI), 14))
        tokens = list(s.last_tokens)
    assert any(ord(ch) > 0xFFFF for ch in full), full  # 4-byte characters
    raw = [model.token_to_piece(t) for t in tokens]
    cuts = [n for n in range(1, len(raw)) if not _is_utf8(b"".join(raw[:n]))]
    assert cuts, "no character of the answer spans tokens: the test would prove nothing"
    reply = chat.create_chat_completion(EMOJI, max_tokens=len(tokens), temperature=0)
    assert content_of(reply) == full
    # max_tokens inside a character: what it cuts off never shows, in either form
    n = cuts[0]
    whole = b"".join(raw[:n]).decode("utf-8", errors="ignore")
    reply = chat.create_chat_completion(EMOJI, max_tokens=n, temperature=0)
    deltas, finish = stream_deltas(chat, EMOJI, max_tokens=n, temperature=0)
    assert content_of(reply) == "".join(deltas) == whole and finish == "length"
    assert all("\ufffd" not in d for d in deltas)
    # ... and one more token completes it
    m = next(m for m in range(n + 1, len(raw) + 1) if m not in cuts)
    deltas, _ = stream_deltas(chat, EMOJI, max_tokens=m, temperature=0)
    assert "".join(deltas) == b"".join(raw[:m]).decode("utf-8") and len("".join(deltas)) > len(whole)
    # a stop string of one non-ASCII character
    zh = content_of(chat.create_chat_completion(CHINESE, max_tokens=6, temperature=0))
    ch = next(c for c in zh if ord(c) > 0x7F)
    deltas, finish = stream_deltas(chat, CHINESE, max_tokens=6, temperature=0, stop=ch)
    assert "".join(deltas) == zh[:zh.index(ch)] and finish == "stop"


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _open_sessions(model: Model) -> int:
    return sum(not s.closed for s in list(model._sessions))


def test_closing_the_stream_stops_and_frees(chat: ChatModel, model: Model) -> None:
    before = _open_sessions(model)
    gen = chat.create_chat_completion(ASK, stream=True, max_tokens=500, temperature=0)
    for _ in range(4):
        next(gen)
    assert chat.active == 1 and _open_sessions(model) == before + 1
    gen.close()
    assert chat.active == 0 and _open_sessions(model) == before
    # leaving a loop early: the generator goes with its last reference
    for n, _chunk in enumerate(chat.create_chat_completion(ASK, stream=True, max_tokens=500)):
        if n == 3:
            break
    assert chat.active == 0 and _open_sessions(model) == before
    # a stream never started holds nothing
    chat.create_chat_completion(ASK, stream=True).close()
    assert chat.active == 0 and _open_sessions(model) == before


def test_an_owning_chat_model_closes_only_when_idle(model_path: Path) -> None:
    chat = ChatModel(model_path, n_threads=THREADS, name="smol")
    gen = chat.create_chat_completion(ASK, stream=True, max_tokens=50)
    assert next(gen)["model"] == "smol"
    next(gen)
    with pytest.raises(KairoxError, match="still running"):
        chat.close()
    gen.close()
    chat.close()
    assert chat.model.closed
    with pytest.raises(KairoxError, match="closed"):
        chat.create_chat_completion(ASK)


def test_two_threads_at_once(chat: ChatModel) -> None:
    """One session per call: two threads decode concurrently and each gets what it would alone."""
    asks = [ASK, [{"role": "user", "content": "Name three colours."}]]
    alone = [content_of(chat.create_chat_completion(m, max_tokens=16, temperature=0)) for m in asks]
    results: list[list[str]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            start.wait()
            for stream in (False, True):
                if stream:
                    deltas, _ = stream_deltas(chat, asks[i], max_tokens=16, temperature=0)
                    results[i].append("".join(deltas))
                else:
                    results[i].append(content_of(chat.create_chat_completion(asks[i], max_tokens=16,
                                                                             temperature=0)))
        except BaseException as e:  # reported below, in the test's own thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert results == [[alone[0]] * 2, [alone[1]] * 2]
    assert chat.active == 0


def test_kairox_gguf_runs_sparse(tmp_path: Path) -> None:
    """A Kairox GGUF answers in its own sparse mode by default; mode= picks another."""
    path = write_synthetic_llama(tmp_path / "tiny-kx.gguf", SHAPES["tiny"], "q4_0", SparseSpec(0))
    with Model(path) as m:
        sparse, dense = ChatModel(m, n_threads=THREADS), ChatModel(m, n_threads=THREADS, mode="dense")
        for chat, mode in ((sparse, "predictor"), (dense, "dense")):
            with m.session(chat.params) as s:
                assert s.mode == mode
            reply = chat.create_chat_completion(ASK, max_tokens=6, temperature=0)
            deltas, _ = stream_deltas(chat, ASK, max_tokens=6, temperature=0)
            assert "".join(deltas) == content_of(reply)
            assert reply["usage"]["completion_tokens"] == 6


def test_mode_reaches_every_call(chat: ChatModel, model: Model) -> None:
    with pytest.raises(KairoxError, match="mode"):
        ChatModel(model, mode="sparse-please")
    threshold = ChatModel(model, n_threads=THREADS, mode="threshold")  # the default model is no Kairox GGUF
    with pytest.raises(KairoxError, match="sparsity data"):
        threshold.create_chat_completion(ASK, max_tokens=4)
    assert threshold.active == 0


BAD: list[tuple[str, dict[str, Any]]] = [
    ("empty", {"messages": []}),
    ("must be a list", {"messages": "hello"}),
    ("must be a dict", {"messages": [("user", "hello")]}),
    ("role", {"messages": [{"role": "wizard", "content": "hello"}]}),
    ("role", {"messages": [{"content": "hello"}]}),
    ("content must be a string", {"messages": [{"role": "user", "content": None}]}),
    ("content must be a string", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    ("max_tokens", {"max_tokens": 0}),
    ("max_tokens", {"max_tokens": -1}),
    ("max_tokens", {"max_tokens": 2.5}),
    ("max_tokens", {"max_tokens": True}),
    ("stop", {"stop": 7}),
    ("stop", {"stop": ["ok", None]}),
    ("stop", {"stop": b"bytes"}),
    ("empty", {"stop": ""}),
    ("temperature", {"temperature": math.nan}),
    ("temperature", {"temperature": "hot"}),
    ("top_p", {"top_p": 0.0}),
    ("top_k", {"top_k": 1.5}),
    ("seed", {"seed": -1}),
    ("model must be a string", {"model": 3}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("match", "kw"), BAD, ids=[f"{m}-{sorted(k.items())!r}"[:60] for m, k in BAD])
def test_bad_input_raises_at_the_call(chat: ChatModel, match: str, kw: dict[str, Any], stream: bool) -> None:
    args = {"messages": ASK, "max_tokens": 4, **kw}
    with pytest.raises(ChatRequestError, match=match) as info:
        chat.create_chat_completion(args.pop("messages"), stream=stream, **args)
    assert isinstance(info.value, KairoxError) and isinstance(info.value, ValueError)
    assert chat.active == 0


def test_n_ctx_bounds_the_conversation(model: Model) -> None:
    small = ChatModel(model, n_ctx=48, n_threads=THREADS)
    with pytest.raises(ChatRequestError, match="n_ctx=48"):
        small.create_chat_completion([{"role": "user", "content": "word " * 60}])
    # max_tokens beyond it: the answer ends where the conversation has used n_ctx tokens
    reply = small.create_chat_completion([{"role": "user", "content": "Count from one to one hundred."}],
                                         max_tokens=500, temperature=0)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["total_tokens"] == 48
