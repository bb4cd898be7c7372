"""The resume rule has no holes: every setting is either one a resumed run may change or a fixed one, whatever its
saved value (None included), the docs' table lists the same, and a fixed one changed is refused naming both values.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import tasks
import train_optimized as cli
from tests.helpers import toy_config
from trainer import Task, Trainer
from trainer.cli.options import function_parameters
from trainer.config import TrainConfig
from trainer.state import RESUME_FIXED, RESUME_MAY_CHANGE, TABLE_MAY_CHANGE, ResumeError, resume_changes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def _table_settings() -> set[str]:
    """Every key the [run] and [task] tables of a built-in task's run can hold."""
    keys = {f.name for f in dataclasses.fields(cli.RunOptions)}
    for name in tasks.MODULES:
        keys |= set(function_parameters(tasks.TASK_BUILDERS[name]()))
    return keys


def test_every_setting_is_in_exactly_one_list():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not RESUME_MAY_CHANGE & RESUME_FIXED, sorted(RESUME_MAY_CHANGE & RESUME_FIXED)
    assert RESUME_MAY_CHANGE | RESUME_FIXED == fields, sorted((RESUME_MAY_CHANGE | RESUME_FIXED) ^ fields)
    fixed = tasks.RESUME_FIXED_SETTINGS
    assert not TABLE_MAY_CHANGE & fixed, sorted(TABLE_MAY_CHANGE & fixed)
    every = _table_settings() | {"data_root"}  # data_root: no built-in task's, a user task's data folder by name
    assert TABLE_MAY_CHANGE | fixed == every, sorted((TABLE_MAY_CHANGE | fixed) ^ every)
    for shared in _table_settings() & fields:  # seed, device_cache: one rule in both tables
        assert (shared in RESUME_FIXED) == (shared in fixed), shared


def test_the_docs_table_is_the_code():
    text = (ROOT / "docs" / "guides" / "never-lose-a-run.md").read_text(encoding="utf-8")
    table = text.split("<!-- resume-rules:", 1)[1].split("\n\n", 1)[0]
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in table.splitlines() if line.startswith("| ")}
    names = {k: [set(re.findall(r"`([a-z_0-9]+)`", cell)) for cell in v] for k, v in rows.items()}
    (train,) = [v for k, v in names.items() if k.startswith("training")]
    (other,) = [v for k, v in names.items() if k.startswith("task and run")]
    assert train == [set(RESUME_MAY_CHANGE), set(RESUME_FIXED)]
    assert other == [set(TABLE_MAY_CHANGE), set(tasks.RESUME_FIXED_SETTINGS)]


def test_none_is_a_value_like_any_other():
    old = {"train": {"lr_decay_steps": None, "ref_batch_size": None, "gradient_clip_val": 1.0, "log_every": None}}
    new = {"train": {"lr_decay_steps": 48, "ref_batch_size": None, "gradient_clip_val": None, "log_every": 5}}
    assert resume_changes(old, new) == [("lr_decay_steps", None, 48), ("gradient_clip_val", 1.0, None)]
    assert resume_changes({"task": {"lon": None}}, {"task": {"lon": [10, 20], "data_path": "x"}}) == [
        ("lon", None, [10, 20])
    ]
    assert resume_changes({"train": {}}, {"train": {"lr_decay_steps": 48}}) == []  # not saved (an older file)
    assert resume_changes({"run": {"plots": True}}, {"run": {"plots": False}}) == []  # may change


def _toy() -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return Task("toy", nn.Linear(4, 1), TensorDataset(x[:48], x[:48, :1]), TensorDataset(x[48:], x[48:, :1]))


@pytest.mark.parametrize("change", [{"lr_decay_steps": 48}, {"gradient_clip_val": 1.0}, {"ref_batch_size": 64}])
def test_the_engine_refuses_an_unset_fixed_setting_given_on_resume(change, tmp_path):
    cfg = toy_config(tmp_path, epochs=1, batch_size=16)
    Trainer(cfg, _toy()).fit()
    ((key, value),) = change.items()
    again = dataclasses.replace(cfg, resume=str(tmp_path / "run"), epochs=2, **change)
    with pytest.raises(ResumeError, match=rf"{key} None -> {value:g}"):
        Trainer(again, _toy())


BUILDER = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainer import Task

TRAIN_DEFAULTS = {"epochs": 1, "batch_size": 8}


def build(*, hidden: int = 4, width: int | None = None) -> Task:
    x = torch.randn(32, 3)
    model = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    return Task("mine", model, TensorDataset(x[:24], x[:24, :1]), TensorDataset(x[24:], x[24:, :1]))
"""
QUIET = ["--no-progress_bar", "--output_dir", "runs"]


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A finished one-epoch run of a user task (resumable with more --epochs), the CLI's registry restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    Path("rules_task.py").write_text(BUILDER)  # a name of its own: sys.modules keeps modules
    builders, modules = dict(tasks.TASK_BUILDERS), dict(tasks.USER_MODULES)
    assert cli.main(["--task", "rules_task:build", "--run_name", "a", "--no-plots", *QUIET]) == 0
    yield ["--resume", "runs/a", "--task", "rules_task:build", "--epochs", "2", *QUIET]
    tasks.TASK_BUILDERS.clear()
    tasks.TASK_BUILDERS.update(builders)
    tasks.USER_MODULES.clear()
    tasks.USER_MODULES.update(modules)


@pytest.mark.parametrize("flag", [["--lr_decay_steps", "48"], ["--gradient_clip_val", "1"],
                                  ["--ref_batch_size", "64"], ["--width", "8"]])  # fmt: skip
def test_the_cli_refuses_an_unset_fixed_setting_given_on_resume(flag, run, capsys):
    before = Path("runs/a/checkpoints/last.pt").read_bytes()
    capsys.readouterr()
    assert cli.main([*run, *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()[0]
    assert f"--{flag[0][2:]} {flag[1]}" in err and f"{flag[0][2:]} unset" in err, err
    assert Path("runs/a/checkpoints/last.pt").read_bytes() == before


def test_a_setting_that_may_change_changes(run, capsys):
    assert cli.main([*run, "--plots", "--log_every", "2", "--ema_decay", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "resume: runs/a" in out and "ema: the checkpoint holds no EMA state" in out
