"""ctypes bindings to libkairox (patched llama.cpp + ggml in one shared library).

This is the ONE place that finds and loads the library and declares the C functions
kairox_py calls; everything else calls the typed functions declared here.

Why it is organised this way:

* Struct mirrors must match ``vendor/llama.cpp/include/llama.h`` of the vendored version
  field for field: ctypes cannot check that, so the library describes its own layout
  (``kairox_abi_sizeof`` / ``kairox_abi_offsetof``) and the test suite compares the two.
* Each C function is a module-level Python function with type hints, declared by
  :func:`ctypes_function` right under its C signature, so editors and type checkers see its
  arguments and result, and a llama.cpp upgrade is a diff against ``llama.h`` in one file.
* Loading is lazy and cached (:func:`lib`): importing ``kairox_py`` must work without a
  built library (``kairox info`` only needs the ``gguf`` package), and the log callback
  and ``llama_backend_init`` must happen exactly once per process. The first call of any
  declared function loads the library, which then binds every declaration at once (so a
  stale build reports all its missing functions together).
"""
# The declarations' bodies never run (ctypes_function replaces them): `...` is their whole body.
# mypy: disable-error-code="empty-body"
from __future__ import annotations

import collections
import ctypes
import functools
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int8,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, TypeAlias, TypeVar, cast

from .errors import KairoxError

LIB_NAME = "libkairox.so" if sys.platform != "darwin" else "libkairox.dylib"
ENV_LIB = "KAIROX_LIB"
ENV_VERBOSE = "KAIROX_VERBOSE"

# ---------------------------------------------------------------------------------------
# Constants and scalar types (llama.h)
# ---------------------------------------------------------------------------------------
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
# enum llama_load_mode: LLAMA_LOAD_MODE_NONE reads the weights into the library's own buffers
LLAMA_LOAD_MODE_NONE = 0
# enum ggml_backend_dev_type (ggml-backend.h)
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
LLAMA_TOKEN_NULL = -1

llama_token = c_int32
llama_pos = c_int32
llama_seq_id = c_int32
c_enum = c_int  # C enums are int-sized on every ABI we build for

# opaque handles: struct llama_model *, llama_context *, llama_vocab *, llama_sampler *,
# llama_memory_t. Kept as plain void pointers; type safety lives in the Python wrappers.
llama_model_p = c_void_p
llama_context_p = c_void_p
llama_vocab_p = c_void_p
llama_sampler_p = c_void_p
llama_memory_t = c_void_p

# ggml_log_level (ggml.h)
GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO = 0, 1, 2
GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 3, 4, 5

# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
ggml_log_callback = CFUNCTYPE(None, c_enum, c_char_p, c_void_p)
# typedef bool (*llama_progress_callback)(float progress, void * user_data);
llama_progress_callback = CFUNCTYPE(c_bool, c_float, c_void_p)
# typedef bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data);
ggml_backend_sched_eval_callback = CFUNCTYPE(c_bool, c_void_p, c_bool, c_void_p)
# typedef bool (*ggml_abort_callback)(void * data);
ggml_abort_callback = CFUNCTYPE(c_bool, c_void_p)


# ---------------------------------------------------------------------------------------
# Struct mirrors (llama.h, same order and names as in C)
# ---------------------------------------------------------------------------------------
class llama_token_data(Structure):
    _fields_ = [
        ("id", llama_token),  # token id
        ("logit", c_float),  # log-odds of the token
        ("p", c_float),  # probability of the token
    ]


class llama_token_data_array(Structure):
    _fields_ = [
        ("data", POINTER(llama_token_data)),
        ("size", c_size_t),
        ("selected", c_int64),  # index in data (not the token id)
        ("sorted", c_bool),
    ]


class llama_batch(Structure):
    _fields_ = [
        ("n_tokens", c_int32),
        ("token", POINTER(llama_token)),
        ("embd", POINTER(c_float)),
        ("pos", POINTER(llama_pos)),
        ("n_seq_id", POINTER(c_int32)),
        ("seq_id", POINTER(POINTER(llama_seq_id))),
        ("logits", POINTER(c_int8)),  # "output" flags
    ]


class llama_model_tensor_buft_override(Structure):
    _fields_ = [
        ("pattern", c_char_p),  # regex on tensor names; NULL ends the list
        ("buft", c_void_p),  # ggml_backend_buffer_type_t
    ]


class llama_model_params(Structure):
    _fields_ = [
        ("devices", c_void_p),  # ggml_backend_dev_t *
        ("tensor_buft_overrides", c_void_p),  # const struct llama_model_tensor_buft_override *
        ("n_gpu_layers", c_int32),
        ("split_mode", c_enum),  # enum llama_split_mode
        ("load_mode", c_enum),  # enum llama_load_mode
        ("lazy_mode", c_enum),  # enum llama_lazy_mode
        ("main_gpu", c_int32),
        ("tensor_split", POINTER(c_float)),
        ("progress_callback", llama_progress_callback),
        ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p),  # const struct llama_model_kv_override *
        ("vocab_only", c_bool),
        ("check_tensors", c_bool),
        ("use_extra_bufts", c_bool),
        ("no_host", c_bool),
        ("no_alloc", c_bool),
        ("load_mtp", c_bool),
    ]


class llama_sampler_seq_config(Structure):
    _fields_ = [
        ("seq_id", llama_seq_id),
        ("sampler", llama_sampler_p),
    ]


class llama_context_params(Structure):
    _fields_ = [
        ("n_ctx", c_uint32),
        ("n_batch", c_uint32),
        ("n_ubatch", c_uint32),
        ("n_seq_max", c_uint32),
        ("n_rs_seq", c_uint32),
        ("n_outputs_max", c_uint32),
        ("n_outputs_max_per_seq", c_uint32),
        ("n_threads", c_int32),
        ("n_threads_batch", c_int32),
        ("ctx_type", c_enum),  # enum llama_context_type
        ("rope_scaling_type", c_enum),  # enum llama_rope_scaling_type
        ("pooling_type", c_enum),  # enum llama_pooling_type
        ("attention_type", c_enum),  # enum llama_attention_type
        ("flash_attn_type", c_enum),  # enum llama_flash_attn_type
        ("rope_freq_base", c_float),
        ("rope_freq_scale", c_float),
        ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float),
        ("yarn_beta_fast", c_float),
        ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32),
        ("defrag_thold", c_float),
        ("cb_eval", ggml_backend_sched_eval_callback),
        ("cb_eval_user_data", c_void_p),
        ("type_k", c_enum),  # enum ggml_type
        ("type_v", c_enum),  # enum ggml_type
        ("abort_callback", ggml_abort_callback),
        ("abort_callback_data", c_void_p),
        ("embeddings", c_bool),
        ("offload_kqv", c_bool),
        ("no_perf", c_bool),
        ("op_offload", c_bool),
        ("swa_full", c_bool),
        ("kv_unified", c_bool),
        ("samplers", POINTER(llama_sampler_seq_config)),
        ("n_samplers", c_size_t),
        ("ctx_other", llama_context_p),
    ]


class llama_logit_bias(Structure):
    _fields_ = [
        ("token", llama_token),
        ("bias", c_float),
    ]


class llama_sampler_chain_params(Structure):
    _fields_ = [
        ("no_perf", c_bool),  # whether to measure performance timings
    ]


class llama_chat_message(Structure):
    _fields_ = [
        ("role", c_char_p),
        ("content", c_char_p),
    ]


class llama_perf_context_data(Structure):
    _fields_ = [
        ("t_start_ms", c_double),  # absolute start time
        ("t_load_ms", c_double),  # time needed for loading the model
        ("t_p_eval_ms", c_double),  # time needed for processing the prompt
        ("t_eval_ms", c_double),  # time needed for generating tokens
        ("n_p_eval", c_int32),  # number of prompt tokens
        ("n_eval", c_int32),  # number of generated tokens
        ("n_reused", c_int32),  # number of times a ggml compute graph had been reused
    ]


class llama_perf_sampler_data(Structure):
    _fields_ = [
        ("t_sample_ms", c_double),
        ("n_sample", c_int32),
    ]


# ---- kairox.h ----
# enum kairox_mode
KAIROX_MODE_AUTO, KAIROX_MODE_DENSE, KAIROX_MODE_PREDICTOR, KAIROX_MODE_THRESHOLD, KAIROX_MODE_CATS = range(5)
KAIROX_MODES = {"auto": KAIROX_MODE_AUTO, "dense": KAIROX_MODE_DENSE, "predictor": KAIROX_MODE_PREDICTOR,
                "threshold": KAIROX_MODE_THRESHOLD, "cats": KAIROX_MODE_CATS}
# enum kairox_activation
KAIROX_ACTIVATIONS = {"model": 0, "relu": 1, "silu": 2, "gelu": 3}
# enum kairox_profile_kind
(KAIROX_PROFILE_FFN_INPUT, KAIROX_PROFILE_FFN_HIDDEN, KAIROX_PROFILE_RESIDUAL, KAIROX_PROFILE_LAYER_OUT,
 KAIROX_PROFILE_ATTN_NORM) = range(5)


class kairox_params(Structure):
    _fields_ = [
        ("size", c_uint32),  # sizeof(struct kairox_params) as the caller compiled it
        ("version", c_uint32),  # KAIROX_PARAMS_VERSION
        ("mode", c_int32),  # enum kairox_mode
        ("pred_threshold", c_float),  # predictor probability threshold; <= 0: the model's
        ("threshold_scale", c_float),  # multiplies calibrated thresholds; <= 0: 1
        ("max_sparse_tokens", c_uint32),  # ubatches up to this size run sparse; 0: default
        ("stats", c_bool),  # count active neurons per layer
        # version 2: the hybrid runtime
        ("vram_budget_gib", c_float),  # > 0: device cache of neuron groups under this budget; 0: CPU only
        ("policy", c_int32),  # enum kairox_balancer_policy of the device cache
        ("lambda_init", c_float),  # TAM decay (the start of tam_lambda's); <= 0: the balancer's default
        ("deterministic", c_bool),  # reproducible: down in fixed blocks summed in double; hybrid: lambda fixed
        # version 3
        ("down_dense_share", c_float),  # active share above which down reads ffn_down in order; < 0: model/built-in
        # version 4
        ("vram_reserve_gib", c_float),  # auto budget: device memory left free besides KV cache and compute
        # version 5
        ("activation", c_int32),  # enum kairox_activation: the FFN activation on every path; 0: the model's
        # version 6
        ("gate_up_rows", c_int32),  # threshold mode's whole gate/up: 1 row kernels, 0 ggml's; < 0: the model's
        # version 7
        ("head_start", c_int32),  # hybrid: 1 plan layers before their own input exists; 0 at their own step
    ]


#: kairox_params.vram_budget_gib: size the budget from the device's free memory
KAIROX_VRAM_BUDGET_AUTO = -1.0


class kairox_hybrid_layer_stats(Structure):
    _fields_ = [
        ("n_groups", c_int32),
        ("n_slots", c_int32),  # the layer's share of the budget, in groups
        ("n_resident", c_int32),
        ("n_io_bound", c_int32),  # steps whose reloads took longer than the CPU half (I/O-bound)
        ("n_steps", c_int64),
        ("n_loads", c_int64),
        ("n_evicts", c_int64),
        ("bytes_reloaded", c_int64),
        ("n_active", c_int64),  # predicted-active (neuron, token) pairs
        ("n_active_dev", c_int64),  # of those, resident (computed from the device cache)
        ("n_dev_computed", c_int64),  # pairs the device half's down projection computed
        ("t_io_us", c_double),
        ("t_cpu_us", c_double),
        ("lambda_now", c_float),  # the decay at the last step
        ("margin_now", c_float),  # the swap margin at the last step (adaptive TAM; 0 otherwise)
        ("n_ahead", c_int64),  # steps planned one layer early (the adjacent predictor's head start)
        ("n_loads_early", c_int64),  # loads that landed in the token whose step queued them
        ("t_plan_us", c_double),
        ("t_stall_us", c_double),  # time the plan waited for the reload worker
        ("n_timed", c_int64),  # steps with both halves timed (kairox_hybrid_set_timing)
        ("t_dev_us", c_double),  # the device half (a GPU's events; the stand-in's host time)
        ("t_overlap_us", c_double),  # time both halves computed at once
        ("t_shorter_us", c_double),  # the shorter half's time, summed per timed step
    ]


class kairox_hybrid_info(Structure):
    _fields_ = [
        ("group_size", c_int32),
        ("policy", c_int32),
        ("deterministic", c_int32),
        ("n_slots", c_int32),
        ("n_groups", c_int32),
        ("budget_bytes", c_int64),
        ("dense_bytes", c_int64),
        ("cache_bytes", c_int64),
        ("device", ctypes.c_char * 64),
    ]


class kairox_hybrid_budget(Structure):
    _fields_ = [
        ("is_auto", c_int32),  # 1: from the device's free memory; 0: the caller's vram_budget_gib
        ("device_free", c_int64),
        ("device_total", c_int64),
        ("kv_bytes", c_int64),  # margin: the KV cache
        ("compute_bytes", c_int64),  # margin: compute buffers (an upper estimate)
        ("reserve_bytes", c_int64),  # margin: kairox_params.vram_reserve_gib
        ("budget_bytes", c_int64),
    ]


class kairox_layer_stats(Structure):
    _fields_ = [
        ("n_calls", c_int64),
        ("n_pairs", c_int64),
        ("n_active", c_int64),
        ("n_predicted", c_int64),
    ]


class kairox_op_time(Structure):
    _fields_ = [
        ("name", ctypes.c_char * 48),  # node name without the layer suffix
        ("op", ctypes.c_char * 24),  # ggml op (or unary op) name
        ("count", c_int64),  # nodes timed
        ("total_us", c_double),  # summed wall time
    ]


# ---- kairox.h: balancer ----
# enum kairox_balancer_policy
(KAIROX_BALANCER_STATIC, KAIROX_BALANCER_LRU, KAIROX_BALANCER_LFU, KAIROX_BALANCER_TOPK,
 KAIROX_BALANCER_EAGER, KAIROX_BALANCER_TAM, KAIROX_BALANCER_TAM_FIXED, KAIROX_BALANCER_TAM_LAMBDA) = range(8)
# enum kairox_bottleneck
KAIROX_BOTTLENECK_NONE, KAIROX_BOTTLENECK_IO, KAIROX_BOTTLENECK_CPU = 0, 1, 2
KAIROX_BALANCER_PARAMS_VERSION = 2


class kairox_balancer_params(Structure):
    _fields_ = [
        ("size", c_uint32),  # sizeof(struct kairox_balancer_params) as the caller compiled it
        ("version", c_uint32),  # KAIROX_BALANCER_PARAMS_VERSION
        ("policy", c_int32),  # enum kairox_balancer_policy
        ("n_layer", c_int32),
        ("n_groups", POINTER(c_int32)),  # [n_layer]
        ("budget", POINTER(c_int32)),  # [n_layer] K in groups
        ("group_freq", POINTER(c_float)),  # [sum n_groups] or NULL
        ("lambda_init", c_float),
        ("lambda_min", c_float),
        ("lambda_max", c_float),
        ("alpha", c_float),
        ("eps", c_float),  # tau = (1 - lambda) + eps
        ("max_loads", c_int32),  # 0: no cap
        ("adapt_cap", c_bool),
        # version 2
        ("margin_min", c_float),  # TAM's swap margin: 0, or within [margin_min, margin_max]
        ("margin_max", c_float),
        ("margin_up", c_float),  # factor per I/O-bound step
        ("margin_down", c_float),  # factor per CPU-bound step
    ]


#: Every struct mirror, by its C name: what the ABI test compares against the library.
STRUCTS: dict[str, type[Structure]] = {
    cls.__name__: cls
    for cls in (
        llama_model_params,
        llama_context_params,
        llama_batch,
        llama_sampler_chain_params,
        llama_perf_context_data,
        llama_perf_sampler_data,
        llama_chat_message,
        llama_token_data,
        llama_token_data_array,
        llama_logit_bias,
        kairox_params,
        kairox_layer_stats,
        kairox_op_time,
        kairox_balancer_params,
        kairox_hybrid_layer_stats,
        kairox_hybrid_info,
        kairox_hybrid_budget,
    )
}


# ---------------------------------------------------------------------------------------
# Python-side types of C arguments and results (annotations of the declarations below)
# ---------------------------------------------------------------------------------------
_CT = TypeVar("_CT", bound="ctypes._CData")

#: An opaque handle (``struct llama_model *``, ``llama_memory_t``, ...): ctypes returns a
#: ``void *`` result as an int, NULL as None, and takes either as an argument.
Handle: TypeAlias = "int | None"
#: A ``T *`` argument: a ctypes array or pointer of T, ``ctypes.byref()`` of one T, or None (NULL).
CPtr: TypeAlias = "ctypes._Pointer[_CT] | ctypes.Array[_CT] | ctypes._CArgObject | None"
#: A ``T *`` result: a ctypes pointer, false when NULL.
CPointer: TypeAlias = "ctypes._Pointer[_CT]"
#: A ``void *`` data argument: an address (NumPy's ``.ctypes.data``), any ctypes pointer, array or
#: ``byref()``, or None (NULL).
VoidPtr: TypeAlias = "int | c_void_p | ctypes._Pointer[Any] | ctypes.Array[Any] | ctypes._CArgObject | None"
#: A ``char *`` the function writes into: ``ctypes.create_string_buffer(n)``.
CCharBuffer: TypeAlias = "ctypes.Array[ctypes.c_char]"
#: A C function pointer made from a CFUNCTYPE type; the caller keeps it referenced while C may call it.
CallbackPtr: TypeAlias = "ctypes._CFunctionType | None"


# ---------------------------------------------------------------------------------------
# Finding the library
# ---------------------------------------------------------------------------------------
def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def _distribution_candidates() -> Iterator[Path]:
    """The .so among the files of the installed ``kairox`` distribution.

    scikit-build-core editable installs leave ``kairox_py`` sources in the repository and
    put the built library into site-packages, so it is not next to ``__file__``.
    """
    try:
        dist = importlib.metadata.distribution("kairox")
    except importlib.metadata.PackageNotFoundError:
        return
    for f in dist.files or ():
        if f.name == LIB_NAME:
            yield Path(str(dist.locate_file(f))).resolve()


def _repo_candidates() -> Iterator[Path]:
    """Developer builds in the source tree: build/dev first, then any other build dir."""
    build = _package_dir().parent / "build"
    yield build / "dev" / LIB_NAME
    if build.is_dir():
        yield from sorted(build.glob(f"*/{LIB_NAME}"))


def library_candidates() -> list[Path]:
    """Where :func:`find_library` looks, in order (the env var first)."""
    found: list[Path] = []
    env = os.environ.get(ENV_LIB)
    if env:
        found.append(Path(env).expanduser())
    found.append(_package_dir() / "lib" / LIB_NAME)
    found.extend(_distribution_candidates())
    found.extend(_repo_candidates())
    return found


def find_library() -> Path:
    """Path of libkairox, or KairoxError saying how to build it."""
    env = os.environ.get(ENV_LIB)
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise KairoxError(f"{ENV_LIB}={env} does not name a file")
        return p
    for p in library_candidates():
        if p.is_file():
            return p
    raise KairoxError(
        f"{LIB_NAME} not found: install the package with `pip install .` (builds it), "
        f"or build it with `cmake -S . -B build/dev -G Ninja && cmake --build build/dev "
        f"--target kairox`, or point {ENV_LIB} at it")


def find_tool(name: str) -> Path | None:
    """A llama.cpp tool (llama-bench, llama-server, ...): the one built next to libkairox, in
    its build's bin/ folder, so that it runs the same kernels as the library; else one on
    PATH; None if neither."""
    try:
        near = find_library().resolve().parent / "bin" / name
    except KairoxError:
        near = None
    if near is not None and near.is_file():
        return near
    on_path = shutil.which(name)
    return Path(on_path) if on_path else None


# ---------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------
class LogSink:
    """Receives llama.cpp/ggml log messages.

    Quiet by default: llama.cpp logs hundreds of lines per model load. Error-level
    messages are still kept (last few) so failures such as a corrupt GGUF can be reported
    with the library's own reason. Verbose mode echoes everything to stderr.
    """

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self._errors: collections.deque[str] = collections.deque(maxlen=16)
        self._last_level = GGML_LOG_LEVEL_NONE
        # ctypes would free the trampoline with the Python object: keep it referenced.
        self.callback = ggml_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes | None, _user: int | None) -> None:
        if level == GGML_LOG_LEVEL_CONT:
            level = self._last_level
        self._last_level = level
        msg = (text or b"").decode("utf-8", errors="replace")
        if level == GGML_LOG_LEVEL_ERROR:
            if self._errors and not self._errors[-1].endswith("\n"):
                self._errors[-1] += msg
            else:
                self._errors.append(msg)
        if self.verbose:
            sys.stderr.write(msg)
            sys.stderr.flush()

    def take_errors(self) -> list[str]:
        """Error messages logged since the last call (stripped, non-empty)."""
        out = [m.strip() for m in self._errors if m.strip()]
        self._errors.clear()
        return out


# ---------------------------------------------------------------------------------------
# The loaded library
# ---------------------------------------------------------------------------------------
#: Function groups a library built from an older tree may lack without failing to load (the
#: rest of kairox_py keeps working); calling one then raises KairoxError asking for a rebuild.
_OPTIONAL_PREFIXES: tuple[str, ...] = ("kairox_balancer_",)


def _missing_function(path: Path, name: str) -> Callable[..., Any]:
    def missing(*_args: Any) -> Any:
        raise KairoxError(f"{path} lacks {name}: rebuild it from this tree")
    return missing


class Library:
    """libkairox with every function declared by :func:`ctypes_function` bound to its prototype."""

    def __init__(self, path: Path, verbose: bool) -> None:
        self.path = path
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as e:
            raise KairoxError(f"cannot load {path}: {e}") from None
        #: C name -> the library's function with its argtypes and restype set
        self.functions: dict[str, Callable[..., Any]] = {}
        missing = []
        for name, (argtypes, restype) in _PROTOTYPES.items():
            try:
                fn = getattr(self.cdll, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.argtypes = argtypes
            fn.restype = restype
            self.functions[name] = fn
        required = [m for m in missing if not m.startswith(_OPTIONAL_PREFIXES)]
        if required:
            raise KairoxError(f"{path} lacks {', '.join(required)}: rebuild it from this tree")
        for name in missing:  # optional groups: fail only when used
            self.functions[name] = _missing_function(path, name)
        self.log = LogSink(verbose)
        # the bound functions themselves: the module-level ones would ask lib(), which is
        # still constructing this object
        self.functions["llama_log_set"](self.log.callback, None)
        self.functions["llama_backend_init"]()


def _env_verbose() -> bool:
    return os.environ.get(ENV_VERBOSE, "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def lib() -> Library:
    """The process-wide library handle (loaded, logging installed, backend initialised)."""
    return Library(find_library(), verbose=_env_verbose())


def set_verbose(verbose: bool) -> None:
    """Echo llama.cpp's log output to stderr (True) or keep it quiet (False)."""
    lib().log.verbose = verbose


def take_log_errors() -> list[str]:
    """llama.cpp's error messages logged since the last call: the reason behind a NULL result."""
    return lib().log.take_errors()


# ---------------------------------------------------------------------------------------
# Declaring C functions
# ---------------------------------------------------------------------------------------
_F = TypeVar("_F", bound=Callable[..., Any])

#: Every declared C function, name -> (argtypes, restype), in declaration order: filled while
#: this module is imported, bound by Library when the library loads.
_PROTOTYPES: dict[str, tuple[tuple[Any, ...], Any]] = {}


def ctypes_function(name: str, argtypes: Sequence[Any], restype: Any) -> Callable[[_F], _F]:
    """Declare the C function `name` with its ctypes prototype; the decorated stub, named as in
    C, gives the Python signature and is never run.

    The result calls the library's function, loading the library on the first call
    (:func:`lib`): declaring needs no library, so importing kairox_py works without a build.
    """
    def declare(stub: _F) -> _F:
        if stub.__name__ != name or name in _PROTOTYPES:
            raise TypeError(f"the declaration of {name} is misnamed or repeated")
        _PROTOTYPES[name] = (tuple(argtypes), restype)

        def call(*args: Any) -> Any:
            return lib().functions[name](*args)

        return cast(_F, functools.update_wrapper(call, stub))
    return declare


# --- kairox.h ---

# const char * kairox_version(void);
@ctypes_function("kairox_version", [], c_char_p)
def kairox_version() -> bytes | None: ...


# size_t kairox_abi_sizeof(const char * type_name);
@ctypes_function("kairox_abi_sizeof", [c_char_p], c_size_t)
def kairox_abi_sizeof(type_name: bytes | None, /) -> int: ...


# size_t kairox_abi_offsetof(const char * type_name, const char * field_name);
@ctypes_function("kairox_abi_offsetof", [c_char_p, c_char_p], c_size_t)
def kairox_abi_offsetof(type_name: bytes | None, field_name: bytes | None, /) -> int: ...


# const char * kairox_format_name(const char * id);
@ctypes_function("kairox_format_name", [c_char_p], c_char_p)
def kairox_format_name(id: bytes | None, /) -> bytes | None: ...


# struct kairox_params kairox_default_params(void);
@ctypes_function("kairox_default_params", [], kairox_params)
def kairox_default_params() -> kairox_params: ...


# struct llama_context * kairox_init_from_model(struct llama_model * model,
#         struct llama_context_params cparams, const struct kairox_params * kparams);
@ctypes_function("kairox_init_from_model",
                 [llama_model_p, llama_context_params, POINTER(kairox_params)], llama_context_p)
def kairox_init_from_model(model: Handle, cparams: llama_context_params,
                           kparams: CPtr[kairox_params], /) -> int | None: ...


# bool kairox_model_has_sparsity(const struct llama_model * model);
@ctypes_function("kairox_model_has_sparsity", [llama_model_p], c_bool)
def kairox_model_has_sparsity(model: Handle, /) -> bool: ...


# bool kairox_model_has_predictor(const struct llama_model * model);
@ctypes_function("kairox_model_has_predictor", [llama_model_p], c_bool)
def kairox_model_has_predictor(model: Handle, /) -> bool: ...


# bool kairox_model_has_threshold(const struct llama_model * model);
@ctypes_function("kairox_model_has_threshold", [llama_model_p], c_bool)
def kairox_model_has_threshold(model: Handle, /) -> bool: ...


# int32_t kairox_context_mode(const struct llama_context * ctx);
@ctypes_function("kairox_context_mode", [llama_context_p], c_int32)
def kairox_context_mode(ctx: Handle, /) -> int: ...


# int32_t kairox_get_layer_stats(const struct llama_context * ctx, struct kairox_layer_stats * out, int32_t n_max);
@ctypes_function("kairox_get_layer_stats", [llama_context_p, POINTER(kairox_layer_stats), c_int32], c_int32)
def kairox_get_layer_stats(ctx: Handle, out: CPtr[kairox_layer_stats], n_max: int, /) -> int: ...


# void kairox_reset_stats(struct llama_context * ctx);
@ctypes_function("kairox_reset_stats", [llama_context_p], None)
def kairox_reset_stats(ctx: Handle, /) -> None: ...


# --- workloads (synthetic models) ---

# int32_t kairox_set_workload(struct llama_context * ctx, const uint8_t * bits, int64_t n_steps,
#                             int32_t n_layer, int64_t n_ff, char * err, size_t err_size);
@ctypes_function("kairox_set_workload",
                 [llama_context_p, POINTER(c_uint8), c_int64, c_int32, c_int64, c_char_p, c_size_t], c_int32)
def kairox_set_workload(ctx: Handle, bits: CPtr[c_uint8], n_steps: int, n_layer: int, n_ff: int,
                        err: Any, err_size: int, /) -> int: ...


# void kairox_workload_seek(struct llama_context * ctx, int64_t step);
@ctypes_function("kairox_workload_seek", [llama_context_p, c_int64], None)
def kairox_workload_seek(ctx: Handle, step: int, /) -> None: ...


# int64_t kairox_workload_pos(const struct llama_context * ctx);
@ctypes_function("kairox_workload_pos", [llama_context_p], c_int64)
def kairox_workload_pos(ctx: Handle, /) -> int: ...


# --- hybrid runtime ---

# int32_t kairox_hybrid_get_info(const struct llama_context * ctx, struct kairox_hybrid_info * out);
@ctypes_function("kairox_hybrid_get_info", [llama_context_p, POINTER(kairox_hybrid_info)], c_int32)
def kairox_hybrid_get_info(ctx: Handle, out: CPtr[kairox_hybrid_info], /) -> int: ...


# int32_t kairox_hybrid_get_budget(const struct llama_context * ctx, struct kairox_hybrid_budget * out);
@ctypes_function("kairox_hybrid_get_budget", [llama_context_p, POINTER(kairox_hybrid_budget)], c_int32)
def kairox_hybrid_get_budget(ctx: Handle, out: CPtr[kairox_hybrid_budget], /) -> int: ...


# int32_t kairox_hybrid_get_stats(const struct llama_context * ctx, struct kairox_hybrid_layer_stats * out, int32_t n_max);
@ctypes_function("kairox_hybrid_get_stats",
                 [llama_context_p, POINTER(kairox_hybrid_layer_stats), c_int32], c_int32)
def kairox_hybrid_get_stats(ctx: Handle, out: CPtr[kairox_hybrid_layer_stats], n_max: int, /) -> int: ...


# int32_t kairox_hybrid_get_lambda_trace(const struct llama_context * ctx, int32_t layer, float * out, int32_t n_max);
@ctypes_function("kairox_hybrid_get_lambda_trace",
                 [llama_context_p, c_int32, POINTER(c_float), c_int32], c_int32)
def kairox_hybrid_get_lambda_trace(ctx: Handle, layer: int, out: CPtr[c_float], n_max: int, /) -> int: ...


# int64_t kairox_hybrid_get_resident(const struct llama_context * ctx, int32_t layer, uint8_t * mask, int64_t n_max);
@ctypes_function("kairox_hybrid_get_resident",
                 [llama_context_p, c_int32, POINTER(c_uint8), c_int64], c_int64)
def kairox_hybrid_get_resident(ctx: Handle, layer: int, mask: CPtr[c_uint8], n_max: int, /) -> int: ...


# void kairox_hybrid_reset_stats(struct llama_context * ctx);
@ctypes_function("kairox_hybrid_reset_stats", [llama_context_p], None)
def kairox_hybrid_reset_stats(ctx: Handle, /) -> None: ...


# bool kairox_hybrid_set_timing(struct llama_context * ctx, bool enable);
@ctypes_function("kairox_hybrid_set_timing", [llama_context_p, c_bool], c_bool)
def kairox_hybrid_set_timing(ctx: Handle, enable: bool, /) -> bool: ...


# int32_t kairox_hybrid_get_device_busy(const struct llama_context * ctx, double * wall_us, double * busy_us);
@ctypes_function("kairox_hybrid_get_device_busy", [llama_context_p, POINTER(c_double), POINTER(c_double)], c_int32)
def kairox_hybrid_get_device_busy(ctx: Handle, wall_us: CPtr[c_double], busy_us: CPtr[c_double], /) -> int: ...


# bool kairox_set_op_timing(struct llama_context * ctx, bool enable);
@ctypes_function("kairox_set_op_timing", [llama_context_p, c_bool], c_bool)
def kairox_set_op_timing(ctx: Handle, enable: bool, /) -> bool: ...


# int32_t kairox_get_op_times(const struct llama_context * ctx, struct kairox_op_time * out, int32_t n_max);
@ctypes_function("kairox_get_op_times", [llama_context_p, POINTER(kairox_op_time), c_int32], c_int32)
def kairox_get_op_times(ctx: Handle, out: CPtr[kairox_op_time], n_max: int, /) -> int: ...


# void kairox_reset_op_times(struct llama_context * ctx);
@ctypes_function("kairox_reset_op_times", [llama_context_p], None)
def kairox_reset_op_times(ctx: Handle, /) -> None: ...


# int32_t kairox_graph_splits(const struct llama_context * ctx);
@ctypes_function("kairox_graph_splits", [llama_context_p], c_int32)
def kairox_graph_splits(ctx: Handle, /) -> int: ...


# int32_t kairox_graph_waits(const struct llama_context * ctx);
@ctypes_function("kairox_graph_waits", [llama_context_p], c_int32)
def kairox_graph_waits(ctx: Handle, /) -> int: ...


# struct kairox_profiler * kairox_profiler_init(int32_t n_layer, int32_t n_embd, int32_t n_ff, int32_t max_tokens);
@ctypes_function("kairox_profiler_init", [c_int32, c_int32, c_int32, c_int32], c_void_p)
def kairox_profiler_init(n_layer: int, n_embd: int, n_ff: int, max_tokens: int, /) -> int | None: ...


# void kairox_profiler_free(struct kairox_profiler * prof);
@ctypes_function("kairox_profiler_free", [c_void_p], None)
def kairox_profiler_free(prof: Handle, /) -> None: ...


# void kairox_profiler_set_kinds(struct kairox_profiler * prof, uint32_t mask);
@ctypes_function("kairox_profiler_set_kinds", [c_void_p, c_uint32], None)
def kairox_profiler_set_kinds(prof: Handle, mask: int, /) -> None: ...


# int32_t kairox_profiler_n_tokens(const struct kairox_profiler * prof, int32_t kind, int32_t layer);
@ctypes_function("kairox_profiler_n_tokens", [c_void_p, c_int32, c_int32], c_int32)
def kairox_profiler_n_tokens(prof: Handle, kind: int, layer: int, /) -> int: ...


# int64_t kairox_profiler_get(const struct kairox_profiler * prof, int32_t kind, int32_t layer, float * dst, int64_t n_max);
@ctypes_function("kairox_profiler_get", [c_void_p, c_int32, c_int32, POINTER(c_float), c_int64], c_int64)
def kairox_profiler_get(prof: Handle, kind: int, layer: int, dst: CPtr[c_float], n_max: int, /) -> int: ...


# void kairox_profiler_clear(struct kairox_profiler * prof);
@ctypes_function("kairox_profiler_clear", [c_void_p], None)
def kairox_profiler_clear(prof: Handle, /) -> None: ...


# --- kairox.h: balancer ---

# struct kairox_balancer_params kairox_balancer_default_params(void);
@ctypes_function("kairox_balancer_default_params", [], kairox_balancer_params)
def kairox_balancer_default_params() -> kairox_balancer_params: ...


# const char * kairox_balancer_check_params(const struct kairox_balancer_params * params);
@ctypes_function("kairox_balancer_check_params", [POINTER(kairox_balancer_params)], c_char_p)
def kairox_balancer_check_params(params: CPtr[kairox_balancer_params], /) -> bytes | None: ...


# struct kairox_balancer * kairox_balancer_init(const struct kairox_balancer_params * params);
@ctypes_function("kairox_balancer_init", [POINTER(kairox_balancer_params)], c_void_p)
def kairox_balancer_init(params: CPtr[kairox_balancer_params], /) -> int | None: ...


# void kairox_balancer_free(struct kairox_balancer * bal);
@ctypes_function("kairox_balancer_free", [c_void_p], None)
def kairox_balancer_free(bal: Handle, /) -> None: ...


# void kairox_balancer_reset(struct kairox_balancer * bal);
@ctypes_function("kairox_balancer_reset", [c_void_p], None)
def kairox_balancer_reset(bal: Handle, /) -> None: ...


# int32_t kairox_balancer_group_intensity(const uint8_t * mask, int64_t n_neurons, int32_t group_size,
#                                         float * out, int32_t n_max);
@ctypes_function("kairox_balancer_group_intensity",
                 [c_void_p, c_int64, c_int32, POINTER(c_float), c_int32], c_int32)
def kairox_balancer_group_intensity(mask: VoidPtr, n_neurons: int, group_size: int, out: CPtr[c_float],
                                    n_max: int, /) -> int: ...


# void kairox_balancer_feedback(struct kairox_balancer * bal, int32_t layer, int32_t bottleneck);
@ctypes_function("kairox_balancer_feedback", [c_void_p, c_int32, c_int32], None)
def kairox_balancer_feedback(bal: Handle, layer: int, bottleneck: int, /) -> None: ...


# int32_t kairox_balancer_step(struct kairox_balancer * bal, int32_t layer, const float * intensity, int32_t n_groups);
@ctypes_function("kairox_balancer_step", [c_void_p, c_int32, POINTER(c_float), c_int32], c_int32)
def kairox_balancer_step(bal: Handle, layer: int, intensity: CPtr[c_float], n_groups: int, /) -> int: ...


# int64_t kairox_balancer_step_all(struct kairox_balancer * bal, const float * intensity, const int32_t * feedback);
@ctypes_function("kairox_balancer_step_all", [c_void_p, POINTER(c_float), POINTER(c_int32)], c_int64)
def kairox_balancer_step_all(bal: Handle, intensity: CPtr[c_float], feedback: CPtr[c_int32], /) -> int: ...


# int64_t kairox_balancer_get_resident(const struct kairox_balancer * bal, int32_t layer, uint8_t * mask, int64_t n_max);
@ctypes_function("kairox_balancer_get_resident", [c_void_p, c_int32, c_void_p, c_int64], c_int64)
def kairox_balancer_get_resident(bal: Handle, layer: int, mask: VoidPtr, n_max: int, /) -> int: ...


# int32_t kairox_balancer_get_loads(const struct kairox_balancer * bal, int32_t layer, int32_t * groups, int32_t n_max);
@ctypes_function("kairox_balancer_get_loads", [c_void_p, c_int32, POINTER(c_int32), c_int32], c_int32)
def kairox_balancer_get_loads(bal: Handle, layer: int, groups: CPtr[c_int32], n_max: int, /) -> int: ...


# int32_t kairox_balancer_get_evicts(const struct kairox_balancer * bal, int32_t layer, int32_t * groups, int32_t n_max);
@ctypes_function("kairox_balancer_get_evicts", [c_void_p, c_int32, POINTER(c_int32), c_int32], c_int32)
def kairox_balancer_get_evicts(bal: Handle, layer: int, groups: CPtr[c_int32], n_max: int, /) -> int: ...


# int64_t kairox_balancer_get_scores(const struct kairox_balancer * bal, int32_t layer, float * scores, int64_t n_max);
@ctypes_function("kairox_balancer_get_scores", [c_void_p, c_int32, POINTER(c_float), c_int64], c_int64)
def kairox_balancer_get_scores(bal: Handle, layer: int, scores: CPtr[c_float], n_max: int, /) -> int: ...


# int32_t kairox_balancer_get_lambda(const struct kairox_balancer * bal, int32_t layer, float * lambda, int32_t n_max);
@ctypes_function("kairox_balancer_get_lambda", [c_void_p, c_int32, POINTER(c_float), c_int32], c_int32)
def kairox_balancer_get_lambda(bal: Handle, layer: int, lambdas: CPtr[c_float], n_max: int, /) -> int: ...


# int32_t kairox_balancer_get_margin(const struct kairox_balancer * bal, int32_t layer, float * margin, int32_t n_max);
@ctypes_function("kairox_balancer_get_margin", [c_void_p, c_int32, POINTER(c_float), c_int32], c_int32)
def kairox_balancer_get_margin(bal: Handle, layer: int, margins: CPtr[c_float], n_max: int, /) -> int: ...


# float kairox_balancer_get_load_cap(const struct kairox_balancer * bal, int32_t layer);
@ctypes_function("kairox_balancer_get_load_cap", [c_void_p, c_int32], c_float)
def kairox_balancer_get_load_cap(bal: Handle, layer: int, /) -> float: ...


# --- ggml quantization (kairox convert: dequantize-transpose-requantize of ffn_down) ---

# size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst, int64_t start,
#                            int64_t nrows, int64_t n_per_row, const float * imatrix);
@ctypes_function("ggml_quantize_chunk",
                 [c_enum, POINTER(c_float), c_void_p, c_int64, c_int64, c_int64, POINTER(c_float)], c_size_t)
def ggml_quantize_chunk(type: int, src: CPtr[c_float], dst: VoidPtr, start: int, nrows: int, n_per_row: int,
                        imatrix: CPtr[c_float], /) -> int: ...


# bool ggml_quantize_requires_imatrix(enum ggml_type type);
@ctypes_function("ggml_quantize_requires_imatrix", [c_enum], c_bool)
def ggml_quantize_requires_imatrix(type: int, /) -> bool: ...


# size_t ggml_row_size(enum ggml_type type, int64_t ne);
@ctypes_function("ggml_row_size", [c_enum, c_int64], c_size_t)
def ggml_row_size(type: int, ne: int, /) -> int: ...


# --- ggml-backend.h / ggml-cpu.h: devices (where the hybrid runtime's cache can live) ---

# size_t ggml_backend_dev_count(void);
@ctypes_function("ggml_backend_dev_count", [], c_size_t)
def ggml_backend_dev_count() -> int: ...


# ggml_backend_dev_t ggml_backend_dev_get(size_t index);
@ctypes_function("ggml_backend_dev_get", [c_size_t], c_void_p)
def ggml_backend_dev_get(index: int, /) -> int | None: ...


# enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
@ctypes_function("ggml_backend_dev_type", [c_void_p], c_enum)
def ggml_backend_dev_type(device: Handle, /) -> int: ...


# bool ggml_backend_cpu_kairox_rows_faster(enum ggml_type type);
@ctypes_function("ggml_backend_cpu_kairox_rows_faster", [c_enum], c_bool)
def ggml_backend_cpu_kairox_rows_faster(type: int, /) -> bool:
    """Whether the sparse row kernels read a whole matrix of this ggml type faster than the CPU
    backend's repacked layout on this machine (then the loader keeps it in plain rows)."""
    ...


# ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);
@ctypes_function("ggml_backend_cpu_buffer_type", [], c_void_p)
def ggml_backend_cpu_buffer_type() -> int | None: ...


# --- backend and logging ---

# const char * llama_version(void);
@ctypes_function("llama_version", [], c_char_p)
def llama_version() -> bytes | None: ...


# void llama_backend_init(void);
@ctypes_function("llama_backend_init", [], None)
def llama_backend_init() -> None: ...


# void llama_log_set(ggml_log_callback log_callback, void * user_data);
@ctypes_function("llama_log_set", [ggml_log_callback, c_void_p], None)
def llama_log_set(log_callback: CallbackPtr, user_data: VoidPtr, /) -> None: ...


# const char * llama_print_system_info(void);
@ctypes_function("llama_print_system_info", [], c_char_p)
def llama_print_system_info() -> bytes | None: ...


# bool llama_supports_gpu_offload(void);
@ctypes_function("llama_supports_gpu_offload", [], c_bool)
def llama_supports_gpu_offload() -> bool: ...


# --- default parameters ---

# struct llama_model_params llama_model_default_params(void);
@ctypes_function("llama_model_default_params", [], llama_model_params)
def llama_model_default_params() -> llama_model_params: ...


# struct llama_context_params llama_context_default_params(void);
@ctypes_function("llama_context_default_params", [], llama_context_params)
def llama_context_default_params() -> llama_context_params: ...


# struct llama_sampler_chain_params llama_sampler_chain_default_params(void);
@ctypes_function("llama_sampler_chain_default_params", [], llama_sampler_chain_params)
def llama_sampler_chain_default_params() -> llama_sampler_chain_params: ...


# --- model ---

# struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
@ctypes_function("llama_model_load_from_file", [c_char_p, llama_model_params], llama_model_p)
def llama_model_load_from_file(path_model: bytes | None, params: llama_model_params, /) -> int | None: ...


# void llama_model_free(struct llama_model * model);
@ctypes_function("llama_model_free", [llama_model_p], None)
def llama_model_free(model: Handle, /) -> None: ...


# const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
# (the address of the model's own vocab: never NULL)
@ctypes_function("llama_model_get_vocab", [llama_model_p], llama_vocab_p)
def llama_model_get_vocab(model: Handle, /) -> int: ...


# int32_t llama_model_n_ctx_train(const struct llama_model * model);
@ctypes_function("llama_model_n_ctx_train", [llama_model_p], c_int32)
def llama_model_n_ctx_train(model: Handle, /) -> int: ...


# int32_t llama_model_n_embd(const struct llama_model * model);
@ctypes_function("llama_model_n_embd", [llama_model_p], c_int32)
def llama_model_n_embd(model: Handle, /) -> int: ...


# int32_t llama_model_n_layer(const struct llama_model * model);
@ctypes_function("llama_model_n_layer", [llama_model_p], c_int32)
def llama_model_n_layer(model: Handle, /) -> int: ...


# int32_t llama_model_n_head(const struct llama_model * model);
@ctypes_function("llama_model_n_head", [llama_model_p], c_int32)
def llama_model_n_head(model: Handle, /) -> int: ...


# int32_t llama_model_n_head_kv(const struct llama_model * model);
@ctypes_function("llama_model_n_head_kv", [llama_model_p], c_int32)
def llama_model_n_head_kv(model: Handle, /) -> int: ...


# int32_t llama_model_desc(const struct llama_model * model, char * buf, size_t buf_size);
@ctypes_function("llama_model_desc", [llama_model_p, c_char_p, c_size_t], c_int32)
def llama_model_desc(model: Handle, buf: CCharBuffer, buf_size: int, /) -> int: ...


# uint64_t llama_model_size(const struct llama_model * model);
@ctypes_function("llama_model_size", [llama_model_p], c_uint64)
def llama_model_size(model: Handle, /) -> int: ...


# uint64_t llama_model_n_params(const struct llama_model * model);
@ctypes_function("llama_model_n_params", [llama_model_p], c_uint64)
def llama_model_n_params(model: Handle, /) -> int: ...


# bool llama_model_has_decoder(const struct llama_model * model);
@ctypes_function("llama_model_has_decoder", [llama_model_p], c_bool)
def llama_model_has_decoder(model: Handle, /) -> bool: ...


# bool llama_model_has_encoder(const struct llama_model * model);
@ctypes_function("llama_model_has_encoder", [llama_model_p], c_bool)
def llama_model_has_encoder(model: Handle, /) -> bool: ...


# const char * llama_model_chat_template(const struct llama_model * model, const char * name);
@ctypes_function("llama_model_chat_template", [llama_model_p, c_char_p], c_char_p)
def llama_model_chat_template(model: Handle, name: bytes | None, /) -> bytes | None: ...


# int32_t llama_model_meta_count(const struct llama_model * model);
@ctypes_function("llama_model_meta_count", [llama_model_p], c_int32)
def llama_model_meta_count(model: Handle, /) -> int: ...


# int32_t llama_model_meta_key_by_index(const struct llama_model * model, int32_t i, char * buf, size_t buf_size);
@ctypes_function("llama_model_meta_key_by_index", [llama_model_p, c_int32, c_char_p, c_size_t], c_int32)
def llama_model_meta_key_by_index(model: Handle, i: int, buf: CCharBuffer, buf_size: int, /) -> int: ...


# int32_t llama_model_meta_val_str_by_index(const struct llama_model * model, int32_t i, char * buf, size_t buf_size);
@ctypes_function("llama_model_meta_val_str_by_index", [llama_model_p, c_int32, c_char_p, c_size_t], c_int32)
def llama_model_meta_val_str_by_index(model: Handle, i: int, buf: CCharBuffer, buf_size: int, /) -> int: ...


# --- vocab and tokenization ---

# int32_t llama_vocab_n_tokens(const struct llama_vocab * vocab);
@ctypes_function("llama_vocab_n_tokens", [llama_vocab_p], c_int32)
def llama_vocab_n_tokens(vocab: Handle, /) -> int: ...


# bool llama_vocab_is_eog(const struct llama_vocab * vocab, llama_token token);
@ctypes_function("llama_vocab_is_eog", [llama_vocab_p, llama_token], c_bool)
def llama_vocab_is_eog(vocab: Handle, token: int, /) -> bool: ...


# llama_token llama_vocab_bos(const struct llama_vocab * vocab);
@ctypes_function("llama_vocab_bos", [llama_vocab_p], llama_token)
def llama_vocab_bos(vocab: Handle, /) -> int: ...


# llama_token llama_vocab_eos(const struct llama_vocab * vocab);
@ctypes_function("llama_vocab_eos", [llama_vocab_p], llama_token)
def llama_vocab_eos(vocab: Handle, /) -> int: ...


# bool llama_vocab_get_add_bos(const struct llama_vocab * vocab);
@ctypes_function("llama_vocab_get_add_bos", [llama_vocab_p], c_bool)
def llama_vocab_get_add_bos(vocab: Handle, /) -> bool: ...


# int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
#                        llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
@ctypes_function("llama_tokenize",
                 [llama_vocab_p, c_char_p, c_int32, POINTER(llama_token), c_int32, c_bool, c_bool], c_int32)
def llama_tokenize(vocab: Handle, text: bytes | None, text_len: int, tokens: CPtr[llama_token],
                   n_tokens_max: int, add_special: bool, parse_special: bool, /) -> int: ...


# int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token, char * buf,
#                              int32_t length, int32_t lstrip, bool special);
@ctypes_function("llama_token_to_piece",
                 [llama_vocab_p, llama_token, c_char_p, c_int32, c_int32, c_bool], c_int32)
def llama_token_to_piece(vocab: Handle, token: int, buf: CCharBuffer, length: int, lstrip: int,
                         special: bool, /) -> int: ...


# int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
#                          char * text, int32_t text_len_max, bool remove_special, bool unparse_special);
@ctypes_function("llama_detokenize",
                 [llama_vocab_p, POINTER(llama_token), c_int32, c_char_p, c_int32, c_bool, c_bool], c_int32)
def llama_detokenize(vocab: Handle, tokens: CPtr[llama_token], n_tokens: int, text: CCharBuffer,
                     text_len_max: int, remove_special: bool, unparse_special: bool, /) -> int: ...


# int32_t llama_chat_apply_template(const char * tmpl, const struct llama_chat_message * chat, size_t n_msg,
#                                   bool add_ass, char * buf, int32_t length);
@ctypes_function("llama_chat_apply_template",
                 [c_char_p, POINTER(llama_chat_message), c_size_t, c_bool, c_char_p, c_int32], c_int32)
def llama_chat_apply_template(tmpl: bytes | None, chat: CPtr[llama_chat_message], n_msg: int, add_ass: bool,
                              buf: CCharBuffer, length: int, /) -> int: ...


# --- context ---

# struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
@ctypes_function("llama_init_from_model", [llama_model_p, llama_context_params], llama_context_p)
def llama_init_from_model(model: Handle, params: llama_context_params, /) -> int | None: ...


# void llama_free(struct llama_context * ctx);
@ctypes_function("llama_free", [llama_context_p], None)
def llama_free(ctx: Handle, /) -> None: ...


# uint32_t llama_n_ctx(const struct llama_context * ctx);
@ctypes_function("llama_n_ctx", [llama_context_p], c_uint32)
def llama_n_ctx(ctx: Handle, /) -> int: ...


# uint32_t llama_n_batch(const struct llama_context * ctx);
@ctypes_function("llama_n_batch", [llama_context_p], c_uint32)
def llama_n_batch(ctx: Handle, /) -> int: ...


# uint32_t llama_n_ubatch(const struct llama_context * ctx);
@ctypes_function("llama_n_ubatch", [llama_context_p], c_uint32)
def llama_n_ubatch(ctx: Handle, /) -> int: ...


# int32_t llama_n_threads(struct llama_context * ctx);
@ctypes_function("llama_n_threads", [llama_context_p], c_int32)
def llama_n_threads(ctx: Handle, /) -> int: ...


# void llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
@ctypes_function("llama_set_n_threads", [llama_context_p, c_int32, c_int32], None)
def llama_set_n_threads(ctx: Handle, n_threads: int, n_threads_batch: int, /) -> None: ...


# llama_memory_t llama_get_memory(const struct llama_context * ctx);
@ctypes_function("llama_get_memory", [llama_context_p], llama_memory_t)
def llama_get_memory(ctx: Handle, /) -> int | None: ...


# void llama_memory_clear(llama_memory_t mem, bool data);
@ctypes_function("llama_memory_clear", [llama_memory_t, c_bool], None)
def llama_memory_clear(mem: Handle, data: bool, /) -> None: ...


# bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
@ctypes_function("llama_memory_seq_rm", [llama_memory_t, llama_seq_id, llama_pos, llama_pos], c_bool)
def llama_memory_seq_rm(mem: Handle, seq_id: int, p0: int, p1: int, /) -> bool: ...


# llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id);
@ctypes_function("llama_memory_seq_pos_max", [llama_memory_t, llama_seq_id], llama_pos)
def llama_memory_seq_pos_max(mem: Handle, seq_id: int, /) -> int: ...


# --- decoding ---

# struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
@ctypes_function("llama_batch_init", [c_int32, c_int32, c_int32], llama_batch)
def llama_batch_init(n_tokens: int, embd: int, n_seq_max: int, /) -> llama_batch: ...


# void llama_batch_free(struct llama_batch batch);
@ctypes_function("llama_batch_free", [llama_batch], None)
def llama_batch_free(batch: llama_batch, /) -> None: ...


# int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);
@ctypes_function("llama_decode", [llama_context_p, llama_batch], c_int32)
def llama_decode(ctx: Handle, batch: llama_batch, /) -> int: ...


# float * llama_get_logits(struct llama_context * ctx);
@ctypes_function("llama_get_logits", [llama_context_p], POINTER(c_float))
def llama_get_logits(ctx: Handle, /) -> CPointer[c_float]: ...


# float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);
@ctypes_function("llama_get_logits_ith", [llama_context_p, c_int32], POINTER(c_float))
def llama_get_logits_ith(ctx: Handle, i: int, /) -> CPointer[c_float]: ...


# --- sampling ---

# struct llama_sampler * llama_sampler_chain_init(struct llama_sampler_chain_params params);
@ctypes_function("llama_sampler_chain_init", [llama_sampler_chain_params], llama_sampler_p)
def llama_sampler_chain_init(params: llama_sampler_chain_params, /) -> int | None: ...


# void llama_sampler_chain_add(struct llama_sampler * chain, struct llama_sampler * smpl);
@ctypes_function("llama_sampler_chain_add", [llama_sampler_p, llama_sampler_p], None)
def llama_sampler_chain_add(chain: Handle, smpl: Handle, /) -> None: ...


# struct llama_sampler * llama_sampler_init_greedy(void);
@ctypes_function("llama_sampler_init_greedy", [], llama_sampler_p)
def llama_sampler_init_greedy() -> int | None: ...


# struct llama_sampler * llama_sampler_init_dist(uint32_t seed);
@ctypes_function("llama_sampler_init_dist", [c_uint32], llama_sampler_p)
def llama_sampler_init_dist(seed: int, /) -> int | None: ...


# struct llama_sampler * llama_sampler_init_top_k(int32_t k);
@ctypes_function("llama_sampler_init_top_k", [c_int32], llama_sampler_p)
def llama_sampler_init_top_k(k: int, /) -> int | None: ...


# struct llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep);
@ctypes_function("llama_sampler_init_top_p", [c_float, c_size_t], llama_sampler_p)
def llama_sampler_init_top_p(p: float, min_keep: int, /) -> int | None: ...


# struct llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep);
@ctypes_function("llama_sampler_init_min_p", [c_float, c_size_t], llama_sampler_p)
def llama_sampler_init_min_p(p: float, min_keep: int, /) -> int | None: ...


# struct llama_sampler * llama_sampler_init_temp(float t);
@ctypes_function("llama_sampler_init_temp", [c_float], llama_sampler_p)
def llama_sampler_init_temp(t: float, /) -> int | None: ...


# struct llama_sampler * llama_sampler_init_logit_bias(int32_t n_vocab, int32_t n_logit_bias,
#                                                      const llama_logit_bias * logit_bias);
@ctypes_function("llama_sampler_init_logit_bias",
                 [c_int32, c_int32, POINTER(llama_logit_bias)], llama_sampler_p)
def llama_sampler_init_logit_bias(n_vocab: int, n_logit_bias: int,
                                  logit_bias: CPtr[llama_logit_bias], /) -> int | None: ...


# llama_token llama_sampler_sample(struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx);
@ctypes_function("llama_sampler_sample", [llama_sampler_p, llama_context_p, c_int32], llama_token)
def llama_sampler_sample(smpl: Handle, ctx: Handle, idx: int, /) -> int: ...


# void llama_sampler_reset(struct llama_sampler * smpl);
@ctypes_function("llama_sampler_reset", [llama_sampler_p], None)
def llama_sampler_reset(smpl: Handle, /) -> None: ...


# void llama_sampler_free(struct llama_sampler * smpl);
@ctypes_function("llama_sampler_free", [llama_sampler_p], None)
def llama_sampler_free(smpl: Handle, /) -> None: ...


# --- performance ---

# struct llama_perf_context_data llama_perf_context(const struct llama_context * ctx);
@ctypes_function("llama_perf_context", [llama_context_p], llama_perf_context_data)
def llama_perf_context(ctx: Handle, /) -> llama_perf_context_data: ...


# void llama_perf_context_reset(struct llama_context * ctx);
@ctypes_function("llama_perf_context_reset", [llama_context_p], None)
def llama_perf_context_reset(ctx: Handle, /) -> None: ...


# ---------------------------------------------------------------------------------------
# Helpers over the declarations
# ---------------------------------------------------------------------------------------
#: what kairox_abi_sizeof / kairox_abi_offsetof return for a name they do not describe
_ABI_UNKNOWN = ctypes.c_size_t(-1).value


def version() -> str:
    """The library's own version string (``kairox_version``)."""
    return (kairox_version() or b"").decode()


def abi_sizeof(type_name: str) -> int | None:
    """sizeof(type_name) as compiled into the library; None if it is not described."""
    n = int(kairox_abi_sizeof(type_name.encode()))
    return None if n == _ABI_UNKNOWN else n


def abi_offsetof(type_name: str, field: str) -> int | None:
    """offsetof(type_name, field) in the library; None if it is not described."""
    n = int(kairox_abi_offsetof(type_name.encode(), field.encode()))
    return None if n == _ABI_UNKNOWN else n


def profiler_eval_fn() -> int:
    """Address of the C eval callback ``kairox_profiler_eval`` (for llama_context_params.cb_eval)."""
    return ctypes.cast(lib().cdll.kairox_profiler_eval, c_void_p).value or 0
