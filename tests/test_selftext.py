"""Self-text profiling text: the prompt set, the half-and-half mix, generation and its cache."""
from __future__ import annotations

from pathlib import Path

import pytest

from kairox_py import KairoxError
from kairox_py.offline.corpus import Corpus
from kairox_py.offline.selftext import generate_self_text, load_selftext_prompts, mix_corpora


def test_default_prompts_have_both_kinds() -> None:
    prompts = load_selftext_prompts()
    assert len(prompts) >= 32
    assert any(chat for _, chat in prompts) and any(not chat for _, chat in prompts)
    assert all(p and not p.startswith(("+", "#")) for p, _ in prompts)


def test_prompt_file_errors(tmp_path: Path) -> None:
    with pytest.raises(KairoxError, match="not found"):
        load_selftext_prompts(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(KairoxError, match="no prompts"):
        load_selftext_prompts(empty)
    one = tmp_path / "one.txt"
    one.write_text("+ Once upon a time\nWhat is rain?\n")
    assert load_selftext_prompts(one) == [("Once upon a time", False), ("What is rain?", True)]


def test_mix_is_half_and_half() -> None:
    base = Corpus("".join(f"<{i:05d}>" for i in range(20000)), "base")  # 140000 chars
    extra = Corpus("x" * 7000, "extra")
    mixed = mix_corpora(base, extra)
    head, tail = mixed.text[: -len(extra.text)], mixed.text[-len(extra.text):]
    assert tail == extra.text
    assert abs(len(head) - len(extra.text)) < 200  # the base's share: about as long as extra
    assert "<00000>" in head and "<19999>" in head  # excerpts spread from start to end
    assert "base" in mixed.description and "extra" in mixed.description
    short = Corpus("tiny", "short")
    assert mix_corpora(short, extra).text == "tiny\n\n" + extra.text  # all of a short base


def test_generate_is_cached_and_deterministic(tmp_path: Path, model_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROX_CACHE", str(tmp_path / "cache"))
    prompts = [("Name three colours.", True), ("The river ran past the mill and", False)]
    first = generate_self_text(model_path, 48, threads=2, seed=7, prompts=prompts)
    assert "Name three colours." in first.text and "The river ran past the mill and" in first.text
    assert len(first.text) > 60
    files = list((tmp_path / "cache" / "selftext").iterdir())
    assert len(files) == 1 and files[0].read_text() == first.text
    again = generate_self_text(model_path, 48, threads=2, seed=7, prompts=prompts)
    assert again.text == first.text and "cached" in again.description
    files[0].unlink()  # regenerated from scratch: the same seed gives the same text
    assert generate_self_text(model_path, 48, threads=2, seed=7, prompts=prompts).text == first.text
    with pytest.raises(KairoxError, match="at least 1"):
        generate_self_text(model_path, 0, prompts=prompts)


def test_profile_cli_mixes_self_text(run_cli, tmp_path: Path, model_path: Path,  # type: ignore[no-untyped-def]
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`kairox profile --self-text N` profiles the corpus and the generated text together
    (the profile's corpus description names both)."""
    import json

    monkeypatch.setenv("KAIROX_CACHE", str(tmp_path / "cache"))  # inherited by the subprocess
    out = tmp_path / "prof"
    proc = run_cli("profile", str(model_path), "-o", str(out), "--tokens", "256", "--self-text", "64",
                   "-t", "2")
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert "self-text" in meta["corpus"] and "pydoc" in meta["corpus"]
    assert len(list((tmp_path / "cache" / "selftext").iterdir())) == 1


def test_default_self_text_depends_on_model_size(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversions that do not ask get self-text for small models only (generation runs at
    decode speed: a 7B model would spend half an hour on it)."""
    import kairox_py.offline.convert as conv

    inp = conv.open_input(model_path)
    assert conv.default_self_text(inp) == conv.DEFAULT_SELF_TEXT  # 135M parameters
    monkeypatch.setattr(conv, "SELF_TEXT_MAX_PARAMS", 100_000_000)
    assert conv.default_self_text(inp) == 0
