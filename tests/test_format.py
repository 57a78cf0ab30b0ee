"""The Kairox format names: kairox_py.format mirrors kairox.h (checked through the library)."""
from __future__ import annotations

from kairox_py import _lib
from kairox_py import format as fmt


def test_every_name_matches_the_library() -> None:
    for ident, name in fmt.NAMES.items():
        got = _lib.kairox_format_name(ident.encode())
        assert got is not None, f"the library does not know {ident}"
        assert got.decode() == name, ident


def test_unknown_id_is_null() -> None:
    assert _lib.kairox_format_name(b"KEY_NO_SUCH_THING") is None


def test_tensor_name() -> None:
    assert fmt.tensor_name(fmt.TENSOR_DOWN_T, 3) == "blk.3.ffn_down_t.weight"
    assert fmt.tensor_name(fmt.TENSOR_PRED_UP, 0, "bias") == "blk.0.kx_pred_up.bias"
    assert fmt.tensor_name(fmt.TENSOR_PERM, 7, "") == "blk.7.kx_perm"


def test_format_doc_names_every_key_and_tensor() -> None:
    from conftest import REPO

    doc = (REPO / "docs" / "FORMAT.md").read_text()
    for name in fmt.NAMES.values():
        assert name.replace("%d", "N") in doc, name
