"""Seed 000's quick start through BaseTrainer: its code with only the import lines changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trainer.base as base_mod
from trainer.base import BaseTrainer

QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "examples" / "seed000_quickstart.py"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, era5_cache):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(base_mod, "MODEL_SAVE_PATH", str(tmp_path / "models"))
    return tmp_path


def run_quickstart(source: str, train: bool) -> dict:
    if not train:
        source = source.replace("model = trainer.train()", "")
    g: dict = {"__file__": str(QUICKSTART), "__name__": "quickstart"}
    exec(compile(source, str(QUICKSTART), "exec"), g)
    return g


def test_quickstart_verbatim_builds_the_seed_configuration(in_tmp):
    g = run_quickstart(QUICKSTART.read_text(encoding="utf-8"), train=False)
    tr: BaseTrainer = g["trainer"]
    assert (tr.config.epochs, tr.config.batch_size) == (500, 150)
    task = tr.build_task()
    assert (task.train_set.height, task.train_set.width) == (80, 180)  # int(160/2), int(360/2), as the seed computes
    assert task.model.learning_rate == 1e-3
    x, _ = task.train_set[0]
    with torch.no_grad():
        y = task.model.eval()(x[None])
    assert y.shape == (1, 80, 180) and torch.isfinite(y).all()


def test_quickstart_trains_and_saves_a_state_dict(in_tmp):
    # the same code with smaller numbers, so that it trains on a CPU in seconds
    src = QUICKSTART.read_text(encoding="utf-8")
    for old, new in [('"epochs": 500', '"epochs": 2, "progress_bar": False, "num_workers": 0'),
                     ('"batch_size": 150', '"batch_size": 16'), ('"d_model": 512', '"d_model": 32'),
                     ('"dim_feedforward": 1024', '"dim_feedforward": 64'), ("resolution = 2", "resolution = 10")]:
        assert old in src
        src = src.replace(old, new)
    g = run_quickstart(src, train=True)
    model = g["model"]
    save = Path(base_mod.MODEL_SAVE_PATH) / "seq_len-2" / "ra_transformer.pkl"
    state = torch.load(save, weights_only=True)  # a plain state dict, not a pickled model
    assert set(state) == set(model.state_dict())
    assert g["trainer"].summary["steps"] == 2 * (len(g["trainer"].trainer.task.train_set) // 16)


def test_unknown_trainer_param_is_a_clear_error(in_tmp):
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer

    with pytest.raises(ValueError, match="unknown key.*'batchsize'"):
        BaseTrainer("t", Area("g", lon=[-180, 180], lat=[-80, 80]), "u", RecursiveAttentionTransformer,
                    ERA5SSTMonthlyDataset, "m.pt", trainer_params={"batchsize": 3})
    with pytest.raises(ValueError, match="split_ratio"):
        BaseTrainer("t", Area("g", lon=[-180, 180], lat=[-80, 80]), "u", RecursiveAttentionTransformer,
                    ERA5SSTMonthlyDataset, "m.pt", trainer_params={"split_ratio": [0.9, 0.9]})


def test_learning_rate_goes_to_the_optimizer_when_the_model_does_not_take_it(in_tmp):
    class Tiny(torch.nn.Module):
        def __init__(self, width: int, height: int):
            super().__init__()
            self.lin = torch.nn.Linear(width * height, width * height)

        def forward(self, x):
            return self.lin(x.flatten(1)).view(x.shape[0], *x.shape[-2:])

    class Data(torch.utils.data.Dataset):  # no `split` argument: BaseTrainer splits in time order
        def __init__(self, lon, lat, n=40):
            self.x = torch.randn(n, 1, 2, 3)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.x[i, 0] * 0.5

    from datasets.area import Area

    tr = BaseTrainer("tiny", Area("g", lon=[0, 10], lat=[0, 10]), "u", Tiny, Data, in_tmp / "tiny.pt",
                     model_params={"width": 3, "height": 2, "learning_rate": 0.05},
                     trainer_params={"epochs": 1, "batch_size": 8, "progress_bar": False, "num_workers": 0})
    assert tr.config.lr == 0.05 and "learning_rate" not in tr.model_params
    task = tr.build_task()
    assert len(task.train_set) == 32 and len(task.val_set) == 8  # 0.8 / 0.2, in order
    assert list(task.val_set.indices) == list(range(32, 40))
    tr.train()
    assert (in_tmp / "tiny.pt").is_file()
