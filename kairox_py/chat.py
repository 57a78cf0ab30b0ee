"""OpenAI-shaped chat completions over a loaded model, the interface llama-cpp-python users know.

Applications written against ``llama_cpp.Llama.create_chat_completion`` (and so against the
OpenAI client's result shapes) can switch to Kairox by swapping the object they call: the
messages go in the same way, and the same dicts (or, streaming, the same chunks) come out.

Why it is built this way:

* Every call opens its own Session (llama_context) and closes it when done, so one loaded
  ChatModel serves several threads at once (one session each, the weights shared) and a
  call leaves nothing behind. The native calls release the GIL, so threads really overlap.
* Streaming and non-streaming share one text loop, so their text is the same by
  construction. Text that could be the start of a stop string is held back until it is
  known not to be one: a stop string never shows up in part in a streamed delta.
* Deltas are whole characters: Session.generate decodes UTF-8 incrementally, so a character
  split across tokens is emitted once complete, and one cut off by max_tokens is left out.
* Argument errors raise when create_chat_completion is called, even with stream=True,
  rather than at the first ``next()`` of the stream; they are ChatRequestError, which is
  both a KairoxError (what the rest of kairox_py raises) and a ValueError (what callers of
  other libraries catch).
"""
from __future__ import annotations

import codecs
import math
import os
import threading
import time
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypedDict, cast, overload

from .errors import KairoxError
from .gguf_info import inspect_gguf
from .llama import ROW_MODES, ContextParams, Model, SamplingParams, Session, has_gpu

#: roles a message may have (those of the OpenAI chat API that carry plain text)
ROLES = ("system", "user", "assistant")
#: the longest context a ChatModel gives a call unless told otherwise (a model's training
#: context can be 32k tokens and more, whose KV cache would be allocated for every call)
DEFAULT_N_CTX = 4096
#: per-call contexts are sized in steps of this many tokens (as llama.cpp rounds n_ctx)
CTX_ROUND = 256
#: what Session.generate's UTF-8 decoder makes of bytes that are not (yet) a whole character
REPLACEMENT = "\ufffd"


class ChatRequestError(KairoxError, ValueError):
    """A create_chat_completion argument that cannot be served (bad messages, max_tokens, stop, ...)."""


# ---------------------------------------------------------------------------------------
# Result shapes (OpenAI's chat.completion and chat.completion.chunk objects)
# ---------------------------------------------------------------------------------------
class ChatMessage(TypedDict):
    role: str
    content: str


class ChatCompletionChoice(TypedDict):
    index: int
    message: ChatMessage
    logprobs: None
    finish_reason: str


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage


class ChatCompletionDelta(TypedDict, total=False):
    role: str
    content: str


class ChatCompletionChunkChoice(TypedDict):
    index: int
    delta: ChatCompletionDelta
    logprobs: None
    finish_reason: str | None


class ChatCompletionChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]


# ---------------------------------------------------------------------------------------
# One request, checked
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Request:
    """A validated call: prompt tokens, how far to generate, how to sample, where to stop."""

    tokens: list[int]
    max_tokens: int
    n_ctx: int
    sampling: SamplingParams
    stops: tuple[str, ...]


@dataclass
class _Outcome:
    """What one run of the text loop ends with (filled in by the loop, read by its caller)."""

    finish_reason: str = "length"
    completion_tokens: int = 0


@dataclass
class _InFlight:
    """How many calls of one ChatModel hold a session now (close() refuses while any do)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0


def _check_messages(messages: object) -> list[dict[str, str]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatRequestError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ChatRequestError("messages is empty: a chat completion needs at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatRequestError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ChatRequestError(f"messages[{i}] has role {role!r}; roles: {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ChatRequestError(f"messages[{i}] content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _check_stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise ChatRequestError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(s == "" for s in stops):
        raise ChatRequestError("stop strings must not be empty (one would end every completion at once)")
    return tuple(dict.fromkeys(stops))


def _find_stop(text: str, stops: tuple[str, ...]) -> int:
    """Index of the earliest stop string in text, -1 if none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def _held_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of text that begins some stop string (and so must wait)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _whole_characters(model: Model, session: Session, pieces: Iterator[str]) -> Iterator[str]:
    """Session.generate's pieces without the U+FFFD it flushes for a character cut off by the
    end of generation (max_tokens or the context): an answer holds only whole characters.

    A lone U+FFFD piece waits for the next one; if none comes, it is dropped when the answer's
    bytes end inside a character (a U+FFFD the model did write is kept).
    """
    waiting = ""
    for piece in pieces:
        if waiting:
            yield waiting
            waiting = ""
        if piece == REPLACEMENT:
            waiting = piece
        else:
            yield piece
    if waiting:
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        utf8.decode(b"".join(model.token_to_piece(t) for t in session.last_tokens))
        if not utf8.getstate()[0]:
            yield waiting


# ---------------------------------------------------------------------------------------
# ChatModel
# ---------------------------------------------------------------------------------------
class ChatModel:
    """A model that answers chat conversations, llama-cpp-python style.

        chat = ChatModel("model.gguf")            # or ChatModel(Model(...)) to share one
        reply = chat.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=64)
        print(reply["choices"][0]["message"]["content"])

    model: a GGUF path (loaded here and freed by close()) or an open Model (borrowed: its
    owner closes it). Kairox GGUFs run sparse in their own mode ("auto"); `mode` picks another
    ("dense", "predictor", "threshold", "cats"). n_ctx: the most tokens a call's conversation and
    answer hold together (None: the model's training context, at most DEFAULT_N_CTX); each call
    allocates only what it can use. n_threads: CPU threads per call (None: min(4, CPUs));
    context: further ContextParams fields (threshold_scale, deterministic, ...).
    name: the "model" field of the results (default: the GGUF's file name).
    """

    def __init__(self, model: Model | str | os.PathLike[str], *, n_ctx: int | None = None,
                 n_threads: int | None = None, mode: str = "auto", n_batch: int = 512,
                 name: str | None = None, **context: Any) -> None:
        if isinstance(model, Model):
            self._model, self._owns_model = model, False
        else:
            path = Path(model)
            # a Kairox GGUF run sparse on a GPU machine keeps its FFN weights in host memory,
            # where the sparse kernels read them (as `kairox run` places them)
            on_host = mode != "dense" and has_gpu() and inspect_gguf(path).has_kairox_data
            self._model, self._owns_model = Model(path, ffn_on_host=on_host, ffn_rows=mode in ROW_MODES), True
        try:
            train = self._model.n_ctx_train
            cap = n_ctx if n_ctx is not None else min(train, DEFAULT_N_CTX) if train > 0 else DEFAULT_N_CTX
            #: the settings of every call's session; n_ctx is the cap, each call sizes its own
            self.params = ContextParams(n_ctx=cap, n_batch=n_batch, n_threads=n_threads, mode=mode, **context)
            self.params.validate()
        except (KairoxError, TypeError):
            if self._owns_model:
                self._model.close()
            raise
        self.name = name if name is not None else self._model.path.name
        # session creation is serialised: it is quick, and llama.cpp's context setup is not
        # promised to be safe from several threads at once
        self._create_lock = threading.Lock()
        self._in_flight = _InFlight()

    # -- lifetime ------------------------------------------------------------------------
    @property
    def model(self) -> Model:
        """The loaded Model (for tokenize, chat_template, metadata, ...)."""
        return self._model

    @property
    def active(self) -> int:
        """Completions holding a session right now (a stream counts until it ends or is closed)."""
        return self._in_flight.count

    def close(self) -> None:
        """Free the model if this ChatModel loaded it. Refused while completions run, whose
        sessions would otherwise be freed under them."""
        with self._in_flight.lock:
            if self._in_flight.count:
                raise KairoxError(f"{self._in_flight.count} chat completion(s) still running: let them "
                                  "finish or close their streams first")
            if self._owns_model:
                self._model.close()

    def __enter__(self) -> ChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChatModel({self.name!r}, mode={self.params.mode!r}, n_ctx<={self.params.n_ctx})"

    # -- completions ---------------------------------------------------------------------
    @overload
    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], *, stream: Literal[False] = ...,
                               max_tokens: int | None = ..., temperature: float = ..., top_p: float = ...,
                               top_k: int = ..., seed: int | None = ...,
                               stop: str | Sequence[str] | None = ..., model: str | None = ...
                               ) -> ChatCompletion: ...

    @overload
    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], *, stream: Literal[True],
                               max_tokens: int | None = ..., temperature: float = ..., top_p: float = ...,
                               top_k: int = ..., seed: int | None = ...,
                               stop: str | Sequence[str] | None = ..., model: str | None = ...
                               ) -> Generator[ChatCompletionChunk, None, None]: ...

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], *, stream: bool = False,
                               max_tokens: int | None = None, temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, seed: int | None = None,
                               stop: str | Sequence[str] | None = None, model: str | None = None
                               ) -> ChatCompletion | Generator[ChatCompletionChunk, None, None]:
        """Answer a conversation as the assistant, formatted with the GGUF's chat template.

        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...].
        max_tokens: most tokens to generate (None: until the model ends its turn or the
        ChatModel's n_ctx is used up, which caps it too). temperature <= 0 is greedy;
        otherwise top-k, then top-p, then temperature, then a draw seeded by seed (None: a
        random seed); the defaults are llama-cpp-python's. stop: strings that end the answer;
        they are not part of it. model: the results' "model" field (default: the ChatModel's
        name).

        Returns a "chat.completion" dict, or with stream=True a generator of
        "chat.completion.chunk" dicts: the assistant role, then content deltas, then an empty
        delta with finish_reason ("stop": the model ended its turn or a stop string came;
        "length": max_tokens or n_ctx ran out). Closing the generator (or leaving a
        loop over it) stops generating and frees the call's session.
        """
        req = self._request(messages, max_tokens, temperature, top_p, top_k, seed, stop)
        if model is not None and not isinstance(model, str):
            raise ChatRequestError(f"model must be a string (the results' name for the model), got {model!r}")
        name = self.name if model is None else model
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:
            return self._chunks(req, cid, created, name)
        outcome = _Outcome()
        content = "".join(self._text(req, outcome))
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "logprobs": None, "finish_reason": outcome.finish_reason}],
            "usage": {"prompt_tokens": len(req.tokens), "completion_tokens": outcome.completion_tokens,
                      "total_tokens": len(req.tokens) + outcome.completion_tokens},
        }

    def _request(self, messages: object, max_tokens: object, temperature: object, top_p: object,
                 top_k: object, seed: object, stop: object) -> _Request:
        """Check every argument and tokenize the prompt, so that bad input raises at the call."""
        if self._model.closed:
            raise KairoxError("the model is closed")
        msgs = _check_messages(messages)
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ChatRequestError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature):
            raise ChatRequestError(f"temperature must be a finite number, got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise ChatRequestError(f"top_k must be an integer, got {top_k!r}")
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
            raise ChatRequestError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ChatRequestError(f"seed must be an integer or None, got {seed!r}")
        sampling = SamplingParams(temperature=float(temperature), top_k=top_k, top_p=float(top_p), seed=seed)
        try:
            sampling.validate()
        except KairoxError as e:
            raise ChatRequestError(str(e)) from None
        stops = _check_stop(stop)
        model = self._model
        tokens = model.tokenize(model.apply_chat_template(msgs), add_special=True, parse_special=True)
        cap = self.params.n_ctx
        if len(tokens) >= cap:
            raise ChatRequestError(f"the conversation has {len(tokens)} tokens: the context (n_ctx={cap}) "
                                   "leaves no room for an answer")
        # n_ctx is the conversation's budget, answer included, whatever llama.cpp rounds it up to
        room = cap - len(tokens)
        n = room if max_tokens is None else min(int(max_tokens), room)
        n_ctx = min(cap, -(-(len(tokens) + n) // CTX_ROUND) * CTX_ROUND)
        return _Request(tokens, n, n_ctx, sampling, stops)

    def _chunks(self, req: _Request, cid: str, created: int,
                name: str) -> Generator[ChatCompletionChunk, None, None]:
        def chunk(delta: ChatCompletionDelta, finish_reason: str | None = None) -> ChatCompletionChunk:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

        yield chunk({"role": "assistant"})
        outcome = _Outcome()
        texts = self._text(req, outcome)
        try:
            for text in texts:
                yield chunk({"content": text})
        finally:
            texts.close()  # the consumer's close() reaches the session now, not at garbage collection
        yield chunk({}, outcome.finish_reason)

    def _text(self, req: _Request, outcome: _Outcome) -> Generator[str, None, None]:
        """The answer's text in deltas, stop strings cut off; fills outcome at the end.

        Owns the call's session: it is created on the first next() and closed when the loop
        ends, however it ends (exhausted, a stop string, an error, or the consumer's close()).
        """
        with self._in_flight.lock:  # close() takes it too: the model stays open from here on
            if self._model.closed:
                raise KairoxError("the model is closed")
            self._in_flight.count += 1
        try:
            with self._create_lock:
                session = self._model.session(replace(self.params, n_ctx=req.n_ctx))
        except BaseException:
            with self._in_flight.lock:
                self._in_flight.count -= 1
            raise
        try:
            pieces = cast(Generator[str, None, None],
                          session.generate(req.tokens, req.max_tokens, req.sampling))
            try:
                held = ""
                for piece in _whole_characters(self._model, session, pieces):
                    text = held + piece
                    at = _find_stop(text, req.stops)
                    if at >= 0:
                        if at:
                            yield text[:at]
                        outcome.finish_reason = "stop"
                        return
                    keep = _held_length(text, req.stops)
                    held = text[len(text) - keep:]
                    if len(text) > keep:
                        yield text[:len(text) - keep]
                if held:
                    yield held
                outcome.finish_reason = "stop" if session.stop_reason == "eog" else "length"
            finally:
                outcome.completion_tokens = len(session.last_tokens)
                pieces.close()
        finally:
            session.close()
            with self._in_flight.lock:
                self._in_flight.count -= 1
