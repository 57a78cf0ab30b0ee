"""Repository hygiene: (h) vendor tree == pristine + patches/, and README <-> .ci/run."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO


def test_patches_check() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "patches.py"), "check"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def readme_setup_commands() -> list[str]:
    """The commands of README's first shell code block."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S)
    assert block, "README has no code block"
    return [line.strip() for line in block.group(1).splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_readme_has_two_setup_commands() -> None:
    cmds = readme_setup_commands()
    assert len(cmds) == 2, cmds
    assert "kairox run" in cmds[0] and "pytest" in cmds[1]


def test_ci_runs_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert readme_setup_commands()[1] in ci


def patch_subjects() -> list[str]:
    subjects = []
    for p in sorted((REPO / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch")):
        m = re.search(r"^Subject: \[PATCH[^\]]*\] (.*)$", p.read_text(), re.M)
        assert m, p.name
        subjects.append(m.group(1))
    return subjects


def test_patches_are_one_per_concern() -> None:
    """A short queue, each patch a concern named before its subject's colon; no fix-ups."""
    subjects = patch_subjects()
    assert 1 <= len(subjects) <= 12, subjects
    keys = [s.split(":", 1)[0] for s in subjects]
    assert all(":" in s for s in subjects), subjects
    assert len(set(keys)) == len(keys), keys
    assert not any(re.match(r"(fixup|squash|amend)!|review\b", s) for s in subjects), subjects


def _git(cwd, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


def test_export_amends_the_concern(tmp_path) -> None:
    """`patches.py export --into NAME` folds an edit into that concern's patch: the queue keeps
    its length, and only that patch changes."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "patches").mkdir()
    (tmp_path / "scripts" / "patches.py").write_text((REPO / "scripts" / "patches.py").read_text())
    vendor = tmp_path / "vendor" / "llama.cpp"
    vendor.mkdir(parents=True)
    _git(vendor, "init", "-q", "-b", "kairox")
    (vendor / "up.c").write_text("int up;\n")
    _git(vendor, "add", "-A")
    _git(vendor, "commit", "-q", "-m", "upstream")
    _git(vendor, "tag", "upstream")
    for name, text in (("one", "int one;\n"), ("two", "int two;\n")):
        (vendor / f"{name}.c").write_text(text)
        _git(vendor, "add", "-A")
        _git(vendor, "commit", "-q", "-m", f"{name}: the {name} concern")
    script = [sys.executable, str(tmp_path / "scripts" / "patches.py")]
    run = lambda *a: subprocess.run([*script, *a], cwd=tmp_path, capture_output=True, text=True)  # noqa: E731
    assert run("export").returncode == 0
    before = {p.name: p.read_text() for p in (tmp_path / "patches").glob("*.patch")}
    assert len(before) == 2

    (vendor / "one.c").write_text("int one = 1;\n")
    refused = run("export")  # an edit must name its concern
    assert refused.returncode == 1 and "--into" in refused.stderr
    assert run("export", "--into", "nosuch").returncode == 1
    proc = run("export", "--into", "one")
    assert proc.returncode == 0, proc.stderr
    after = {p.name: p.read_text() for p in (tmp_path / "patches").glob("*.patch")}
    assert sorted(after) == sorted(before)
    changed = [n for n in after if after[n] != before[n]]
    assert len(changed) == 1 and changed[0].startswith("0001-") and "int one = 1;" in after[changed[0]]
    assert "fixup!" not in _git(vendor, "log", "--format=%s")
    assert run("check").returncode == 0
