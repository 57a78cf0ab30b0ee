"""Kairox: activation-sparse LLM inference on top of llama.cpp.

Public Python API. Importing it does not load the native library; that happens on the
first Model (or `kairox_py._lib.lib()`), so GGUF inspection and the default-model
download work even before the C++ side is built.

    from kairox_py import Model, SamplingParams, ensure_default_model

    with Model(ensure_default_model()) as model, model.session(n_ctx=512) as s:
        for piece in s.generate("The capital of France is", 32):
            print(piece, end="")
"""
from __future__ import annotations

import importlib.metadata

from ._lib import set_verbose
from .chat import ChatModel, ChatRequestError
from .default_model import DEFAULT_MODEL, WheelModel, cache_dir
from .default_model import ensure_model as ensure_default_model
from .errors import KairoxError
from .gguf_info import GGUFSummary, inspect_gguf
from .llama import ContextParams, LayerStats, Model, Profiler, SamplingParams, Session, Timings

try:
    __version__ = importlib.metadata.version("kairox")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_MODEL",
    "ChatModel",
    "ChatRequestError",
    "ContextParams",
    "GGUFSummary",
    "KairoxError",
    "LayerStats",
    "Profiler",
    "Model",
    "SamplingParams",
    "Session",
    "Timings",
    "WheelModel",
    "cache_dir",
    "ensure_default_model",
    "inspect_gguf",
    "set_verbose",
    "__version__",
]
