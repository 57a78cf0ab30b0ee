"""Default corpus split (disjoint, deterministic) and user corpus errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from kairox_py import KairoxError
from kairox_py.offline.corpus import default_corpus, default_topics, load_corpus, read_corpus


def test_split_is_disjoint_and_covers_all_topics() -> None:
    from pydoc_data import topics

    prof, ev = default_topics("profile"), default_topics("eval")
    assert set(prof).isdisjoint(ev)
    assert set(prof) | set(ev) <= set(topics.topics)
    assert set(prof.values()).isdisjoint(ev.values())
    assert len(ev) >= 5 and len(prof) > len(ev)


def test_split_is_deterministic() -> None:
    assert default_corpus("eval").text == default_corpus("eval").text
    assert default_corpus("profile").text != default_corpus("eval").text


def test_eval_text_never_in_profile_text() -> None:
    prof = default_corpus("profile").text
    for body in default_topics("eval").values():
        assert body.strip()[:200] not in prof


def test_user_files(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("hello world")
    assert "hello world" in read_corpus([a]).text
    assert load_corpus(None, "eval").text == default_corpus("eval").text


@pytest.mark.parametrize("content", ["", "   \n\n\t"])
def test_empty_corpus_is_an_error(tmp_path: Path, content: str) -> None:
    f = tmp_path / "empty.txt"
    f.write_text(content)
    with pytest.raises(KairoxError, match="empty"):
        read_corpus([f])


def test_missing_corpus_file(tmp_path: Path) -> None:
    with pytest.raises(KairoxError, match="not found"):
        read_corpus([tmp_path / "nope.txt"])
