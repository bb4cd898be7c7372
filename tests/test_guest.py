"""plainloop as a guest in a user's repository: it takes none of the user's top-level names, keeps every import path
the docs have shown, and hands over its tools from the package (`from plainloop import measuring_tools`,
`python -m plainloop plot RUN_DIR`). The wheel's own run of these is in test_install.py."""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_NAMES = ("utils", "datasets", "models", "tasks", "trainer")  # what a research repo (and Hugging Face) call theirs

# a task of the user's that imports the user's own packages, and checks, while plainloop runs it, that no module of
# plainloop's sits under a top-level name but `plainloop`
LAB_TASK = """
import sys
import torch
from torch import nn
from torch.utils.data import TensorDataset
from utils import normalize, WHO
import datasets, models, tasks, trainer
from plainloop import Task, TrainConfig

PLAINLOOP = {PLAINLOOP!r}  # plainloop's own folders (and train_optimized.py)


def plainloops_bare_modules():
    out = []
    for name, m in list(sys.modules.items()):
        f = getattr(m, "__file__", None) or ""
        if name.split(".")[0] not in ("plainloop", "__main__", "__mp_main__") and f.startswith(PLAINLOOP):
            out.append(name)
    return out


def build(cfg: TrainConfig, *, hidden: int = 8) -> Task:
    assert (WHO, datasets.WHO, models.WHO, tasks.WHO, trainer.WHO) == ("lab-utils", "lab-datasets", "lab-models",
                                                                       "lab-tasks", "lab-trainer")
    assert plainloops_bare_modules() == [], plainloops_bare_modules()
    print("[lab] the lab's own packages")
    x = torch.randn(128, 4, generator=torch.Generator().manual_seed(cfg.seed))
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    y = normalize(x.sum(dim=1, keepdim=True))
    return Task("lab", model, TensorDataset(x[:96], y[:96]), TensorDataset(x[96:], y[96:]))
"""


def make_lab(folder: Path, own: tuple[str, ...] | None = None) -> Path:
    """A research repository with packages named like plainloop's folders, and a task file using them; `own`:
    where plainloop's files are (no module from there may have a name outside `plainloop`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in USER_NAMES:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"WHO = 'lab-{name}'\n", encoding="utf-8")
    with (folder / "utils" / "__init__.py").open("a", encoding="utf-8") as f:
        f.write("def normalize(x):\n    return x / 2\n")
    own = own or tuple(str(ROOT / d) for d in (*USER_NAMES, "train_optimized.py"))  # plainloop's files
    (folder / "labtask.py").write_text(LAB_TASK.replace("{PLAINLOOP!r}", repr(own)), encoding="utf-8")
    return folder


def run(cmd: list, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_command_runs_a_task_beside_the_users_own_packages(tmp_path):
    """`python -m plainloop` (the `plainloop` command) with a task importing the lab's utils/datasets/models/tasks/
    trainer; then the tools through the same command."""
    lab = make_lab(tmp_path / "lab")
    out = run(
        [
            sys.executable,
            "-m",
            "plainloop",
            "--task",
            "labtask.py:build",
            "--epochs",
            "1",
            "--batch_size",
            "32",
            "--no-plots",
        ],
        lab,
    )
    assert "[lab] the lab's own packages" in out.stdout
    (run_dir,) = (lab / "runs").glob("lab-*")
    assert (run_dir / "summary.json").is_file()
    plotted = run([sys.executable, "-m", "plainloop", "plot", run_dir], lab)
    assert any(Path(p).suffix == ".png" and Path(p).is_file() for p in plotted.stdout.split()), plotted.stdout
    assert "## Hardware" in run([sys.executable, "-m", "plainloop", "hardware"], lab).stdout


@pytest.mark.slow
def test_the_repositorys_script_run_from_elsewhere_takes_no_names(tmp_path):
    """`python path/to/train_optimized.py --task labtask.py:build` from the lab: the checkout runs as the package."""
    lab = make_lab(tmp_path / "lab")
    out = run([sys.executable, ROOT / "train_optimized.py", "--task", "labtask.py:build", "--epochs", "1",
               "--batch_size", "32", "--no-plots"], lab)  # fmt: skip
    assert "[lab] the lab's own packages" in out.stdout


SCRIPT = """
import sys
import plainloop
from plainloop import TensorBoardLogger, TrainingMonitor, diagnose, hardware_info, measuring_tools, plot_run
from plainloop import EMA, CSVLogger, WandbLogger
from plainloop.base import BaseTrainer
import labtask, utils, datasets, models, tasks, trainer
assert utils.WHO == "lab-utils" and datasets.WHO == "lab-datasets" and trainer.WHO == "lab-trainer"
assert labtask.plainloops_bare_modules() == [], labtask.plainloops_bare_modules()
assert set(plainloop.__all__) >= {"measuring_tools", "TensorBoardLogger", "EMA", "CSVLogger", "WandbLogger"}
print("tools:", [type(t).__name__ for t in measuring_tools(verdict=False)])
"""


def test_a_python_script_imports_plainloops_tools_beside_its_own_packages(tmp_path):
    lab = make_lab(tmp_path / "lab")
    (lab / "script.py").write_text(SCRIPT, encoding="utf-8")
    assert "tools: ['ClosingLines']" in run([sys.executable, "script.py"], lab).stdout


# every import path the docs have shown for a public name (README.md and docs/, over the project's history)
DOCUMENTED = [
    ("trainer", "Trainer TrainConfig Task BaseTrainer Callback accuracy top_k_accuracy EMA CSVLogger WandbLogger"),
    ("plainloop", "Trainer TrainConfig Task BaseTrainer Callback EMA CSVLogger WandbLogger"),
    ("plainloop", "measuring_tools TensorBoardLogger TrainingMonitor plot_run diagnose hardware_info"),
    ("trainer.base", "BaseTrainer MODEL_SAVE_PATH load_model load_weights_into"),
    ("plainloop.base", "BaseTrainer MODEL_SAVE_PATH load_model"),
    ("trainer.compat.base_trainer", "BaseTrainer MODEL_SAVE_PATH load_model load_weights_into"),
    ("trainer.hooks", "Callback"),
    ("trainer.task", "Task"),
    ("trainer.ema", "EMA"),
    ("trainer.extras.ema", "EMA"),
    ("trainer.loggers", "CSVLogger WandbLogger"),
    ("trainer.extras.loggers", "CSVLogger WandbLogger"),
    ("trainer.autobatch", "auto_batch_size"),
    ("trainer.extras.autobatch", "auto_batch_size"),
    ("trainer.setup", "seed_everything"),
    ("trainer.options", "add_dataclass_arguments"),
    ("utils.tools", "measuring_tools"),
    ("utils.performance_monitor", "TrainingMonitor"),
    ("utils.tensorboard_logger", "TensorBoardLogger"),
    ("datasets.area", "Area"),
    ("datasets.era5", "ERA5SSTMonthlyDataset"),
    ("datasets.cached_sampler", "CachedModalAwarePKSampler"),
    ("models.ratransformer", "RecursiveAttentionTransformer"),
]


@pytest.mark.parametrize("module, names", DOCUMENTED, ids=[m for m, _ in DOCUMENTED])
def test_every_documented_import_path_keeps_working(module, names):
    m = importlib.import_module(module)
    for name in names.split():
        assert getattr(m, name) is not None, f"from {module} import {name}"


def test_the_seed_guides_layout_imports_trainer_base_from_src(tmp_path):
    """The origin repository keeps the engine in src/trainer/: `from src.trainer.base import BaseTrainer`."""
    shutil.copytree(ROOT / "trainer", tmp_path / "src" / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    probe = "from src.trainer.base import BaseTrainer, MODEL_SAVE_PATH, load_model; print(BaseTrainer.__module__)"
    assert run([sys.executable, "-c", probe], tmp_path).stdout.strip() == "src.trainer.compat.base_trainer"


def test_the_app_loader_renames_only_plainloops_own_imports():
    import plainloop._app as app

    source = (
        "from utils.metrics import lat_weights\n"
        "from trainer import Task\n"
        "from trainer.config import TrainConfig\n"
        "import datasets.era5 as era5\n"
        "from utilsx import a\n"
        "import numpy\n"
        "from . import sibling\n"
        "def f():\n    from tasks.args import check_task_args\n"
    )
    tree = app.Renamer("x.py").visit(ast.parse(source))
    got = [(n.module, n.level) if isinstance(n, ast.ImportFrom) else n.names[0].name
           for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]  # fmt: skip
    assert got == [
        ("plainloop._app.utils.metrics", 0),
        ("plainloop", 0),
        ("plainloop.config", 0),
        "plainloop._app.datasets.era5",
        ("utilsx", 0),
        "numpy",
        (None, 1),
        ("plainloop._app.tasks.args", 0),
    ]
    with pytest.raises(ImportError, match=r"x.py:1: write `from utils.metrics import \.\.\.`"):
        app.Renamer("x.py").visit(ast.parse("import utils.metrics\n"))


def test_the_apps_files_import_each_other_in_forms_the_loader_renames():
    """No `import utils.x` without `as` in the app (it would bind a top-level name the package does not have)."""
    import plainloop._app as app

    files = [ROOT / "train_optimized.py", *(p for d in app.APP_NAMES[:-1] for p in (ROOT / d).rglob("*.py"))]
    for f in files:
        app.Renamer(str(f)).visit(ast.parse(f.read_text(encoding="utf-8")))
