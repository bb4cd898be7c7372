"""Model knobs (trainer/knobs.py): channels_last, deterministic mode, SyncBatchNorm, the parameter count."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch import nn

from trainer import knobs


def conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))


def test_channels_last_converts_4d_weights_and_batches():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    note = knobs.channels_last(m, torch.device("cpu"))
    assert m[0].weight.is_contiguous(memory_format=torch.channels_last) and "NHWC" in note
    x = torch.randn(2, 3, 8, 8)
    batch = knobs.to_channels_last({"img": x, "meta": [torch.ones(2), (x, "id")]})
    assert batch["img"].is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(
        memory_format=torch.channels_last
    )
    assert batch["meta"][1][0].is_contiguous(memory_format=torch.channels_last) and batch["meta"][1][1] == "id"
    assert torch.equal(batch["img"], x)  # the values stay, only the layout changes
    Pair = collections.namedtuple("Pair", "img label")  # a namedtuple batch converts too, and stays one
    pair = knobs.to_channels_last(Pair(x, torch.ones(2)))
    assert type(pair) is Pair and pair.img.is_contiguous(memory_format=torch.channels_last)
    assert "no 4-D" in knobs.channels_last(nn.Linear(2, 2), torch.device("cpu"))


def test_deterministic_turns_torch_deterministic_on():
    try:
        notes = knobs.deterministic(7, torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled() and "seed 7" in notes[-1]
    finally:
        torch.use_deterministic_algorithms(False)


def test_seed_worker_seeds_numpy_and_random_from_torch():
    import random

    torch.manual_seed(1234)
    knobs.seed_worker(0)
    a = (np.random.rand(), random.random())
    torch.manual_seed(1234)
    knobs.seed_worker(0)
    assert (np.random.rand(), random.random()) == a


def test_sync_batchnorm_converts_only_where_it_can_synchronise():
    m, note = knobs.sync_batchnorm(conv_net(), 1, torch.device("cpu"))
    assert not any(isinstance(x, nn.SyncBatchNorm) for x in m.modules()) and "one process" in note
    m, note = knobs.sync_batchnorm(conv_net(), 2, torch.device("cpu"))
    assert not any(isinstance(x, nn.SyncBatchNorm) for x in m.modules()) and "CUDA tensors only" in note
    net = conv_net()
    weight = net[1].weight
    m, note = knobs.sync_batchnorm(net, 4, torch.device("cuda"))  # the conversion itself touches no GPU
    assert isinstance(m[1], nn.SyncBatchNorm) and m[1].weight is weight and "1 BatchNorm layer(s)" in note
    assert "no BatchNorm" in knobs.sync_batchnorm(nn.Linear(2, 2), 2, torch.device("cuda"))[1]


def test_parameter_count_counts_tied_weights_once_and_frozen_apart():
    emb = nn.Embedding(100, 16)
    head = nn.Linear(16, 100, bias=False)
    head.weight = emb.weight  # tied
    m = nn.Sequential(emb, nn.Linear(16, 16), head, nn.BatchNorm1d(100))
    m[1].bias.requires_grad_(False)
    c = knobs.parameter_count(m)
    assert c["total"] == 1600 + 16 * 16 + 16 + 200 and c["trainable"] == c["total"] - 16
    buffers = sum(b.numel() * b.element_size() for b in m.buffers())
    assert c["size_mb"] == pytest.approx((c["total"] * 4 + buffers) / 2**20)
    assert knobs.describe_parameters({"total": 1_234_567, "trainable": 1000, "size_mb": 4.71}) == (
        "1.23M parameters (1.00k trainable), 4.7 MB"
    )


@pytest.fixture
def restore_deterministic():
    yield
    torch.use_deterministic_algorithms(False)  # a process-wide switch: later tests run without it


def test_the_trainer_applies_the_knobs_and_reports_the_model_size(tmp_path, restore_deterministic):
    from torch.utils.data import TensorDataset

    from tests.helpers import toy_config
    from trainer import Task
    from trainer.loop import Trainer

    torch.manual_seed(0)
    x, y = torch.randn(64, 3, 8, 8), torch.randn(64, 2)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 2))
    lines: list[str] = []
    cfg = toy_config(tmp_path, max_steps=3, batch_size=16, channels_last=True, deterministic=True, sync_batchnorm=True)
    t = Trainer(cfg, Task("conv", model, TensorDataset(x, y)), log=lines.append)
    summary = t.fit()
    assert torch.are_deterministic_algorithms_enabled()
    assert t.raw_model[0].weight.is_contiguous(memory_format=torch.channels_last)
    n = sum(p.numel() for p in model.parameters())
    assert summary["model"]["parameters"] == n == summary["model"]["trainable"]
    start = next(line for line in lines if line.startswith("[plainloop] conv:"))
    assert knobs.describe_parameters(knobs.parameter_count(model)) in start
    notes = "\n".join(summary["notes"])
    assert "channels_last: 4-D weights" in notes and "deterministic: torch.use_deterministic_algorithms" in notes
    assert "sync_batchnorm: one process" in notes


def test_deterministic_loader_workers_are_seeded(tmp_path, restore_deterministic):
    from torch.utils.data import TensorDataset

    from tests.helpers import toy_config
    from trainer import Task
    from trainer.loop import Trainer

    task = Task("toy", nn.Linear(4, 1), TensorDataset(torch.randn(32, 4), torch.randn(32, 1)))
    t = Trainer(toy_config(tmp_path, num_workers=1, device_cache=False, deterministic=True), task)
    assert t.data.loader_kw["worker_init_fn"] is knobs.deterministic_worker
    t2 = Trainer(toy_config(tmp_path, run_name="b", num_workers=1, device_cache=False), task)
    assert t2.data.loader_kw["worker_init_fn"] is not knobs.deterministic_worker
