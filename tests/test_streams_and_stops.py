"""Streams as Lightning runs them (a finite IterableDataset: one pass an epoch; with max_steps the stream restarts),
`trainer.should_stop`, and the start-up refusals of a monitor no validation reports, a metric that would replace
val_loss and an empty split (issue 39)."""

from __future__ import annotations

import json
import os
import signal

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from tests.helpers import metric_rows, toy_config
from trainer import Task, Trainer
from trainer.finish import TrainingStopped
from trainer.state import RunFinished

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(tmp_path, **kw):
    return toy_config(tmp_path, **{"batch_size": 10, "warmup_steps": 0, "log_every": 2, **kw})


def pairs(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(1, keepdim=True)


class Pass(IterableDataset):
    """A finite stream: `n` samples a pass (Lightning's DQN example: 50 replay samples an epoch); every pass
    starts where the last one ended (pass k gives samples seeded k), and it keeps its place (state_dict)."""

    def __init__(self, n=50, stateful=True):
        self.n, self.passes, self.pos, self.stateful = n, 0, 0, stateful

    def __iter__(self):
        x, y = pairs(self.n, self.passes)
        while self.pos < self.n:
            i = self.pos
            self.pos += 1
            yield x[i], y[i]
        self.passes, self.pos = self.passes + 1, 0

    def state_dict(self):
        return {"passes": self.passes, "pos": self.pos}

    def load_state_dict(self, state):
        self.passes, self.pos = state["passes"], state["pos"]


class Replayed(IterableDataset):
    """The same finite stream without state: every pass gives the same samples."""

    def __init__(self, n=50):
        self.n = n

    def __iter__(self):
        x, y = pairs(self.n, 0)
        yield from zip(x, y)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def run(c, train, val=None, model=None, **kw):
    t = Trainer(c, Task("s", model or net(), train, val, **kw), log=lambda s: None)
    return t, t.fit()


def val_set():
    return TensorDataset(*pairs(20, 9))


def test_a_finite_stream_trains_one_pass_per_epoch_without_max_steps(tmp_path):
    lines = []
    t = Trainer(cfg(tmp_path, epochs=3), Task("s", net(), Pass(), val_set()), log=lines.append)
    s = t.fit()
    assert (t.step, t.epoch, s["steps"]) == (15, 3, 15)  # 50 samples, batch 10: 5 steps a pass
    vals = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "val"]
    assert [r["epoch"] for r in vals] == [1, 2, 3]  # validated at each pass's end
    assert any("has no len(): an epoch ends when a pass of it is exhausted" in line for line in lines)
    assert any(line.startswith("[epoch 3/3] step 15/?") for line in lines), lines
    with pytest.raises(RunFinished):  # it finished: a resume does not train it again
        run(cfg(tmp_path, epochs=3, resume=str(tmp_path / "run")), Pass(), val_set())


def test_with_max_steps_a_finite_stream_restarts_a_pass_as_a_new_epoch(tmp_path):
    t, s = run(cfg(tmp_path, max_steps=12), Pass(), val_set())
    assert (t.step, t.epoch, t.batches_done) == (12, 2, 2) and "val_loss" in s["final_metrics"]


def test_a_pass_that_ends_mid_window_steps_it(tmp_path):
    """5 batches a pass, 2 per optimizer step: the fifth steps alone, as under Lightning."""
    t, _ = run(cfg(tmp_path, epochs=2, accumulate_grad_batches=2), Pass())
    assert (t.step, t.epoch) == (6, 2)


def test_a_stream_with_a_len_has_known_epochs(tmp_path):
    class Sized(Replayed):
        def __len__(self):
            return self.n

    lines = []
    t = Trainer(cfg(tmp_path, epochs=2), Task("s", net(), Sized()), log=lines.append)
    t.fit()
    assert t.step == 10 and any("5 batches/epoch, 10 optimizer steps" in line for line in lines)


def test_a_pass_without_a_batch_is_one_line_not_an_endless_loop(tmp_path):
    with pytest.raises(ValueError, match=r"the train stream \(Replayed\) gave no batch in epoch 1"):
        run(cfg(tmp_path, max_steps=5), Replayed(0))


@pytest.mark.parametrize("stateful", [True, False])
def test_a_stream_resumes_mid_pass_exactly(tmp_path, stateful):
    make = (lambda: Pass()) if stateful else (lambda: Replayed())
    a, b, c = net(), net(), net()
    run(cfg(tmp_path / "a", epochs=3, log_every=1), make(), model=a)

    class StopAt:
        def on_log(self, trainer, row):
            if row.get("kind") == "train" and row["step"] == 8:  # epoch 2, batch 3 of 5
                os.kill(os.getpid(), signal.SIGTERM)

    t = Trainer(cfg(tmp_path / "b", epochs=3, log_every=1), Task("s", b, make()), callbacks=[StopAt()],
                log=lambda s: None)  # fmt: skip
    with pytest.raises(TrainingStopped):
        t.fit()
    assert (t.epoch, t.batches_done) == (1, 3)
    t, _ = run(cfg(tmp_path / "b", epochs=3, log_every=1, resume=str(tmp_path / "b" / "run")), make(), model=c)
    assert t.step == 15
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), c.state_dict().values()))


# ------------------------------------------------------------------ should_stop
class DQNLike(L.LightningModule):
    """A LightningModule on a finite stream that ends its run itself (self.trainer.should_stop)."""

    def __init__(self, stop_at):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.stop_at = stop_at

    def training_step(self, batch, batch_idx):
        if self.global_step + 1 == self.stop_at:
            self.trainer.should_stop = True
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_a_lightning_module_setting_should_stop_ends_the_run_after_that_step(tmp_path):
    t, s = run(cfg(tmp_path, epochs=10), Pass(), val_set(), model=DQNLike(stop_at=7))
    assert t.step == 7 and s["steps"] == 7
    rows = metric_rows(tmp_path / "run")
    assert [r["step"] for r in rows if r["kind"] == "val"][-1] == 7  # validated at the stop, as Lightning does
    assert any("should_stop" in n for n in s["notes"])
    with pytest.raises(RunFinished, match="should_stop"):
        run(cfg(tmp_path, epochs=10, resume=str(tmp_path / "run")), Pass(), val_set(), model=DQNLike(stop_at=7))


def test_a_callback_setting_should_stop_at_an_epoch_end_stops_there(tmp_path):
    class After2:
        def on_train_epoch_end(self, trainer, epoch):
            trainer.should_stop = epoch == 1

    t = Trainer(cfg(tmp_path, epochs=5), Task("s", net(), TensorDataset(*pairs(40, 1))), callbacks=[After2()],
                log=lambda s: None)  # fmt: skip
    t.fit()
    assert (t.epoch, t.step) == (2, 8)


# ------------------------------------------------------------------ refused at start-up, before any file
def test_a_monitor_the_built_in_validation_does_not_report_is_refused(tmp_path):
    data = TensorDataset(*pairs(40, 1))
    with pytest.raises(ValueError, match=r"monitor_metric='val_nope'\): the validation reports val_loss, val_mae"):
        Trainer(cfg(tmp_path), Task("s", net(), data, data, monitor_metric="val_nope",
                                    metrics={"mae": lambda o, t: (o - t).abs()}))  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_metric_named_loss_is_refused(tmp_path):
    data = TensorDataset(*pairs(40, 1))
    with pytest.raises(ValueError, match=r"'loss' is the built-in val_loss; name the metric otherwise"):
        Trainer(cfg(tmp_path), Task("s", net(), data, data, metrics={"loss": lambda o, t: (o - t).abs()}))


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_an_empty_split_is_named_before_the_run_directory_is_made(tmp_path, split):
    data, empty = TensorDataset(*pairs(40, 1)), TensorDataset(*pairs(0, 1))
    sets = {"train": data, "val": data, "test": data, split: empty}
    with pytest.raises(ValueError, match=f"its {split} split \\(TensorDataset\\) is empty"):
        Trainer(cfg(tmp_path), Task("s", net(), sets["train"], sets["val"], sets["test"])).fit()
    assert not (tmp_path / "run").exists()


def test_best_json_names_the_monitor_that_chose_best_pt(tmp_path):
    data = TensorDataset(*pairs(40, 1))
    run(cfg(tmp_path), data, data, metrics={"mae": lambda o, t: (o - t).abs()}, monitor_metric="val_mae")
    assert json.loads((tmp_path / "run" / "best.json").read_text())["metric"] == "val_mae"
