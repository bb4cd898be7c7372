"""What the loop trains: a task bundles model, data, loss and evaluation.

The loop in `trainer/loop.py` knows nothing about SST or re-identification; a task hands it
these pieces. Builders for the built-in tasks live in `trainer/tasks.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

# loss_fn(model, batch) -> scalar loss tensor. `batch` is already on the training device.
LossFn = Callable[[nn.Module, Any], torch.Tensor]
# evaluate_fn(model, split, device) -> {"metric": float, ...}; split is "val" or "test".
EvaluateFn = Callable[[nn.Module, str, torch.device], dict[str, float]]
# batch_sampler_fn(dataset, batch_size, seed, rank, world_size, drop_last) -> a batch sampler
# with set_epoch / state_dict / load_state_dict (see trainer/data.py for the default one).
BatchSamplerFn = Callable[..., Any]


@dataclass
class Task:
    name: str
    model: nn.Module
    train_set: Dataset
    val_set: Dataset | None = None
    test_set: Dataset | None = None
    loss_fn: LossFn | None = None  # None: model.loss(model(x), y) if it exists, else MSE over finite y
    evaluate_fn: EvaluateFn | None = None  # None: mean loss over val_set
    batch_sampler_fn: BatchSamplerFn | None = None  # None: plainloop's shuffling (distributed) sampler
    collate_fn: Callable | None = None
    monitor_metric: str = "val_loss"  # metric that picks best.pt
    monitor_mode: str = "min"  # "min" or "max"
    flops_per_sample: float | None = None  # forward+backward FLOPs, for MFU in benchmarks
    info: dict[str, Any] = field(default_factory=dict)  # printed once and written to summary.json
    artifacts: dict[str, Any] = field(default_factory=dict)  # filled by evaluate_fn; dicts of arrays -> run_dir/*.npz
