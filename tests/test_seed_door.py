"""BaseTrainer called as the Lightning-based BaseTrainer of the seed guides is called: the same feed and cadence as
`lightning.Trainer` with that trainer's loaders, constructor arguments that come back as their types in a new
process, predict's 2-D maps, the start-up lines where plainloop differs on purpose; and a user's batch sampler
without set_epoch or state_dict (Lightning's LSTM demo style) trains and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from trainer import Task, TrainConfig, Trainer
from trainer.checkpoint import CheckpointError
from trainer.compat.base_trainer import BaseTrainer, first_map, load_model, split_points

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


class Months(Dataset):
    """Monthly 4x8 maps with NaN land: x = `seq_len` months (seq_len, 1, 4, 8), y = the next month (1, 4, 8)."""

    def __init__(self, lon, lat, seq_len: int = 2, offset: int = 0, n: int = 43):
        g = torch.Generator().manual_seed(7)
        self.maps = torch.randn(n + seq_len + offset, 1, 4, 8, generator=g).cumsum(0) * 0.3
        self.maps[:, :, 0, :2] = float("nan")
        self.seq_len, self.offset, self.n = seq_len, offset, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.nan_to_num(self.maps[i : i + self.seq_len]), self.maps[i + self.seq_len + self.offset]


def area():
    from datasets.area import Area

    return Area("box", lon=[0, 40], lat=[0, 20])


# ------------------------------------------------------------------ the split
def test_the_split_is_cut_with_int_in_time_order(tmp_path):
    assert split_points(57, (0.8, 0.2)) == [45, 57]  # round() would give 46/11
    assert split_points(43, (0.9, 0.1)) == [38, 43]
    assert split_points(100, (0.7, 0.2, 0.1)) == [70, 90, 100]
    assert split_points(10, (0.5, 0.3)) == [5, 8]  # ratios below 1: the rest is left out
    lines: list[str] = []
    bt = BaseTrainer("cut", "u", area(), torch.nn.Identity, Months, tmp_path / "m.pt",
                     dataset_params={"n": 57}, log=lines.append)  # fmt: skip
    train, val, _ = bt._datasets()
    assert (list(train.indices), list(val.indices)) == (list(range(45)), list(range(45, 57)))
    assert any("train/val = 45/12 samples" in n for n in bt.notes)


def test_defaults_left_out_are_the_lightning_based_trainers(tmp_path):
    cfg = BaseTrainer("d", "u", area(), torch.nn.Identity, Months, tmp_path / "m.pt").config
    feed = (cfg.epochs, cfg.batch_size, cfg.shuffle, cfg.drop_last, cfg.validation_interval)
    assert feed == (100, 20, False, False, 1)
    given = {"epochs": 3, "batch_size": 7, "shuffle": True, "drop_last": True, "validation_interval": 5}
    cfg = BaseTrainer("d", "u", area(), torch.nn.Identity, Months, tmp_path / "m.pt", trainer_params=given).config
    assert (cfg.epochs, cfg.batch_size, cfg.shuffle, cfg.drop_last, cfg.validation_interval) == tuple(given.values())


# ------------------------------------------------------------------ the same run as lightning.Trainer
def lightning_module():
    L = pytest.importorskip("lightning")

    class OriginNet(L.LightningModule):
        """A LightningModule as the seed guides' models are written: its own loss, Adam, self.log."""

        def __init__(self, width=8, height=4, seq_len=2, learning_rate=1e-2, dropout=0.2):
            super().__init__()
            self.conv = torch.nn.Conv2d(seq_len, 8, 3, padding=1)
            self.drop = torch.nn.Dropout(dropout)
            self.out = torch.nn.Conv2d(8, 1, 1)
            self.learning_rate = learning_rate
            self.initial = {k: v.clone() for k, v in self.state_dict().items()}
            self.batches: list[tuple[int, list[float]]] = []  # (epoch, one value per sample) per training batch
            self.val_epochs: list[int] = []

        def forward(self, x):
            return self.out(self.drop(torch.relu(self.conv(x.flatten(1, 2)))))

        def _loss(self, batch):
            x, y = batch
            ok = torch.isfinite(y)
            return ((self(x) - torch.nan_to_num(y))[ok] ** 2).mean()

        def training_step(self, batch, batch_idx):
            self.batches.append((self.current_epoch, batch[0][:, 0, 0, 1, 3].tolist()))
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch))

        def on_validation_epoch_end(self):
            self.val_epochs.append(self.current_epoch)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.learning_rate)

    return L, OriginNet


def test_base_trainer_feeds_validates_and_seeds_as_lightning_trainer_with_the_same_loaders(tmp_path):
    L, OriginNet = lightning_module()
    box, epochs, batch = area(), 3, 8
    # lightning.Trainer as the Lightning-based BaseTrainer set it up: int() split in time order, loaders without
    # shuffling that keep the last short batch (with num_workers 0, validation gets 1 worker), validation every
    # epoch, no sanity pass, the caller's seed
    torch.manual_seed(0)
    ds = Months(box.lon, box.lat)
    cut = int(len(ds) * 0.9)
    train = DataLoader(Subset(ds, range(cut)), batch_size=batch, shuffle=False, num_workers=0)
    val = DataLoader(Subset(ds, range(cut, len(ds))), batch_size=batch, shuffle=False, num_workers=1)
    ref = OriginNet()
    lit = L.Trainer(max_epochs=epochs, accelerator="cpu", enable_checkpointing=False, num_sanity_val_steps=0,
                    logger=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=str(tmp_path / "lit"))  # fmt: skip
    lit.fit(ref, train, val)

    torch.manual_seed(0)
    lines: list[str] = []
    bt = BaseTrainer("origin", "u", box, OriginNet, Months, tmp_path / "m.pt", log=lines.append,
                     trainer_params={"epochs": epochs, "batch_size": batch, "split_ratio": [0.9, 0.1],
                                     "num_workers": 0, "output_dir": str(tmp_path / "runs"), "progress_bar": False})  # fmt: skip
    model = bt.train()

    assert all(torch.equal(ref.initial[k], model.initial[k]) for k in ref.initial)  # the caller's seed decided
    assert len(ref.batches) == epochs * 5  # 38 samples: 4 batches of 8 and the last 6 kept
    assert [e for e, _ in model.batches] == [e for e, _ in ref.batches]
    assert np.allclose([v for _, b in model.batches for v in b], [v for _, b in ref.batches for v in b])
    assert model.val_epochs == ref.val_epochs == [0, 1, 2]
    want, got = float(lit.callback_metrics["val_loss"]), bt.summary["final_metrics"]["val_loss"]
    assert got == pytest.approx(want, rel=1e-3)
    # dropout drew the same masks: the global random state was drawn from where Lightning's DataLoaders draw
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ref.state_dict().values(), model.state_dict().values()))
    assert "train/val = 38/5 samples" in "\n".join(lines)


def test_a_seed_in_trainer_params_seeds_the_weights_and_none_leaves_the_callers_state(tmp_path):
    def run(tp, seed):
        torch.manual_seed(seed)
        bt = BaseTrainer("s", "u", area(), Net, Months, tmp_path / "s.pt",
                         trainer_params={"epochs": 1, "batch_size": 8, "output_dir": str(tmp_path / "runs"),
                                         "progress_bar": False, "num_workers": 0, **tp}, log=lambda s: None)  # fmt: skip
        task = bt.build_task()
        return task.model.conv.weight.detach().clone()

    def fresh(seed):
        torch.manual_seed(seed)
        return Net().conv.weight.detach().clone()

    assert torch.equal(run({}, 0), fresh(0)) and torch.equal(run({}, 1), fresh(1))
    assert torch.equal(run({"seed": 5}, 0), fresh(5))
    # the run's own seeding does not reach the caller's random state when no seed is given
    torch.manual_seed(3)
    BaseTrainer("s", "u", area(), Net, Months, tmp_path / "s.pt",
                trainer_params={"epochs": 1, "batch_size": 8, "output_dir": str(tmp_path / "runs"),
                                "progress_bar": False, "num_workers": 0, "device_cache": False},
                log=lambda s: None).train()  # fmt: skip
    after = torch.rand(1)
    torch.manual_seed(3)
    Net()  # what drew from the caller's state: the model, and the two draws Lightning's loaders make as they
    for _ in range(2):  # start (the training epoch, the validation)
        torch.empty((), dtype=torch.int64).random_()
    assert torch.equal(after, torch.rand(1))


class Net(torch.nn.Module):
    def __init__(self, seq_len: int = 2):
        super().__init__()
        self.conv = torch.nn.Conv2d(seq_len, 1, 3, padding=1)

    def forward(self, x):
        return self.conv(x.flatten(1, 2))


def test_loader_draws_follow_lightnings_dataloaders_persistent_workers_included():
    from trainer.compat.base_trainer import LoaderDraws

    def draws(cb, calls):
        torch.manual_seed(0)
        for name, done in calls:
            t = SimpleNamespace(progress=SimpleNamespace(batches_done=done))
            cb.on_train_epoch_start(t, 0) if name == "train" else cb.on_validation_start(t)
        return torch.rand(1)

    def after(n):
        torch.manual_seed(0)
        for _ in range(n):
            torch.empty((), dtype=torch.int64).random_()
        return torch.rand(1)

    run = [("train", 0), ("val", 0), ("train", 0), ("val", 0)]
    assert torch.equal(draws(LoaderDraws(False), run), after(4))  # a new iterator per epoch: a draw each
    assert torch.equal(draws(LoaderDraws(True), run), after(2))  # persistent workers: the first start only
    assert torch.equal(draws(LoaderDraws(False), [("train", 3)]), after(0))  # resumed mid-epoch: drawn before
    cb = LoaderDraws(True)
    draws(cb, [("train", 0)])
    again = LoaderDraws(True)
    again.load_state_dict(cb.state_dict())  # a resume knows the training loader had started
    assert torch.equal(draws(again, [("train", 0), ("val", 0)]), after(1))


# ------------------------------------------------------------------ differences on purpose: one line each
def test_each_deliberate_difference_is_one_line_that_names_the_matching_key(tmp_path):
    bt = BaseTrainer("l", "u", area(), Net, Months, tmp_path / "l.pt")
    notes = ["precision: auto -> bf16-mixed on cuda", "num_workers: auto -> 0: cheap", "other"]
    t = SimpleNamespace(
        cfg=SimpleNamespace(baseline=False, cudnn_benchmark=True),
        rt=SimpleNamespace(device=torch.device("cuda"), precision="bf16-mixed"),
        data=SimpleNamespace(on_device=False, loader_kw={"num_workers": 0}),
        notes=notes,
    )
    bt._differences(t)  # type: ignore[arg-type]
    assert len(notes) == 4 and notes[2] == "other"
    assert "precision: auto -> bf16-mixed" in notes[0] and "trainer_params['precision']='16-mixed'" in notes[0]
    assert "trainer_params['num_workers']=8 matches it" in notes[1]
    assert "trainer_params['cudnn_benchmark']=False matches it" in notes[3]
    t.data.on_device, t.notes = True, ["data: held on cuda, batches gathered there (no loader workers)"]
    bt._differences(t)  # type: ignore[arg-type]
    assert len(t.notes) == 3 and "device_cache']=False reads through a DataLoader" in t.notes[0]
    assert not any(n.startswith("num_workers") for n in t.notes)  # no loader: nothing to say about workers
    given = BaseTrainer("l", "u", area(), Net, Months, tmp_path / "l.pt",
                        trainer_params={"precision": "bf16-mixed", "cudnn_benchmark": True, "num_workers": 2})  # fmt: skip
    t.data, t.notes = SimpleNamespace(on_device=False, loader_kw={"num_workers": 2}), []
    given._differences(t)  # type: ignore[arg-type]
    assert t.notes == []  # what the user wrote is not a difference to explain


# ------------------------------------------------------------------ save, load, predict
TUPLE_NET = '''
import torch


class TupleNet(torch.nn.Module):
    """Insists on tuples, as ConvLSTM does."""

    def __init__(self, kernel_size=(3, 3), layers=((3, 3), (1, 1)), area=None, hidden=[4], opts=None, name="x",
                 act=None):
        super().__init__()
        if not (isinstance(kernel_size, tuple) or (isinstance(kernel_size, list)
                                                   and all(isinstance(k, tuple) for k in kernel_size))):
            raise ValueError("kernel_size must be tuple or list of tuples")
        assert all(isinstance(k, tuple) for k in layers), layers
        self.args = dict(kernel_size=kernel_size, layers=layers, area=area, hidden=hidden, opts=opts, name=name)
        self.conv = torch.nn.Conv2d(2, 1, kernel_size[0] if isinstance(kernel_size, list) else kernel_size,
                                    padding="same")

    def forward(self, x):
        return self.conv(x.flatten(1, 2))
'''


def test_constructor_arguments_come_back_as_their_types_in_a_new_process(tmp_path, monkeypatch):
    (tmp_path / "tuple_net.py").write_text(TUPLE_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    from tuple_net import TupleNet  # type: ignore[import-not-found]

    mp = {"kernel_size": [(3, 3), (1, 1)], "layers": ((3, 3), (5, (1, 2))), "hidden": [4, (2, 2)],
          "opts": {"mode": "same", "scale": 0.5, "flag": True, "none": None}, "name": "tn"}  # fmt: skip
    bt = BaseTrainer("t", "u", area(), TupleNet, Months, tmp_path / "t.pt", model_params=mp,
                     trainer_params={"epochs": 1, "batch_size": 8, "output_dir": str(tmp_path / "runs"),
                                     "progress_bar": False, "num_workers": 0}, log=lambda s: None)  # fmt: skip
    model = bt.train()
    assert model.args["area"] is bt.area  # the model names `area`: it gets it
    x = torch.randn(2, 2, 1, 4, 8)
    want = model.eval()(x).detach()
    torch.save(x, tmp_path / "x.pt")
    torch.save(want, tmp_path / "want.pt")
    script = textwrap.dedent(f"""
        import json, sys, torch
        sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]
        from trainer.compat.base_trainer import load_model
        import tuple_net, datasets.area  # the program imports its classes; the file only names them
        model = load_model({str(tmp_path / "t.pt")!r})  # the replacement of torch.load(path, weights_only=False)
        a = model.args
        same = torch.equal(model(torch.load({str(tmp_path / "x.pt")!r})), torch.load({str(tmp_path / "want.pt")!r}))
        print(json.dumps({{"types": {{k: repr(v) for k, v in a.items()}}, "area": type(a["area"]).__module__ + "."
                          + type(a["area"]).__name__, "same": same, "training": model.training}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ""}, cwd=tmp_path)  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["types"]["kernel_size"] == repr([(3, 3), (1, 1)])
    assert got["types"]["layers"] == repr(((3, 3), (5, (1, 2))))
    assert got["types"]["hidden"] == repr([4, (2, 2)])
    assert got["types"]["opts"] == repr({"mode": "same", "scale": 0.5, "flag": True, "none": None})
    assert got["types"]["area"] == repr(bt.area) and got["area"] == "datasets.area.Area"
    assert got["same"] is True and got["training"] is False


@pytest.mark.parametrize("named", ["os:system", "subprocess:Popen", "builtins:exec", "tuple_net_never:Net"])
def test_a_model_file_never_makes_load_model_import_or_call_what_it_names(tmp_path, named):
    """A saved model file names its class; load_model only finds a model class the program imported itself."""
    import trainer.compat.base_trainer as bt

    path = tmp_path / "evil.pt"
    touched = tmp_path / "touched"
    torch.save({"format": bt.MODEL_FORMAT, "model_class": named, "state_dict": {},
                "model_params": {"command": f"touch {touched}", "args": ["touch", str(touched)]}}, path)  # fmt: skip
    with pytest.raises(ValueError, match="not a class this program has imported"):
        bt.load_model(path)
    assert not touched.exists() and "tuple_net_never" not in sys.modules


def test_an_argument_that_is_not_a_plain_value_is_named_at_save_and_asked_for_at_load(tmp_path, monkeypatch):
    (tmp_path / "tuple_net.py").write_text(TUPLE_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    from tuple_net import TupleNet  # type: ignore[import-not-found]

    lines: list[str] = []
    bt = BaseTrainer("t", "u", None, TupleNet, Months, tmp_path / "t.pt", model_params={"act": torch.nn.GELU()},
                     dataset_params={"lon": [0, 40], "lat": [0, 20]}, log=lines.append,
                     trainer_params={"epochs": 1, "batch_size": 8, "output_dir": str(tmp_path / "runs"),
                                     "progress_bar": False, "num_workers": 0})  # fmt: skip
    bt.train()
    assert sum("model argument(s) act are not plain values" in ln for ln in lines) == 1
    with pytest.raises(ValueError, match=r"saved without its argument\(s\) act .*load_model\(path, act=\.\.\.\)"):
        load_model(tmp_path / "t.pt")
    assert isinstance(load_model(tmp_path / "t.pt", act=torch.nn.ReLU()), TupleNet)
    torch.save(TupleNet(), tmp_path / "pickled.pt")  # a whole module, as torch.save(model) writes it
    with pytest.raises(CheckpointError, match=r"pickled.pt: cannot be read as weights.*weights_only=False"):
        load_model(tmp_path / "pickled.pt")


def test_predict_returns_2d_maps(tmp_path):
    bt = BaseTrainer("p", "u", area(), Net, Months, tmp_path / "p.pt", log=lambda s: None,
                     trainer_params={"epochs": 1, "batch_size": 8, "output_dir": str(tmp_path / "runs"),
                                     "progress_bar": False, "num_workers": 0})  # fmt: skip
    bt.train()
    x, y, pred, rmse, r2, ssta = bt.predict(offset=1)
    assert x.shape == y.shape == pred.shape == (4, 8)  # from (2, 1, 4, 8), (1, 4, 8) and (1, 1, 4, 8)
    ds = Months([0, 40], [0, 20], offset=1)
    assert np.array_equal(x, ds[0][0][0, 0].numpy())
    assert np.array_equal(y, ds[0][1][0].numpy(), equal_nan=True)
    assert np.isnan(pred[0, :2]).all() and np.isfinite(pred[1:]).all()  # land stays NaN
    with torch.no_grad():
        want = bt.model(ds[0][0][None])[0, 0].numpy()
    ok = np.isfinite(y)
    assert rmse == pytest.approx(float(np.sqrt(np.mean((want[ok] - y[ok]) ** 2))), rel=1e-5)
    assert ssta is None and np.isfinite(r2)
    assert first_map(np.zeros((3, 5))).shape == (3, 5) and first_map(np.zeros(7)).shape == (7,)


# ------------------------------------------------------------------ a batch sampler without set_epoch or state
class SequenceSampler(torch.utils.data.Sampler):
    """Lightning's LSTM demo sampler (lightning.pytorch.demos.lstm): no set_epoch, no state_dict."""

    def __init__(self, dataset, batch_size):
        super().__init__()
        self.dataset, self.batch_size = dataset, batch_size
        self.chunk_size = len(self.dataset) // self.batch_size

    def __iter__(self):
        n = len(self.dataset)
        for i in range(self.chunk_size):
            yield list(range(i, n - (n % self.batch_size), self.chunk_size))

    def __len__(self):
        return self.chunk_size


def test_a_batch_sampler_without_set_epoch_or_state_trains_and_resumes_exactly(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))

    def fn(ds, batch_size, seed, rank, world_size, drop_last):
        return SequenceSampler(ds, batch_size)

    def fit(run, max_steps, resume=None):
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        cfg = TrainConfig(max_steps=max_steps, batch_size=10, num_workers=0, device_cache=False, progress_bar=False,
                          output_dir=str(tmp_path), run_name=run, resume=resume, warmup_steps=0, lr_decay_steps=1000,
                          validation_interval=1)  # fmt: skip
        t = Trainer(cfg, Task("seq", net, data, batch_sampler_fn=fn), log=lambda s: None)
        t.fit()
        return net, t

    a, t = fit("a", 50)  # 20 batches per epoch: 2.5 epochs
    assert any("SequenceSampler has no state_dict" in n for n in t.notes)
    fit("b", 30)  # stopped mid-epoch 2
    c, _ = fit("b", 50, resume=str(tmp_path / "b"))
    assert torch.equal(a.weight, c.weight) and torch.equal(a.bias, c.bias)
