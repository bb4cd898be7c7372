"""Lightning's own demo models (lightning.pytorch.demos) are users' models: their training_step,
configure_optimizers and hooks run, and they train under plainloop as under `lightning.Trainer` (same model, data
and seed; weights compared with test_model_protocol's tolerance). Only LightningModule's own defaults are skipped.

Dropout draws from torch's global generator in both runs: both are seeded alike (plainloop seeds it with
TrainConfig.seed before the first step) and Lightning's loaders get their own generator, as plainloop's do, so
that making a loader iterator draws nothing from it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tests.test_model_protocol import ATOL, max_diff, plainloop_fit
from trainer.compat.lightning import _own, is_lightning_style

L = pytest.importorskip("lightning")
demos = pytest.importorskip("lightning.pytorch.demos")
from lightning.pytorch.demos.boring_classes import RandomDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SEED, BATCH = 42, 4


def lightning_fit(model: nn.Module, train: Dataset, val: Dataset | None, epochs: int, **kw: object) -> None:
    def loader(ds: Dataset) -> DataLoader:
        return DataLoader(ds, batch_size=BATCH, generator=torch.Generator().manual_seed(0))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, max_epochs=epochs, **kw,
        )  # fmt: skip
        torch.manual_seed(SEED)  # what plainloop's seed does before its first step
        trainer.fit(model, loader(train), None if val is None else loader(val))


def both(make: Callable[[], nn.Module], train: Dataset, val: Dataset | None, tmp_path, epochs: int = 2, **kw):
    """The same model trained by lightning.Trainer and by plainloop."""
    torch.manual_seed(0)
    m0 = make()
    a, b = copy.deepcopy(m0), copy.deepcopy(m0)
    lightning_fit(a, train, val, epochs, **kw)
    plainloop_fit(b, train, val, tmp_path, epochs=epochs, batch_size=BATCH, seed=SEED, **kw)
    assert max_diff(m0, b) > 1e-3  # plainloop did train (the comparison is not vacuous)
    return a, b


def tokens(n: int = 16, t: int = 6, vocab: int = 12) -> TensorDataset:
    """A tiny language-model set in WikiText2's form, (inputs, next tokens), without its download."""
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, vocab, (n, t + 1), generator=g)
    return TensorDataset(seq[:, :-1], seq[:, 1:])


def no_download(m: nn.Module) -> nn.Module:
    m.prepare_data = lambda: None  # the demos' prepare_data downloads WikiText2 (an instance attribute wins, as ever)
    return m


def test_the_demo_models_methods_are_theirs_and_only_lightning_modules_defaults_are_not():
    m = demos.BoringModel()
    assert is_lightning_style(m)
    for name in ("training_step", "validation_step", "test_step", "configure_optimizers", "train_dataloader"):
        assert _own(m, name) is not None, name
    for name in ("on_train_epoch_end", "setup", "prepare_data", "optimizer_step", "lr_scheduler_step"):
        assert _own(m, name) is None, name  # LightningModule's and its hooks mixins' no-op defaults
    lstm = demos.LightningLSTM(vocab_size=5)
    assert _own(lstm, "on_train_epoch_end") is not None and _own(lstm, "prepare_data") is not None
    assert _own(L.LightningModule(), "training_step") is None


def test_boring_model_trains_as_under_lightning(tmp_path):
    torch.manual_seed(3)
    train, val = RandomDataset(32, 16), RandomDataset(32, 8)
    a, b = both(demos.BoringModel, train, val, tmp_path)  # its SGD and StepLR (lr 0.1, then 0.01)
    assert max_diff(a, b) <= ATOL


def test_a_boring_model_subclass_keeps_what_it_inherits_and_what_it_overrides(tmp_path):
    class Mine(demos.BoringModel):
        def training_step(self, batch, batch_idx):
            loss = self.step(batch) * 2
            self.log("train_twice", loss)
            return loss  # configure_optimizers (SGD and StepLR), step and loss: BoringModel's

    torch.manual_seed(3)
    train = RandomDataset(32, 16)
    a, b = both(Mine, train, None, tmp_path, epochs=3)
    assert max_diff(a, b) <= ATOL


def test_lightning_transformer_trains_as_under_lightning(tmp_path):
    a, b = both(lambda: no_download(demos.LightningTransformer(vocab_size=12)), tokens(), None, tmp_path)
    assert max_diff(a, b) <= ATOL


def test_lightning_lstm_trains_as_under_lightning_with_its_epoch_end_hook(tmp_path):
    def make() -> nn.Module:
        m = no_download(demos.LightningLSTM(vocab_size=12))
        m.model = demos.SimpleLSTM(vocab_size=12, ninp=16, nhid=16, nlayers=2)  # the demo's net, small
        return m

    a, b = both(make, tokens(), None, tmp_path, gradient_clip_val=0.25)  # its lr=20 wants clipping, as upstream
    assert max_diff(a, b) <= ATOL
    assert a.hidden is None and b.hidden is None  # its on_train_epoch_end ran after the last epoch
