"""Names of the Kairox GGUF format (keys `kairox.*`, per-layer tensors) and small helpers.

Why a mirror: the C++ loader reads these names from ``kairox.h``; the converter writes
them from here. ``docs/FORMAT.md`` documents the format in one place, and
``tests/test_format.py`` checks every name below against the library's
``kairox_format_name(id)`` so the two sides cannot drift apart silently.
"""
from __future__ import annotations

#: 2: ffn_down_t may be absent, derived by the loader from ffn_down (KEY_DOWN_T_TYPE)
FORMAT_VERSION = 2

KEY_FORMAT_VERSION = "kairox.format_version"   # u32
KEY_MODE = "kairox.mode"                       # str: predictor | threshold | cats
KEY_ACTIVATION = "kairox.activation"           # str (optional): relu | silu | gelu override
KEY_GROUP_SIZE = "kairox.group_size"           # u32
KEY_SPARSITY = "kairox.sparsity"               # f32: target share of neurons skipped
KEY_THRESHOLD = "kairox.threshold"             # f32[n_layer]: |act(gate)*up| thresholds
KEY_CATS_THRESHOLD = "kairox.cats_threshold"   # f32[n_layer]: |act(gate)| thresholds
KEY_PRED_RANK = "kairox.predictor.rank"        # i32[n_layer]: 0 = no predictor
KEY_PRED_THRESHOLD = "kairox.predictor.threshold"  # f32: probability threshold
KEY_PRED_DOWN_SCALE = "kairox.predictor.down_scale"  # f32 (optional): predictor-mode down threshold factor
#: f32 (optional): active share above which the sparse down reads ffn_down in order; measured
#: per machine by `kairox calibrate` (absent or negative, as `kairox convert` writes it: the
#: library's built-in crossover per weight type)
KEY_DOWN_DENSE_SHARE = "kairox.down_dense_share"
#: i32 (optional): threshold mode's whole gate/up in plain rows through the sparse op's row
#: kernels (1) or ggml's mat-vec (0); measured by `kairox calibrate`; -1: not measured (rows)
KEY_GATE_UP_ROWS = "kairox.gate_up_rows"
KEY_PERMUTED = "kairox.permuted"               # bool
#: bool (optional): random weights for speed measurements; only such a model runs a workload
KEY_SYNTHETIC = "kairox.synthetic"
#: str (optional): the file holds no ffn_down_t; the loader derives it from ffn_down in this
#: ggml type (a whole matrix per layer less on disk, a few seconds more at load)
KEY_DOWN_T_TYPE = "kairox.down_t_type"

TENSOR_DOWN_T = "blk.%d.ffn_down_t"            # numpy (n_ff, n_embd)
TENSOR_PRED_UP = "blk.%d.kx_pred_up"           # numpy (rank, n_embd) + .bias (rank,)
TENSOR_PRED_DOWN = "blk.%d.kx_pred_down"       # numpy (n_ff, rank) + .bias (n_ff,)
TENSOR_PERM = "blk.%d.kx_perm"                 # i32 (n_ff,): original index of stored neuron
TENSOR_PERM_INV = "blk.%d.kx_perm_inv"         # i32 (n_ff,): stored index of original neuron
TENSOR_GROUP_FREQ = "blk.%d.kx_group_freq"     # f32 (n_ff / group_size,)

#: every name by the id the C library knows it under (macro name without ``KAIROX_``)
NAMES: dict[str, str] = {
    "KEY_FORMAT_VERSION": KEY_FORMAT_VERSION,
    "KEY_MODE": KEY_MODE,
    "KEY_ACTIVATION": KEY_ACTIVATION,
    "KEY_GROUP_SIZE": KEY_GROUP_SIZE,
    "KEY_SPARSITY": KEY_SPARSITY,
    "KEY_THRESHOLD": KEY_THRESHOLD,
    "KEY_CATS_THRESHOLD": KEY_CATS_THRESHOLD,
    "KEY_PRED_RANK": KEY_PRED_RANK,
    "KEY_PRED_THRESHOLD": KEY_PRED_THRESHOLD,
    "KEY_PRED_DOWN_SCALE": KEY_PRED_DOWN_SCALE,
    "KEY_DOWN_DENSE_SHARE": KEY_DOWN_DENSE_SHARE,
    "KEY_PERMUTED": KEY_PERMUTED,
    "KEY_SYNTHETIC": KEY_SYNTHETIC,
    "KEY_DOWN_T_TYPE": KEY_DOWN_T_TYPE,
    "TENSOR_DOWN_T": TENSOR_DOWN_T,
    "TENSOR_PRED_UP": TENSOR_PRED_UP,
    "TENSOR_PRED_DOWN": TENSOR_PRED_DOWN,
    "TENSOR_PERM": TENSOR_PERM,
    "TENSOR_PERM_INV": TENSOR_PERM_INV,
    "TENSOR_GROUP_FREQ": TENSOR_GROUP_FREQ,
}

MODES = ("predictor", "threshold", "cats")

#: Architectures the converter accepts, mapped to their FFN activation: dense per-layer
#: FFNs built by llama.cpp's build_ffn, either gated (separate gate/up/down, act(gate)*up,
#: no biases) or, for the architectures in UNGATED_ARCHES, up/down only (act(up x + b)):
#: the two shapes the sparse path runs. Mistral and the ReLU llamas of the papers (ProSparse,
#: Bamboo, ReluLLaMA) are "llama" GGUFs; ReluFalcon is a "falcon" one; OPT (DejaVu's and
#: PowerInfer's ReLU model) is "opt", an architecture Kairox adds to llama.cpp, with FFN
#: biases. Others are refused with a clear error rather than converted into a model the
#: runtime would silently run dense.
SUPPORTED_ARCHES: dict[str, str] = {
    "llama": "silu",
    "qwen2": "silu",
    "qwen3": "silu",
    "gemma": "gelu",
    "gemma2": "gelu",
    "gemma3": "gelu",
    "falcon": "gelu",
    "opt": "relu",
}

#: Architectures whose FFN has no gate: hidden = act(up x + up bias). No CATS mode for them
#: (its criterion is |act(gate)|).
UNGATED_ARCHES = frozenset({"falcon", "opt"})

#: Architectures whose FFN reads the attention's input norm (attention and FFN in parallel
#: on one normed input): the profiler records that norm ("attn_norm") as the FFN input.
PARALLEL_FFN_ARCHES = frozenset({"falcon"})


def tensor_name(pattern: str, layer: int, suffix: str = "weight") -> str:
    """The GGUF name of a per-layer tensor: pattern % layer, plus ``.suffix`` if given.

    kx_perm, kx_perm_inv and kx_group_freq carry no suffix (suffix="")."""
    base = pattern % layer
    return f"{base}.{suffix}" if suffix else base


def ffn_input_kind(arch: str) -> str:
    """The Profiler kind that records an architecture's FFN input (the predictor's input)."""
    return "attn_norm" if arch in PARALLEL_FFN_ARCHES else "input"


def activation_kind(arch: str, override: str | None = None) -> str:
    """"relu" when a neuron is active iff its activation is > 0, else "silu"/"gelu"
    (magnitude thresholds calibrated to a target sparsity)."""
    if override:
        return override
    return SUPPORTED_ARCHES.get(arch, "silu")
