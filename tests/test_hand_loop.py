"""A hand-written loop's pieces go into plainloop as they are: the user's optimizer and torch LR scheduler
(pytorch/examples' mnist: Adadelta + StepLR per epoch), a per-step lr function (nanoGPT's get_lr), a plain
DataLoader's data order (TrainConfig(data_order="plain")); the same weights and lr curve as the hand loop, exact
resume, and one line for each combination that cannot work.

Tolerance: plainloop runs the same float32 operations in the same order as the hand loop here (batches in order,
the same optimizer object, no AMP, one thread), so weights are compared for equality.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
EPOCHS, BATCH = 3, 16


class Net(nn.Module):
    """pytorch/examples' mnist Net, shrunk: conv, pool, two linear layers, log_softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc1, self.fc2 = nn.Linear(4 * 3 * 3, 16), nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def nll(model, batch):
    return F.nll_loss(model(batch[0]), batch[1])


def mnist_data(n: int = 70) -> TensorDataset:  # 70 = 4 full batches of 16 and a last one of 6
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(epochs=EPOCHS, batch_size=BATCH, data_order="plain", precision="32", device="cpu", num_workers=0,
                progress_bar=False, output_dir=str(tmp_path), run_name="run", log_every=2)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def fit(model, task_kw, tmp_path, **cfg_kw):
    task = Task("mnist", model, mnist_data(), **{"loss_fn": nll, **task_kw})
    trainer = Trainer(cfg(tmp_path, **cfg_kw), task, log=lambda s: None)
    trainer.fit()
    return trainer


def hand_mnist(model, epochs=EPOCHS):
    """pytorch/examples mnist's main(): train() per epoch, then scheduler.step()."""
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    sched = StepLR(opt, step_size=1, gamma=0.7)
    lrs = []
    for _ in range(epochs):
        model.train()
        for x, y in DataLoader(mnist_data(), batch_size=BATCH):
            lrs.append(opt.param_groups[0]["lr"])
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
        sched.step()
    return lrs


class LrLog:
    """The lr each optimizer step runs with (read before the step)."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, optimizer) -> None:
        self.lrs.append(float(optimizer.param_groups[0]["lr"]))


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# ------------------------------------------------------------------ the mnist port
class DropoutNet(Net):
    """mnist's Net keeps its Dropout: each epoch's iter(DataLoader) draws from the global random state first."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = self.drop(F.max_pool2d(F.relu(self.conv(x)), 2))
        return F.log_softmax(self.fc2(self.drop(F.relu(self.fc1(torch.flatten(x, 1))))), dim=1)


@pytest.mark.parametrize("test_each_epoch", [False, True])
def test_a_port_with_dropout_draws_the_masks_of_the_hand_loop(tmp_path, test_each_epoch):
    """mnist's main() runs test() after each epoch: its iter(test_loader) draws too, as plainloop's validation does."""
    torch.manual_seed(0)
    m0 = DropoutNet()
    hand, mine = copy.deepcopy(m0), copy.deepcopy(m0)
    torch.manual_seed(1)
    opt = torch.optim.Adadelta(hand.parameters(), lr=1.0)
    sched = StepLR(opt, step_size=1, gamma=0.7)
    for _ in range(EPOCHS):
        hand.train()
        for x, y in DataLoader(mnist_data(), batch_size=BATCH):
            opt.zero_grad()
            F.nll_loss(hand(x), y).backward()
            opt.step()
        if test_each_epoch:
            hand.eval()
            with torch.no_grad():
                for x, _ in DataLoader(mnist_data(20), batch_size=1000):
                    hand(x)
        sched.step()
    opt = torch.optim.Adadelta(mine.parameters(), lr=1.0)
    val = mnist_data(20) if test_each_epoch else None
    task = Task("mnist", mine, mnist_data(), val, loss_fn=nll, optimizer=opt, scheduler=StepLR(opt, 1, 0.7))
    Trainer(cfg(tmp_path, seed=1, validation_interval=1), task, log=lambda s: None).fit()
    assert same_weights(hand, mine)


def test_mnist_port_trains_the_same_weights_as_the_hand_loop(tmp_path):
    torch.manual_seed(0)
    m0 = Net()
    hand, mine = copy.deepcopy(m0), copy.deepcopy(m0)
    hand_lrs = hand_mnist(hand)
    opt = torch.optim.Adadelta(mine.parameters(), lr=1.0)
    sched = StepLR(opt, step_size=1, gamma=0.7)
    log = LrLog()
    task = Task("mnist", mine, mnist_data(), loss_fn=nll, optimizer=opt, scheduler=sched, callbacks=[log])
    lines: list[str] = []
    t = Trainer(cfg(tmp_path), task, log=lines.append)
    summary = t.fit()
    assert summary["steps"] == EPOCHS * 5  # the last batch of 6 kept: 5 batches an epoch
    assert t.optimizer is opt and sched.last_epoch == EPOCHS  # the very objects, stepped once per epoch
    assert log.lrs == hand_lrs
    assert same_weights(hand, mine)
    line = next(s for s in lines if "optimizer: your Adadelta" in s)
    assert "from Task(optimizer=...)" in line and "StepLR, stepped every epoch" in line


def test_a_step_interval_scheduler_steps_after_every_optimizer_step(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    log = LrLog()
    fit(model, dict(optimizer=opt, scheduler=sched, scheduler_interval="step", callbacks=[log]), tmp_path, epochs=1)
    assert sched.last_epoch == 5
    assert log.lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])


def test_data_order_plain_is_a_dataloaders_order_and_a_fixed_setting():
    c = TrainConfig(data_order="plain").effective()
    assert (c.shuffle, c.drop_last) == (False, False)
    assert TrainConfig().effective().shuffle  # the default keeps plainloop's shuffled epochs
    from trainer.state import resume_changes

    old, new = {"train": TrainConfig().to_dict()}, {"train": TrainConfig(data_order="plain").to_dict()}
    assert ("data_order", "default", "plain") in resume_changes(old, new)  # a resume may not change the order


def test_a_skipped_step_steps_neither_the_scheduler_nor_lr_fn(tmp_path):
    from trainer.compat.lightning import GivenStepSchedule, SchedulerConfig
    from trainer.compat.nanogpt import LrFnSchedule

    calls = []

    def nan_second(model, batch):  # the second batch's loss is NaN: that optimizer step is skipped
        calls.append(1)
        return nll(model, batch) * (float("nan") if len(calls) == 2 else 1.0)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    task_kw = dict(loss_fn=nan_second, optimizer=opt, scheduler=sched, scheduler_interval="step")
    t = fit(model, task_kw, tmp_path, epochs=1, max_consecutive_skips=3)
    assert t.opt.skip_counts()[0] == 1 and sched.last_epoch == 4  # 5 steps, 1 skipped (read on the host)
    # where only the device knows (fp16, a fused optimizer on a GPU), the flag is handed to the schedule
    opt = torch.optim.SGD(Net().parameters(), lr=0.1)
    steps = GivenStepSchedule(opt, [SchedulerConfig(StepLR(opt, 1, 0.5), "step")], lambda s, m: s.step())
    fn = LrFnSchedule(opt, get_lr)
    opt.step()  # no gradients, nothing moves: torch's scheduler wants a step before its own
    for found in (1.0, 0.0, 1.0):
        steps.step(torch.tensor(found))
        fn.step(torch.tensor(found))
    assert steps.steps == 1 and steps.configs[0].scheduler.last_epoch == 1 and fn.steps == 1


# ------------------------------------------------------------------ nanoGPT's get_lr
def get_lr(it, warmup_iters=3, lr_decay_iters=10, learning_rate=6e-3, min_lr=6e-4):
    """nanoGPT train.py's get_lr, verbatim but for its globals."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_nanogpt_get_lr_gives_the_hand_loops_lr_sequence_and_weights(tmp_path):
    torch.manual_seed(0)
    m0 = Net()
    hand, mine = copy.deepcopy(m0), copy.deepcopy(m0)
    opt = torch.optim.AdamW(hand.parameters(), lr=6e-3, betas=(0.9, 0.95))
    hand_lrs, it = [], 0
    for _ in range(EPOCHS):
        for x, y in DataLoader(mnist_data(), batch_size=BATCH):
            lr = get_lr(it)
            for g in opt.param_groups:
                g["lr"] = lr
            hand_lrs.append(lr)
            F.nll_loss(hand(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            it += 1
    log = LrLog()
    mine_opt = torch.optim.AdamW(mine.parameters(), lr=6e-3, betas=(0.9, 0.95))
    t = fit(mine, dict(optimizer=mine_opt, lr_fn=get_lr, callbacks=[log]), tmp_path)
    assert log.lrs == hand_lrs and t.optim.schedule.steps == len(hand_lrs)
    assert same_weights(hand, mine)


def test_lr_fn_alone_drives_plainloops_adamw(tmp_path):
    torch.manual_seed(0)
    log = LrLog()
    t = fit(Net(), dict(lr_fn=get_lr, callbacks=[log]), tmp_path, epochs=1)
    assert log.lrs == [get_lr(i) for i in range(5)]
    assert type(t.optimizer).__name__ == "AdamW" and "get_lr(step) sets the lr" in "\n".join(t.notes)


def test_lr_fn_goes_on_top_of_a_nanogpt_models_configure_optimizers(tmp_path):
    class GPTish(Net):
        def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
            return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)

    torch.manual_seed(0)
    log = LrLog()
    t = fit(GPTish(), dict(lr_fn=get_lr, callbacks=[log]), tmp_path, epochs=1)
    assert log.lrs == [get_lr(i) for i in range(5)] and t.optimizer.param_groups[0]["betas"] == (0.9, 0.999)


# ------------------------------------------------------------------ resume
@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_a_resumed_run_continues_the_scheduler_exactly(tmp_path, interval):
    def pieces(model):
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
        return dict(optimizer=opt, scheduler=StepLR(opt, step_size=2, gamma=0.7), scheduler_interval=interval)

    torch.manual_seed(0)
    m0 = Net()
    a, b, c = copy.deepcopy(m0), copy.deepcopy(m0), copy.deepcopy(m0)
    la, lc = LrLog(), LrLog()
    fit(a, {**pieces(a), "callbacks": [la]}, tmp_path / "straight")
    fit(b, pieces(b), tmp_path / "split", max_steps=7)  # stops mid-epoch 2
    kw = {**pieces(c), "callbacks": [lc]}
    t = fit(c, kw, tmp_path / "split", resume=str(tmp_path / "split" / "run"))
    assert lc.lrs == la.lrs[7:] and kw["scheduler"].last_epoch == (EPOCHS if interval == "epoch" else 15)
    assert same_weights(a, c) and t.step == 15


def test_a_resumed_run_continues_lr_fn(tmp_path):
    torch.manual_seed(0)
    m0 = Net()
    a, b, c = copy.deepcopy(m0), copy.deepcopy(m0), copy.deepcopy(m0)
    la, lc = LrLog(), LrLog()
    fit(a, dict(lr_fn=get_lr, callbacks=[la]), tmp_path / "straight")
    fit(b, dict(lr_fn=get_lr), tmp_path / "split", max_steps=6)
    fit(c, dict(lr_fn=get_lr, callbacks=[lc]), tmp_path / "split", resume=str(tmp_path / "split" / "run"))
    assert lc.lrs == la.lrs[6:] == [get_lr(i) for i in range(6, 15)]
    assert same_weights(a, c)


# ------------------------------------------------------------------ a model's learning_rate
class WithRate(Net):
    def __init__(self) -> None:
        super().__init__()
        self.learning_rate = 0.5


def test_a_plain_models_learning_rate_does_not_beat_lr(tmp_path):
    t = fit(WithRate(), {}, tmp_path, epochs=1, lr=1e-3)
    assert t.optim.schedule.base_lrs[0] == pytest.approx(1e-3)
    assert any("lr 0.001 (from --lr / TrainConfig.lr)" in n for n in t.notes)


def test_a_lightningmodules_learning_rate_is_its_lr(tmp_path):
    L = pytest.importorskip("lightning")

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.learning_rate = Net(), 0.02

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            return nll(self, batch)

    t = fit(Lit(), {}, tmp_path, epochs=1)
    assert t.optim.schedule.base_lrs[0] == pytest.approx(0.02)
    notes = "\n".join(t.notes)
    assert "Lit.learning_rate = 0.02" in notes and "lr 0.02 (from Task.lr; --lr 0.001 not used)" in notes


# ------------------------------------------------------------------ refusals, one line each
def _refused(tmp_path, match, model=None, cfg_kw=None, **task_kw):
    model = model or Net()
    with pytest.raises(ValueError, match=match) as e:
        fit(model, task_kw, tmp_path, **(cfg_kw or {}))
    assert "\n" not in str(e.value)


def test_bad_combinations_are_refused_in_one_line(tmp_path):
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    other = torch.optim.SGD(m.parameters(), lr=0.1)
    _refused(tmp_path, "scheduler steps another optimizer", m, optimizer=opt, scheduler=StepLR(other, 1))
    _refused(tmp_path, "warmup_steps=3.*would do nothing", m, {"warmup_steps": 3}, optimizer=opt)
    _refused(tmp_path, "lr=0.01.*would do nothing", m, {"lr": 0.01}, optimizer=opt)
    _refused(tmp_path, "not Net's", Net(), optimizer=opt)  # built over another model's parameters
    _refused(tmp_path, "scheduler= without optimizer=", m, scheduler=StepLR(other, 1))
    _refused(tmp_path, "scheduler= and lr_fn= both", m, optimizer=opt, scheduler=StepLR(opt, 1), lr_fn=get_lr)
    _refused(tmp_path, "scheduler_interval='batch'", m, optimizer=opt, scheduler_interval="batch")
    _refused(tmp_path, "not callable", m, lr_fn=0.1)
    _refused(tmp_path, "optimizer_fn or optimizer=", m, optimizer=opt, optimizer_fn=lambda *a: None)
    _refused(tmp_path, "warmup_steps=3", m, {"warmup_steps": 3}, lr_fn=get_lr)
    _refused(tmp_path, r"<lambda>\(0\) returned nan", m, lr_fn=lambda it: float("nan"))
