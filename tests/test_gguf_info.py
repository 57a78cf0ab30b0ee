"""(i) GGUF inspection of the real model, cross-checked against the library."""
from __future__ import annotations

from pathlib import Path

from kairox_py import Model, inspect_gguf


def test_inspect_default_model(model_path: Path, model: Model) -> None:
    s = inspect_gguf(model_path)
    assert s.architecture == "llama"
    assert (s.n_layer, s.n_embd, s.n_ff) == (30, 576, 1536)
    assert (s.n_head, s.n_head_kv) == (9, 3)
    assert s.n_vocab == 49152 == model.n_vocab
    assert s.context_length == 8192
    assert s.file_size == model_path.stat().st_size
    assert s.n_params == model.n_params
    assert set(s.tensor_types) == {"Q4_1", "Q8_0", "F32"}
    assert s.tensor_types["Q8_0"].count == 1  # tied output = token_embd
    assert sum(t.nbytes for t in s.tensor_types.values()) == model.size
    assert not s.has_kairox_data and s.kairox_keys == ()


def test_inspect_kairox_model_shows_values(converted, run_cli) -> None:  # type: ignore[no-untyped-def]
    """`kairox info` on a Kairox GGUF shows what its kairox.* keys hold, not only their names."""
    s = inspect_gguf(converted.output)
    assert s.has_kairox_data
    assert s.kairox_values["kairox.group_size"] == 64  # the fixture converts with groups of 64
    assert len(s.kairox_values["kairox.threshold"]) == 30
    proc = run_cli("info", str(converted.output))
    assert proc.returncode == 0, proc.stderr
    assert "kairox.group_size" in proc.stdout and "30 values" in proc.stdout


def test_inspect_non_utf8_token(tmp_path: Path) -> None:
    """Raw byte tokens that are not UTF-8 do not make a loadable model look corrupt."""
    import gguf
    import numpy as np

    p = tmp_path / "bytes.gguf"
    w = gguf.GGUFWriter(p, "llama")
    w.add_block_count(1)
    w.add_array("tokenizer.ggml.tokens", [b"ok", b"\xff\xfe"])
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert inspect_gguf(p).n_vocab == 2
