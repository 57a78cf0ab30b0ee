"""`kairox import-opt HF_DIR OUT.gguf`: a Hugging Face OPT checkpoint as a GGUF llama.cpp runs.

OPT (facebook/opt-*) is the ReLU model of DejaVu and PowerInfer, but llama.cpp has neither the
architecture nor a converter for it: our patches add the architecture (``models/opt.cpp``) and
this module the conversion, from the checkpoint's own files (``config.json``, ``vocab.json``,
``merges.txt``, ``model.safetensors`` or its shards) read with NumPy alone (no torch).

The GGUF uses GPT-2's tensor names with separate ``attn_q``/``attn_k``/``attn_v``; HF's learned
positions are offset by 2 (its row p + 2 holds position p), so ``position_embd`` is written from
row 2 on and llama.cpp indexes it by position. Matrices are written in F16 (or F32), norms and
biases in F32; quantize the result with llama.cpp's ``llama-quantize`` if wanted. Refused with a
clear error: checkpoints that are not OPT, OPT-350m's post-norm layers and its projected word
embeddings (``word_embed_proj_dim`` != ``hidden_size``), ``*.bin`` (pickled torch) checkpoints.
The output is written to a temporary file and renamed into place when complete.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType
from rich.console import Console

from ..errors import KairoxError
from ..outputs import atomic_file, check_output_file
from .convert import NewTensor, write_tensors

ARCH = "opt"
#: HF's positions start at this row of embed_positions (OPTLearnedPositionalEmbedding's offset)
POSITION_OFFSET = 2

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class SafeTensors:
    """The tensors of one or more .safetensors files, memory-mapped (read on demand)."""

    def __init__(self, files: list[Path]) -> None:
        self._where: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
        for f in files:
            try:
                with open(f, "rb") as fh:
                    (n,) = struct.unpack("<Q", fh.read(8))
                    header = json.loads(fh.read(n))
            except (OSError, struct.error, ValueError) as e:
                raise KairoxError(f"cannot read {f} as safetensors: {e}") from None
            base = 8 + n
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in _ST_DTYPES:
                    raise KairoxError(f"{f}: tensor {name} has dtype {info['dtype']} (F32, F16, BF16 supported)")
                b0, b1 = info["data_offsets"]
                self._where[name] = (f, info["dtype"], tuple(info["shape"]), base + b0, base + b1)

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name][2]

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32."""
        f, dt, shape, b0, b1 = self._where[name]
        count = int(np.prod(shape)) if shape else 1
        if (b1 - b0) != count * np.dtype(_ST_DTYPES[dt]).itemsize or f.stat().st_size < b1:
            raise KairoxError(f"{f}: tensor {name} is truncated or mis-sized")
        a = np.memmap(f, dtype=_ST_DTYPES[dt], mode="r", offset=b0, shape=(count,))
        if dt == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        return np.asarray(a, dtype=np.float32).reshape(shape)


def _checkpoint_files(src: Path) -> list[Path]:
    single = src / "model.safetensors"
    index = src / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise KairoxError(f"cannot read {index}: {e}") from None
        return [src / s for s in shards]
    if any(src.glob("*.bin")):
        raise KairoxError(f"{src} has only pickled torch weights (*.bin): save the model as safetensors "
                          "first (model.save_pretrained(dir, safe_serialization=True))")
    raise KairoxError(f"no model.safetensors (or shards) in {src}")


def _read_config(src: Path) -> dict:
    try:
        cfg = json.loads((src / "config.json").read_text())
    except FileNotFoundError:
        raise KairoxError(f"no config.json in {src} (a Hugging Face checkpoint directory is needed)") from None
    except (OSError, ValueError) as e:
        raise KairoxError(f"cannot read {src / 'config.json'}: {e}") from None
    if cfg.get("model_type") != "opt":
        raise KairoxError(f"{src} is a {cfg.get('model_type')!r} checkpoint, not OPT")
    if not cfg.get("do_layer_norm_before", True):
        raise KairoxError("post-norm OPT layers (do_layer_norm_before = false: OPT-350m) are not supported")
    if cfg.get("word_embed_proj_dim", cfg["hidden_size"]) != cfg["hidden_size"]:
        raise KairoxError("projected word embeddings (word_embed_proj_dim != hidden_size: OPT-350m) are not supported")
    if cfg.get("activation_function", "relu") != "relu":
        raise KairoxError(f"activation {cfg.get('activation_function')!r}: OPT's FFN is ReLU")
    if not cfg.get("enable_bias", True):
        raise KairoxError("OPT without biases (enable_bias = false) is not supported")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise KairoxError("hidden_size is not a multiple of num_attention_heads")
    return cfg


def _vocab(src: Path, n_vocab: int) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """Tokens (in id order, padded to the embedding's rows), their types, the merges and the
    special tokens' ids."""
    try:
        vocab: dict[str, int] = json.loads((src / "vocab.json").read_text(encoding="utf-8"))
        merges = [ln for ln in (src / "merges.txt").read_text(encoding="utf-8").splitlines()
                  if ln and not ln.startswith("#version")]
    except FileNotFoundError as e:
        raise KairoxError(f"the tokenizer file {Path(e.filename).name} is missing in {src}") from None
    except (OSError, ValueError) as e:
        raise KairoxError(f"cannot read the tokenizer in {src}: {e}") from None
    if not vocab or max(vocab.values()) >= n_vocab:
        raise KairoxError(f"vocab.json has {len(vocab)} tokens, ids up to {max(vocab.values(), default=-1)}, "
                          f"for {n_vocab} embedding rows")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [int(TokenType.UNUSED)] * n_vocab
    for tok, i in vocab.items():
        tokens[i] = tok
        types[i] = int(TokenType.NORMAL)
    special: dict[str, int] = {}
    for name, tok in (("bos", "</s>"), ("eos", "</s>"), ("pad", "<pad>"), ("unk", "<unk>")):
        if tok in vocab:
            special[name] = vocab[tok]
    for tok in ("<s>", "</s>", "<pad>", "<unk>"):
        if tok in vocab:
            types[vocab[tok]] = int(TokenType.CONTROL)
    return tokens, types, merges, special


# (HF name under model.decoder.layers.N., GGUF name under blk.N., shape in terms of e = hidden_size
# and f = ffn_dim); 2-D tensors are matrices (written in the chosen type), 1-D ones in F32
_LAYER_TENSORS = [
    ("self_attn_layer_norm.weight", "attn_norm.weight", "e"),
    ("self_attn_layer_norm.bias", "attn_norm.bias", "e"),
    ("self_attn.q_proj.weight", "attn_q.weight", "ee"),
    ("self_attn.q_proj.bias", "attn_q.bias", "e"),
    ("self_attn.k_proj.weight", "attn_k.weight", "ee"),
    ("self_attn.k_proj.bias", "attn_k.bias", "e"),
    ("self_attn.v_proj.weight", "attn_v.weight", "ee"),
    ("self_attn.v_proj.bias", "attn_v.bias", "e"),
    ("self_attn.out_proj.weight", "attn_output.weight", "ee"),
    ("self_attn.out_proj.bias", "attn_output.bias", "e"),
    ("final_layer_norm.weight", "ffn_norm.weight", "e"),
    ("final_layer_norm.bias", "ffn_norm.bias", "e"),
    ("fc1.weight", "ffn_up.weight", "fe"),
    ("fc1.bias", "ffn_up.bias", "f"),
    ("fc2.weight", "ffn_down.weight", "ef"),
    ("fc2.bias", "ffn_down.bias", "e"),
]


@dataclass(frozen=True)
class _Tensor:
    gguf: str
    hf: str
    shape: tuple[int, ...]  # the checkpoint's
    skip_rows: int = 0      # leading rows not written (HF's position offset)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.shape[0] - self.skip_rows, *self.shape[1:])


def _plan(st: SafeTensors, cfg: dict) -> list[_Tensor]:
    """Every tensor to write, in file order, with the shape config.json implies for it."""
    names = set(st.names())
    prefix = next((p for p in ("model.decoder.", "decoder.") if p + "embed_tokens.weight" in names), None)
    if prefix is None:
        raise KairoxError("the checkpoint has no decoder.embed_tokens.weight: not an OPT model")
    dims = {"e": cfg["hidden_size"], "f": cfg["ffn_dim"]}
    e = dims["e"]
    n_vocab = st.shape(prefix + "embed_tokens.weight")[0]
    plan = [_Tensor("token_embd.weight", prefix + "embed_tokens.weight", (n_vocab, e)),
            _Tensor("position_embd.weight", prefix + "embed_positions.weight",
                    (cfg["max_position_embeddings"] + POSITION_OFFSET, e), POSITION_OFFSET)]
    for i in range(cfg["num_hidden_layers"]):
        plan += [_Tensor(f"blk.{i}.{gg}", f"{prefix}layers.{i}.{hf}", tuple(dims[d] for d in shape))
                 for hf, gg, shape in _LAYER_TENSORS]
    plan += [_Tensor("output_norm.weight", prefix + "final_layer_norm.weight", (e,)),
             _Tensor("output_norm.bias", prefix + "final_layer_norm.bias", (e,))]
    # lm_head: written only if it differs from the token embedding (tied in every OPT)
    if "lm_head.weight" in names and not np.array_equal(st.get("lm_head.weight"), st.get(plan[0].hf)):
        plan.append(_Tensor("output.weight", "lm_head.weight", (n_vocab, e)))
    missing = [t.hf for t in plan if t.hf not in names]
    if missing:
        raise KairoxError(f"the checkpoint lacks {len(missing)} tensor(s), e.g. {missing[0]}")
    for t in plan:
        if st.shape(t.hf) != t.shape:
            raise KairoxError(f"{t.hf} has shape {st.shape(t.hf)}, expected {t.shape} from config.json")
    return plan


def import_opt(src: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str = "f16",
               console: Console | None = None) -> Path:
    """Write the OPT checkpoint in directory `src` as a GGUF at `out` (a progress bar on
    `console`, if given); returns out's path."""
    src_p, out_p = Path(src), Path(out)
    if not src_p.is_dir():
        raise KairoxError(f"not a directory: {src_p}")
    if dtype not in ("f16", "f32"):
        raise KairoxError(f"--type must be f16 or f32, got {dtype!r}")
    check_output_file(out_p)
    cfg = _read_config(src_p)
    st = SafeTensors(_checkpoint_files(src_p))
    plan = _plan(st, cfg)
    e, f, n_layer = cfg["hidden_size"], cfg["ffn_dim"], cfg["num_hidden_layers"]
    n_vocab = plan[0].shape[0]
    tokens, types, merges, special = _vocab(src_p, n_vocab)

    mat_dt = np.float16 if dtype == "f16" else np.float32
    with atomic_file(out_p) as tmp:
        w = GGUFWriter(tmp, ARCH)
        w.add_name(Path(cfg.get("_name_or_path", src_p.name)).name or "opt")
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(e)
        w.add_feed_forward_length(f)
        w.add_block_count(n_layer)
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_attention_heads"])
        w.add_layer_norm_eps(1e-5)
        w.add_file_type(LlamaFileType.MOSTLY_F16 if dtype == "f16" else LlamaFileType.ALL_F32)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        if "bos" in special:
            w.add_bos_token_id(special["bos"])
            w.add_add_bos_token(True)  # OPT's tokenizer starts every text with </s>
        if "eos" in special:
            w.add_eos_token_id(special["eos"])
        if "pad" in special:
            w.add_pad_token_id(special["pad"])
        if "unk" in special:
            w.add_unk_token_id(special["unk"])

        def planned(t: _Tensor) -> NewTensor:
            dt = np.dtype(mat_dt if len(t.shape) == 2 else np.float32)
            return NewTensor(t.gguf, t.out_shape, dt, int(np.prod(t.out_shape)) * dt.itemsize, None,
                             lambda: np.ascontiguousarray(st.get(t.hf)[t.skip_rows:], dtype=dt))

        write_tensors(w, [planned(t) for t in plan], console, label="writing tensors")
    return out_p

