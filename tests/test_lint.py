"""ruff check, ruff format --check and mypy on trainer/ are part of the test suite (the commands a developer runs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: it is in requirements-dev.txt (./run_tests.sh installs it)")
    return [exe]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args):
    proc = subprocess.run([*ruff(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_on_the_engine():
    """`mypy trainer/` at the strictness of pyproject.toml's [tool.mypy]: every function annotated, no errors."""
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not importable here: it is in requirements-dev.txt (./run_tests.sh installs it)")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "trainer/"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
