"""`pip install` gives the package `plainloop` and the `plainloop` command, and nothing under another top-level name.

The wheel is built offline from a copy of the project, installed without dependencies into a fresh virtualenv
that sees this interpreter's packages (torch is not downloaded), and used from a folder outside the repository:
the README's "Your model in 10 lines", a task of the user's own through the command, and a built-in task.
Then the set-up script: the launcher installs the runtime, the tests the rest, each once.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_guest import make_lab

ROOT = Path(__file__).resolve().parents[1]
slow = pytest.mark.slow
# what setup.py reads: the engine, the command line and its tasks, the metadata
SOURCES = ("trainer", "tasks", "datasets", "models", "utils", "scripts/app", "train_optimized.py", "setup.py")
SHADOWING = ("trainer", "datasets", "utils", "models", "tasks")

USER_TASK = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
from plainloop import Task, TrainConfig


def build(cfg: TrainConfig, *, hidden: int = 16) -> Task:
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(cfg.seed))
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    y = x.sum(dim=1, keepdim=True)
    return Task("mymod", model, TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:]))
"""


def engine_version() -> str:
    tree = ast.parse((ROOT / "trainer" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise AssertionError("trainer/__init__.py has no literal __version__ = '...'")


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Your model in 10 lines", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run(cmd: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def copy_project(dest: Path) -> Path:
    """The files a build reads, copied: the build writes build/ and *.egg-info beside them, not in the repo."""
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copy2(ROOT / "LICENSE", dest / "LICENSE")
    return dest


def purelib(python: Path) -> str:
    return run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=python.parent
    ).stdout.strip()


def fresh_venv(path: Path) -> Path:
    """A virtualenv without pip, which sees this interpreter's packages (torch, numpy) through a .pth file."""
    run([sys.executable, "-m", "venv", "--without-pip", path], cwd=path.parent)
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    (Path(purelib(python)) / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    return python


def pip(python: Path, *args) -> list:
    return [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", *args]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = copy_project(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheels")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", out, src], src)
    (whl,) = out.glob("plainloop-*.whl")
    return whl


@slow
def test_the_wheel_holds_plainloop_only(wheel):
    assert wheel.name.startswith(f"plainloop-{engine_version()}-"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"plainloop", f"plainloop-{engine_version()}.dist-info"}, tops
    for must in (
        "plainloop/__init__.py",
        "plainloop/py.typed",
        "plainloop/_app/__init__.py",
        "plainloop/_app/train_optimized.py",
    ):
        assert must in names
    assert "plainloop/_app/setup.py" not in names
    # every subfolder of the engine and of the command's folders installs (new ones too, without listing them)
    for folder, package in [("trainer", "plainloop")] + [(f, f"plainloop/_app/{f}") for f in SHADOWING[1:]]:
        for py in (ROOT / folder).rglob("*.py"):
            assert f"{package}/{py.relative_to(ROOT / folder).as_posix()}" in names, f"{py} is not in the wheel"
    entry = zipfile.ZipFile(wheel).read(f"plainloop-{engine_version()}.dist-info/entry_points.txt").decode()
    assert "plainloop = plainloop._app:main" in entry


@slow
def test_installed_from_the_wheel_outside_the_repository(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    run(pip(python, "install", "--no-deps", "--no-index", wheel), tmp_path)
    user = tmp_path / "user"
    user.mkdir()

    # the README's example, saved where the user keeps their code
    (user / "example.py").write_text(readme_example(), encoding="utf-8")
    run([python, "example.py"], user)
    assert list((user / "runs").glob("mine-*/summary.json")), "the README example wrote no summary.json"

    probe = (
        "import importlib.util, sys, plainloop\n"
        "from plainloop import Trainer, TrainConfig, Task, BaseTrainer, Callback\n"
        "print(plainloop.__version__)\n"
        f"for name in {SHADOWING!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    assert spec is None or 'plainloop' not in (spec.origin or ''), (name, spec)\n"
        "    assert name not in sys.modules, name\n"
    )
    assert run([python, "-c", probe], user).stdout.strip() == engine_version()

    command = python.parent / "plainloop"
    assert run([command, "--help"], user).stdout.startswith("usage: plainloop")
    # a research repository with its own utils/datasets/models/tasks/trainer: its task and scripts get their own
    lab = make_lab(tmp_path / "lab", own=(str(Path(purelib(python)) / "plainloop"),))
    assert (
        "own packages"
        in run([command, "--task", "labtask.py:build", "--epochs", "1", "--batch_size", "32"], lab).stdout
    )
    (lab_run,) = (lab / "runs").glob("lab-*")
    assert list((lab_run / "plots").glob("*.png")), "the command drew no plots"
    assert run([python, "-m", "plainloop", "plot", lab_run], lab).stdout.strip()
    tools = "from plainloop import measuring_tools, TensorBoardLogger, TrainingMonitor; import utils; print(utils.WHO)"
    assert run([python, "-c", tools], lab).stdout.strip() == "lab-utils"
    (user / "mymod.py").write_text(USER_TASK, encoding="utf-8")
    run([command, "--task", "mymod:build", "--epochs", "1", "--output_dir", "out", "--no-plots"], user)
    assert list((user / "out").glob("mymod-*/summary.json")), "plainloop --task mymod:build wrote no summary.json"
    # a built-in task: its datasets/ and models/ come with the command
    run([command, "--task", "reid", "--max_steps", "2", "--output_dir", "out", "--no-plots"], user)
    assert list((user / "out").glob("reid-*/summary.json")), "plainloop --task reid wrote no summary.json"


@slow
def test_an_editable_install_runs_the_repository_files(tmp_path):
    src = copy_project(tmp_path / "src")
    python = fresh_venv(tmp_path / "venv")
    run(pip(python, "install", "--no-deps", "--no-index", "--no-build-isolation", "-e", src), tmp_path)
    out = run([python, "-c", "import plainloop; print(plainloop.__file__)"], tmp_path).stdout.strip()
    assert Path(out) == src / "trainer" / "__init__.py"
    assert run([python.parent / "plainloop", "--task", "reid", "--help"], tmp_path).stdout.startswith("usage:")
    lab = make_lab(tmp_path / "lab", own=tuple(str(src / d) for d in SHADOWING))
    cmd = [
        python.parent / "plainloop",
        "--task",
        "labtask.py:build",
        "--epochs",
        "1",
        "--batch_size",
        "32",
        "--no-plots",
    ]
    assert "own packages" in run(cmd, lab).stdout


# ---------------------------------------------------------------------------------------------- the set-up script
STUB_PYTHON = """#!/bin/sh
# stands in for .venv/bin/python: records each call; `python -c` (the setuptools check) succeeds
echo "$*" >> "$(dirname "$0")/../calls.log"
"""


def setup_calls(venv: Path, needs: str, torch_spec: str = "torch==2.13.0") -> list[str]:
    """Source scripts/ensure_venv.sh as a launcher does, against a .venv whose python records its calls."""
    log = venv / "calls.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "VENV": str(venv), "PLAINLOOP_NEEDS": needs, "TORCH_SPEC": torch_spec}
    proc = subprocess.run(
        ["bash", "-c", "source scripts/ensure_venv.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("[setup]"), proc.stdout  # one line a phase
    calls = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return [c for c in calls if " install " in f" {c} "]


def test_the_launcher_installs_the_runtime_and_the_tests_the_rest_once(tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(STUB_PYTHON, encoding="utf-8")
    (venv / "bin" / "python").chmod(0o755)

    first = setup_calls(venv, "runtime")  # ./optimize_training.sh on a fresh machine
    assert len(first) == 2, first
    assert "requirements.txt" in first[0] and "requirements-dev.txt" not in first[0] and "torch==2.13.0" in first[0]
    assert "--quiet" not in first[0]  # pip's progress shows
    assert "-e" in first[1].split() and "--no-deps" in first[1]  # plainloop itself, editable
    assert setup_calls(venv, "runtime") == []  # nothing changed: nothing installed
    dev = setup_calls(venv, "dev")  # ./run_tests.sh adds the development tools
    assert len(dev) == 1 and "requirements-dev.txt" in dev[0]
    assert setup_calls(venv, "runtime") == [] and setup_calls(venv, "dev") == []  # each satisfies the other
    assert "torch==2.1.0" in setup_calls(venv, "runtime", torch_spec="torch==2.1.0")[0]  # a new TORCH_SPEC installs

    made_by_tests = tmp_path / "tests-venv"
    made_by_tests.mkdir()
    (made_by_tests / "bin").mkdir()
    (made_by_tests / "bin" / "python").write_text(STUB_PYTHON, encoding="utf-8")
    (made_by_tests / "bin" / "python").chmod(0o755)
    assert len(setup_calls(made_by_tests, "dev")) == 2
    assert setup_calls(made_by_tests, "runtime") == []  # a .venv the tests made serves the launcher as it is


def test_a_bad_setup_level_is_one_line(tmp_path):
    env = {**os.environ, "VENV": str(tmp_path / "v"), "PLAINLOOP_NEEDS": "everything"}
    proc = subprocess.run(["bash", "scripts/ensure_venv.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "PLAINLOOP_NEEDS='everything' is not valid: use runtime or dev" in proc.stderr
    assert not (tmp_path / "v").exists()
