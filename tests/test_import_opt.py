"""`kairox import-opt`: a Hugging Face OPT checkpoint (as `save_pretrained` writes it: config.json,
GPT-2 BPE vocab.json/merges.txt, model.safetensors) as a GGUF that llama.cpp runs.

No OPT checkpoint can be downloaded here: a tiny one is written by the test with random weights
in HF's naming and conventions (positions offset by 2, tied lm_head, a vocabulary padded past
the tokenizer's last id). The logits llama.cpp computes from the imported GGUF are checked
against OPT's forward pass computed in NumPy from the checkpoint itself, so the importer's
mapping and the architecture (models/opt.cpp) are checked together against HF's definition.
"""
from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import SMALL_OPTS as OPTS
from conftest import all_logits, small_convert, small_profile

from kairox_py import ContextParams, KairoxError, Model
from kairox_py.cli import main as cli_main
from kairox_py.offline.hf_opt import import_opt

E, F, L, H, CTX = 64, 256, 2, 4, 128


def _byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet (bytes mapped to printable characters)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _bf16(a: np.ndarray) -> np.ndarray:
    """`a` rounded to bfloat16 (to nearest even), kept as float32."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> None:
    """A .safetensors file of `tensors`, each stored as dtypes[name] (F32, F16 or BF16; default:
    F16 for float16 arrays, else F32)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt = (dtypes or {}).get(name, "F16" if a.dtype == np.float16 else "F32")
        raw = {"F32": lambda: a.astype(np.float32).tobytes(), "F16": lambda: a.astype(np.float16).tobytes(),
               "BF16": lambda: (_bf16(a).view(np.uint32) >> 16).astype(np.uint16).tobytes()}[dt]()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    d = tmp_path_factory.mktemp("hf-opt")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for t in _byte_tokens():
        vocab[t] = len(vocab)
    merges = ["Ġ t", "h e", "Ġt he"]
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    n_vocab = len(vocab) + 8  # the embedding has rows past the tokenizer's ids, as OPT's does
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (d / "config.json").write_text(json.dumps({
        "model_type": "opt", "hidden_size": E, "ffn_dim": F, "num_hidden_layers": L, "num_attention_heads": H,
        "max_position_embeddings": CTX, "vocab_size": n_vocab, "word_embed_proj_dim": E,
        "do_layer_norm_before": True, "activation_function": "relu", "enable_bias": True}))
    rng = np.random.default_rng(7)

    def r(*shape: int, std: float = 0.1, mean: float = 0.0) -> np.ndarray:
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.decoder.embed_tokens.weight": r(n_vocab, E, std=1.0),
        "model.decoder.embed_positions.weight": r(CTX + 2, E, std=0.3),
        "model.decoder.final_layer_norm.weight": 1.0 + r(E),
        "model.decoder.final_layer_norm.bias": r(E),
    }
    for i in range(L):
        p = f"model.decoder.layers.{i}."
        for ln in ("self_attn_layer_norm", "final_layer_norm"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = 1.0 + r(E), r(E)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[p + f"self_attn.{proj}.weight"], w[p + f"self_attn.{proj}.bias"] = r(E, E, std=E ** -0.5), r(E)
        w[p + "fc1.weight"], w[p + "fc1.bias"] = r(F, E, std=E ** -0.5), r(F, std=0.3, mean=-0.3)
        w[p + "fc2.weight"], w[p + "fc2.bias"] = r(E, F, std=F ** -0.5), r(E)
    w["lm_head.weight"] = w["model.decoder.embed_tokens.weight"]  # tied, as in every OPT
    _write_safetensors(d / "model.safetensors", {k: (v.astype(np.float16) if k.endswith("fc1.weight") else v)
                                                 for k, v in w.items()})
    w["model.decoder.layers.0.fc1.weight"] = w["model.decoder.layers.0.fc1.weight"].astype(np.float16).astype(np.float32)
    w["model.decoder.layers.1.fc1.weight"] = w["model.decoder.layers.1.fc1.weight"].astype(np.float16).astype(np.float32)
    return d, w


def _hf_forward(w: dict[str, np.ndarray], toks: list[int]) -> np.ndarray:
    """OPTForCausalLM's forward pass (pre-norm) in NumPy, in HF's own terms: positions p + 2."""
    def g(n: str) -> np.ndarray:
        return w[n].astype(np.float64)

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g(p + ".weight") + g(p + ".bias")

    n, d = len(toks), E // H
    x = g("model.decoder.embed_tokens.weight")[toks] + g("model.decoder.embed_positions.weight")[np.arange(n) + 2]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(L):
        p = f"model.decoder.layers.{i}."
        h = ln(x, p + "self_attn_layer_norm")
        q, k, v = (h @ g(p + f"self_attn.{c}_proj.weight").T + g(p + f"self_attn.{c}_proj.bias") for c in "qkv")
        q = q * d ** -0.5
        att = []
        for hd in range(H):
            s = slice(hd * d, (hd + 1) * d)
            z = q[:, s] @ k[:, s].T + causal
            a = np.exp(z - z.max(-1, keepdims=True))
            att.append(a / a.sum(-1, keepdims=True) @ v[:, s])
        x = x + np.concatenate(att, -1) @ g(p + "self_attn.out_proj.weight").T + g(p + "self_attn.out_proj.bias")
        h = ln(x, p + "final_layer_norm")
        x = x + np.maximum(h @ g(p + "fc1.weight").T + g(p + "fc1.bias"), 0) @ g(p + "fc2.weight").T + g(p + "fc2.bias")
    return ln(x, "model.decoder.final_layer_norm") @ g("lm_head.weight").T


def test_imported_model_computes_hf_opt(hf_dir: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    d, w = hf_dir
    out = import_opt(d, tmp_path / "opt.gguf", "f32")
    toks = [2, 71, 40, 77, 12, 90, 5, 33, 120, 8, 64, 99]
    got = all_logits(out, toks, mode="dense")
    ref = _hf_forward(w, toks)
    err = float(np.sum((got - ref) ** 2) / np.sum(ref ** 2))
    assert err < 1e-6, err
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_tokenizer_and_cli(hf_dir: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    """The CLI writes an F16 GGUF; its tokenizer is GPT-2's byte-level BPE with OPT's </s>
    first, and text round-trips."""
    d, _ = hf_dir
    out = tmp_path / "opt-f16.gguf"
    with pytest.raises(SystemExit) as e:
        cli_main(["import-opt", str(d), str(out)])
    assert e.value.code == 0 and out.is_file()
    with Model(out, vocab_only=True) as m:
        toks = m.tokenize("the tide")
        assert toks[0] == 2 and len(toks) > 2
        assert m.detokenize(toks[1:]) == "the tide"


def test_bad_checkpoints_are_refused(hf_dir: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    d, _ = hf_dir
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(KairoxError, match="config.json"):
        import_opt(bad, tmp_path / "x.gguf")
    cfg = json.loads((d / "config.json").read_text())
    for change, msg in (({"model_type": "gpt2"}, "not OPT"), ({"do_layer_norm_before": False}, "post-norm"),
                        ({"word_embed_proj_dim": 32}, "projected word embeddings"), ({"ffn_dim": 128}, "shape")):
        for f in ("vocab.json", "merges.txt", "model.safetensors"):
            (bad / f).write_bytes((d / f).read_bytes())
        (bad / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(KairoxError, match=msg):
            import_opt(bad, tmp_path / "x.gguf")
    # a truncated weights file
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-1000])
    with pytest.raises(KairoxError, match="truncated"):
        import_opt(bad, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists() and not list(tmp_path.glob(".x.gguf.tmp*"))


def test_positions_past_the_table_are_an_error(hf_dir: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    """Learned positions end at the training context (128 here): a decode past it fails with an
    error, not a read past the position table; profiling chunks stay within it, so the whole
    chain (import, profile, convert, sparse decode) runs on a model with a short table."""
    d, _ = hf_dir
    out = import_opt(d, tmp_path / "opt.gguf")
    with Model(out) as m, m.session(ContextParams(n_ctx=512, n_batch=512, n_threads=2, mode="dense")) as s:
        with pytest.raises(KairoxError):
            s.decode(list(range(4, 4 + CTX + 8)))
    prof = small_profile(out)
    assert prof.meta.ctx <= CTX
    kx = small_convert(out, prof, replace(OPTS, mode="predictor"))
    toks = list(range(4, 40))
    dense = all_logits(out, toks, mode="dense")
    sparse = all_logits(kx.output, toks, mode="predictor")
    assert (dense.argmax(-1) == sparse.argmax(-1)).mean() >= 0.5


def test_shards_and_bf16(hf_dir: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    """A checkpoint in two shards with an index, some tensors in BF16, imports to the same model
    (its BF16 tensors rounded as the checkpoint holds them); pickled torch weights are refused
    with what to do instead."""
    d, w = hf_dir
    sh = tmp_path / "sharded"
    sh.mkdir()
    for f in ("config.json", "vocab.json", "merges.txt"):
        (sh / f).write_bytes((d / f).read_bytes())
    names = sorted(w)
    dtypes = {n: "BF16" if n.endswith("fc2.weight") else "F16" for n in names if n.endswith(("fc1.weight", "fc2.weight"))}
    index = {}
    for i, part in enumerate([names[: len(names) // 2], names[len(names) // 2:]]):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        _write_safetensors(sh / fn, {n: w[n] for n in part}, dtypes)
        index.update({n: fn for n in part})
    (sh / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    out = import_opt(sh, tmp_path / "sharded.gguf", "f32")
    w2 = {n: (_bf16(a) if dtypes.get(n) == "BF16" else a) for n, a in w.items()}
    toks = [2, 50, 60, 70, 80]
    ref = _hf_forward(w2, toks)
    got = all_logits(out, toks, mode="dense")
    assert float(np.sum((got - ref) ** 2) / np.sum(ref ** 2)) < 1e-6
    pt = tmp_path / "torch"
    pt.mkdir()
    (pt / "config.json").write_bytes((d / "config.json").read_bytes())
    (pt / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(KairoxError, match="safetensors"):
        import_opt(pt, tmp_path / "pt.gguf")
