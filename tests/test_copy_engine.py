"""The engine lifts into another repo as one folder: `trainer/` alone, next to the repo's own utils/datasets/models."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import metric_rows

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import torch
from torch import nn
from torch.utils.data import TensorDataset

import utils                                     # the research repo's own helpers, not plainloop's
from datasets import make_pairs
from models import TinyNet
from trainer import BaseTrainer, Task, TrainConfig, Trainer

assert utils.helper() == 42
x, y = make_pairs()
task = Task("mine", TinyNet(), TensorDataset(x[:448], y[:448]), TensorDataset(x[448:], y[448:]))
cfg = TrainConfig(epochs=8, batch_size=32, lr=1e-2, output_dir=sys.argv[1], run_name="copied",
                  progress_bar=False, log_every=7, num_workers=0)
summary = Trainer(cfg, task).fit()
print(json.dumps({"summary": summary["final_metrics"], "plainloop_root_on_path": any(
    p.rstrip("/") == sys.argv[2].rstrip("/") for p in sys.path)}))
"""


@pytest.mark.slow
def test_trainer_folder_alone_trains_in_a_repo_with_its_own_utils(tmp_path):
    repo = tmp_path / "research"
    repo.mkdir()
    (repo / "utils.py").write_text("def helper():\n    return 42\n", encoding="utf-8")
    (repo / "datasets.py").write_text(
        "import torch\n\ndef make_pairs():\n    g = torch.Generator().manual_seed(0)\n"
        "    x = torch.randn(512, 4, generator=g)\n    return x, x.sum(1, keepdim=True)\n",
        encoding="utf-8",
    )
    (repo / "models.py").write_text(
        "from torch import nn\n\nclass TinyNet(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))\n",
        encoding="utf-8",
    )
    shutil.copytree(ROOT / "trainer", repo / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "train.py").write_text(SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "train.py", str(tmp_path / "runs"), str(ROOT)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plainloop_root_on_path"] is False
    rows = metric_rows(tmp_path / "runs" / "copied")
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < 0.2 * losses[0]  # it trained
    assert out["summary"]["val_loss"] < 0.2 * losses[0]


def test_engine_imports_nothing_from_the_rest_of_plainloop():
    import ast

    outside = {"utils", "datasets", "models", "tasks", "benchmarks", "trainer", "train_optimized"}
    for f in (ROOT / "trainer").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            assert not {m.split(".")[0] for m in mods} & outside, f"{f.name}:{node.lineno} imports {mods}"
