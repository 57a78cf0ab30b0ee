"""Summarise a GGUF file (``kairox info``) with the ``gguf`` package alone.

Why not through the native library: inspecting a file should work before anything is
built and must never load weights; the ``gguf`` reader memory-maps the file and parses
only headers. It also tells whether the file already carries Kairox sparsity data
(metadata keys under ``kairox.``), which later tools add when converting a model.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import KairoxError
from .format import KEY_DOWN_DENSE_SHARE

GGUF_MAGIC = b"GGUF"
KAIROX_KEY_PREFIX = "kairox."


@dataclass(frozen=True)
class TypeStats:
    """Tensors of one ggml type: how many, how many parameters, how many bytes."""

    count: int = 0
    params: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class GGUFSummary:
    path: Path
    file_size: int
    gguf_version: int | None
    architecture: str | None
    name: str | None
    file_type: str | None
    n_layer: Any
    n_embd: Any
    n_ff: Any
    n_head: Any
    n_head_kv: Any
    n_vocab: int | None
    context_length: Any
    n_tensors: int
    n_params: int
    tensor_types: dict[str, TypeStats] = field(default_factory=dict)
    kairox_values: dict[str, Any] = field(default_factory=dict)  # the kairox.* metadata, by key
    down_dense_share: float | None = None  # kairox.down_dense_share (negative: not measured)

    @property
    def kairox_keys(self) -> tuple[str, ...]:
        return tuple(self.kairox_values)

    @property
    def has_kairox_data(self) -> bool:
        return bool(self.kairox_values)


def _field_value(f: Any) -> Any:
    """A ReaderField's value as Python data (str, number, or list). Strings that are not valid
    UTF-8 (some vocabularies hold raw byte tokens) get U+FFFD, as llama.cpp loads them anyway."""
    if hasattr(f, "contents"):  # gguf >= 0.11
        try:
            return f.contents()
        except UnicodeDecodeError:
            pass  # decoded leniently from the raw parts below
    from gguf import GGUFValueType

    def one(idx: int, vtype: Any) -> Any:
        part = f.parts[idx]
        return bytes(part).decode("utf-8", "replace") if vtype == GGUFValueType.STRING \
            else part.tolist()[0]

    if not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        return [one(i, f.types[-1]) for i in f.data]
    return one(f.data[0], f.types[0])


def inspect_gguf(path: str | os.PathLike[str]) -> GGUFSummary:
    """Read a GGUF's header, metadata and tensor index; KairoxError on bad input."""
    p = Path(path)
    if not p.exists():
        raise KairoxError(f"model file not found: {p}")
    if not p.is_file():
        raise KairoxError(f"not a file: {p}")
    try:
        with open(p, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise KairoxError(f"cannot read {p}: {e.strerror or e}") from None
    if magic != GGUF_MAGIC:
        raise KairoxError(f"not a GGUF file (bad magic {magic!r}): {p}")
    file_size = p.stat().st_size

    from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType

    try:
        reader = GGUFReader(p, "r")
        fields = {k: _field_value(v) for k, v in reader.fields.items()}
        tensors = list(reader.tensors)
    except Exception as e:  # the reader raises many kinds on truncated/corrupt input
        raise KairoxError(f"corrupt or truncated GGUF file {p}: {e or type(e).__name__}") from None

    if tensors:
        end = max(int(t.data_offset) + int(t.n_bytes) for t in tensors)
        if end > file_size:
            raise KairoxError(f"truncated GGUF file {p}: tensor data ends at byte {end} "
                              f"but the file has {file_size}")

    arch = fields.get("general.architecture")

    def arch_key(key: str) -> Any:
        return fields.get(f"{arch}.{key}") if arch else None

    tokens = fields.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, Sequence) and not isinstance(tokens, str) \
        else arch_key("vocab_size")

    file_type = fields.get("general.file_type")
    if isinstance(file_type, int):
        try:
            file_type = LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            file_type = str(file_type)

    stats: dict[str, TypeStats] = {}
    for t in tensors:
        try:
            tname = GGMLQuantizationType(int(t.tensor_type)).name
        except ValueError:
            tname = f"type {int(t.tensor_type)}"
        s = stats.get(tname, TypeStats())
        stats[tname] = TypeStats(s.count + 1, s.params + int(t.n_elements), s.nbytes + int(t.n_bytes))

    return GGUFSummary(
        path=p,
        file_size=file_size,
        gguf_version=fields.get("GGUF.version"),
        architecture=arch,
        name=fields.get("general.name"),
        file_type=file_type if isinstance(file_type, str) else None,
        n_layer=arch_key("block_count"),
        n_embd=arch_key("embedding_length"),
        n_ff=arch_key("feed_forward_length"),
        n_head=arch_key("attention.head_count"),
        n_head_kv=arch_key("attention.head_count_kv"),
        n_vocab=n_vocab,
        context_length=arch_key("context_length"),
        n_tensors=len(tensors),
        n_params=sum(int(t.n_elements) for t in tensors),
        tensor_types=dict(sorted(stats.items(), key=lambda kv: -kv[1].nbytes)),
        kairox_values={k: fields[k] for k in sorted(fields) if k.startswith(KAIROX_KEY_PREFIX)},
        down_dense_share=_float_or_none(fields.get(KEY_DOWN_DENSE_SHARE)),
    )


def _float_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _human_bytes(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def _human_count(n: int) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _show_metadata(v: Any) -> str:
    """A metadata value on one line: per-layer arrays as their range and length."""
    if isinstance(v, (list, tuple)):
        nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(v) > 6 and len(nums) == len(v):
            return f"{len(v)} values, {min(nums):.4g} .. {max(nums):.4g}"
        return ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _show(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):  # per-layer values (e.g. n_ff of some models)
        uniq = sorted(set(v))
        return str(uniq[0]) if len(uniq) == 1 else f"{min(v)}..{max(v)} (per layer)"
    return str(v)


def render(s: GGUFSummary, console: Console) -> None:
    """Print the summary as two rich tables: the model, then bytes per tensor type."""
    heads = _show(s.n_head) if s.n_head_kv in (None, s.n_head) else \
        f"{_show(s.n_head)} (KV {_show(s.n_head_kv)})"
    kairox = f"yes ({len(s.kairox_keys)} keys, below)" if s.has_kairox_data else "no"
    info = Table(title=str(s.path), show_header=False, title_justify="left")
    info.add_column(style="bold")
    info.add_column()
    rows = [
        ("architecture", _show(s.architecture)),
        ("name", _show(s.name)),
        ("file type", _show(s.file_type)),
        ("file size", f"{_human_bytes(s.file_size)} ({s.file_size:,} bytes)"),
        ("GGUF version", _show(s.gguf_version)),
        ("layers", _show(s.n_layer)),
        ("n_embd", _show(s.n_embd)),
        ("n_ff", _show(s.n_ff)),
        ("heads", heads),
        ("vocab size", _show(s.n_vocab)),
        ("context length", _show(s.context_length)),
        ("tensors", str(s.n_tensors)),
        ("parameters", f"{_human_count(s.n_params)} ({s.n_params:,})"),
        ("Kairox sparsity data", kairox),
    ]
    if s.has_kairox_data:
        share = s.down_dense_share
        rows.append(("down crossover", "built-in per type (kairox calibrate measures it)" if share is None or share < 0
                     else f"{share:.3f} (kairox.down_dense_share, from kairox calibrate on the machine that measured it)"))
    for k, v in rows:
        info.add_row(k, v)
    console.print(info)
    if s.has_kairox_data:
        kx = Table(title="Kairox sparsity data", show_header=False, title_justify="left")
        kx.add_column(style="bold")
        kx.add_column()
        for k, v in s.kairox_values.items():
            kx.add_row(k, _show_metadata(v))
        console.print(kx)

    types = Table(title="tensor types", title_justify="left")
    for col in ("type", "tensors", "parameters", "bytes", "share"):
        types.add_column(col, justify="left" if col == "type" else "right")
    total = sum(t.nbytes for t in s.tensor_types.values()) or 1
    for name, t in s.tensor_types.items():
        types.add_row(name, str(t.count), _human_count(t.params), _human_bytes(t.nbytes),
                      f"{100 * t.nbytes / total:.1f}%")
    console.print(types)
