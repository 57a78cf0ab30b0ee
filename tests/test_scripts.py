"""The maintained tools in scripts/ start and explain themselves (`--help`, exit 0).

They run rarely (benchmarks, A/B comparisons, patch upkeep), so an import that a refactoring
broke would otherwise go unnoticed until someone needs the tool. One-off measurements live in
experiments/ and are not checked.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))


def test_scripts_are_found() -> None:
    assert SCRIPTS, "no Python scripts in scripts/"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help(script: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage:" in proc.stdout, proc.stdout
