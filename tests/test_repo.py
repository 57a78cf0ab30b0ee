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
