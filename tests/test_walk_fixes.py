"""A new user's walk through the doors: each defect it found, fixed and kept fixed (one line that names what to
change, the real source of a value, no silent contradiction)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer import BaseTrainer, Task, TrainConfig, Trainer
from trainer.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ data_order="plain" and shuffle / drop_last
@pytest.mark.parametrize("kw", [{"shuffle": True}, {"drop_last": True}, {"shuffle": True, "drop_last": True}])
def test_plain_order_with_shuffle_or_drop_last_is_refused_not_ignored(kw):
    with pytest.raises(ConfigError, match=r"^TrainConfig: data_order='plain' turns shuffle and drop_last off: drop "):
        TrainConfig(data_order="plain", **kw)


def test_plain_order_says_so_in_its_own_fields_and_rebuilds_from_them():
    c = TrainConfig(data_order="plain")
    assert (c.shuffle, c.drop_last) == (False, False)  # what config.toml stores: no contradiction to refuse later
    assert TrainConfig(**c.to_dict()) == c and dataclasses.replace(c, epochs=3).epochs == 3
    assert TrainConfig(data_order="plain", shuffle=False, drop_last=False) == c


def test_the_command_line_refuses_it_in_one_line(capsys):
    from train_optimized import _main

    assert _main(["--data_order", "plain", "--shuffle"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: TrainConfig: data_order='plain' turns shuffle and drop_last off")


# ------------------------------------------------------------------ --resume auto's line for a user task
def test_resume_auto_names_the_runs_a_user_task_writes(tmp_path):
    from train_optimized import _resume_dir

    notes: list[str] = []
    assert _resume_dir("auto", {"task": "tasks.regress:build", "output_dir": str(tmp_path)}, notes) is None
    assert notes == [
        f"resume auto: nothing to resume under {tmp_path} (no unfinished run of --task tasks.regress:build with a "
        f"checkpoint); starting a new run"
    ]
    notes.clear()  # a built-in task's runs are <task>-<time>
    assert _resume_dir("auto", {"task": "reid", "output_dir": str(tmp_path)}, notes) is None
    assert "(no unfinished reid-* run with a checkpoint)" in notes[0]


# ------------------------------------------------------------------ BaseTrainer names what its user wrote
class Tiny(nn.Module):
    def __init__(self, width: int, height: int):
        super().__init__()
        self.lin = nn.Linear(width * height, width * height)

    def forward(self, x):
        return self.lin(x.flatten(1)).view(x.shape[0], *x.shape[-2:])


class Maps(torch.utils.data.Dataset):
    def __init__(self, lon, lat, n=40):
        self.x = torch.randn(n, 1, 2, 3, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.x[i, 0] * 0.5


def base_trainer(tmp_path, lines: list[str], trainer_params=None, **model_params) -> BaseTrainer:
    from datasets.area import Area

    tp = {"epochs": 1, "batch_size": 8, "progress_bar": False, "num_workers": 0, "output_dir": str(tmp_path)}
    return BaseTrainer(
        "tiny", "u", Area("g", lon=[0, 10], lat=[0, 10]), Tiny, Maps, tmp_path / "tiny.pt",
        model_params={"width": 3, "height": 2, **model_params}, trainer_params={**tp, **(trainer_params or {})},
        log=lines.append,
    )  # fmt: skip


def test_base_trainer_names_model_params_learning_rate_as_the_lr_source(tmp_path):
    lines: list[str] = []
    base_trainer(tmp_path, lines, learning_rate=3e-3).train()
    line = next(s for s in lines if "optimizer: plainloop's AdamW" in s)
    assert "lr 0.003 (from model_params['learning_rate'])" in line and "--lr" not in line
    lines.clear()
    base_trainer(tmp_path / "b", lines, {"lr": 2e-3}, learning_rate=3e-3).train()
    assert "lr 0.002 (from trainer_params['lr'])" in next(s for s in lines if "optimizer: plainloop's AdamW" in s)


def test_base_trainer_names_trainer_params_monitor_not_a_task_it_never_wrote(tmp_path):
    with pytest.raises(ValueError, match=r"^trainer_params\['monitor'\]='val_rmse': the validation reports") as e:
        base_trainer(tmp_path, [], {"monitor": "val_rmse"}).train()
    assert "Task(monitor_metric" not in str(e.value)


def test_base_trainer_lists_each_valid_key_once(tmp_path):
    with pytest.raises(ValueError, match="unknown key.*'batchsize'") as e:
        base_trainer(tmp_path, [], {"batchsize": 8})
    keys = str(e.value).split("Valid keys: ")[1].split(", ")
    assert "save_top_k" in keys and len(keys) == len(set(keys))


# ------------------------------------------------------------------ start-up and validation lines
def test_the_optimizer_line_says_lr_fn_sets_the_lr(tmp_path):
    class Own(nn.Module):  # nanoGPT-style: its own configure_optimizers, no scheduler
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def forward(self, x):
            return self.lin(x)

        def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
            return torch.optim.SGD(self.parameters(), lr=learning_rate)

    def get_lr(it):
        return 0.01

    x = torch.randn(16, 4)
    task = Task("own", Own(), TensorDataset(x, x.sum(1, keepdim=True)), lr_fn=get_lr)
    lines: list[str] = []
    cfg = TrainConfig(epochs=1, batch_size=8, num_workers=0, progress_bar=False, output_dir=str(tmp_path))
    Trainer(cfg, task, log=lines.append).fit()
    line = next(s for s in lines if "optimizer: the model's own" in s)
    assert "schedule: get_lr (Task(lr_fn=...))" in line and "none (constant lr)" not in line


def test_a_validation_that_logs_nothing_says_so(tmp_path):
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Quiet(BoringModel):
        def validation_step(self, batch, batch_idx):
            self(batch)  # BoringModel's own validation logs nothing either

    torch.manual_seed(0)
    lines: list[str] = []
    cfg = TrainConfig(max_steps=4, batch_size=2, num_workers=0, progress_bar=False, output_dir=str(tmp_path))
    Trainer(cfg, Task("boring", Quiet(), BoringModel().train_dataloader().dataset,
                      BoringModel().val_dataloader().dataset), log=lines.append).fit()  # fmt: skip
    val = [s for s in lines if s.startswith("[val] step")]
    assert val and all(s.endswith(": (no metrics logged)") for s in val)
