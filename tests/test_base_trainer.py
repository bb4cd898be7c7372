"""BaseTrainer: the guides' quick start verbatim (trained in tests/test_seed_recipes.py), own models and datasets,
the area, callbacks, rejected keys, the "before" run, loader notes, auto_batch_size. Its feed, cadence, saved
arguments and predict against lightning.Trainer: tests/test_seed_door.py."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

import trainer.compat.base_trainer as base_mod
from trainer.compat.base_trainer import BaseTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "examples" / "seed000_quickstart.py"


def run_quickstart(source: str, train: bool) -> dict:
    if not train:
        source = source.replace("model = trainer.train()", "")
    g: dict = {"__file__": str(QUICKSTART), "__name__": "quickstart"}
    exec(compile(source, str(QUICKSTART), "exec"), g)
    return g


@pytest.mark.slow
def test_quickstart_verbatim_builds_the_seed_configuration(in_tmp):
    g = run_quickstart(QUICKSTART.read_text(encoding="utf-8"), train=False)
    tr: BaseTrainer = g["trainer"]
    assert (tr.config.epochs, tr.config.batch_size) == (500, 150)
    task = tr.build_task()
    assert (task.train_set.height, task.train_set.width) == (
        80,
        180,
    )  # int(160/2), int(360/2), as the seed computes
    assert task.model.learning_rate == 1e-3
    x, _ = task.train_set[0]
    with torch.no_grad():
        y = task.model.eval()(x[None])
    assert y.shape == (1, 80, 180) and torch.isfinite(y).all()


def test_unknown_trainer_param_is_a_clear_error(in_tmp):
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer

    area = Area("g", lon=[-180, 180], lat=[-80, 80])
    for params, message in (
        ({"batchsize": 3}, "unknown key.*'batchsize'"),
        ({"split_ratio": [0.9, 0.9]}, "split_ratio"),
    ):
        with pytest.raises(ValueError, match=message):
            BaseTrainer(
                "t", "u", area, RecursiveAttentionTransformer, ERA5SSTMonthlyDataset, "m.pt", trainer_params=params
            )


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

    tr = BaseTrainer(
        "tiny",
        "u",
        Area("g", lon=[0, 10], lat=[0, 10]),
        Tiny,
        Data,
        in_tmp / "tiny.pt",
        model_params={"width": 3, "height": 2, "learning_rate": 0.05},
        trainer_params={"epochs": 1, "batch_size": 8, "progress_bar": False, "num_workers": 0},
    )
    assert tr.config.lr == 0.05 and "learning_rate" not in tr.model_params
    task = tr.build_task()
    assert len(task.train_set) == 32 and len(task.val_set) == 8  # 0.8 / 0.2, in order
    assert list(task.val_set.indices) == list(range(32, 40))
    tr.train()
    assert (in_tmp / "tiny.pt").is_file()


# ---------------------------------------------------------------- own models and datasets
class Rows(torch.utils.data.Dataset):
    """n samples (x: 4 features, y: a linear function of x); records the keyword arguments it was built with."""

    built: list[dict] = []

    def __init__(self, n: int = 64, **kwargs):  # absorbs **kwargs: must not receive lon/lat/split on a guess
        Rows.built.append(dict(kwargs))
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 0.0])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Gridded(Rows):
    """Names lon/lat (required) and split/split_ratio, and honours split."""

    def __init__(self, lon, lat, split="train", split_ratio=(0.8, 0.2), n: int = 80):
        super().__init__(n, lon=lon, lat=lat, split=split, split_ratio=split_ratio)
        cut = int(n * split_ratio[0])
        sl = slice(0, cut) if split == "train" else slice(cut, n)
        self.x, self.y = self.x[sl], self.y[sl]


class IgnoresSplit(Rows):
    def __init__(self, split="train", n: int = 40):  # takes split= ... and returns the same data for every split
        super().__init__(n, split=split)


class Linear(torch.nn.Module):
    def __init__(self, **kwargs):  # absorbs **kwargs: must not be handed the area on a guess
        super().__init__()
        self.got = dict(kwargs)
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)


class AreaModel(Linear):
    def __init__(self, area=None, lon_range=None, lat_range=None):
        super().__init__(area=area, lon_range=lon_range, lat_range=lat_range)


class RangeModel(Linear):
    def __init__(self, lon_range=(-180.0, 180.0), lat_range=(-80.0, 80.0)):
        super().__init__(lon_range=lon_range, lat_range=lat_range)


def quiet(**tp):
    # no loader workers unless a test asks: starting and stopping a worker process costs seconds on a busy CPU
    return {"epochs": 1, "batch_size": 8, "progress_bar": False, "num_workers": 0, **tp}


def make(tmp_path, model=Linear, data=Rows, area=None, tp=None, **kw):
    lines: list[str] = []
    tr = BaseTrainer(
        "own",
        "u1",
        area,
        model,
        data,
        tmp_path / "own.pt",
        trainer_params={"output_dir": str(tmp_path / "runs"), **quiet(**(tp or {}))},
        log=lines.append,
        **kw,
    )
    return tr, lines


def pacific():
    from datasets.area import Area

    return Area("Pacific", lon=[170, -120], lat=[-5, 5])  # Niño 3.4: crosses the dateline


def test_model_gets_the_area_by_name_only(tmp_path):
    area = pacific()
    tr, _ = make(tmp_path, AreaModel, area=area)
    assert tr.build_task().model.got["area"] is area
    assert any("area='Pacific'" in n for n in tr.notes)
    tr, _ = make(tmp_path, RangeModel, area=area)
    assert tr.build_task().model.got == {"lon_range": (170.0, -120.0), "lat_range": (-5.0, 5.0)}
    tr, _ = make(tmp_path, Linear, area=area)  # **kwargs only: nothing is passed
    assert tr.build_task().model.got == {}
    tr, _ = make(tmp_path, RangeModel, area=area, model_params={"lon_range": (0, 10)})  # the user's own wins
    assert tr.build_task().model.got == {"lon_range": (0, 10), "lat_range": (-80.0, 80.0)}


@pytest.mark.slow
def test_recursive_attention_transformer_gets_the_area(tmp_path, era5_cache):
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer

    area = Area("East Pacific", lon=[-170, -90], lat=[-20, 20])
    mp = dict(
        width=8,
        height=4,
        seq_len=2,
        d_model=16,
        num_heads=2,
        num_layers=1,
        dim_feedforward=16,
        dropout=0.0,
        recursion_depth=1,
    )
    tr = BaseTrainer(
        "rat",
        "u",
        area,
        RecursiveAttentionTransformer,
        ERA5SSTMonthlyDataset,
        tmp_path / "m.pt",
        dataset_params={"seq_len": 2, "resolution": 10},
        model_params=mp,
        trainer_params=quiet(),
    )
    task = tr.build_task()
    assert tuple(task.model.lon_range) == (-170, -90) and tuple(task.model.lat_range) == (-20, 20)
    assert (task.train_set.height, task.train_set.width) == (4, 8)


def test_own_dataset_without_area_or_split(tmp_path):
    Rows.built.clear()
    tr, lines = make(tmp_path, data=Rows, dataset_params={"n": 50})
    task = tr.build_task()
    assert Rows.built == [{}]  # **kwargs absorbs anything, so neither lon/lat nor split was passed
    assert list(task.train_set.indices) == list(range(40)) and list(task.val_set.indices) == list(range(40, 50))
    tr.train()
    assert "data: 50 samples split in order by split_ratio [0.8, 0.2]: train/val = 40/10 samples" in "\n".join(lines)


def test_own_dataset_that_names_lon_lat_and_split(tmp_path):
    from datasets.area import Area

    Rows.built.clear()
    tr, _ = make(tmp_path, data=Gridded, area=Area("g", lon=[0, 10], lat=[0, 10]), tp={"split_ratio": [0.75, 0.25]})
    task = tr.build_task()
    assert [b["split"] for b in Rows.built] == ["train", "val"]
    assert Rows.built[0]["lon"] == [0.0, 10.0] and Rows.built[0]["split_ratio"] == (0.75, 0.25)
    assert (len(task.train_set), len(task.val_set)) == (60, 20)
    with pytest.raises(ValueError, match=r"area=None, but Gridded needs lon and lat"):
        make(tmp_path, data=Gridded)[0].build_task()


def test_train_and_val_that_are_the_same_samples_are_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"train and val splits of IgnoresSplit are the same 40 samples"):
        make(tmp_path, data=IgnoresSplit)[0].build_task()


def test_callbacks_are_handed_to_the_trainer(tmp_path):
    class Recorder:
        def __init__(self):
            self.calls = []

        def on_fit_start(self, trainer):
            self.calls.append("start")

        def on_log(self, trainer, row):
            self.calls.append(row["kind"])

        def on_fit_end(self, trainer, summary):
            self.calls.append("end")

    rec = Recorder()
    make(tmp_path, callbacks=[rec])[0].train()
    assert rec.calls[0] == "start" and rec.calls[-1] == "end" and "train" in rec.calls and "val" in rec.calls


@pytest.mark.parametrize("key, hint", [
    ("callbacks", r"BaseTrainer\(\.\.\., callbacks=\[\.\.\.\]\).*early_stopping_patience.*checkpoint_every"),
    ("early_stopping", "early_stopping_patience"),
    ("enable_checkpointing", "checkpoint_every.*save_best"),
    ("max_epochs", "use 'epochs'"),
    ("use_gradient_checkpointing", "model_params"),
    ("batchsize", r"unknown key.*'batchsize' \(did you mean batch_size"),
    ("log_evry", "did you mean log_every"),
])  # fmt: skip
def test_rejected_keys_name_the_supported_alternative(tmp_path, key, hint):
    with pytest.raises(ValueError, match=hint):
        make(tmp_path, tp={key: 1})


def test_two_trainers_with_one_uid_get_their_own_run_directories(tmp_path):
    a, _ = make(tmp_path)
    a.train()
    b, lines = make(tmp_path)
    b.train()
    da, db = Path(a.summary["run_dir"]), Path(b.summary["run_dir"])
    assert (da.name, db.name) == ("own-u1", "own-u1-2")
    assert "already holds a run" in "\n".join(lines)
    for d in (da, db):  # each run has its own complete set of files
        assert {"config.json", "metrics.jsonl", "summary.json"} <= {p.name for p in d.iterdir()}
        assert (d / "checkpoints" / "last.pt").is_file()
    rows = lambda d: [line for line in (d / "metrics.jsonl").read_text().splitlines() if line]  # noqa: E731
    assert len(rows(da)) == len(rows(db))  # nothing of run b was appended to run a
    assert "save_path" in "\n".join(lines)  # the shared save_path is replaced, and the second run says so


def test_the_guides_before_settings_run_the_baseline_loop(tmp_path):
    before = {"num_workers": 0, "precision": "32", "pin_memory": False}
    tr, lines = make(tmp_path, tp=before)
    assert tr.config.baseline
    tr.train()
    assert "baseline: trainer_params switch the optimisations off (num_workers 0" in "\n".join(lines)
    cfg = tr.trainer.cfg
    assert (cfg.device_cache, cfg.log_every, cfg.validation_interval) == (False, 1, 1)
    assert not make(tmp_path, tp={**before, "baseline": False})[0].config.baseline
    assert not make(tmp_path, tp={"num_workers": 0, "precision": "32"})[0].config.baseline


class Resident(Rows):
    """Speaks the engine's residency protocol, so the data is held in memory and gathered without a loader."""

    def __init__(self, split="train", n: int = 80):
        super().__init__(n)
        sl = slice(0, 64) if split == "train" else slice(64, n)
        self.x, self.y = self.x[sl], self.y[sl]

    def maybe_to_device(self, device):
        self.x, self.y = self.x.to(device), self.y.to(device)
        return True

    def gather(self, idx):
        return self.x[idx], self.y[idx]


def test_loader_settings_that_are_not_used_are_named(tmp_path):
    tr, lines = make(tmp_path, data=Resident, tp={"num_workers": 2})
    tr.train()
    out = "\n".join(lines)
    assert "data: held on cpu" in out
    assert "num_workers=2, prefetch_factor and persistent_workers are not used" in out  # the engine's note
    tr, lines = make(tmp_path, data=Resident, tp={"prefetch_factor": 4, "multiprocessing_context": "spawn"})
    tr.train()
    assert (
        "prefetch_factor=4, multiprocessing_context='spawn' not used: the data is held in memory on cpu"
        in "\n".join(lines)
    )
    tr, lines = make(tmp_path, tp={"num_workers": 0, "prefetch_factor": 4})
    tr.train()
    assert "prefetch_factor=4 not used: they only apply to loader worker processes" in "\n".join(lines)
    tr, _ = make(tmp_path, tp={"num_workers": 64})  # read through a loader: more workers than cores is named
    with warnings.catch_warnings():  # PyTorch's own DataLoader warning says the same
        warnings.simplefilter("ignore", UserWarning)
        t = base_mod.Trainer(tr.config, tr.build_task(), log=lambda _s: None)  # built, not run: no 64 processes
    assert any("num_workers: 64 per process x 1 process(es) is more than the" in n for n in t.notes)
    tr, lines = make(tmp_path, tp={"baseline": True, "num_workers": 1, "precision": "32"})
    tr.train()
    assert "baseline: num_workers=1 -> 0 (the baseline loop fixes these" in "\n".join(lines)


class Limited(Linear):
    """Raises the allocator's out-of-memory error above 37 samples, as a GPU would."""

    def forward(self, x):
        if x.shape[0] > 37:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {x.shape[0]} samples")
        return super().forward(x)


def test_auto_batch_size_searches_before_training(tmp_path):
    tr, lines = make(tmp_path, model=Limited, dataset_params={"n": 1000}, tp={"auto_batch_size": True})
    tr.train()
    assert tr.config.batch_size == 37 and tr.config.ref_batch_size == 8  # lr follows from the batch given
    assert tr.trainer.cfg.batch_size == 37
    out = "\n".join(lines)
    assert "auto_batch_size: 8 -> 37" in out and "64 (out of memory)" in out
    tr, lines = make(
        tmp_path,
        model=Limited,
        dataset_params={"n": 1000},
        tp={"auto_batch_size": True, "batch_size": 50, "accumulate_grad_batches": 2},
    )
    tr.train()
    assert (tr.config.batch_size, tr.config.accumulate_grad_batches) == (34, 3)  # effective 100 kept: 3 x 34
    with pytest.raises(ValueError, match="auto_batch_size.*True or False"):
        make(tmp_path, tp={"auto_batch_size": "yes"})


def test_same_samples_compares_values_nan_included():
    import numpy as np

    from trainer.compat.base_trainer import same_samples

    nan = torch.tensor([1.0, float("nan")])
    a = [({"x": nan.clone(), "name": np.array(["rgb"]), "pid": 3}, nan.clone()) for _ in range(4)]
    b = [({"x": nan.clone(), "name": np.array(["rgb"]), "pid": 3}, nan.clone()) for _ in range(4)]
    assert same_samples(a, b)  # NaN (land cells) equals NaN; strings, ints and dicts compared by value
    b[2] = ({"x": nan.clone(), "name": np.array(["ir"]), "pid": 3}, nan.clone())  # the middle sample differs
    assert not same_samples(a, b)
    assert not same_samples(a, a[:3]) and not same_samples([], [])
    halves = Rows(40)  # a 50/50 split of one dataset: equal lengths, different samples
    lo, hi = torch.utils.data.Subset(halves, range(20)), torch.utils.data.Subset(halves, range(20, 40))
    assert not same_samples(lo, hi)


def test_dateline_area_trains_end_to_end(tmp_path, era5_cache):
    """Niño 3.4 (170°E -> 120°W) through BaseTrainer with the real dataset and model."""
    import inspect

    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer

    if "area" not in inspect.signature(RecursiveAttentionTransformer).parameters:
        pytest.skip("RecursiveAttentionTransformer does not take dateline areas yet")
    area, res = pacific(), 5
    mp = dict(width=int(area.width / res), height=int(area.height / res), seq_len=2, d_model=16, num_heads=2,
              num_layers=1, dim_feedforward=16, dropout=0.0, recursion_depth=1, learning_rate=1e-3)  # fmt: skip
    tr = BaseTrainer("nino", "u", area, RecursiveAttentionTransformer, ERA5SSTMonthlyDataset, tmp_path / "n.pt",
                     dataset_params={"seq_len": 2, "resolution": res}, model_params=mp,
                     trainer_params=quiet(batch_size=64, output_dir=str(tmp_path)))  # fmt: skip
    model = tr.train()
    assert tuple(model.lon_range) == (170.0, -120.0)
    assert (tr.trainer.task.train_set.height, tr.trainer.task.train_set.width) == (2, 14)
    assert math.isfinite(tr.summary["final_metrics"]["val_loss"])


# ------------------------------------------------------------------ the Lightning-based BaseTrainer's surface
class Grid(torch.utils.data.Dataset):
    """A 3x4 map with NaN "land" in one corner: x = this month, y = the month `offset + 1` later."""

    def __init__(self, lon, lat, offset: int = 0, n: int = 60):
        g = torch.Generator().manual_seed(1)
        t = torch.arange(n + 8, dtype=torch.float32)[:, None, None]
        self.maps = torch.sin(t / 3 + torch.randn(1, 3, 4, generator=g)) + 0.05 * torch.randn(n + 8, 3, 4, generator=g)
        self.maps[:, 0, 0] = float("nan")
        self.offset, self.n = offset, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.nan_to_num(self.maps[i])[None], self.maps[i + 1 + self.offset]


class MapNet(torch.nn.Module):
    def __init__(self, width: int = 4, height: int = 3):
        super().__init__()
        self.width, self.height = width, height
        self.lin = torch.nn.Linear(width * height, width * height)

    def forward(self, x):
        return self.lin(x.flatten(1)).view(x.shape[0], self.height, self.width)


def grid_trainer(tmp_path, **kw):
    from datasets.area import Area

    tp = {"epochs": 3, "batch_size": 8, "lr": 1e-2, "output_dir": str(tmp_path / "runs"), **kw.pop("tp", {})}
    return BaseTrainer("grid", "u1", Area("g", lon=[0, 40], lat=[0, 30]), MapNet, Grid, kw.pop("save_path",
                       tmp_path / "grid.pt"), trainer_params=quiet(**tp), log=kw.pop("log", lambda s: None), **kw)  # fmt: skip


def test_the_signature_in_its_positional_order():
    import inspect

    names = list(inspect.signature(BaseTrainer).parameters)
    assert names[:13] == [
        "title", "uid", "area", "model_class", "dataset_class", "save_path", "checkpoint_path", "pre_model",
        "dataset_params", "trainer_params", "model_params", "use_checkpoint", "use_wandb",
    ]  # fmt: skip


def test_an_earlier_plainloop_order_is_accepted_and_named(tmp_path):
    from datasets.area import Area

    area = Area("g", lon=[0, 40], lat=[0, 30])
    tr = BaseTrainer("grid", area, "u1", MapNet, Grid, tmp_path / "m.pt", trainer_params=quiet())
    assert (tr.uid, tr.area) == ("u1", area) and any("(title, uid, area" in n for n in tr.notes)


def test_lightning_style_trainer_params_are_honoured_or_named(tmp_path):
    tr = grid_trainer(tmp_path, tp={"monitor": "val_loss", "mode": "max", "save_top_k": 3, "matmul_precision":
                                    "highest", "accelerator": "cpu", "devices": 2, "shuffle": False})  # fmt: skip
    cfg = tr.config
    assert (cfg.device, cfg.tf32, cfg.shuffle, cfg.save_best) == ("cpu", False, False, True)
    assert cfg.save_top_k == 3
    assert any("save_top_k=-1" in n for n in grid_trainer(tmp_path, tp={"save_top_k": -1}).notes)
    assert any("torchrun --nproc_per_node 2" in n for n in tr.notes)
    task = tr.build_task()
    assert (task.monitor_metric, task.monitor_mode) == ("val_loss", "max")
    assert grid_trainer(tmp_path, tp={"save_top_k": 0}).config.save_best is False
    assert grid_trainer(tmp_path, use_checkpoint=False).config.save_best is False
    with pytest.raises(ValueError, match=r"trainer_params\['mode'\]='up'"):
        grid_trainer(tmp_path, tp={"mode": "up"})


def test_save_load_round_trip_rebuilds_the_model_in_one_call(tmp_path):
    from trainer.compat.base_trainer import load_model

    tr = grid_trainer(tmp_path, model_params={"width": 4, "height": 3})
    model = tr.train()
    state = torch.load(tr.save_path, weights_only=True)  # weights only: no pickled code
    assert state["model_params"] == {"width": 4, "height": 3}
    again = load_model(tr.save_path)  # the class is imported from the name saved with the weights
    x = torch.randn(2, 1, 3, 4)
    assert torch.equal(again(x), model(x)) and type(again) is MapNet


def test_predict_scores_rmse_and_r2_over_the_ocean_and_plots(tmp_path):
    import numpy as np

    tr = grid_trainer(tmp_path)
    tr.train()
    out = tr.predict(offset=0, plot=True)
    x, y, pred, rmse, r2, ssta = out  # the tuple of the Lightning-based BaseTrainer
    ds = Grid(lon=[0, 40], lat=[0, 30], offset=0)
    with torch.no_grad():
        want = tr.model.eval()(ds[0][0][None])[0].numpy()
    ok = np.isfinite(y)
    assert not ok[0, 0] and ok.sum() == 11 and np.isnan(pred[0, 0])  # land is NaN and ignored
    assert rmse == pytest.approx(float(np.sqrt(np.mean((want[ok] - y[ok]) ** 2))), rel=1e-5)
    assert r2 == pytest.approx(1 - np.mean((want[ok] - y[ok]) ** 2) / np.var(y[ok]), rel=1e-5)
    assert ssta is None and tr.last_plot.is_file()
    # a fresh BaseTrainer predicts from save_path (predict after a restart)
    fresh = grid_trainer(tmp_path)
    assert fresh.predict(offset=0).rmse == pytest.approx(rmse, rel=1e-6)
    # offset goes to the dataset: another lead gives another target
    assert not np.allclose(fresh.predict(offset=2).target, y, equal_nan=True)


def test_a_lightning_ckpt_is_a_starting_point_as_checkpoint_path_and_pre_model(tmp_path):
    tr = grid_trainer(tmp_path)
    model = tr.train()
    sd = {f"model.{k}": v for k, v in model.state_dict().items()}  # a LightningModule wrapping the net as .model
    torch.save({"state_dict": sd, "pytorch-lightning_version": "2.6.0", "epoch": 3}, tmp_path / "last.ckpt")
    lines: list[str] = []
    tr2 = grid_trainer(tmp_path, checkpoint_path=tmp_path / "last.ckpt", save_path=tmp_path / "b.pt",
                       log=lines.append)  # fmt: skip
    task = tr2.build_task()
    assert all(torch.equal(a, b) for a, b in zip(task.model.state_dict().values(), model.state_dict().values()))
    assert any("Lightning checkpoint" in n for n in tr2.notes) and tr2.config.resume is None
    torch.save({"state_dict": model.state_dict()}, tmp_path / "pre.ckpt")
    tr3 = grid_trainer(tmp_path, pre_model=True, save_path=tmp_path / "pre.ckpt")
    assert torch.equal(tr3.build_task().model.lin.weight, model.lin.weight)


def test_use_wandb_logs_offline_or_names_the_missing_package(tmp_path, monkeypatch):
    import builtins
    import importlib.util

    real_import = builtins.__import__

    def no_wandb(name, *a, **k):
        if name == "wandb":
            raise ImportError("no wandb")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    lines: list[str] = []
    grid_trainer(tmp_path, use_wandb=True, log=lines.append, tp={"epochs": 1}).train()
    assert sum("wandb is not installed" in ln for ln in lines) == 1
    monkeypatch.setattr(builtins, "__import__", real_import)
    if importlib.util.find_spec("wandb") is None:
        return
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tr = grid_trainer(tmp_path, use_wandb=True, tp={"epochs": 1, "run_name": "wb"})
    tr.train()
    runs = list((tmp_path / "runs" / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1


def test_a_lightning_module_trains_through_base_trainer_with_its_own_optimizer(tmp_path):
    L = pytest.importorskip("lightning")

    class LitMap(L.LightningModule):
        def __init__(self, width: int = 4, height: int = 3):
            super().__init__()
            self.net = MapNet(width, height)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            ok = torch.isfinite(y)
            loss = ((self(x) - torch.nan_to_num(y))[ok] ** 2).mean()
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            ok = torch.isfinite(y)
            self.log("val_loss", ((self(x) - torch.nan_to_num(y))[ok] ** 2).mean())

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.05)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5**e)}

    from datasets.area import Area

    lines: list[str] = []
    tr = BaseTrainer("lit", "u", Area("g", lon=[0, 40], lat=[0, 30]), LitMap, Grid, tmp_path / "lit.pt",
                     trainer_params=quiet(epochs=3, output_dir=str(tmp_path / "runs"), validation_interval=1),
                     log=lines.append)  # fmt: skip
    model = tr.train()
    assert model._trainer is None  # given back without plainloop attached
    assert any("the model's own AdamW" in ln for ln in lines)
    assert model.net.lin.weight.grad is None and tr.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 / 8)
    assert math.isfinite(tr.summary["final_metrics"]["val_loss"])


def test_title_and_save_path_are_checked_before_anything_is_written(tmp_path):
    """A title that would put the run outside output_dir, or a save_path that cannot be written, is one line at
    construction (not after training), naming the argument; nothing is created."""
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer
    from trainer.config import ConfigError

    area = Area("g", lon=[-180, 180], lat=[-80, 80])
    args = (RecursiveAttentionTransformer, ERA5SSTMonthlyDataset)
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"title='\.\./\.\./x'.*path separator"):
        BaseTrainer("../../x", "u", area, *args, tmp_path / "m.pt", trainer_params={"output_dir": str(out)})
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match=r"save_path=.*a_file.*cannot be written"):
        BaseTrainer("t", "u", area, *args, blocker / "m.pt", trainer_params={"output_dir": str(out)})
    assert not out.exists()


def test_model_params_that_do_not_fit_the_model_are_one_line(tmp_path):
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer
    from trainer.config import ConfigError

    tr = BaseTrainer("t", "u", Area("g", lon=[-180, 180], lat=[-80, 80]), RecursiveAttentionTransformer,
                     ERA5SSTMonthlyDataset, tmp_path / "m.pt", None, False, {"seq_len": 2},
                     {"epochs": 1, "output_dir": str(tmp_path / "runs")}, {"dim": 16})  # fmt: skip
    with pytest.raises(ConfigError, match=r"model_params: .*RecursiveAttentionTransformer; it takes .*width"):
        tr.build_task()


def test_a_save_path_that_is_a_directory_is_refused_before_anything_is_written(tmp_path):
    """save() would find a directory in its place after the whole run: one line at construction instead, naming
    save_path and the file path to give."""
    from trainer.config import ConfigError

    folder = tmp_path / "models"
    folder.mkdir()
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"save_path='.*models' is a directory; give a file path .*models/model\.pt"):
        BaseTrainer("t", "u", None, Linear, Rows, folder, trainer_params={"output_dir": str(out)})
    assert not out.exists()


class Strict(Rows):
    """Takes only its own n: no **kwargs to absorb a misspelt key."""

    def __init__(self, n: int = 64):
        super().__init__(n)


class StrictSplits(Gridded):
    def __init__(self, lon=(0, 1), lat=(0, 1), split="train", n: int = 80):
        super().__init__(lon, lat, split, n=n)


def test_dataset_params_that_do_not_fit_the_dataset_are_one_line(tmp_path):
    """A key the dataset class does not take is a ConfigError naming dataset_params, the key, the class and the
    keys it takes, before the dataset is built (it was a TypeError from inside the class); **kwargs still absorb."""
    from trainer.config import ConfigError

    built = len(Rows.built)
    tr, _ = make(tmp_path, data=Strict, dataset_params={"nn": 40})
    with pytest.raises(ConfigError, match=r"dataset_params: unknown key\(s\) 'nn' \(did you mean n\?\) for Strict; "
                       r"it takes n \(given: nn\)"):  # fmt: skip
        tr.build_task()
    tr, _ = make(tmp_path, data=StrictSplits, dataset_params={"lenght": 40})
    with pytest.raises(ConfigError, match=r"dataset_params: unknown key\(s\) 'lenght' for StrictSplits; it takes lon"):
        tr.build_task()
    assert len(Rows.built) == built  # refused before the class ran
    tr, _ = make(tmp_path, data=Rows, dataset_params={"n": 40, "extra": 1})  # a **kwargs catch-all takes any key
    tr.build_task()
    assert Rows.built[-1] == {"extra": 1}


def test_the_config_toml_header_rebuilds_the_config_as_it_says(tmp_path, monkeypatch):
    """The header of a BaseTrainer run's config.toml gives the expression that rebuilds its TrainConfig; it works."""
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from trainer import TrainConfig

    monkeypatch.chdir(tmp_path)  # a script's folder, without train_optimized.py (whose header is its own line)
    tr, _ = make(tmp_path, tp={"epochs": 2, "lr": 3e-3})
    tr.train()
    path = tr.trainer.run_dir / "config.toml"
    header = path.read_text().splitlines()[0]
    expr = re.search(r"TrainConfig\(\*\*(.+?)\) rebuilds", header)
    assert expr, header
    with open(path, "rb") as f:
        rebuilt = eval(f"TrainConfig(**{expr.group(1)})", {"TrainConfig": TrainConfig, "tomllib": tomllib, "f": f})
    assert (rebuilt.epochs, rebuilt.lr, rebuilt.batch_size, rebuilt.output_dir) == (2, 3e-3, 8, str(tmp_path / "runs"))
