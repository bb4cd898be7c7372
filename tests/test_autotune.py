"""trainer.extras.autobatch (batch-size search under a fake memory limit) and utils.autotune (LR scaling, num_workers)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.extras.autobatch import find_max_batch_size, is_oom_error
from trainer.optim import scaled_lr
from utils.autotune import default_worker_candidates, tune_num_workers


class MemoryLimitedModel(nn.Module):
    """A real model whose forward raises the allocator's OOM error when activations would exceed a fake budget."""

    def __init__(self, limit_bytes: int, width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, 1))
        self.limit = limit_bytes
        self.fixed = sum(p.numel() * 4 * 3 for p in self.parameters())  # weights + grads + SGD-momentum copy

    def bytes_for(self, bs: int) -> int:
        act_per_sample = sum(m.out_features for m in self.net if isinstance(m, nn.Linear)) * 4 * 2  # fwd + bwd
        return self.fixed + bs * (act_per_sample + self.net[0].in_features * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        need = self.bytes_for(x.shape[0])
        if need > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {need} bytes (fake limit {self.limit})"
            )
        return self.net(x)


def _trier(model: MemoryLimitedModel):
    def try_batch(bs: int) -> None:
        x = torch.randn(bs, model.net[0].in_features)
        model(x).pow(2).mean().backward()
        model.zero_grad(set_to_none=True)

    return try_batch


def _largest_fitting(model: MemoryLimitedModel, cap: int) -> int:
    return max(b for b in range(1, cap + 1) if model.bytes_for(b) <= model.limit)


@pytest.mark.parametrize("limit_kb", [700, 2_000, 5_500])
def test_finds_largest_batch_under_fake_limit(limit_kb: int) -> None:
    model = MemoryLimitedModel(limit_kb * 1024)
    r = find_max_batch_size(_trier(model), start=2, max_batch=4096)
    assert r["batch_size"] == _largest_fitting(model, 4096)
    assert r["accumulate_grad_batches"] == 1 and not r["hit_max"]
    assert any(not ok for _, ok in r["tried"])  # it did hit the limit and recovered
    assert len(r["tried"]) <= 2 * math.ceil(math.log2(4096)) + 2  # doubling + bisection, not a linear scan


def test_target_keeps_effective_batch_with_accumulation() -> None:
    model = MemoryLimitedModel(700 * 1024)
    best = _largest_fitting(model, 4096)
    target = 4 * best + 3
    r = find_max_batch_size(_trier(model), start=8, target=target)
    assert r["batch_size"] == best
    assert r["accumulate_grad_batches"] == math.ceil(target / best)
    assert r["balanced_batch_size"] * r["accumulate_grad_batches"] >= target
    assert r["balanced_batch_size"] <= best


def test_target_below_limit_needs_no_accumulation() -> None:
    model = MemoryLimitedModel(5_500 * 1024)
    r = find_max_batch_size(_trier(model), start=2, target=24)
    assert r["batch_size"] == 24 and r["accumulate_grad_batches"] == 1 and r["hit_max"]


def test_start_too_big_backs_off_and_errors() -> None:
    model = MemoryLimitedModel(700 * 1024)
    r = find_max_batch_size(_trier(model), start=4096)
    assert r["batch_size"] == _largest_fitting(model, 4096)
    tiny = MemoryLimitedModel(1024)  # not even the weights fit
    with pytest.raises(RuntimeError, match="does not fit"):
        find_max_batch_size(_trier(tiny), start=4)

    def broken(bs: int) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):  # not an OOM: propagates
        find_max_batch_size(broken)
    with pytest.raises(ValueError, match="start"):
        find_max_batch_size(broken, start=0)


def test_is_oom_error() -> None:
    assert is_oom_error(torch.OutOfMemoryError("x"))
    assert is_oom_error(RuntimeError("CUDA error: out of memory"))
    assert is_oom_error(RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom_error(RuntimeError("size mismatch"))


def test_scaled_lr() -> None:
    """The one lr-scaling rule (trainer/optim.py), as --ref_batch_size / --lr_scaling apply it."""
    assert scaled_lr(1e-3, 150, 50, "sqrt") == pytest.approx(1e-3 * math.sqrt(3))  # seed 003's example
    assert scaled_lr(0.1, 512, 256, "linear") == pytest.approx(0.2)
    assert scaled_lr(0.1, 512, 256, "none") == 0.1
    assert scaled_lr(0.1, 512, None, "sqrt") == 0.1  # no reference batch: nothing to scale from
    with pytest.raises(ValueError, match="lr_scaling"):
        scaled_lr(0.1, 2, 1, "cubic")
    with pytest.raises(ValueError, match="batch sizes"):
        scaled_lr(0.1, 0, 1, "sqrt")


def test_tune_num_workers_returns_measured_best() -> None:
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))

    def make_loader(n: int) -> DataLoader:
        return DataLoader(data, batch_size=8, num_workers=n)

    r = tune_num_workers(make_loader, candidates=[0, 1], batches=5)
    assert set(r["samples_per_s"]) == {0, 1}
    assert r["num_workers"] == max(r["samples_per_s"], key=r["samples_per_s"].get)
    assert all(v > 0 for v in r["samples_per_s"].values())
    with pytest.raises(ValueError, match="single batch"):
        tune_num_workers(lambda n: DataLoader(data, batch_size=96), candidates=[0])
    with pytest.raises(ValueError, match="non-negative"):
        tune_num_workers(make_loader, candidates=[-1])
    with pytest.raises(ValueError, match="no batch_size"):  # samples/s needs the batch size
        tune_num_workers(lambda n: [data.tensors] * 3, candidates=[0])


def test_default_worker_candidates() -> None:
    assert default_worker_candidates(2) == [0, 1, 2]
    assert default_worker_candidates(12) == [0, 1, 2, 4, 8, 12]
