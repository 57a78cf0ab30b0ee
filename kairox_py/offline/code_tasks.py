"""`kairox passk`: pass@1 of a model on Python function-completion tasks, dense vs sparse.

Perplexity says how far a sparse model's next-token distribution moves; it does not say
whether the model still writes working code. This module asks a chat model to complete
small Python functions (kairox_py/data/code_tasks.jsonl: a signature plus docstring, an
entry point and asserts) and runs each answer against its tests, so that a conversion can
be judged by the share of tasks it still solves.

How it works and why:

* One user message per task, formatted with the GGUF's chat template, asks for the whole
  function in one fenced block; decoding is greedy (temperature 0), so one sample per task
  is the model's answer and pass@1 is the share of tasks passed.
* Generation stops as soon as the reply holds a closed code block that defines the entry
  point (the model's explanation after it never changes the verdict, and skipping it saves
  most of the decode time), else at max_tokens or the end of the model's turn.
* Code is taken from the first fenced block that defines the entry point, else the first
  fenced block, else the reply's code lines; a full definition replaces the prompt's stub
  (the prompt's imports stay), a bare body is indented under the prompt's signature.
* The program (prompt, answer, tests) runs in a fresh `python -I` in a temporary directory
  with the tests in the same module, stdin closed, CPU, memory and file-size limits, its
  own process group and a wall-clock timeout, so a looping or greedy answer costs seconds
  and cannot outlive the run. `if __name__ == "__main__":` blocks of an answer do not run
  (the module runs under another name), so the model's own demo code cannot end the
  program before the tests. A task passes only when the runner reaches its end marker.
* The same tasks run in each setting: the original GGUF dense (--reference, the honest
  baseline), the Kairox GGUF dense and the Kairox GGUF in its own sparse mode (a plain
  GGUF has only dense). Sparse mode here is the runtime's: prompt batches above the
  library's sparse-token limit take the dense FFN, decoding takes the sparse one.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import TaskID

from ..errors import KairoxError
from ..outputs import atomic_files_into
from ..progress import make_progress

if TYPE_CHECKING:
    from ..chat import ChatModel

#: the package's own task set
DEFAULT_TASKS = "data/code_tasks.jsonl"
#: most tokens of one answer: the tasks' functions fit in about 200, the echoed docstring adds some
DEFAULT_MAX_TOKENS = 512
#: seconds one program (answer plus tests) may run; the reference solutions take well under one
DEFAULT_TIMEOUT = 10.0
#: address-space limit of a program: far above what any task needs, far below the machine's
MEMORY_LIMIT = 2 << 30
#: largest file (stdout and stderr go to files) a program may write
FILE_LIMIT = 16 << 20
#: the verdicts of one task
STATUSES = ("passed", "failed", "error", "timeout")
#: written by the runner after the tests: its absence means the program ended early
PASS_MARKER = "kairox-code-task-tests-passed"

REQUIRED_FIELDS = ("id", "prompt", "entry_point", "test")

#: runs one program: limits first, then the module under a name other than __main__; exit
#: status 3 = a failed assert, 4 = any other exception (SystemExit included: an answer that
#: exits has not passed its tests)
_RUNNER = r"""
import sys
path, marker, mem, cpu, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
try:
    import resource
    for lim, val in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize)):
        try:
            resource.setrlimit(lim, (val, val))
        except (ValueError, OSError):
            pass
except ImportError:
    pass
import runpy, traceback
try:
    runpy.run_path(path, run_name="candidate")
except AssertionError:
    traceback.print_exc()
    sys.exit(3)
except BaseException:
    traceback.print_exc()
    sys.exit(4)
with open(marker, "w") as f:
    f.write("ok")
"""


@dataclass(frozen=True)
class CodeTask:
    """One problem: the prompt (imports, signature, docstring) the model completes, the
    name of the function the tests call, and the tests (asserts run after the answer)."""

    id: str
    prompt: str
    entry_point: str
    test: str
    category: str = ""
    difficulty: str = ""


@dataclass(frozen=True)
class Setting:
    """One column of the comparison: a label, the GGUF and the mode it runs in."""

    label: str
    path: str
    mode: str


@dataclass(frozen=True)
class Verdict:
    """What running one program gave: a status of STATUSES and a short reason."""

    status: str
    detail: str = ""


@dataclass(frozen=True)
class TaskResult:
    """One task in one setting (a row of results.csv)."""

    id: str
    mode: str  # the setting's label: original, dense or sparse
    passed: bool
    status: str
    tokens: int
    seconds: float
    gguf: str
    difficulty: str
    finish: str  # stop (end of turn), fence (code block complete) or length (max_tokens)
    detail: str


# ---------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------
def _parse_task(obj: object, where: str) -> CodeTask:
    if not isinstance(obj, dict):
        raise KairoxError(f"{where}: a task must be a JSON object")
    for key in REQUIRED_FIELDS:
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise KairoxError(f"{where}: field {key!r} must be a non-empty string")
    task = CodeTask(id=obj["id"], prompt=obj["prompt"], entry_point=obj["entry_point"], test=obj["test"],
                    category=str(obj.get("category", "")), difficulty=str(obj.get("difficulty", "")))
    if not task.entry_point.isidentifier():
        raise KairoxError(f"{where}: entry_point {task.entry_point!r} is not a Python name")
    if not re.search(rf"^def {re.escape(task.entry_point)}\s*\(", task.prompt, re.M):
        raise KairoxError(f"{where}: the prompt does not define {task.entry_point}()")
    for part in ("prompt", "test"):
        try:
            compile(getattr(task, part), f"<{task.id} {part}>", "exec")
        except SyntaxError as e:
            raise KairoxError(f"{where}: the {part} is not valid Python: {e.msg} (line {e.lineno})") from None
    return task


def load_tasks(path: str | os.PathLike[str] | None = None) -> list[CodeTask]:
    """The tasks of a JSONL file (one object per line with id, prompt, entry_point, test and
    optionally category and difficulty), or of the package's set when path is None.
    KairoxError names the line of a malformed task or a repeated id."""
    if path is None:
        text = resources.files("kairox_py").joinpath(DEFAULT_TASKS).read_text(encoding="utf-8")
        name = DEFAULT_TASKS
    else:
        p = Path(path)
        if not p.is_file():
            raise KairoxError(f"task file not found: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise KairoxError(f"cannot read task file {p}: {e}") from None
        name = str(p)
    tasks: list[CodeTask] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise KairoxError(f"{where}: not JSON ({e.msg})") from None
        task = _parse_task(obj, where)
        if task.id in seen:
            raise KairoxError(f"{where}: task id {task.id!r} repeats")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise KairoxError(f"{name} holds no tasks")
    return tasks


def select_tasks(tasks: Sequence[CodeTask], ids: Sequence[str] = (), limit: int | None = None) -> list[CodeTask]:
    """The tasks named by ids (in the file's order; KairoxError for an unknown id), then at
    most the first `limit` of them."""
    chosen = list(tasks)
    if ids:
        known = {t.id for t in tasks}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise KairoxError(f"unknown task id(s): {', '.join(unknown)}")
        wanted = set(ids)
        chosen = [t for t in tasks if t.id in wanted]
    return chosen[:limit] if limit is not None else chosen


# ---------------------------------------------------------------------------------------
# The request and the answer's code
# ---------------------------------------------------------------------------------------
def user_message(task: CodeTask) -> str:
    """The one user message of a task: the prompt in a fenced block, and what to reply.
    Chat-tuned coder models answer with the whole function (docstring included, whatever
    the message says), so the message asks for exactly that rather than a bare body."""
    return ("Complete the following Python function. Reply with the complete function in a "
            "single ```python code block.\n\n"
            f"```python\n{task.prompt.rstrip()}\n```")


_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[ \t]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M)
_CLOSED_FENCE = re.compile(r"^[ \t]*```[ \t]*[\w+.-]*[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)
_CODE_START = re.compile(r"^(def |async def |class |import |from |@)")


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.M) is not None


def code_block_done(text: str, entry_point: str) -> bool:
    """Whether text holds a closed fenced block that defines entry_point: the point where
    generation can stop, as the rest of the reply cannot change the extracted code."""
    return any(_defines(m.group(1), entry_point) for m in _CLOSED_FENCE.finditer(text))


def _parses(code: str) -> bool:
    try:
        compile(code, "<answer>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def _code_lines(reply: str) -> str:
    """The code of a reply without fences: from the first line that starts a definition or
    import to the longest run of lines that parses (prose after the code is dropped). A
    reply with no such line is taken whole (a bare function body)."""
    lines = reply.splitlines()
    start = next((i for i, ln in enumerate(lines) if _CODE_START.match(ln)), None)
    if start is None:
        return reply
    for end in range(len(lines), start, -1):
        chunk = "\n".join(lines[start:end])
        if _parses(chunk):
            return chunk
    return "\n".join(lines[start:])


def extract_code(reply: str, entry_point: str) -> str:
    """The code of a model's reply: the first fenced block that defines entry_point, else the
    first non-empty fenced block (a block cut off by max_tokens counts), else the reply's
    code lines. '' when there is none (no text, or only empty blocks)."""
    fences = [m.group(2) for m in _FENCE.finditer(reply)]
    blocks = [b for b in fences if b.strip()]
    if fences and not blocks:
        return ""
    chosen = next((b for b in blocks if _defines(b, entry_point)), blocks[0] if blocks else None)
    code = chosen if chosen is not None else _code_lines(reply)
    return code.strip("\n") if code.strip() else ""


def build_program(task: CodeTask, code: str) -> str:
    """The program that checks an answer: the prompt, then the answer (a full definition,
    which replaces the prompt's docstring-only stub, or a body indented under the prompt's
    signature), then the tests."""
    if _defines(code, task.entry_point):
        answer = "\n\n" + textwrap.dedent(code)
    else:
        answer = textwrap.indent(textwrap.dedent(code), "    ")
    return f"{task.prompt.rstrip()}\n{answer.rstrip()}\n\n\n{task.test.rstrip()}\n"


# ---------------------------------------------------------------------------------------
# Running a program
# ---------------------------------------------------------------------------------------
def _last_lines(text: str, n: int = 2, width: int = 240) -> str:
    """The end of a traceback: the failing line and the exception (Python 3.11+'s marker
    lines of ^ and ~ left out)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip(" ^~")]
    return " / ".join(lines[-n:])[-width:]


def run_program(program: str, timeout: float = DEFAULT_TIMEOUT) -> Verdict:
    """Run a program in a fresh, isolated interpreter (see the module's notes) and say how
    it ended: passed (the runner's end marker), failed (an assert), error (any other
    exception, or an early exit), timeout (killed after `timeout` seconds)."""
    with tempfile.TemporaryDirectory(prefix="kairox-code-") as tmp:
        d = Path(tmp)
        src, marker = d / "candidate.py", d / "passed"
        src.write_text(program, encoding="utf-8")
        cpu = max(1, int(timeout) + 1)
        cmd = [sys.executable, "-I", "-c", _RUNNER, str(src), str(marker), str(MEMORY_LIMIT), str(cpu),
               str(FILE_LIMIT)]
        env = {"PATH": os.defpath, "HOME": tmp, "LC_ALL": "C.UTF-8"}
        with open(d / "stdout", "wb") as out, open(d / "stderr", "wb") as err:
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                # the whole group: an answer that started processes leaves none behind
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        stderr = (d / "stderr").read_text(encoding="utf-8", errors="replace")
        if rc is None or rc == -getattr(signal, "SIGXCPU", -1000):
            return Verdict("timeout", f"ran over {timeout:g} s")
        if rc == 0 and marker.is_file():
            return Verdict("passed")
        if rc == 3:
            return Verdict("failed", _last_lines(stderr))
        if rc == 0:
            return Verdict("error", "the program exited before its tests ended")
        return Verdict("error", _last_lines(stderr) or f"exit status {rc}")


def check_answer(task: CodeTask, reply: str, timeout: float = DEFAULT_TIMEOUT) -> Verdict:
    """The verdict on a reply to a task: its code run against the task's tests."""
    code = extract_code(reply, task.entry_point)
    if not code:
        return Verdict("error", "no code in the reply")
    return run_program(build_program(task, code), timeout)


# ---------------------------------------------------------------------------------------
# Running a model
# ---------------------------------------------------------------------------------------
def settings_for(model: str, has_sparse: bool, reference: str | None = None,
                 only: Sequence[str] = ()) -> list[Setting]:
    """What one run compares: the reference GGUF dense, the model dense, and (a Kairox GGUF)
    the model in its own sparse mode; `only` keeps the named ones (a run is minutes per
    setting, and greedy answers of a setting scored before do not change)."""
    out = [Setting("original", reference, "dense")] if reference else []
    out.append(Setting("dense", model, "dense"))
    if has_sparse:
        out.append(Setting("sparse", model, "auto"))
    if only:
        missing = set(only) - {s.label for s in out}
        if missing:
            raise KairoxError(f"no {', '.join(sorted(missing))} setting for this run (the original needs "
                              "--reference, sparse a Kairox GGUF)")
        out = [s for s in out if s.label in only]
    return out


def ask(chat: ChatModel, task: CodeTask, max_tokens: int) -> tuple[str, int, str]:
    """One greedy reply of a ChatModel to a task: (text, tokens generated, finish reason).
    Streams, and closes the stream once code_block_done; a content delta is one token (a
    character split over tokens, rare in code, counts once)."""
    stream = chat.create_chat_completion(
        [{"role": "user", "content": user_message(task)}], stream=True, max_tokens=max_tokens,
        temperature=0.0)
    text, tokens, finish = "", 0, "length"
    try:
        for chunk in stream:
            choice = chunk["choices"][0]
            piece = choice["delta"].get("content")
            if piece:
                text += piece
                tokens += 1
                # a closing fence ends with a backtick: only then can the block have completed
                if "`" in piece and code_block_done(text, task.entry_point):
                    finish = "fence"
                    break
            if choice["finish_reason"] is not None:
                finish = choice["finish_reason"]
    finally:
        stream.close()
    return text, tokens, finish


@dataclass
class Reply:
    """The raw reply of one task in one setting (replies.jsonl): for reading failures."""

    id: str
    mode: str
    reply: str


def run_setting(setting: Setting, tasks: Sequence[CodeTask], *, threads: int | None = None,
                max_tokens: int = DEFAULT_MAX_TOKENS, timeout: float = DEFAULT_TIMEOUT,
                on_task: Callable[[TaskResult], None] | None = None) -> tuple[list[TaskResult], list[Reply]]:
    """Every task in one setting: load the GGUF in the setting's mode, ask, check."""
    from ..chat import ChatModel  # the native library loads only when a model runs

    results: list[TaskResult] = []
    replies: list[Reply] = []
    gguf = Path(setting.path).name
    with ChatModel(setting.path, mode=setting.mode, n_threads=threads) as chat:
        for task in tasks:
            t0 = time.perf_counter()
            reply, tokens, finish = ask(chat, task, max_tokens)
            seconds = time.perf_counter() - t0
            verdict = check_answer(task, reply, timeout)
            r = TaskResult(task.id, setting.label, verdict.status == "passed", verdict.status, tokens,
                           round(seconds, 2), gguf, task.difficulty, finish, verdict.detail)
            results.append(r)
            replies.append(Reply(task.id, setting.label, reply))
            if on_task is not None:
                on_task(r)
    return results, replies


def run_settings(settings: Sequence[Setting], tasks: Sequence[CodeTask], *, threads: int | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, timeout: float = DEFAULT_TIMEOUT,
                 console: Console | None = None) -> tuple[list[TaskResult], list[Reply]]:
    """Each setting in turn (one model loaded at a time), a progress bar each."""
    results: list[TaskResult] = []
    replies: list[Reply] = []
    with make_progress(console) as bar:
        for s in settings:
            bid = bar.add_task(f"{s.label}: 0 passed", total=len(tasks))
            passed = 0

            def step(r: TaskResult, bid: TaskID = bid) -> None:
                nonlocal passed
                passed += r.passed
                bar.update(bid, advance=1, description=f"{r.mode}: {passed} passed")

            res, rep = run_setting(s, tasks, threads=threads, max_tokens=max_tokens, timeout=timeout,
                                   on_task=step)
            results += res
            replies += rep
    return results, replies


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------
def pass_at_1(results: Iterable[TaskResult]) -> dict[str, float]:
    """Share of tasks passed per setting label (greedy decoding: one sample per task)."""
    total: dict[str, int] = {}
    passed: dict[str, int] = {}
    for r in results:
        total[r.mode] = total.get(r.mode, 0) + 1
        passed[r.mode] = passed.get(r.mode, 0) + r.passed
    return {m: passed[m] / total[m] for m in total}


def differing_tasks(results: Sequence[TaskResult]) -> list[tuple[str, dict[str, TaskResult]]]:
    """The tasks whose pass/fail differs between settings, with each setting's result."""
    by_task: dict[str, dict[str, TaskResult]] = {}
    for r in results:
        by_task.setdefault(r.id, {})[r.mode] = r
    return [(tid, rs) for tid, rs in by_task.items() if len({r.passed for r in rs.values()}) > 1]


def markdown_report(results: Sequence[TaskResult], title: str) -> str:
    """pass@1 per setting (with the count of each status, by difficulty), and the tasks on
    which the settings disagree."""
    labels = list(dict.fromkeys(r.mode for r in results))
    lines = [f"### {title}", "",
             "| setting | GGUF | passed | pass@1 | failed | error | timeout | mean tokens | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in labels:
        rs = [r for r in results if r.mode == m]
        n = {s: sum(r.status == s for r in rs) for s in STATUSES}
        mean_tok = sum(r.tokens for r in rs) / len(rs)
        lines.append(f"| {m} | {rs[0].gguf} | {n['passed']}/{len(rs)} | {100 * n['passed'] / len(rs):.1f}% | "
                     f"{n['failed']} | {n['error']} | {n['timeout']} | {mean_tok:.0f} | "
                     f"{sum(r.seconds for r in rs):.0f} |")
    levels = [d for d in ("easy", "medium", "hard") if any(r.difficulty == d for r in results)]
    levels += sorted({r.difficulty for r in results} - set(levels) - {""})
    if levels:
        first = [r for r in results if r.mode == labels[0]]
        counts = {d: sum(r.difficulty == d for r in first) for d in levels}
        lines += ["", "pass@1 by difficulty:", "",
                  "| setting | " + " | ".join(f"{d} ({counts[d]})" for d in levels) + " |",
                  "| --- |" + " --- |" * len(levels)]
        for m in labels:
            cells = []
            for d in levels:
                rs = [r for r in results if r.mode == m and r.difficulty == d]
                cells.append(f"{100 * sum(r.passed for r in rs) / len(rs):.0f}%" if rs else "-")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if len(labels) > 1:
        diff = differing_tasks(results)
        lines += ["", f"Tasks where the settings differ: {len(diff)}", ""]
        if "dense" in labels and "sparse" in labels:
            pairs = [(by["dense"].passed, by["sparse"].passed) for _, by in diff if "dense" in by and "sparse" in by]
            lines += [f"dense vs sparse: {sum(1 for p in pairs if p[0] != p[1])} differ "
                      f"({sum(1 for p in pairs if p[0] and not p[1])} pass only dense, "
                      f"{sum(1 for p in pairs if p[1] and not p[0])} pass only sparse)", ""]
        if diff:
            lines += ["| task | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
            for tid, by in diff:
                lines.append(f"| {tid} | " + " | ".join(by[m].status if m in by else "-" for m in labels) + " |")
    return "\n".join(lines) + "\n"


def write_results(results: Sequence[TaskResult], replies: Sequence[Reply], out_dir: str | os.PathLike[str],
                  report: str) -> list[Path]:
    """results.csv (a row per task per setting), results.md (the report) and replies.jsonl
    (the raw replies) in out_dir, each file replaced whole."""
    names = ["results.csv", "results.md", "replies.jsonl"]
    with atomic_files_into(out_dir) as tmp:
        with open(tmp / "results.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(TaskResult.__dataclass_fields__))
            w.writeheader()
            for r in results:
                w.writerow(asdict(r))
        (tmp / "results.md").write_text(report, encoding="utf-8")
        with open(tmp / "replies.jsonl", "w", encoding="utf-8") as f:
            for rep in replies:
                f.write(json.dumps(asdict(rep), ensure_ascii=False) + "\n")
    return [Path(out_dir) / n for n in names]
