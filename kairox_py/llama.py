"""Thin Python objects over the llama.cpp C API: Model, Session, sampling, timings.

Why thin: Kairox's value is in the C++ kernels; Python only has to drive them the same
way llama.cpp's own tools do (so results can be compared token for token with
``llama-completion``) and expose what evaluation needs (logits, timings). Every native
resource is owned by exactly one object, released by ``close()`` (or the context
manager, or a ``weakref.finalize`` as a last resort), and a Model closes its Sessions
first because a llama_context must not outlive its llama_model.
"""
from __future__ import annotations

import codecs
import ctypes
import functools
import math
import os
import re
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _lib
from .errors import KairoxError
from .hybrid import POLICIES, HybridBudget, HybridInfo, HybridLayerStats

GGUF_MAGIC = b"GGUF"

#: A chat message: {"role": ..., "content": ...} or (role, content).
Message = Mapping[str, str] | Sequence[str]


#: ggml's GGML_MAX_N_THREADS: its thread pools hold at most this many (more crash in OpenMP)
MAX_THREADS = 512


def default_threads() -> int:
    """min(4, CPU count): more threads rarely help a small model and hurt on shared boxes."""
    return max(1, min(4, os.cpu_count() or 1))


def _read_string(call: Callable[..., int], *args: Any, initial: int = 256) -> str:
    """Call a llama.cpp `(…, char * buf, size_t buf_size) -> length` function, growing buf."""
    size = initial
    while True:
        buf = ctypes.create_string_buffer(size)
        n = call(*args, buf, size)
        if n < 0:
            return ""
        if n < size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1


def _load_failure_reason(errors: list[str]) -> str:
    """The most specific reason among llama.cpp's error log lines for a failed load."""
    for msg in errors:
        line = msg.splitlines()[0] if msg else ""
        # "llama_model_load: error loading model: tensor '…' data is not within the file bounds"
        line = re.sub(r"^(\w+: )+", "", line)
        line = re.sub(r"^error loading model: (\w+: )*", "", line)
        if line and not line.startswith("failed to load model"):
            return line
    return "the library could not load it (run with -v / KAIROX_VERBOSE=1 for its log)"


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
def has_gpu() -> bool:
    """Whether the library sees a GPU (a CUDA build on a machine with one): where the hybrid
    runtime keeps its neuron-group cache; without one it uses the CPU stand-in device."""
    return any(_lib.ggml_backend_dev_type(_lib.ggml_backend_dev_get(i)) in
               (_lib.GGML_BACKEND_DEVICE_TYPE_GPU, _lib.GGML_BACKEND_DEVICE_TYPE_IGPU)
               for i in range(_lib.ggml_backend_dev_count()))


# The FFN matrices the hybrid placement keeps in host memory (ffn_up, ffn_gate, ffn_down and
# the sparse path's ffn_down_t), as a tensor-override regex: not ffn_norm, whose one multiply
# would otherwise cost each layer a device-to-host round trip
FFN_WEIGHTS = "ffn_(up|gate|down)"
# The matrices the sparse ops of predictor and CATS mode read by rows: kept out of the CPU
# backend's repacked layout, which only its own dense kernels read
FFN_ROWS = "ffn_(up|gate)"
#: sparse modes that select rows of ffn_gate/ffn_up (threshold mode reads them whole)
ROW_MODES = ("predictor", "cats")


# the error of the hybrid runtime's calls on a context without one
NO_HYBRID = "this context has no hybrid runtime (ContextParams(vram_budget_gib != 0))"


class Model:
    """A loaded GGUF model (llama_model) plus its vocabulary.

    Errors a user can cause (missing file, not a GGUF, truncated or corrupt file) raise
    KairoxError; they are checked in Python first where cheap, and otherwise reported
    from llama.cpp's own log when the library returns NULL.
    """

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int | None = None,
                 vocab_only: bool = False, use_mmap: bool = True, ffn_on_host: bool = False,
                 ffn_rows: bool = False) -> None:
        """ffn_on_host: with a GPU, every layer goes to it except the FFN weights (ffn_up, ffn_gate,
        ffn_down, the sparse path's ffn_down_t), which stay in host memory: the hybrid runtime's
        placement (dense parts on the device, FFN neurons on the CPU and in the device's group
        cache). Without a GPU it keeps ffn_gate/ffn_up in plain rows, as ffn_rows does.

        ffn_rows: keep ffn_gate/ffn_up in plain rows. The library repacks them (where the CPU
        backend has a faster layout for their type) unless the model's own mode reads them by
        rows; a Kairox GGUF whose mode is threshold, run in predictor or CATS mode (ROW_MODES) or
        by the hybrid runtime, needs this for sparse speed (without it those modes compute the
        rows dense and mask them)."""
        self.path = Path(path)
        _check_gguf_file(self.path)
        params = _lib.llama_model_default_params()
        if n_gpu_layers is not None:
            params.n_gpu_layers = n_gpu_layers
        self._overrides = None  # kept alive while the model loads
        on_gpu = ffn_on_host and has_gpu()
        if on_gpu or ffn_on_host or ffn_rows:
            arr = (_lib.llama_model_tensor_buft_override * 2)()
            arr[0].pattern = (FFN_WEIGHTS if on_gpu else FFN_ROWS).encode()
            arr[0].buft = _lib.ggml_backend_cpu_buffer_type()  # plain rows in host memory
            self._overrides = arr
            params.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)
            if on_gpu and n_gpu_layers is None:
                params.n_gpu_layers = 999
        params.vocab_only = vocab_only
        if not use_mmap:
            # Weights read into anonymous memory, which the library backs with huge pages
            # (a mapped file stays on 4 KiB pages): sparse decode reads scattered rows, and
            # with small pages nearly every row costs a TLB miss.
            params.load_mode = _lib.LLAMA_LOAD_MODE_NONE
        _lib.take_log_errors()  # drop stale messages so the reason below is ours
        ptr = _lib.llama_model_load_from_file(os.fsencode(self.path), params)
        if not ptr:
            reason = _load_failure_reason(_lib.take_log_errors())
            raise KairoxError(f"cannot load model {self.path}: {reason}")
        self._ptr: int | None = ptr
        self.vocab_only = vocab_only
        self._vocab = _lib.llama_model_get_vocab(ptr)
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._finalizer = weakref.finalize(self, _lib.llama_model_free, ptr)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Free the model (and first every Session still open on it)."""
        for s in list(self._sessions):
            s.close()
        self._finalizer()
        self._ptr = None

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.desc
        return f"Model({str(self.path)!r}, {state})"

    @property
    def ptr(self) -> int:
        """The raw `llama_model *` (for code that calls _lib directly)."""
        if self._ptr is None:
            raise KairoxError("model is closed")
        return self._ptr

    @property
    def vocab_ptr(self) -> int:
        """The raw `const llama_vocab *` (valid while the model is open)."""
        if self._ptr is None:
            raise KairoxError("model is closed")
        return int(self._vocab)

    # -- properties ----------------------------------------------------------------------
    @property
    def n_layer(self) -> int:
        return int(_lib.llama_model_n_layer(self.ptr))

    @property
    def n_embd(self) -> int:
        return int(_lib.llama_model_n_embd(self.ptr))

    @property
    def arch(self) -> str:
        """The GGUF's general.architecture ("" if it has none)."""
        return self.metadata.get("general.architecture", "")

    @functools.cached_property
    def n_ff(self) -> int:
        """FFN width (neurons per layer), from `<arch>.feed_forward_length`."""
        arch = self.arch
        v = self.metadata.get(f"{arch}.feed_forward_length")
        if v is None or not v.strip().isdigit():
            raise KairoxError(f"the model has no single {arch}.feed_forward_length")
        return int(v)

    @property
    def has_sparsity(self) -> bool:
        """Whether the GGUF carries Kairox sparsity data."""
        return bool(_lib.kairox_model_has_sparsity(self.ptr))

    @property
    def has_predictor(self) -> bool:
        return bool(_lib.kairox_model_has_predictor(self.ptr))

    @property
    def n_head(self) -> int:
        return int(_lib.llama_model_n_head(self.ptr))

    @property
    def n_head_kv(self) -> int:
        return int(_lib.llama_model_n_head_kv(self.ptr))

    @property
    def n_vocab(self) -> int:
        return int(_lib.llama_vocab_n_tokens(self.vocab_ptr))

    @property
    def n_ctx_train(self) -> int:
        return int(_lib.llama_model_n_ctx_train(self.ptr))

    @property
    def n_params(self) -> int:
        return int(_lib.llama_model_n_params(self.ptr))

    @property
    def size(self) -> int:
        """Total bytes of all tensors."""
        return int(_lib.llama_model_size(self.ptr))

    @property
    def desc(self) -> str:
        """llama.cpp's one-line description, e.g. 'llama ?B Q4_1'."""
        return _read_string(_lib.llama_model_desc, self.ptr)

    @functools.cached_property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata as strings (arrays appear as llama.cpp summarises them)."""
        ptr = self.ptr
        out = {}
        for i in range(_lib.llama_model_meta_count(ptr)):
            key = _read_string(_lib.llama_model_meta_key_by_index, ptr, i)
            out[key] = _read_string(_lib.llama_model_meta_val_str_by_index, ptr, i)
        return out

    @property
    def chat_template(self) -> str | None:
        """The model's default chat template (Jinja source), or None."""
        raw = _lib.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def bos(self) -> int:
        return int(_lib.llama_vocab_bos(self.vocab_ptr))

    @property
    def eos(self) -> int:
        return int(_lib.llama_vocab_eos(self.vocab_ptr))

    @property
    def add_bos(self) -> bool:
        return bool(_lib.llama_vocab_get_add_bos(self.vocab_ptr))

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""
        return bool(_lib.llama_vocab_is_eog(self.vocab_ptr, token))

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        return tuple(t for t in range(self.n_vocab) if self.is_eog(t))

    # -- text <-> tokens -----------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        """Text -> token ids. add_special adds BOS/EOS as the model asks; parse_special
        turns texts such as '<|im_start|>' into their control tokens."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        for _ in range(2):
            buf = (_lib.llama_token * cap)()
            n = _lib.llama_tokenize(self.vocab_ptr, data, len(data), buf, cap,
                                    add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            if n == -(2**31):
                break
            cap = -n
        raise KairoxError(f"tokenization failed for a text of {len(data)} bytes")

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """One token's bytes. Not always valid UTF-8 on its own: a character may span
        several tokens, so streaming callers must decode incrementally."""
        buf = ctypes.create_string_buffer(64)
        n = _lib.llama_token_to_piece(self.vocab_ptr, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _lib.llama_token_to_piece(self.vocab_ptr, token, buf, -n, 0, special)
        return buf.raw[:max(n, 0)]

    def detokenize(self, tokens: Sequence[int], *, remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """Token ids -> text (inverse of tokenize)."""
        arr = (_lib.llama_token * len(tokens))(*tokens)
        cap = max(16, 4 * len(tokens) + 16)
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = _lib.llama_detokenize(self.vocab_ptr, arr, len(tokens), buf, cap,
                                      remove_special, unparse_special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = -n
        raise KairoxError("detokenization failed")

    def encode_prompt(self, prompt: str, chat: bool) -> list[int]:
        """Tokens of a user prompt, wrapped in the model's chat template when chat is set and
        the model has one (what benchmarks, traces and the hybrid comparison all feed)."""
        text = self.apply_chat_template([{"role": "user", "content": prompt}]) \
            if chat and self.chat_template else prompt
        return self.tokenize(text, add_special=True, parse_special=True)

    def apply_chat_template(self, messages: Sequence[Message], add_assistant: bool = True,
                            *, template: str | None = None) -> str:
        """Format a conversation with the model's chat template (llama.cpp's built-in
        formatter, which recognises common templates such as ChatML; no Jinja engine).

        With no template in the model (and none given) llama.cpp's default, ChatML, is used.
        add_assistant ends the text with the opening of an assistant turn.
        """
        pairs = [_message_pair(m) for m in messages]
        if not pairs:
            raise KairoxError("no messages to format")
        tmpl = template if template is not None else self.chat_template
        encoded = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in pairs]
        arr = (_lib.llama_chat_message * len(encoded))(
            *[_lib.llama_chat_message(r, c) for r, c in encoded])
        tmpl_b = tmpl.encode("utf-8") if tmpl is not None else None
        cap = 2 * sum(len(r) + len(c) for r, c in encoded) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = _lib.llama_chat_apply_template(tmpl_b, arr, len(encoded), add_assistant,
                                               buf, cap)
            if n < 0:
                raise KairoxError("the model's chat template is not one llama.cpp can apply")
            if n <= cap:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = n
        raise KairoxError("chat template output did not fit")

    # -- sessions ------------------------------------------------------------------------
    def session(self, params: ContextParams | None = None, **overrides: Any) -> Session:
        """A new Session (llama_context) on this model; see ContextParams for options."""
        return Session(self, params, **overrides)


def _check_gguf_file(path: Path) -> None:
    """Cheap checks with clear messages before handing a path to the C loader."""
    if not path.exists():
        raise KairoxError(f"model file not found: {path}")
    if not path.is_file():
        raise KairoxError(f"not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise KairoxError(f"cannot read {path}: {e.strerror or e}") from None
    if magic != GGUF_MAGIC:
        raise KairoxError(f"not a GGUF file (bad magic {magic!r}): {path}")


def _message_pair(m: Message) -> tuple[str, str]:
    if isinstance(m, Mapping):
        role, content = m.get("role"), m.get("content")
    elif isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 2:
        role, content = m[0], m[1]
    else:
        role = content = None
    if not isinstance(role, str) or not isinstance(content, str):
        raise KairoxError(f"a chat message needs a string role and content, got {m!r}")
    return role, content


# ---------------------------------------------------------------------------------------
# Parameters and results
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextParams:
    """Options of a Session's llama_context.

    n_ctx: tokens the context holds; n_batch: most tokens per llama_decode call (prompts
    are fed in chunks of this size); n_ubatch: physical batch (None: llama.cpp's default,
    min(n_batch, 512)); n_threads: threads for single-token decoding and, unless
    n_threads_batch says otherwise, for prompt processing (None: min(4, CPU count)).
    """

    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    #: Kairox sparse FFN: "auto" (the model's own setting; dense for a plain GGUF), "dense",
    #: "predictor", "threshold" or "cats"
    mode: str = "auto"
    #: multiplies the calibrated thresholds (sparsity sweeps)
    threshold_scale: float = 1.0
    #: predictor probability threshold (<= 0: the model's)
    pred_threshold: float = 0.0
    #: ubatches of up to this many tokens run the sparse FFN (0: library default, 16);
    #: evaluation sets it to n_batch so that every token goes through the sparse FFN
    max_sparse_tokens: int = 0
    #: count active neurons per layer (Session.layer_stats)
    stats: bool = False
    #: hybrid runtime: > 0 keeps a device cache of neuron groups under this many GiB of weights
    #: (dense parts first); 0: CPU only; VRAM_AUTO (< 0): the device's free memory minus the KV
    #: cache, compute buffers and vram_reserve_gib. Runs predictor mode (mode "auto" picks it;
    #: another sparse mode is an error) on a converted model.
    vram_budget_gib: float = 0.0
    #: auto budget: device memory left free besides the KV cache and compute buffers
    vram_reserve_gib: float = 0.5
    #: the cache's balancer policy (kairox_py.hybrid.POLICIES)
    policy: str = "tam"
    #: TAM's decay at start (fixed for "tam-t"); <= 0: the balancer's default (0.5)
    lambda_init: float = 0.0
    #: reproducible output: the sparse down projection sums fixed blocks of neurons in float and
    #: the blocks in double, so logits do not depend on the thread count, the batch or (hybrid
    #: runtime) placement; the hybrid runtime also keeps lambda fixed (no timing feedback)
    deterministic: bool = False
    #: share of active neurons above which the sparse down projection reads ffn_down in order
    #: (0: always, >= 1: never); < 0: the model's kairox.down_dense_share (kairox calibrate),
    #: else the library's built-in crossover per weight type
    down_dense_share: float = -1.0
    #: threshold mode computes every row of gate and up (for its mask): 1 through the sparse op's
    #: row kernels, 0 through ggml's mat-vec (for plain rows; repacked ones always take ggml's);
    #: < 0: the model's kairox.gate_up_rows (kairox calibrate), else 1
    gate_up_rows: int = -1
    #: hybrid runtime: plan layers before their own FFN input exists (the live pipeline's head
    #: start: each split layer during the layer before it, layer 0 during the previous token's
    #: last layer); False plans every layer at its own step (the ablation)
    head_start: bool = True
    #: the FFN activation on every path, dense included: "model" (its kairox.activation, else
    #: its architecture's), or "relu" / "silu" / "gelu" (a ReLU-fied llama's GGUF cannot say
    #: "relu": its profile before conversion runs with "relu")
    activation: str = "model"
    #: record FFN inputs/hidden activations of every decode (kairox profile)
    profiler: Profiler | None = field(default=None, compare=False)

    def validate(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise KairoxError(f"{name} must be a positive integer, got {v!r}")
            if v is not None and name.startswith("n_threads") and v > MAX_THREADS:
                raise KairoxError(f"{name} must be at most {MAX_THREADS} (ggml's limit), got {v}")
        if self.mode not in _lib.KAIROX_MODES:
            raise KairoxError(f"mode must be one of {', '.join(_lib.KAIROX_MODES)}, got {self.mode!r}")
        if not (self.threshold_scale > 0 and math.isfinite(self.threshold_scale)):
            raise KairoxError(f"threshold_scale must be positive, got {self.threshold_scale}")
        if not (0 <= self.pred_threshold < 1):
            raise KairoxError(f"pred_threshold must be in [0, 1), got {self.pred_threshold}")
        if self.max_sparse_tokens < 0:
            raise KairoxError("max_sparse_tokens must be >= 0")
        if not math.isfinite(self.vram_budget_gib):
            raise KairoxError(f"vram_budget_gib must be a number of GiB (< 0: auto), got {self.vram_budget_gib}")
        if not (self.vram_reserve_gib >= 0 and math.isfinite(self.vram_reserve_gib)):
            raise KairoxError(f"vram_reserve_gib must be >= 0, got {self.vram_reserve_gib}")
        if self.policy not in POLICIES:
            raise KairoxError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not (0 <= self.lambda_init < 1):
            raise KairoxError(f"lambda_init must be in [0, 1), got {self.lambda_init}")
        if not math.isfinite(self.down_dense_share):
            raise KairoxError(f"down_dense_share must be finite, got {self.down_dense_share}")
        if not isinstance(self.gate_up_rows, int) or self.gate_up_rows > 1:
            raise KairoxError(f"gate_up_rows must be 0, 1 or negative (the model's), got {self.gate_up_rows!r}")
        if not isinstance(self.head_start, bool):
            raise KairoxError(f"head_start must be True or False, got {self.head_start!r}")
        if self.activation not in _lib.KAIROX_ACTIVATIONS:
            raise KairoxError(f"activation must be one of {', '.join(_lib.KAIROX_ACTIVATIONS)}, "
                              f"got {self.activation!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.

    temperature <= 0 means greedy (argmax). Otherwise the chain is
    top-k -> top-p -> temperature -> random draw seeded by `seed` (None: random seed),
    the order llama.cpp's tools use. top_k <= 0 and top_p >= 1 disable those steps.
    ignore_eos keeps generating past end-of-generation tokens (they are banned).
    """

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def validate(self) -> None:
        if not math.isfinite(self.temperature):
            raise KairoxError(f"temperature must be finite, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise KairoxError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not (0 <= self.seed < _lib.LLAMA_DEFAULT_SEED):
            raise KairoxError(f"seed must be in [0, {_lib.LLAMA_DEFAULT_SEED - 1}], got {self.seed}")


@dataclass(frozen=True)
class Timings:
    """Prompt (batched) and decode (one token per call) time, from llama_perf_context."""

    prompt_tokens: int
    prompt_ms: float
    decode_tokens: int
    decode_ms: float

    @property
    def prompt_tps(self) -> float:
        return 1000.0 * self.prompt_tokens / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0


# ---------------------------------------------------------------------------------------
# Session
# ---------------------------------------------------------------------------------------
def _create_context(model: Model, params: ContextParams) -> int:
    """The single place a llama_context is created (Kairox settings will be passed here)."""
    cp = _lib.llama_context_default_params()
    cp.n_ctx = params.n_ctx
    cp.n_batch = params.n_batch
    if params.n_ubatch is not None:
        cp.n_ubatch = params.n_ubatch
    n_threads = params.n_threads or default_threads()
    cp.n_threads = n_threads
    cp.n_threads_batch = params.n_threads_batch or n_threads
    cp.no_perf = False  # Timings come from llama_perf_context
    if params.profiler is not None:
        cp.cb_eval = ctypes.cast(_lib.profiler_eval_fn(), _lib.ggml_backend_sched_eval_callback)
        cp.cb_eval_user_data = params.profiler.ptr
    kp = _lib.kairox_default_params()
    # the hybrid runtime runs predictor mode: "auto" picks it, as kairox run and llama-server do
    mode = "predictor" if params.mode == "auto" and params.vram_budget_gib != 0 else params.mode
    kp.mode = _lib.KAIROX_MODES[mode]
    kp.threshold_scale = params.threshold_scale
    kp.pred_threshold = params.pred_threshold
    kp.max_sparse_tokens = params.max_sparse_tokens
    kp.stats = params.stats
    kp.vram_budget_gib = params.vram_budget_gib
    kp.vram_reserve_gib = params.vram_reserve_gib
    kp.policy = POLICIES[params.policy]
    kp.lambda_init = params.lambda_init
    kp.deterministic = params.deterministic
    kp.down_dense_share = params.down_dense_share
    kp.gate_up_rows = params.gate_up_rows
    kp.head_start = int(params.head_start)
    kp.activation = _lib.KAIROX_ACTIVATIONS[params.activation]
    _lib.take_log_errors()
    ctx = _lib.kairox_init_from_model(model.ptr, cp, ctypes.byref(kp))
    if not ctx:
        errors = _lib.take_log_errors()
        reason = errors[0] if errors else "llama_init_from_model returned NULL"
        raise KairoxError(f"cannot create a context (n_ctx={params.n_ctx}): {reason}")
    return int(ctx)


@dataclass(frozen=True)
class LayerStats:
    """Sparse FFN work of one layer since the last reset (Session.layer_stats)."""

    calls: int
    pairs: int  # (neuron, token) pairs considered
    active: int  # pairs computed in the down projection
    predicted: int  # pairs the predictor/CATS selected for gate/up (-1: not used)

    @property
    def active_fraction(self) -> float:
        return self.active / self.pairs if self.pairs else float("nan")

    @property
    def predicted_fraction(self) -> float:
        return self.predicted / self.pairs if self.pairs and self.predicted >= 0 else float("nan")


class Profiler:
    """C-side capture of each layer's FFN input and hidden activation during decode.

    Pass it as ContextParams(profiler=...); after each Session.decode the arrays of that
    call are read with `get()`. The capture runs in C (an eval callback in libkairox): a
    Python callback per graph node would be far too slow.
    """

    #: what can be recorded: FFN input (after the norm), hidden act(gate)*up, the residual stream
    #: entering the FFN, the layer output (FFN output = output - residual), and the attention's
    #: input norm (the FFN input of parallel-FFN architectures such as Falcon, which have no
    #: FFN norm)
    KINDS = {"input": _lib.KAIROX_PROFILE_FFN_INPUT, "hidden": _lib.KAIROX_PROFILE_FFN_HIDDEN,
             "residual": _lib.KAIROX_PROFILE_RESIDUAL, "output": _lib.KAIROX_PROFILE_LAYER_OUT,
             "attn_norm": _lib.KAIROX_PROFILE_ATTN_NORM}

    def __init__(self, model: Model, max_tokens: int,
                 kinds: Sequence[str] = ("input", "hidden")) -> None:
        self.n_layer, self.n_embd, self.n_ff = model.n_layer, model.n_embd, model.n_ff
        self.max_tokens = max_tokens
        ptr = _lib.kairox_profiler_init(self.n_layer, self.n_embd, self.n_ff, max_tokens)
        if not ptr:
            raise KairoxError("cannot create a profiler")
        self._ptr: int | None = int(ptr)
        self._finalizer = weakref.finalize(self, _lib.kairox_profiler_free, ptr)
        bad = [k for k in kinds if k not in self.KINDS]
        if bad:
            raise KairoxError(f"unknown profile kind {bad[0]!r}; kinds: {', '.join(self.KINDS)}")
        _lib.kairox_profiler_set_kinds(ptr, sum(1 << self.KINDS[k] for k in set(kinds)))

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise KairoxError("profiler is closed")
        return self._ptr

    def close(self) -> None:
        self._finalizer()
        self._ptr = None

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clear(self) -> None:
        _lib.kairox_profiler_clear(self.ptr)

    def get(self, kind: str, layer: int) -> np.ndarray | None:
        """(n_tokens, width) float32 of the last decode for kind (see KINDS); None if not recorded."""
        k = self.KINDS[kind]
        n_tok = int(_lib.kairox_profiler_n_tokens(self.ptr, k, layer))
        if n_tok < 0:
            return None
        width = self.n_ff if kind == "hidden" else self.n_embd
        out = np.empty((n_tok, width), dtype=np.float32)
        got = _lib.kairox_profiler_get(self.ptr, k, layer,
                                       out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
        if got != out.size:
            raise KairoxError(f"profiler returned {got} values, expected {out.size}")
        return out


def _free_session(ctx: int, batch: _lib.llama_batch) -> None:
    _lib.llama_batch_free(batch)
    _lib.llama_free(ctx)


class Session:
    """One llama_context on a Model: decoding, logits, generation, timings.

    A Session tracks its own position (n_past) in a single sequence; `reset()` clears the
    KV memory so the next text starts fresh. Not thread-safe.
    """

    def __init__(self, model: Model, params: ContextParams | None = None,
                 **overrides: Any) -> None:
        params = params or ContextParams()
        if overrides:
            params = ContextParams(**{**params.__dict__, **overrides})
        params.validate()
        if model.vocab_only:
            raise KairoxError("a model loaded with vocab_only=True cannot run a session")
        self.model = model
        self.params = params
        ctx = _create_context(model, params)
        self._ctx: int | None = ctx
        self.n_ctx = int(_lib.llama_n_ctx(ctx))
        self.n_batch = int(_lib.llama_n_batch(ctx))
        self._batch = _lib.llama_batch_init(self.n_batch, 0, 1)
        # numpy views over the batch arrays, filled per chunk without per-element ctypes calls
        b, cap = self._batch, self.n_batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(cap,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(cap,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(cap,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(cap,))[:] = 1
        for i in range(cap):
            b.seq_id[i][0] = 0
        self._n_past = 0
        #: tokens produced by the latest generate() call
        self.last_tokens: list[int] = []
        #: why the latest generate() stopped: "eog", "length" or "context"
        self.stop_reason: str | None = None
        #: the latest generate()'s generator while it may still decode (weak: dropping it ends it)
        self._active_gen: weakref.ref[Generator[str, None, None]] | None = None
        self._finalizer = weakref.finalize(self, _free_session, ctx, self._batch)
        model._sessions.add(self)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        self._finalizer()
        self._ctx = None

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ptr(self) -> int:
        """The raw `llama_context *`."""
        if self._ctx is None:
            raise KairoxError("session is closed")
        return self._ctx

    @property
    def n_past(self) -> int:
        """Tokens currently in the context's memory."""
        return self._n_past

    @property
    def mode(self) -> str:
        """The Kairox mode this context runs ("dense", "predictor", "threshold", "cats")."""
        m = int(_lib.kairox_context_mode(self.ptr))
        return next(k for k, v in _lib.KAIROX_MODES.items() if v == m)

    def layer_stats(self) -> list[LayerStats]:
        """Per-layer sparse FFN work since the last reset (needs ContextParams(stats=True))."""
        n = self.model.n_layer
        buf = (_lib.kairox_layer_stats * n)()
        got = int(_lib.kairox_get_layer_stats(self.ptr, buf, n))
        if got < 0:
            raise KairoxError("statistics are off (ContextParams(stats=True)) or the context runs dense")
        return [LayerStats(s.n_calls, s.n_pairs, s.n_active, s.n_predicted) for s in buf[:got]]

    def reset_stats(self) -> None:
        _lib.kairox_reset_stats(self.ptr)

    def hybrid_info(self) -> HybridInfo | None:
        """Placement of the hybrid runtime (None: this context runs CPU only)."""
        c = _lib.kairox_hybrid_info()
        if int(_lib.kairox_hybrid_get_info(self.ptr, ctypes.byref(c))) < 0:
            return None
        return HybridInfo.from_c(c)

    def hybrid_budget(self) -> HybridBudget | None:
        """How the hybrid runtime's budget was sized (None: this context runs CPU only)."""
        c = _lib.kairox_hybrid_budget()
        if int(_lib.kairox_hybrid_get_budget(self.ptr, ctypes.byref(c))) < 0:
            return None
        return HybridBudget.from_c(c)

    def hybrid_stats(self) -> list[HybridLayerStats]:
        """Per-layer device cache statistics since the last reset (hybrid runtime only)."""
        n = self.model.n_layer
        buf = (_lib.kairox_hybrid_layer_stats * n)()
        got = int(_lib.kairox_hybrid_get_stats(self.ptr, buf, n))
        if got < 0:
            raise KairoxError(NO_HYBRID)
        return [HybridLayerStats.from_c(s) for s in buf[:got]]

    def _hybrid_layer_array(self, fn: Callable[[int, int, Any, int], int], layer: int, dtype: type,
                            ctype: type) -> np.ndarray:
        """A per-layer array of the hybrid runtime: the C call reports its length first."""
        n = int(fn(self.ptr, layer, None, 0))
        if n < 0:
            raise KairoxError(f"no hybrid runtime, or no layer {layer}")
        out = np.zeros(n, dtype=dtype)
        fn(self.ptr, layer, out.ctypes.data_as(ctypes.POINTER(ctype)), n)
        return out

    def lambda_trace(self, layer: int) -> np.ndarray:
        """The layer's decay lambda after each step since the last reset."""
        return self._hybrid_layer_array(_lib.kairox_hybrid_get_lambda_trace, layer, np.float32, ctypes.c_float)

    def resident_groups(self, layer: int) -> np.ndarray:
        """Which of the layer's neuron groups the device cache holds now (bool per group)."""
        return self._hybrid_layer_array(_lib.kairox_hybrid_get_resident, layer, np.uint8, ctypes.c_uint8).astype(bool)

    def reset_hybrid_stats(self) -> None:
        _lib.kairox_hybrid_reset_stats(self.ptr)

    def set_hybrid_timing(self, enable: bool = True) -> None:
        """Time each step's device and CPU halves (HybridLayerStats t_dev_us, t_overlap_us).

        Off by default: timing records two device events per device split and waits for the
        device at the end of each token, which costs a little speed."""
        if not _lib.kairox_hybrid_set_timing(self.ptr, enable):
            raise KairoxError(NO_HYBRID)

    def device_busy(self) -> tuple[int, float, float]:
        """(graphs timed, their wall time, the device's busy time in them), microseconds, since
        the last reset_hybrid_stats with timing on: busy / wall is the device's busy share (a
        GPU: all its work; the stand-in: its device halves)."""
        wall, busy = ctypes.c_double(), ctypes.c_double()
        n = int(_lib.kairox_hybrid_get_device_busy(self.ptr, ctypes.byref(wall), ctypes.byref(busy)))
        if n < 0:
            raise KairoxError(NO_HYBRID)
        return n, wall.value, busy.value

    # -- workloads -----------------------------------------------------------------------
    def set_workload(self, bits: np.ndarray | None) -> None:
        """Run a workload's selections instead of the predictor (synthetic models only).

        bits: uint8 (n_steps, n_layer, n_ff / 8), one bit per neuron (little bit order), as
        `kairox workload` writes them per sequence; None removes the workload. The k-th token
        through the sparse FFN after `seek_workload(s)` takes step (s + k) mod n_steps, so the
        speed of the real runtime (kernels, device cache, balancer) is measured under a
        workload's dynamics; a real model refuses one (its masks come from its predictor).
        """
        err = ctypes.create_string_buffer(512)
        if bits is None:
            _lib.kairox_set_workload(self.ptr, None, 0, 0, 0, err, len(err))
            return
        arr = np.ascontiguousarray(bits, dtype=np.uint8)
        if arr.ndim != 3:
            raise KairoxError(f"workload bits must be (steps, layers, n_ff / 8), got shape {arr.shape}")
        n_steps, n_layer, n_bytes = arr.shape
        rc = _lib.kairox_set_workload(self.ptr, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                      n_steps, n_layer, 8 * n_bytes, err, len(err))
        if rc != 0:
            raise KairoxError(f"workload refused: {err.value.decode(errors='replace')}")

    def seek_workload(self, step: int) -> None:
        """Make the next token take this step of the workload."""
        _lib.kairox_workload_seek(self.ptr, step)

    @property
    def workload_pos(self) -> int | None:
        """The workload step the next token takes (None: no workload)."""
        pos = int(_lib.kairox_workload_pos(self.ptr))
        return None if pos < 0 else pos

    def set_op_timing(self, enable: bool = True) -> None:
        """Time every graph node of the CPU backend (for `op_times`); costs a clock read per node."""
        if not _lib.kairox_set_op_timing(self.ptr, enable):
            raise KairoxError("op timing needs the CPU backend")

    def op_times(self) -> list[tuple[str, str, int, float]]:
        """(node name without layer suffix, op, count, total microseconds) since the last reset."""
        n = int(_lib.kairox_get_op_times(self.ptr, None, 0))
        buf = (_lib.kairox_op_time * max(n, 1))()
        n = int(_lib.kairox_get_op_times(self.ptr, buf, n))
        return [(e.name.decode(), e.op.decode(), int(e.count), float(e.total_us)) for e in buf[:n]]

    def reset_op_times(self) -> None:
        _lib.kairox_reset_op_times(self.ptr)

    def graph_splits(self) -> int:
        """Backend splits of the last graph computed (after a decode step: one token's graph). 1
        when one backend runs all of it; each further split hands over between the CPU and the
        device, a copy and a wait on the pipeline's critical path (-1 before any graph)."""
        return int(_lib.kairox_graph_splits(self.ptr))

    def graph_waits(self) -> int:
        """Synchronisations with a GPU that the scheduler made in the last graph (after a decode
        step: one token's; calls that wait until the device is idle, also when it already is).
        The hybrid runtime's design is one per layer with a CPU half (the fetch of its FFN
        input); 0 without a GPU, -1 before any graph."""
        return int(_lib.kairox_graph_waits(self.ptr))

    def reset(self) -> None:
        """Forget everything decoded so far (KV memory and timings)."""
        _lib.llama_memory_clear(_lib.llama_get_memory(self.ptr), True)
        _lib.llama_perf_context_reset(self.ptr)
        self._n_past = 0

    # -- decoding ------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray | None:
        """Feed tokens after what is already in the context, n_batch at a time.

        With all_logits, returns a float32 array (len(tokens), n_vocab) of the logits
        after each token (for evaluation); otherwise only the last token's logits are
        computed, readable with `logits()`.
        """
        tokens = list(tokens)
        if not tokens:
            raise KairoxError("nothing to decode")
        self._check_tokens(tokens)
        if self._n_past + len(tokens) > self.n_ctx:
            raise KairoxError(f"context full: {self._n_past} + {len(tokens)} tokens "
                              f"exceed n_ctx={self.n_ctx}")
        ctx, n_vocab = self.ptr, self.model.n_vocab
        rows: list[np.ndarray] = []
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            n = len(chunk)
            self._b_token[:n] = chunk
            self._b_pos[:n] = np.arange(self._n_past, self._n_past + n)
            self._b_logits[:n] = 1 if all_logits else 0
            if not all_logits and start + n == len(tokens):
                self._b_logits[n - 1] = 1
            self._batch.n_tokens = n
            rc = _lib.llama_decode(ctx, self._batch)
            if rc != 0:
                self._n_past = int(_lib.llama_memory_seq_pos_max(_lib.llama_get_memory(ctx), 0)) + 1
                raise KairoxError(f"llama_decode failed (code {rc}) at position {self._n_past}")
            self._n_past += n
            if all_logits:
                ptr = _lib.llama_get_logits(ctx)
                rows.append(np.ctypeslib.as_array(ptr, shape=(n, n_vocab)).copy())
        return np.concatenate(rows) if all_logits else None

    def rewind(self, n_past: int) -> None:
        """Forget every token at position >= n_past (speculative decoding drops rejected drafts)."""
        if not 0 <= n_past <= self._n_past:
            raise KairoxError(f"cannot rewind to {n_past} (context holds {self._n_past} tokens)")
        if not _lib.llama_memory_seq_rm(_lib.llama_get_memory(self.ptr), 0, n_past, -1):
            raise KairoxError("this model's memory cannot drop tokens")
        self._n_past = n_past

    def logits(self, i: int = -1) -> np.ndarray:
        """Copy of the logits of output i of the last decode (-1: the last one)."""
        ptr = _lib.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise KairoxError(f"no logits for output {i} of the last decode")
        row: np.ndarray = np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()
        return row

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        n_vocab = self.model.n_vocab
        bad = [t for t in tokens if not (0 <= t < n_vocab)]
        if bad:
            raise KairoxError(f"token id {bad[0]} out of range [0, {n_vocab})")

    # -- generation ----------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], n_predict: int = 128,
                 sampling: SamplingParams | None = None, *, reset: bool = True,
                 add_special: bool = True) -> Iterator[str]:
        """Stream the text of up to n_predict new tokens after `prompt`.

        The prompt is text (tokenized with special tokens parsed, as llama.cpp's tools do)
        or token ids. Pieces are whole UTF-8 characters even when a character spans tokens.
        Generation stops early at an end-of-generation token (unless
        sampling.ignore_eos) or when the context is full. Afterwards `last_tokens`,
        `stop_reason` and `timings()` describe the run. Argument errors raise here, before
        the first piece; reset=False continues after what the context already holds.
        """
        sampling = sampling or SamplingParams()
        sampling.validate()
        active = self._active_gen() if self._active_gen is not None else None
        if active is not None and active.gi_frame is not None:
            # both would decode into the one KV sequence and each corrupt the other's context
            raise KairoxError("another generate() of this session is still open: exhaust it or "
                              "call its close() first (or use a second Session)")
        if not isinstance(n_predict, int) or n_predict < 0:
            raise KairoxError(f"n_predict must be >= 0, got {n_predict!r}")
        if isinstance(prompt, str):
            tokens = self.model.tokenize(prompt, add_special=add_special, parse_special=True)
        else:
            tokens = list(prompt)
        if not tokens:
            raise KairoxError("empty prompt")
        self._check_tokens(tokens)
        start = 0 if reset else self._n_past
        if start + len(tokens) > self.n_ctx:
            raise KairoxError(f"prompt of {len(tokens)} tokens does not fit the context "
                              f"(n_ctx={self.n_ctx}, {start} already used)")
        if reset:
            self.reset()
        self.last_tokens = []
        self.stop_reason = None
        gen = self._generate(tokens, n_predict, sampling)
        self._active_gen = weakref.ref(gen)
        return gen

    def _generate(self, tokens: list[int], n_predict: int,
                  sampling: SamplingParams) -> Iterator[str]:
        model = self.model
        sampler = _make_sampler(model, sampling)
        try:
            self.decode(tokens)
            utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self.stop_reason = "length"
            for i in range(n_predict):
                tok = int(_lib.llama_sampler_sample(sampler, self.ptr, -1))
                if not sampling.ignore_eos and model.is_eog(tok):
                    self.stop_reason = "eog"
                    break
                self.last_tokens.append(tok)
                text = utf8.decode(model.token_to_piece(tok))
                if text:
                    yield text
                if i + 1 == n_predict:
                    break  # like llama-completion: the last token is not decoded
                if self._n_past >= self.n_ctx:
                    self.stop_reason = "context"
                    break
                self.decode([tok])
            tail = utf8.decode(b"", final=True)
            if tail:
                yield tail
        finally:
            _lib.llama_sampler_free(sampler)

    def timings(self) -> Timings:
        """Timings since the last reset (i.e. of the latest generate() by default)."""
        d = _lib.llama_perf_context(self.ptr)
        return Timings(prompt_tokens=int(d.n_p_eval), prompt_ms=float(d.t_p_eval_ms),
                       decode_tokens=int(d.n_eval), decode_ms=float(d.t_eval_ms))


def _make_sampler(model: Model, sp: SamplingParams) -> int:
    """A llama_sampler chain for `sp`; the caller frees it with llama_sampler_free."""
    chain = _lib.llama_sampler_chain_init(_lib.llama_sampler_chain_default_params())
    if not chain:
        raise KairoxError("llama_sampler_chain_init failed")

    def add(smpl: int | None) -> None:
        if not smpl:
            _lib.llama_sampler_free(chain)
            raise KairoxError("could not create a sampler")
        _lib.llama_sampler_chain_add(chain, smpl)

    if sp.ignore_eos and model.eog_tokens:
        eog = model.eog_tokens
        biases = (_lib.llama_logit_bias * len(eog))(
            *[_lib.llama_logit_bias(t, -math.inf) for t in eog])
        add(_lib.llama_sampler_init_logit_bias(model.n_vocab, len(eog), biases))
    if sp.greedy:
        add(_lib.llama_sampler_init_greedy())
    else:
        if sp.top_k > 0:
            add(_lib.llama_sampler_init_top_k(sp.top_k))
        if sp.top_p < 1.0:
            add(_lib.llama_sampler_init_top_p(sp.top_p, 1))
        add(_lib.llama_sampler_init_temp(sp.temperature))
        seed = _lib.LLAMA_DEFAULT_SEED if sp.seed is None else sp.seed
        add(_lib.llama_sampler_init_dist(seed))
    return int(chain)
