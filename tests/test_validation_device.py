"""Validation with one host read: the SST task's scores come from one transfer (the prior, the correction and the
loss at each correction scale) and equal what the scoring gave when each came to the host on its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_skill import sample_file, small_task  # noqa: F401 (a fixture)

from tasks.era5 import _predict_all, choose_correction_scale
from utils.metrics import acc, weighted_rmse

pytestmark = pytest.mark.usefixtures("one_thread")


def _scores_read_one_by_one(task, m) -> dict[str, float]:
    """The validation as it was: base, correction, prediction and loss each read to the host."""
    ds, mask = task.val_set, task.val_set.ocean_mask.numpy()
    ref = ds.reference_c()
    base, corr, y = _predict_all(m, ds, torch.device("cpu"), parts=True)
    base_c = ds.denormalize(base.cpu(), torch.arange(len(ds))).numpy()
    corr_c = corr.cpu().numpy() * ds.anomaly_std
    a = choose_correction_scale(base_c, corr_c, ref["truth_c"], ds.lats, mask, lead=task.info["lead_months"])
    pred = base + a * corr
    pred_c = ds.denormalize(pred.cpu(), torch.arange(len(ds))).numpy()
    return {
        "val_rmse_c": weighted_rmse(pred_c, ref["truth_c"], ds.lats, mask),
        "val_acc": acc(pred_c, ref["truth_c"], ref["clim_target_c"], ds.lats, mask),
        "val_loss": float(m.loss(pred, y)),
        "val_correction_scale": a,
        "val_prior_rmse_c": weighted_rmse(base_c, ref["truth_c"], ds.lats, mask),
    }


@pytest.mark.parametrize("std", [0.0, 0.02, 5.0])  # the prior alone, a correction that helps or may, pure noise
def test_one_read_scores_as_the_reads_one_by_one_did(sample_file, tmp_path, std):  # noqa: F811
    task = small_task(sample_file, tmp_path, prior="hybrid")
    m = task.model.eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for net in m.members:
            torch.nn.init.normal_(net.head.weight, std=std)
        expected = _scores_read_one_by_one(task, m)
        got = task.evaluate_fn(m, "val", torch.device("cpu"))
    assert list(got)[:5] == ["val_rmse_c", "val_acc", "val_loss", "val_correction_scale", "val_prior_rmse_c"]
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-6, rel=1e-6), k
    assert float(m.correction_scale) == expected["val_correction_scale"]
    assert all(np.isfinite(v) for v in got.values())


def test_the_builtin_validation_reads_the_host_once(tmp_path, monkeypatch):
    """The mean loss and every Task(metrics=...) score stay on the device over the batches: one read at the end."""
    from helpers import toy_config
    from torch import nn
    from torch.utils.data import TensorDataset

    from trainer import Task, Trainer, accuracy

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)

    def loss_fn(m, b):
        return nn.functional.cross_entropy(m(b[0]), b[1])

    task = Task(
        "cls", nn.Linear(4, 3), TensorDataset(x, y), TensorDataset(x, y), loss_fn=loss_fn, metrics={"acc": accuracy}
    )
    t = Trainer(toy_config(tmp_path, batch_size=8), task)
    reads: list[str] = []
    for name in ("tolist", "item", "__float__", "cpu", "numpy", "__bool__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _n=name, _r=real, **k: reads.append(_n) or _r(self, *a, **k)
        )
    scores = t.evaluate("val")  # 8 batches
    monkeypatch.undo()
    assert reads == ["tolist"] and set(scores) == {"val_loss", "val_acc"}


def test_the_sst_validation_reads_the_host_once(sample_file, tmp_path, monkeypatch):  # noqa: F811
    """The prior, the correction and the loss at each correction scale come to the host in one copy (they were three
    copies and a float() of the loss); the test split's predictions in one."""
    task = small_task(sample_file, tmp_path, prior="hybrid")
    m = task.model.eval()
    copies: list[tuple[int, ...]] = []
    real = torch.Tensor.cpu

    def cpu(self, *a, **k):
        if self.is_floating_point():
            copies.append(tuple(self.shape))
        return real(self, *a, **k)

    with torch.no_grad():
        task.evaluate_fn(m, "val", torch.device("cpu"))  # the first: the split's fixed references are computed
        copies.clear()
        monkeypatch.setattr(torch.Tensor, "cpu", cpu)
        task.evaluate_fn(m, "val", torch.device("cpu"))
        assert len(copies) == 1 and len(copies[0]) == 1  # one flat copy
        copies.clear()
        task.evaluate_fn(m, "test", torch.device("cpu"))
        assert len(copies) == 1
