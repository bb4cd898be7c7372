"""Your model as it is: real `lightning.LightningModule`s trained by plainloop and by `lightning.Trainer` on a CPU,
same model, data and seed, compared hook by hook, lr by lr and weight by weight; nanoGPT-style models; the errors.

Tolerance: plainloop and Lightning run the same float32 operations in the same order here (batches in order,
the model's own AdamW, no AMP), so weights are compared with atol 1e-6 (they come out bit-identical today; the
margin only allows for a different summation order in a future torch).
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import metric_rows
from trainer import Task, TrainConfig, Trainer
from trainer.compat.lightning import ModelProtocolError, UnsupportedLightningFeature, parse_optimizers

L = pytest.importorskip("lightning")
pytestmark = pytest.mark.usefixtures("one_thread")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
ATOL = 1e-6
EPOCHS, BATCH = 4, 32

HOOKS = [
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_start", "on_validation_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_before_optimizer_step", "setup", "teardown",
]  # fmt: skip


def data(n: int = 224) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(1, keepdim=True).sin()
    return TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])


class Base(L.LightningModule):
    """A small regression LightningModule that records what it sees from inside."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.calls: dict[str, int] = {}
        self.step_lrs: list[float] = []  # lr at every batch start
        self.seen: list[tuple[int, int]] = []  # (current_epoch, global_step) at each epoch start
        self.ema = [p.detach().clone() for p in self.net.parameters()]

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_mse", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.05)

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1


def _hook(name):
    def fn(self, *args, **kwargs):
        self._count(name)
        if name == "on_train_batch_start":
            self.step_lrs.append(float(self.trainer.optimizers[0].param_groups[0]["lr"]))
        if name == "on_train_epoch_start":
            self.seen.append((self.current_epoch, self.global_step, str(self.device)))
        if name == "on_train_batch_end":
            outputs = args[0]
            assert set(outputs) >= {"loss"} and not outputs["loss"].requires_grad
            with torch.no_grad():  # an EMA updated in the hook, as research code does
                for e, p in zip(self.ema, self.net.parameters()):
                    e.mul_(0.9).add_(p.detach(), alpha=0.1)

    fn.__name__ = name
    return fn


for _name in HOOKS:
    setattr(Base, _name, _hook(_name))


def lightning_fit(model, train, val, epochs=EPOCHS, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, max_epochs=epochs, **kw,
        )  # fmt: skip
        trainer.fit(model, DataLoader(train, batch_size=BATCH), DataLoader(val, batch_size=BATCH))
    return trainer


def plainloop_fit(model, train, val, tmp_path, epochs=EPOCHS, **kw):
    cfg = dict(
        epochs=epochs, batch_size=BATCH, shuffle=False, drop_last=False, validation_interval=1, progress_bar=False,
        output_dir=str(tmp_path), run_name="run", log_every=3, num_workers=0,
    )  # fmt: skip
    cfg.update(kw)
    return Trainer(TrainConfig(**cfg), Task("mine", model, train, val), log=lambda s: None).fit()


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def both(model_cls, tmp_path, lightning_kw=None, **plainloop_kw):
    train, val = data()
    torch.manual_seed(0)
    m0 = model_cls()
    a, b = copy.deepcopy(m0), copy.deepcopy(m0)
    lt = lightning_fit(a, train, val, **(lightning_kw or {}))
    summary = plainloop_fit(b, train, val, tmp_path, **plainloop_kw)
    return a, b, lt, summary


# ------------------------------------------------------------------ configure_optimizers forms
def _lambda(e):
    return min(1.0, (e + 1) / 2) * 0.5 ** max(0, e - 2)


def _opt(m):
    return torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.05)


FORMS = {
    "optimizer": lambda m: _opt(m),
    "list": lambda m: [_opt(m)],
    "two_lists": lambda m: (lambda o: ([o], [torch.optim.lr_scheduler.LambdaLR(o, _lambda)]))(_opt(m)),
    "dict_scheduler": lambda m: (lambda o: {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(o, _lambda)})(
        _opt(m)
    ),
    "dict_step_interval": lambda m: (
        lambda o: {
            "optimizer": o,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 5, 0.5), "interval": "step",
                             "frequency": 2},
        }
    )(_opt(m)),
    "dict_plateau": lambda m: (
        lambda o: {
            "optimizer": o,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.3),
                             "monitor": "val_loss"},
        }
    )(torch.optim.SGD(m.parameters(), lr=0.5)),
    "tuple_of_dict": lambda m: (
        lambda o: ({"optimizer": o, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(o, _lambda),
                                                     "frequency": 2}},)
    )(_opt(m)),
}  # fmt: skip


@pytest.mark.parametrize("form", list(FORMS))
def test_each_configure_optimizers_form_trains_as_under_lightning(tmp_path, form):
    class Model(Base):
        def configure_optimizers(self):
            return FORMS[form](self)

    a, b, lt, summary = both(Model, tmp_path)
    assert b.calls == a.calls  # every hook, as often as Lightning calls it
    assert b.calls["on_train_batch_start"] == EPOCHS * 6 and b.calls["on_fit_end"] == 1
    assert b.step_lrs == pytest.approx(a.step_lrs, rel=1e-12)  # the model's schedule, step by step
    assert b.seen == a.seen  # current_epoch and global_step inside the model
    assert max_diff(a, b) <= ATOL
    assert max(float((e - f).abs().max()) for e, f in zip(a.ema, b.ema)) <= ATOL  # the hook's EMA ran the same
    assert summary["final_metrics"]["val_loss"] == pytest.approx(float(lt.callback_metrics["val_loss"]), rel=1e-5)
    if form not in ("optimizer", "list"):
        assert len(set(b.step_lrs)) > 1  # the schedule did change the lr (the comparison is not vacuous)


def test_accumulation_and_clipping_with_the_models_optimizer_match_lightning(tmp_path):
    class Model(Base):
        def configure_optimizers(self):
            return FORMS["dict_step_interval"](self)

    a, b, _, _ = both(
        Model,
        tmp_path,
        lightning_kw={"accumulate_grad_batches": 2, "gradient_clip_val": 0.05},
        accumulate_grad_batches=2,
        gradient_clip_val=0.05,
    )
    assert b.calls == a.calls
    assert b.calls["on_before_optimizer_step"] == EPOCHS * 3
    assert b.step_lrs == pytest.approx(a.step_lrs, rel=1e-12)
    assert max_diff(a, b) <= ATOL


def test_the_run_records_the_models_real_optimizer_and_notes_where_it_came_from(tmp_path):
    class Model(Base):
        def configure_optimizers(self):
            return FORMS["dict_scheduler"](self)

    train, val = data()
    lines: list[str] = []
    cfg = TrainConfig(epochs=1, batch_size=BATCH, output_dir=str(tmp_path), run_name="run", progress_bar=False,
                      num_workers=0, lr=0.123, weight_decay=0.9)  # fmt: skip
    Trainer(cfg, Task("mine", Model(), train, val), log=lines.append).fit()
    note = [ln for ln in lines if "optimizer:" in ln]
    assert len(note) == 1 and "AdamW" in note[0] and "weight_decay=0.05" in note[0] and "LambdaLR" in note[0]
    assert "warm-up/cosine" in note[0] and "so lr=0.123, weight_decay=0.9 do nothing" in note[0]
    assert any(ln.startswith("[epoch") and "train_mse" in ln for ln in lines)  # the model's logs on the console
    import json

    conf = json.loads((tmp_path / "run" / "config.json").read_text())
    groups = conf["optimizer"]["param_groups"]
    assert conf["optimizer"]["type"] == "AdamW" and {g["weight_decay"] for g in groups} == {0.05}
    assert conf["optimizer"]["schedulers"][0]["type"] == "LambdaLR"
    rows = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "train"]
    assert rows and all("train_mse" in r for r in rows)  # self.log values land in the metrics rows
    assert rows[-1]["lr"] == pytest.approx(1e-2 * _lambda(0))  # the model's lr, no warm-up or scaling on top


def test_exact_resume_restores_the_models_scheduler(tmp_path):
    class Model(Base):
        def configure_optimizers(self):
            o = torch.optim.AdamW(self.parameters(), lr=1e-2)
            steps = {"scheduler": torch.optim.lr_scheduler.StepLR(o, 4, 0.7), "interval": "step"}
            return {"optimizer": o, "lr_scheduler": [steps, torch.optim.lr_scheduler.LambdaLR(o, _lambda)]}

    train, val = data()
    torch.manual_seed(0)
    m0 = Model()
    a, b = copy.deepcopy(m0), copy.deepcopy(m0)
    plainloop_fit(a, train, val, tmp_path / "straight")
    plainloop_fit(b, train, val, tmp_path / "split", epochs=2)
    c = copy.deepcopy(m0)  # a fresh process: new model object, state from the checkpoint
    plainloop_fit(c, train, val, tmp_path / "split", resume=str(tmp_path / "split" / "run"))
    assert max_diff(a, c) == 0.0
    assert c.step_lrs == a.step_lrs[len(b.step_lrs) :]


# ------------------------------------------------------------------ errors, one line each
def test_several_optimizers_name_manual_optimization():
    m = nn.Linear(2, 2)
    o1, o2 = torch.optim.SGD(m.parameters(), lr=1), torch.optim.SGD(m.parameters(), lr=1)
    for conf in ([o1, o2], ([o1, o2], []), [{"optimizer": o1}, {"optimizer": o2}]):
        with pytest.raises(ModelProtocolError, match="manual optimization"):
            parse_optimizers(conf)


def test_manual_optimization_and_unknown_trainer_attributes_fail_with_one_line(tmp_path):
    class Manual(Base):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    train, val = data()
    with pytest.raises(ModelProtocolError, match="automatic_optimization is False.*manual optimization"):
        plainloop_fit(Manual(), train, val, tmp_path)

    class Reads(Base):
        def training_step(self, batch, batch_idx):
            _ = self.trainer.datamodule
            return super().training_step(batch, batch_idx)

    with pytest.raises(UnsupportedLightningFeature, match=r"self\.trainer\.datamodule .*provides current_epoch"):
        plainloop_fit(Reads(), train, val, tmp_path / "b")


def test_unknown_forms_are_named():
    m = nn.Linear(2, 2)
    o = torch.optim.SGD(m.parameters(), lr=1)
    s = torch.optim.lr_scheduler.StepLR(o, 1)
    with pytest.raises(ModelProtocolError, match="none of Lightning's forms"):
        parse_optimizers((o, s))
    with pytest.raises(ModelProtocolError, match="needs the metric it watches"):
        parse_optimizers({"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o)})
    with pytest.raises(ModelProtocolError, match="interval='epochs'"):
        parse_optimizers({"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "epochs"}})


def test_the_model_is_given_back_without_plainloop_attached(tmp_path):
    train, val = data()
    m = Base()
    plainloop_fit(m, train, val, tmp_path, epochs=1)
    assert m._trainer is None and "log" not in m.__dict__
    with pytest.raises(RuntimeError, match="not attached"):
        _ = m.trainer  # Lightning's own answer again


# ------------------------------------------------------------------ nanoGPT-style
class TinyGPT(nn.Module):
    """nanoGPT's shape: forward(idx, targets) -> (logits, loss); configure_optimizers(weight_decay, ...)."""

    def __init__(self, vocab: int = 11, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab)
        self.given: dict = {}

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        if targets is None:
            return logits[:, [-1], :], None
        return logits, nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        self.given = {"weight_decay": weight_decay, "learning_rate": learning_rate, "betas": betas,
                      "device_type": device_type}  # fmt: skip
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")


def tokens(n=256, t=8, vocab=11):
    g = torch.Generator().manual_seed(0)
    seq = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(t + 1)) % vocab  # next token = this + 1
    return TensorDataset(seq[:, :-1], seq[:, 1:])


def test_nanogpt_style_model_trains_with_its_own_optimizer_and_loss(tmp_path):
    ds = tokens()
    model = TinyGPT()
    cfg = TrainConfig(epochs=3, batch_size=32, lr=3e-2, weight_decay=0.1, adam_betas=(0.9, 0.95), num_workers=0,
                      output_dir=str(tmp_path), run_name="run", progress_bar=False, log_every=2)  # fmt: skip
    summary = Trainer(cfg, Task("gpt", model, ds, tokens(64)), log=lambda s: None).fit()
    assert model.given == {"weight_decay": 0.1, "learning_rate": 3e-2, "betas": (0.9, 0.95), "device_type": "cpu"}
    rows = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "train"]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    assert math.isfinite(summary["final_metrics"]["val_loss"])


@pytest.mark.parametrize("shape", ["dict", "scalar"])
def test_forward_returning_a_dict_or_a_scalar_is_the_loss(tmp_path, shape):
    class Out(TinyGPT):
        def forward(self, idx, targets=None):
            logits, loss = super().forward(idx, targets)
            return {"logits": logits, "loss": loss} if shape == "dict" else loss

    cfg = TrainConfig(epochs=3, batch_size=32, lr=3e-2, num_workers=0, output_dir=str(tmp_path), run_name="run",
                      progress_bar=False, log_every=2)  # fmt: skip
    Trainer(cfg, Task("gpt", Out(), tokens()), log=lambda s: None).fit()
    rows = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "train"]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]


def test_a_plain_module_whose_forward_takes_targets_trains_on_the_loss_it_returns(tmp_path):
    """No configure_optimizers: plainloop's AdamW, and the loss forward(x, targets) returns (the nanoGPT adapter)."""

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = TinyGPT()

        def forward(self, idx, targets):
            return self.gpt(idx, targets)

    lines: list[str] = []
    cfg = TrainConfig(epochs=3, batch_size=32, lr=3e-2, num_workers=0, output_dir=str(tmp_path), run_name="run",
                      progress_bar=False, log_every=2)  # fmt: skip
    Trainer(cfg, Task("gpt", Plain(), tokens()), log=lines.append).fit()
    assert any("Plain.forward(x, targets) computes it" in s for s in lines)
    rows = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "train"]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]


def test_a_model_without_a_loss_and_integer_targets_is_told_to_give_loss_fn(tmp_path):
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    cfg = TrainConfig(epochs=1, batch_size=16, num_workers=0, output_dir=str(tmp_path), progress_bar=False)
    with pytest.raises(ValueError, match=r"int64.*Task\(loss_fn=\.\.\.\)"):
        Trainer(cfg, Task("cls", nn.Linear(4, 3), ds), log=lambda s: None)


def test_logging_keeps_values_on_the_device_between_log_points(tmp_path, monkeypatch):
    """self.log in every step reads nothing back: the logged means come back with the loss, at log points."""
    from tests.test_engine import SyncCounter

    train, val = data()
    t = Trainer(
        TrainConfig(
            epochs=2,
            batch_size=8,
            log_every=12,
            norm_every=1000,
            validation_interval=100,
            num_workers=0,
            output_dir=str(tmp_path),
            run_name="run",
            progress_bar=False,
        ),  # fmt: skip
        Task("mine", Base(), train, val),
        log=lambda s: None,
    )
    t.opt.host_reads = False
    counter = SyncCounter(monkeypatch)
    t.fit()
    in_protocol = [c for c in counter.calls if "compat/lightning.py" in c]
    log_points = 2 * 24 // 12
    assert 0 < len(in_protocol) <= log_points + 2, in_protocol  # one read per log point (+ the validation's)


def test_validation_step_drives_evaluation_and_is_capped_by_limit_val_batches(tmp_path):
    class Counting(Base):
        def __init__(self):
            super().__init__()
            self.val_batches = 0

        def validation_step(self, batch, batch_idx):
            self.val_batches += 1
            x, y = batch
            self.log("val_mae", (self(x) - y).abs().mean())

    train, val = data(320)  # 128 val samples: 4 batches
    m = Counting()
    s = plainloop_fit(m, train, val, tmp_path, epochs=1, limit_val_batches=2)
    assert m.val_batches == 2 and set(s["final_metrics"]) == {"val_mae"}


def test_lightning_checkpoint_weights_load_into_the_same_model(tmp_path):
    from trainer.compat.base_trainer import load_weights_into

    train, val = data()
    a = Base()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lt = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, max_epochs=1,
                       enable_model_summary=False, default_root_dir=str(tmp_path))  # fmt: skip
        lt.fit(a, DataLoader(train, batch_size=BATCH))
        lt.save_checkpoint(tmp_path / "m.ckpt")
    b = load_weights_into(Base(), tmp_path / "m.ckpt")
    assert max_diff(a, b) == 0.0
    # a plain nn.Module holding the LightningModule's network under "model.": the prefix is handled
    ckpt = torch.load(tmp_path / "m.ckpt", weights_only=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in ckpt["state_dict"].items()}}, tmp_path / "p.ckpt")
    c = load_weights_into(Base(), Path(tmp_path / "p.ckpt"))
    assert max_diff(a, c) == 0.0


# ------------------------------------------------------------------ the guide's examples
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "your-model.md"


def guide_blocks(marker: str) -> list[str]:
    """The ```python blocks right below `<!-- example: tested-by {marker} -->` in docs/guides/your-model.md."""
    import re

    text = GUIDE.read_text(encoding="utf-8")
    pat = re.compile(r"<!-- example: tested-by " + re.escape(marker) + r" -->\n```python\n(.*?)\n```", re.S)
    return pat.findall(text)


@pytest.mark.slow
def test_your_model_guide_examples_run(tmp_path):
    """The LightningModule and nanoGPT-style examples of docs/guides/your-model.md, each in a fresh interpreter."""
    import os
    import subprocess
    import sys

    blocks = guide_blocks("tests/test_model_protocol.py::test_your_model_guide_examples_run")
    assert len(blocks) == 2
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    for code in blocks:
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "optimizer: the model's own AdamW" in proc.stdout  # the note says where the optimizer came from


def test_a_wrapped_model_reaches_training_step_through_its_forward():
    """Under DDP (or torch.compile) the wrapper's forward must run, or gradients are not synchronised: the loss goes
    model(batch) -> the module's forward -> training_step, and the module's own forward is untouched otherwise."""
    from trainer.compat.lightning import ModelAdapter

    class Wrap(nn.Module):  # what DDP does with a call: forward to self.module
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.calls = 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            return self.module(*args, **kwargs)

    m = Base()
    adapter = ModelAdapter(m)
    adapter.attach()
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    wrapped = Wrap(m)
    direct = adapter.loss_fn(m, (x, y))
    through = adapter.loss_fn(wrapped, (x, y))
    assert wrapped.calls == 1 and torch.equal(direct, through)
    assert torch.equal(m(x), m.net(x))  # a plain call still runs the module's forward
    adapter.detach()
    assert "forward" not in m.__dict__ and m._trainer is None


def test_the_models_optimizer_under_the_fp16_scaler_and_the_non_finite_guard():
    """GradScaler (fp16) and the guard drive the model's own optimizer: a non-finite step leaves the weights alone;
    the model's step scheduler advances as under Lightning (only the device knows about the skip there)."""
    from trainer.compat.lightning import model_optimizer
    from trainer.step import OptimizerStep

    class Model(Base):
        def configure_optimizers(self):
            return FORMS["dict_step_interval"](self)

    m = Model()
    own = model_optimizer(m, TrainConfig(), torch.device("cpu"), 1e-3)
    for fp16 in (True, False):
        opt = OptimizerStep(own.optimizer, own.schedule, torch.device("cpu"), fp16=fp16, clip_val=1.0)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        opt.backward(nn.functional.mse_loss(m(x), y))
        before = [p.detach().clone() for p in m.parameters()]
        opt.step()
        assert any(not torch.equal(a, p) for a, p in zip(before, m.parameters()))  # a finite step updates
        opt.backward(m(x).sum() * float("inf"))
        before = [p.detach().clone() for p in m.parameters()]
        opt.step()
        assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))  # the non-finite step is skipped
    assert own.schedule.steps == 3  # fp16: 2 (advanced on the device-only skip too); guard on a CPU: 1


def test_schedule_knobs_the_models_own_optimizer_ignores_are_named():
    """warmup_steps & co. shape plainloop's own AdamW and cosine; with the model's configure_optimizers they do
    nothing, so the start-up notes name each one set away from its default (and only those the model is not given)."""
    from trainer.compat.lightning import model_optimizer

    class GPTLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
            return torch.optim.AdamW(self.parameters(), lr=learning_rate, weight_decay=weight_decay, betas=betas)

    class NoArgs(GPTLike):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    cfg = TrainConfig(warmup_steps=5, lr_decay_steps=20, min_lr_ratio=0.1, lr=0.02, adam_betas=(0.9, 0.95))
    notes = " ".join(model_optimizer(GPTLike(), cfg, torch.device("cpu"), cfg.lr).notes)
    assert "so warmup_steps=5, lr_decay_steps=20, min_lr_ratio=0.1 do nothing" in notes
    unused = notes.split("lr scaling are off, so ")[1].split(" do nothing")[0]
    assert "lr=" not in unused.replace("min_lr_ratio", "") and "adam_betas" not in unused  # they reach the model
    notes = " ".join(model_optimizer(NoArgs(), cfg, torch.device("cpu"), cfg.lr).notes)
    assert "lr=0.02" in notes and "adam_betas=(0.9, 0.95)" in notes and "warmup_steps=5" in notes
    assert "do nothing" not in " ".join(model_optimizer(NoArgs(), TrainConfig(), torch.device("cpu"), 1e-3).notes)


# ------------------------------------------------------------------ what Lightning skips, and what plainloop refuses
class NoValidation(L.LightningModule):
    """A LightningModule with a training_step and no validation_step; counts the hooks Lightning would call."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.calls: dict[str, int] = {}

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def on_validation_epoch_start(self):
        self.calls["on_validation_epoch_start"] = self.calls.get("on_validation_epoch_start", 0) + 1

    def on_train_epoch_end(self):
        self.calls["on_train_epoch_end"] = self.calls.get("on_train_epoch_end", 0) + 1


def test_a_model_without_validation_step_is_not_validated_as_under_lightning(tmp_path):
    """Lightning skips the val loop when the module has no validation_step, though it is given val data; so does
    plainloop, with one start-up line (it used to score training_step on the val split)."""
    train, val = data()
    torch.manual_seed(0)
    m0 = NoValidation()
    a, b = copy.deepcopy(m0), copy.deepcopy(m0)
    lt = lightning_fit(a, train, val)
    lines: list[str] = []
    cfg = TrainConfig(epochs=EPOCHS, batch_size=BATCH, shuffle=False, drop_last=False, validation_interval=1,
                      progress_bar=False, output_dir=str(tmp_path), run_name="run", num_workers=0)  # fmt: skip
    summary = Trainer(cfg, Task("mine", b, train, val), log=lines.append).fit()
    assert a.calls == b.calls == {"on_train_epoch_end": EPOCHS}  # no validation epoch in either
    assert not lt.callback_metrics and not summary["final_metrics"]
    assert not [r for r in metric_rows(tmp_path / "run") if r["kind"] == "val"]
    said = [ln for ln in lines if "validation_step" in ln]
    assert len(said) == 1 and "NoValidation has no validation_step" in said[0] and "as under Lightning" in said[0]
    assert max_diff(a, b) <= ATOL


def test_a_training_step_returning_none_is_refused_in_one_line(tmp_path):
    """Lightning skips such a batch's backward (its step counters still advance); plainloop refuses, naming it."""

    class Skips(Base):
        def training_step(self, batch, batch_idx):
            return None if batch_idx == 2 else super().training_step(batch, batch_idx)

    train, val = data()
    with pytest.raises(ModelProtocolError, match=r"^Skips\.training_step returned None: skipping a batch") as e:
        plainloop_fit(Skips(), train, val, tmp_path)
    assert "\n" not in str(e.value)


def test_configure_optimizers_returning_none_is_refused_not_replaced_by_adamw(tmp_path):
    """Lightning warns and trains with no optimizer step; plainloop refuses before the run starts (it once trained
    such a model with its own AdamW, silently)."""

    class NoOptimizer(Base):
        def configure_optimizers(self):
            return None

    train, val = data()
    cfg = TrainConfig(epochs=1, batch_size=BATCH, output_dir=str(tmp_path), run_name="run", progress_bar=False,
                      num_workers=0)  # fmt: skip
    with pytest.raises(ModelProtocolError, match=r"^NoOptimizer\.configure_optimizers returned None: Lightning"):
        Trainer(cfg, Task("mine", NoOptimizer(), train, val), log=lambda s: None)
    assert not (tmp_path / "run").exists()


def test_the_model_is_given_back_after_a_failed_fit_by_the_next_one(tmp_path):
    """A fit that fails leaves self.log & co. on the model (no on_fit_end); the next fit on it removes them, and a
    nanoGPT-style module (no training_step) is never touched."""

    class Fails(Base):
        fail = True

        def training_step(self, batch, batch_idx):
            if self.fail and batch_idx == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    train, val = data()
    m = Fails()
    with pytest.raises(RuntimeError, match="boom"):
        plainloop_fit(m, train, val, tmp_path / "a", epochs=1)
    assert "log" in m.__dict__  # left by the failed fit
    m.fail = False
    plainloop_fit(m, train, val, tmp_path / "b", epochs=1)
    assert m._trainer is None and not {"log", "log_dict", "optimizers", "lr_schedulers"} & set(m.__dict__)

    gpt = TinyGPT()
    before = set(gpt.__dict__)
    cfg = TrainConfig(epochs=1, batch_size=32, num_workers=0, output_dir=str(tmp_path), run_name="gpt",
                      progress_bar=False)  # fmt: skip
    Trainer(cfg, Task("gpt", gpt, tokens()), log=lambda s: None).fit()
    assert set(gpt.__dict__) == before


def test_the_adapted_task_is_a_plain_task_and_any_task_may_use_its_hooks(tmp_path):
    """The adapter fills generic Task fields (nothing in the loop is for Lightning alone); a plain task sets the same
    fields itself: its optimizer through optimizer_fn, extra train-row values through log_metrics_fn, its scores
    over the loop's batches through batch_evaluate_fn, its own callbacks and start-up notes."""
    from trainer.layers import adapt_task
    from trainer.optim import ConstantSchedule, OptimizerSetup

    train, val = data()
    adapted = adapt_task(Task("mine", Base(), train, val))
    assert adapted.loss_fn is not None and adapted.optimizer_fn is not None and adapted.batch_evaluate_fn is not None
    assert [type(c).__name__ for c in adapted.callbacks] == ["ModelHooks"]
    assert adapt_task(adapted) is adapted  # a Trainer's own task, given to another Trainer, is not adapted twice
    plain = Task("plain", nn.Linear(4, 1), train, val)
    assert adapt_task(plain) is plain

    seen: dict[str, int] = {"batches": 0}

    def optimizer_fn(model, cfg, device, base_lr):
        opt = torch.optim.SGD(model.parameters(), lr=base_lr)
        return OptimizerSetup(opt, ConstantSchedule(opt), notes=[f"optimizer: SGD at {base_lr}"])

    def batch_evaluate_fn(model, split, batches):
        errs = [float((model(b[0]) - b[1]).abs().mean()) for _, b in batches]
        seen["batches"] += len(errs)
        return {f"{split}_mae": sum(errs) / len(errs)}

    class Counts:
        def __init__(self):
            self.fits = 0

        def on_fit_start(self, trainer):
            self.fits += 1

    counts = Counts()
    task = Task("plain", nn.Linear(4, 1), train, val, optimizer_fn=optimizer_fn, batch_evaluate_fn=batch_evaluate_fn,
                log_metrics_fn=lambda: {"answer": 42.0}, callbacks=[counts], notes=["my task's own line"],
                monitor_metric="val_mae")  # fmt: skip
    lines: list[str] = []
    cfg = TrainConfig(epochs=2, batch_size=BATCH, lr=0.05, output_dir=str(tmp_path), run_name="run",
                      progress_bar=False, num_workers=0, validation_interval=1, log_every=2)  # fmt: skip
    summary = Trainer(cfg, task, log=lines.append).fit()
    import json

    assert json.loads((tmp_path / "run" / "config.json").read_text())["optimizer"]["type"] == "SGD"
    assert "[plainloop] optimizer: SGD at 0.05" in lines and "[plainloop] my task's own line" in lines
    assert counts.fits == 1 and seen["batches"] == 2 * 1 and set(summary["final_metrics"]) == {"val_mae"}
    rows = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "train"]
    assert rows and all(r["answer"] == 42.0 for r in rows)
    assert any(ln.startswith("[epoch") and "answer 42" in ln for ln in lines)  # shown on the epoch lines


# ------------------------------------------------------------------ every hook runs, or is refused
class _EpochHalver:
    """A scheduler of another library: step(epoch) only, which Lightning steps through lr_scheduler_step."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.optimizer, self.calls = opt, 0

    def step(self, epoch: int) -> None:
        self.calls += 1
        for g in self.optimizer.param_groups:
            g["lr"] = 1e-2 * 0.5 ** (epoch + 1)

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def test_the_models_lr_scheduler_step_steps_its_schedulers_as_under_lightning(tmp_path):
    class Model(Base):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1e-2)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": _EpochHalver(opt), "interval": "epoch"}}

        def lr_scheduler_step(self, scheduler, metric):
            scheduler.step(epoch=self.current_epoch)

    a, b, _, _ = both(Model, tmp_path)
    assert b.calls == a.calls and len(set(b.step_lrs)) == EPOCHS  # halved after each epoch, in both
    assert b.step_lrs == pytest.approx(a.step_lrs, rel=1e-12) and max_diff(a, b) <= ATOL


NEVER_CALLED = ["on_after_backward", "optimizer_step", "configure_gradient_clipping", "on_before_zero_grad",
                "on_validation_model_eval", "transfer_batch_to_device"]  # fmt: skip


@pytest.mark.parametrize("hook", NEVER_CALLED)
def test_a_lightning_hook_the_loop_never_calls_is_refused_in_one_line(tmp_path, hook):
    """Overridden, it would be skipped in silence and the model trained otherwise than under Lightning."""
    Model = type("Model", (Base,), {hook: lambda self, *a, **k: None})
    train, val = data()
    with pytest.raises(UnsupportedLightningFeature, match=rf"Model\.{hook} is a Lightning hook plainloop's loop"):
        plainloop_fit(Model(), train, val, tmp_path)
    assert not (tmp_path / "run").exists()


def test_fit_time_hooks_and_the_test_loops_hooks_run_in_lightnings_order(tmp_path):
    order: list[str] = []

    class Model(Base):
        def prepare_data(self):
            order.append("prepare_data")

        def setup(self, stage):
            order.append(f"setup:{stage}")

        def configure_model(self):
            order.append("configure_model")

        def configure_optimizers(self):
            order.append("configure_optimizers")
            return super().configure_optimizers()

        def test_step(self, batch, batch_idx):
            self.log("test_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

        def train_dataloader(self):
            raise AssertionError("plainloop reads the Task's datasets")

    for name in ("on_test_start", "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end",
                 "on_test_epoch_end", "on_test_end"):  # fmt: skip
        setattr(Model, name, _hook(name))
    train, val = data()
    m = Model()
    cfg = TrainConfig(epochs=1, batch_size=BATCH, output_dir=str(tmp_path), progress_bar=False)
    t = Trainer(cfg, Task("mine", m, train, val, test_set=val), log=lambda s: None)
    assert order == ["prepare_data", "setup:fit", "configure_model", "configure_optimizers"]
    assert any("train_dataloader not used" in n for n in t.notes)
    summary = t.fit()
    assert "test_loss" in summary["final_metrics"] and m.calls["teardown"] == 1
    batches = -(-len(val) // BATCH)
    assert {k: v for k, v in m.calls.items() if k.startswith("on_test")} == {
        "on_test_start": 1, "on_test_epoch_start": 1, "on_test_batch_start": batches, "on_test_batch_end": batches,
        "on_test_epoch_end": 1, "on_test_end": 1,
    }  # fmt: skip
