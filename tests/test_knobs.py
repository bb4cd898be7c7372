"""Model knobs (trainer/knobs.py): channels_last, deterministic mode, SyncBatchNorm, the parameter count."""

from __future__ import annotations

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
