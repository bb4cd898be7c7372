"""ruff check, ruff format --check and mypy on the whole project are part of the test suite (the commands a developer
runs)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which mypy itself needs there
    import tomli as tomllib

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


@pytest.mark.slow
def test_mypy_on_the_project():
    """`mypy` from the repository root: every folder pyproject.toml's [tool.mypy] `files` names, at its strictness
    (every function annotated), no errors."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: it is in requirements-dev.txt (./run_tests.sh installs it)")
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_checks_every_project_folder():
    """pyproject.toml's mypy `files` names every package of the project and the CLI script: a new package cannot go
    unchecked."""
    files = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    ours = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} | {"train_optimized.py"}
    assert ours <= files, f"add {sorted(ours - files)} to [tool.mypy] files in pyproject.toml"
