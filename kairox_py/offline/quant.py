"""Any-type (de)quantization of weight matrices, for building ``ffn_down_t``.

Dequantization uses the ``gguf`` package (``gguf.quants.dequantize`` knows every ggml
type); quantization goes through the library's own ``ggml_quantize_chunk`` so the bytes
are exactly what ggml would produce and every type the runtime reads can be written.
"""
from __future__ import annotations

import ctypes

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as _gguf_dequantize

from .. import _lib
from .. import format as fmt
from ..errors import KairoxError

#: --down-type choices (lower-case ggml type names)
WRITABLE_TYPES = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_0", "q5_1", "q4_k", "q4_0",
                  "q4_1")


def ggml_type(name: str) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType[name.upper()]
    except KeyError:
        raise KairoxError(f"unknown ggml type '{name}'") from None


def dequantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """A GGUF reader tensor's raw data -> float32 (rows, n_per_row)."""
    if qtype == GGMLQuantizationType.F32:
        return np.asarray(data, dtype=np.float32)
    if qtype == GGMLQuantizationType.F16:
        return np.asarray(data, dtype=np.float32)
    return np.asarray(_gguf_dequantize(np.asarray(data), qtype), dtype=np.float32)


def row_nbytes(qtype: GGMLQuantizationType, n_per_row: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return n_per_row // block * size


def check_quantizable(qtype: GGMLQuantizationType, n_per_row: int, option: str = "--down-type") -> None:
    block, _ = GGML_QUANT_SIZES[qtype]
    if n_per_row % block:
        raise KairoxError(f"{qtype.name} needs rows that are a multiple of {block} values; "
                          f"these rows have {n_per_row}: choose another {option}"
                          + (" (e.g. q8_0)" if option == "--down-type" else " (e.g. f16)"))


def quantize(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 (rows, n_per_row) -> the ggml type's bytes, (rows, row_nbytes) uint8
    (float16/float32 arrays for F16/F32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    if qtype == GGMLQuantizationType.F32:
        return x
    if qtype == GGMLQuantizationType.F16:
        return x.astype(np.float16)
    check_quantizable(qtype, n)
    if _lib.ggml_quantize_requires_imatrix(int(qtype)):
        raise KairoxError(f"{qtype.name} needs an importance matrix: choose another --down-type")
    nb = row_nbytes(qtype, n)
    if int(_lib.ggml_row_size(int(qtype), n)) != nb:
        raise KairoxError(f"row size of {qtype.name} disagrees between gguf and the library")
    out = np.empty((rows, nb), dtype=np.uint8)
    written = _lib.ggml_quantize_chunk(int(qtype), x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                       out.ctypes.data_as(ctypes.c_void_p), 0, rows, n, None)
    if written != out.nbytes:
        raise KairoxError(f"ggml_quantize_chunk wrote {written} bytes, expected {out.nbytes}")
    return out


def down_t_size(reader: GGUFReader, il: int, n_embd: int, n_ff: int) -> tuple[int, str]:
    """(bytes, lower-case ggml type) of layer `il`'s ffn_down_t as the runtime holds it: the
    file's tensor, or the one the loader derives from ffn_down (fmt.KEY_DOWN_T_TYPE); (0, "")
    where the file has neither. Cost models need it either way: the sparse path reads it."""
    name = fmt.tensor_name(fmt.TENSOR_DOWN_T, il)
    for t in reader.tensors:
        if t.name == name:
            return int(t.n_bytes), t.tensor_type.name.lower()
    field = reader.get_field(fmt.KEY_DOWN_T_TYPE)
    if field is None:
        return 0, ""
    tname = str(field.contents())
    return n_ff * row_nbytes(ggml_type(tname), n_embd), tname
