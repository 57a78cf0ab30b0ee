"""The code-task set and its pass@1 harness (kairox_py/offline/code_tasks.py, `kairox passk`).

The set is only worth its numbers if every task is solvable as its docstring says and its
tests catch wrong answers: each reference solution (tests/data/code_task_solutions.py) must
pass through the same harness a model's reply goes through, and a do-nothing function, as
well as a few plausible wrong ones, must fail. The rest checks the harness's pieces: code
extraction from the shapes replies take, the sandboxed run's verdicts, the report, the
CLI's checks (made before any model loads), and one short run of the default model.
"""
from __future__ import annotations

import csv
import json
import runpy
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kairox_py.cli import _run
from kairox_py.errors import KairoxError
from kairox_py.outputs import pid_alive
from kairox_py.offline import code_tasks as ct
from kairox_py.offline.code_tasks import (
    STATUSES,
    TaskResult,
    build_program,
    check_answer,
    code_block_done,
    extract_code,
    load_tasks,
    markdown_report,
    pass_at_1,
    run_program,
    select_tasks,
)

_REFS = runpy.run_path(str(Path(__file__).parent / "data" / "code_task_solutions.py"))
SOLUTIONS: dict[str, str] = _REFS["SOLUTIONS"]
WRONG: dict[str, str] = _REFS["WRONG"]
TASKS = load_tasks()
BY_ID = {t.id: t for t in TASKS}


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code.strip()}\n```\n\nIt works by counting."


# ---- the task set ------------------------------------------------------------------------
def test_task_set_shape() -> None:
    assert len(TASKS) >= 40
    assert len({t.id for t in TASKS}) == len(TASKS)
    assert set(SOLUTIONS) == set(BY_ID)  # a reference for every task, none for a lost one
    assert set(WRONG) <= set(BY_ID)
    levels = Counter(t.difficulty for t in TASKS)
    assert set(levels) == {"easy", "medium", "hard"} and levels["hard"] >= 3
    assert len({t.category for t in TASKS}) >= 5
    for t in TASKS:
        assert f"def {t.entry_point}(" in t.prompt and '"""' in t.prompt, t.id
        assert t.entry_point in t.test and "assert" in t.test, t.id


@pytest.mark.parametrize("task_id", sorted(BY_ID))
def test_reference_solution_passes(task_id: str) -> None:
    v = check_answer(BY_ID[task_id], fenced(SOLUTIONS[task_id]))
    assert v.status == "passed", v


@pytest.mark.parametrize("task_id", sorted(BY_ID))
def test_do_nothing_answer_fails(task_id: str) -> None:
    t = BY_ID[task_id]
    v = check_answer(t, fenced(f"def {t.entry_point}(*args, **kwargs):\n    return None"))
    assert v.status in ("failed", "error"), v


@pytest.mark.parametrize("task_id", sorted(WRONG))
def test_plausible_wrong_answer_fails(task_id: str) -> None:
    v = check_answer(BY_ID[task_id], fenced(WRONG[task_id]))
    assert v.status == "failed", v
    assert "assert" in v.detail  # the failing assert is named


# ---- extracting code from replies --------------------------------------------------------
VOWELS = BY_ID["count_vowels"]
BODY = 'return sum(1 for c in text.lower() if c in "aeiou")'
FULL = f"def count_vowels(text: str) -> int:\n    {BODY}"


@pytest.mark.parametrize("reply", [
    pytest.param(f"```python\n{FULL}\n```", id="fenced"),
    pytest.param(f"Sure! Here it is:\n```python\n{FULL}\n```\nThis counts vowels.\n```python\n"
                 "print(count_vowels('x'))\n```", id="fenced-with-prose-and-demo"),
    pytest.param(f"```\n{FULL}\n```", id="fenced-no-language"),
    pytest.param(f"```py\nfrom typing import *\n\n{FULL}\n```", id="fenced-py-imports"),
    pytest.param(f"```python\nprint('usage first')\n```\n\n```python\n{FULL}\n```", id="second-block-defines"),
    pytest.param(f"{FULL}\n\nThis function counts the vowels.", id="bare-with-prose"),
    pytest.param(f"Here you go:\n{FULL}\n", id="bare-after-prose"),
    pytest.param(f"    {BODY}\n", id="body-indented"),
    pytest.param(f"{BODY}\n", id="body-flush"),
    pytest.param(f"```python\n    {BODY}\n```", id="body-fenced"),
    pytest.param(f"```python\n{FULL}\n", id="unclosed-fence"),
    pytest.param(f"```python\n{FULL}\n\nif __name__ == '__main__':\n    import sys\n    sys.exit(1)\n```",
                 id="main-guard-not-run"),
])
def test_reply_shapes_pass(reply: str) -> None:
    v = check_answer(VOWELS, reply)
    assert v.status == "passed", (v, build_program(VOWELS, extract_code(reply, "count_vowels")))


def test_extract_prefers_the_defining_block() -> None:
    reply = f"```python\nx = 1\n```\n```python\n{FULL}\n```\n```python\ny = 2\n```"
    assert extract_code(reply, "count_vowels") == FULL
    assert extract_code("```python\nx = 1\n```", "count_vowels") == "x = 1"
    assert extract_code("I cannot help with that.", "count_vowels") == "I cannot help with that."
    assert extract_code("", "count_vowels") == ""
    assert extract_code("```python\n\n```", "count_vowels") == ""


def test_no_code_is_an_error() -> None:
    assert check_answer(VOWELS, "").status == "error"
    v = check_answer(VOWELS, "I think you should count the vowels.")
    assert v.status == "error"


def test_code_block_done() -> None:
    assert not code_block_done("```python\ndef count_vowels(text):\n    return 0\n", "count_vowels")
    assert not code_block_done("```python\nprint(1)\n```", "count_vowels")
    assert not code_block_done("```python\ndef count_vowels_x(t):\n    pass\n```", "count_vowels")
    assert code_block_done("Here:\n```python\ndef count_vowels(text):\n    return 0\n```", "count_vowels")


# ---- running programs --------------------------------------------------------------------
def test_infinite_loop_is_a_timeout() -> None:
    t0 = time.perf_counter()
    v = run_program("while True:\n    pass\n", timeout=1.0)
    assert v.status == "timeout", v
    assert time.perf_counter() - t0 < 10


def test_child_processes_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    prog = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "while True:\n    pass\n")
    assert run_program(prog, timeout=2.0).status == "timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:  # killed; init reaps it
        time.sleep(0.05)
    assert not pid_alive(pid)


@pytest.mark.parametrize("program,status", [
    ("assert 1 + 1 == 2\n", "passed"),
    ("assert 1 + 1 == 3\n", "failed"),
    ("raise KeyError('x')\n", "error"),
    ("def f(:\n", "error"),
    ("import sys\nsys.exit(0)\nassert False\n", "error"),  # exits before its tests: not a pass
    ("import os\nos._exit(0)\n", "error"),
    (f"import resource\nassert resource.getrlimit(resource.RLIMIT_AS)[0] == {ct.MEMORY_LIMIT}\n"
     f"assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == {ct.FILE_LIMIT}\n"
     "assert resource.getrlimit(resource.RLIMIT_CPU)[0] == 6\n", "passed"),
    ("print('x' * 100000)\nassert True\n", "passed"),  # output goes to a file, not a pipe
    ("input()\n", "error"),  # stdin is closed
])
def test_program_verdicts(program: str, status: str) -> None:
    v = run_program(program, timeout=5.0)
    assert v.status == status, v


def test_error_detail_names_the_exception() -> None:
    v = check_answer(VOWELS, "```python\ndef count_vowels(text):\n    return undefined_name\n```")
    assert v.status == "error" and "NameError" in v.detail


# ---- loading task files ------------------------------------------------------------------
GOOD = {"id": "t1", "prompt": 'def f(x: int) -> int:\n    """Twice x."""\n', "entry_point": "f",
        "test": "assert f(2) == 4\n"}


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rows,message", [
    ([GOOD, GOOD], "repeats"),
    (["{not json"], "not JSON"),
    ([{**GOOD, "test": ""}], "'test'"),
    ([{k: v for k, v in GOOD.items() if k != "entry_point"}], "'entry_point'"),
    ([{**GOOD, "entry_point": "g"}], "does not define g()"),
    ([{**GOOD, "test": "assert (\n"}], "not valid Python"),
    ([], "holds no tasks"),
    ([[1, 2]], "JSON object"),
])
def test_bad_task_files(tmp_path: Path, rows: list[Any], message: str) -> None:
    with pytest.raises(KairoxError, match="line|holds no tasks") as e:
        load_tasks(_write(tmp_path / "tasks.jsonl", rows))
    assert message in str(e.value)


def test_own_task_file_and_selection(tmp_path: Path) -> None:
    tasks = load_tasks(_write(tmp_path / "tasks.jsonl", [GOOD, {**GOOD, "id": "t2"}]))
    assert [t.id for t in tasks] == ["t1", "t2"]
    assert check_answer(tasks[0], "```python\ndef f(x: int) -> int:\n    return 2 * x\n```").status == "passed"
    assert [t.id for t in select_tasks(tasks, ["t2"])] == ["t2"]
    assert [t.id for t in select_tasks(tasks, limit=1)] == ["t1"]
    with pytest.raises(KairoxError, match="unknown task id"):
        select_tasks(tasks, ["t3"])
    with pytest.raises(KairoxError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl")


# ---- asking a model (a stand-in chat model) ------------------------------------------------
class FakeChat:
    """Streams a fixed reply one character per chunk, as create_chat_completion does, and
    records how far the consumer read."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.sent = 0
        self.closed = False

    def create_chat_completion(self, messages: list[dict[str, str]], **kw: Any) -> Iterator[dict[str, Any]]:
        assert kw["stream"] is True and kw["temperature"] == 0.0
        assert "```python\n" + VOWELS.prompt.rstrip() in messages[0]["content"]

        def gen() -> Iterator[dict[str, Any]]:
            try:
                yield {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}
                for c in self.reply:
                    self.sent += 1
                    yield {"choices": [{"delta": {"content": c}, "finish_reason": None}]}
                yield {"choices": [{"delta": {}, "finish_reason": "stop"}]}
            finally:
                self.closed = True

        return gen()


def test_ask_stops_after_the_code_block() -> None:
    head = f"```python\n{FULL}\n```"
    chat = FakeChat(head + "\n\nExplanation that would take many tokens.")
    text, tokens, finish = ct.ask(chat, VOWELS, 512)  # type: ignore[arg-type]
    assert text == head and tokens == len(head) and finish == "fence" and chat.closed
    chat = FakeChat("no code at all")
    assert ct.ask(chat, VOWELS, 512)[1:] == (len("no code at all"), "stop")  # type: ignore[arg-type]


# ---- the report --------------------------------------------------------------------------
def _result(tid: str, mode: str, status: str, difficulty: str = "easy") -> TaskResult:
    return TaskResult(tid, mode, status == "passed", status, 10, 1.0, f"{mode}.gguf", difficulty, "fence", "")


def test_report_counts_and_differences() -> None:
    rows = [_result("a", "dense", "passed"), _result("a", "sparse", "failed"),
            _result("b", "dense", "passed"), _result("b", "sparse", "passed"),
            _result("c", "dense", "timeout", "hard"), _result("c", "sparse", "passed", "hard")]
    assert pass_at_1(rows) == {"dense": 2 / 3, "sparse": 2 / 3}
    md = markdown_report(rows, "t")
    assert "| dense | dense.gguf | 2/3 | 66.7% | 0 | 0 | 1 |" in md
    assert "dense vs sparse: 2 differ (1 pass only dense, 1 pass only sparse)" in md
    assert "| a | passed | failed |" in md and "| c | timeout | passed |" in md and "| b |" not in md
    assert "| dense | 100% | 0% |" in md  # by difficulty: easy, hard


# ---- the CLI's checks, before any model loads -------------------------------------------
def _never(*_a: object, **_k: object) -> None:
    raise AssertionError("a model ran before the checks")


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kairox_py.commands.passk.run_settings", _never)


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("args,code,message", [
    (["MISSING"], 1, "model file not found"),
    (["NOT_GGUF"], 1, "not a GGUF"),
    (["MODEL", "--reference", "MISSING"], 1, "model file not found"),
    (["MODEL", "--limit", "0"], 2, "--limit"),
    (["MODEL", "--limit", "x"], 2, "--limit"),
    (["MODEL", "--ids", "no_such_task"], 1, "unknown task id(s): no_such_task"),
    (["MODEL", "--tasks", "MISSING"], 1, "task file not found"),
    (["MODEL", "-o", "NO_PARENT"], 1, "directory does not exist"),
    (["MODEL", "--max-tokens", "0"], 2, "--max-tokens"),
])
def test_cli_errors(no_models: None, model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    args: list[str], code: int, message: str) -> None:
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("plain text\n")
    subst = {"MODEL": str(model_path), "MISSING": str(tmp_path / "missing.gguf"), "NOT_GGUF": str(not_gguf),
             "NO_PARENT": str(tmp_path / "a" / "b")}
    assert _run(["passk", *[subst.get(a, a) for a in args]]) == code
    assert message in _one_error(capsys)


# ---- one short run of the default model -------------------------------------------------
def test_default_model_run(run_cli, model_path: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two tasks, short answers: SmolLM2-135M solves next to nothing, so only the shape of the
    results is checked. A plain GGUF runs dense only."""
    out = tmp_path / "out"
    r = run_cli("passk", str(model_path), "--ids", "count_vowels,dedupe", "--max-tokens", "24", "-t", "2",
                "-o", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| setting | GGUF | passed | pass@1 |" in r.stdout and "| dense |" in r.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(row["id"], row["mode"]) for row in rows] == [("count_vowels", "dense"), ("dedupe", "dense")]
    for row in rows:
        assert row["status"] in STATUSES and row["passed"] == str(row["status"] == "passed")
        assert 0 < int(row["tokens"]) <= 24 and float(row["seconds"]) > 0
    assert (out / "results.md").read_text() == r.stdout
    replies = [json.loads(line) for line in (out / "replies.jsonl").read_text().splitlines()]
    assert [x["id"] for x in replies] == ["count_vowels", "dedupe"]



def test_settings_only_keeps_the_named_ones() -> None:
    from kairox_py.offline.code_tasks import settings_for

    all_three = settings_for("kx.gguf", True, "orig.gguf")
    assert [s.label for s in all_three] == ["original", "dense", "sparse"]
    assert [s.label for s in settings_for("kx.gguf", True, "orig.gguf", ["sparse"])] == ["sparse"]
    with pytest.raises(KairoxError, match="no original setting"):
        settings_for("kx.gguf", True, None, ["original"])
