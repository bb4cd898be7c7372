"""What the loop trains: a task bundles model, data, loss and evaluation.

The loop in `trainer/loop.py` knows nothing about SST or re-identification; a task hands it these pieces.
The built-in tasks live outside the engine, in `tasks/`.

Data held on the device: a dataset that has `maybe_to_device(device) -> bool` and `gather(index_tensor) ->
batch` is offered residency (see `trainer/data.py` `place_on_device`); the trainer keeps the answer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from .optim import OptimizerFn

# loss_fn(model, batch) -> scalar loss tensor. `batch` is already on the training device.
LossFn = Callable[[nn.Module, Any], torch.Tensor]
# evaluate_fn(model, split, device) -> {"metric": float, ...}; split is "val" or "test".
EvaluateFn = Callable[[nn.Module, str, torch.device], dict[str, float]]
# batch_evaluate_fn(model, split, batches) -> scores, over the (index, batch on the device) pairs the loop feeds:
# the split in order, limit_val_batches applied, under no_grad and eval mode.
BatchEvaluateFn = Callable[[nn.Module, str, Iterator[tuple[int, Any]]], dict[str, float]]
# log_metrics_fn() -> {"name": float}: added to every train row at log points (a log point may read the device).
LogMetricsFn = Callable[[], dict[str, float]]
# step_metrics_fn() -> {"name": 0-dim device tensor}: read back at NORM_EVERY points with the grad norm.
StepMetricsFn = Callable[[], dict[str, torch.Tensor]]
# metric(output, target) -> a value per sample (or per element; a 0-dim tensor: the batch's mean), averaged over
# the split on the device: `output` is what the model's forward returned in the loss, `target` the batch's y.
MetricFn = Callable[[Any, torch.Tensor], torch.Tensor]
# batch_sampler_fn(dataset, batch_size, seed, rank, world_size, drop_last) -> a batch sampler (an iterable of
# index lists with a length) with set_epoch / state_dict / load_state_dict (see trainer/data.py for the default one).
BatchSamplerFn = Callable[[Dataset, int, int, int, int, bool], Iterable[Sequence[int]]]


@dataclass
class Task:
    name: str
    model: nn.Module
    train_set: Dataset
    val_set: Dataset | None = None
    test_set: Dataset | None = None
    # None: the model's training_step, or forward(x, targets) returning the loss (trainer/compat/), or
    # model.loss(model(x), y), else MSE (masked if y has NaN)
    loss_fn: LossFn | None = None
    evaluate_fn: EvaluateFn | None = None  # None: batch_evaluate_fn, else the mean loss over val_set
    batch_sampler_fn: BatchSamplerFn | None = None  # None: plainloop's shuffling (distributed) sampler
    collate_fn: Callable | None = None
    monitor_metric: str = "val_loss"  # metric that picks best.pt
    console_metrics: tuple[str, ...] | None = None  # metrics printed on the console (None: all)
    monitor_mode: str = "min"  # "min" or "max"
    step_metrics: StepMetricsFn | None = None  # extra device scalars read at NORM_EVERY (e.g. feature norm)
    flops_per_sample: float | None = None  # forward+backward FLOPs, for MFU in benchmarks
    info: dict[str, object] = field(default_factory=dict)  # printed once and written to summary.json
    artifacts: dict[str, Any] = field(default_factory=dict)  # filled by evaluate_fn; dicts of arrays -> run_dir/*.npz
    # what an adapter (trainer/layers.py: a LightningModule's methods) or a user plugs in; any task may set them
    batch_evaluate_fn: BatchEvaluateFn | None = None  # evaluation over the loop's batches (when no evaluate_fn)
    optimizer_fn: OptimizerFn | None = None  # None: plainloop's AdamW with warm-up + cosine and lr scaling
    # a hand-written loop's pieces, used as they are (docs/guides/your-model.md#a-hand-written-loop):
    optimizer: torch.optim.Optimizer | None = None  # your optimizer over the model's parameters, in place of AdamW
    scheduler: Any = None  # a torch LR scheduler of `optimizer`, stepped as scheduler_interval says
    scheduler_interval: str = "epoch"  # "epoch": after each epoch (pytorch/examples); "step": each optimizer step
    lr_fn: Callable[[int], float] | None = None  # lr_fn(steps taken) -> the lr before each step (nanoGPT's get_lr)
    lr: float | None = None  # the task's own rate for plainloop's AdamW, over TrainConfig.lr (a LightningModule's)
    log_metrics_fn: LogMetricsFn | None = None  # extra train-row values, also shown on the epoch lines
    callbacks: list[object] = field(default_factory=list)  # run after Trainer(callbacks=...), before the config's
    notes: list[str] = field(default_factory=list)  # one line each, printed at start-up with the run's notes
    # scores beside the mean loss when the loop evaluates (no evaluate_fn): {"acc": accuracy} -> val_acc, test_acc
    metrics: dict[str, MetricFn] | None = None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DDP and torch.compile wrappers."""
    inner = getattr(model, "module", model)  # DDP
    return getattr(inner, "_orig_mod", inner)  # torch.compile


def mse_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """(x, y) batches: the model's own loss(pred, y) if it has one, else plain MSE."""
    own = getattr(unwrap_model(model), "loss", None)
    pred = model(batch[0])
    return own(pred, batch[1]) if own is not None else F.mse_loss(pred, batch[1])


def plain_mse_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """MSE on (x, y) batches, for a model without a `loss` method (decided once, not per step)."""
    pred, y = model(batch[0]), batch[1]
    return F.mse_loss(_same_shape(pred, y), y)


def _same_shape(pred: Any, y: Any) -> Any:
    """`pred`, when it has the targets' shape: MSE would broadcast others, every output against every target."""
    if isinstance(pred, torch.Tensor) and isinstance(y, torch.Tensor) and pred.shape != y.shape:
        raise ValueError(
            f"loss: the model's output {tuple(pred.shape)} and the targets {tuple(y.shape)} differ in shape, so the "
            f"default MSE would compare every output with every target. Make the targets the output's shape (e.g. "
            f"y.unsqueeze(-1)), or give Task(loss_fn=...) (class labels: lambda m, b: F.cross_entropy(m(b[0]), b[1]))"
        )
    return pred


def masked_mse_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """MSE over the finite targets only (land cells, missing labels), for a model without a `loss` method; no host
    sync to learn how many."""
    pred, y = model(batch[0]), batch[1]
    pred = _same_shape(pred, y)
    finite = torch.isfinite(y)
    diff = torch.where(finite, pred.float() - torch.nan_to_num(y.float()), torch.zeros((), device=y.device))
    return (diff**2).sum() / finite.sum().clamp_min(1)


def pick_default_loss(model: nn.Module, first_batch: Any) -> tuple[LossFn, str | None]:
    """The loss when the task gives none (a nanoGPT-style forward(x, targets) is trainer/compat/nanogpt.py's),
    decided once at start-up from the model and the first sample: the model's `loss(pred, y)`; else MSE, over finite
    targets only when the first sample's target holds NaN. A non-float target without either is an error naming loss_fn."""
    inner = unwrap_model(model)
    pair = isinstance(first_batch, list | tuple) and len(first_batch) > 1
    if first_batch is not None and not pair:
        what = f"dicts (keys {list(first_batch)[:4]})" if isinstance(first_batch, dict) else type(first_batch).__name__
        raise ValueError(
            f"loss: the dataset's samples are {what}, and the default loss (MSE, or the model's loss(pred, y)) takes "
            f"(input, target) pairs. Return (x, y) from __getitem__, or give Task(loss_fn=...) with "
            f"loss_fn(model, batch) -> scalar tensor that reads the batch as your dataset makes it"
        )
    if hasattr(inner, "loss"):
        return mse_loss, None
    y = first_batch[1] if pair else None
    y = torch.as_tensor(y) if isinstance(y, int | float) else y  # a Python label: collated into a tensor
    if isinstance(y, torch.Tensor) and not y.is_floating_point():
        raise ValueError(
            f"loss: the targets are {y.dtype} (class labels?) and {type(inner).__name__} has no loss, so the default "
            f"MSE cannot score them. Give Task(loss_fn=...) with loss_fn(model, batch) -> scalar tensor (e.g. "
            f"lambda m, b: F.cross_entropy(m(b[0]), b[1])), or a forward(x, targets) that returns (logits, loss)"
        )
    if isinstance(y, torch.Tensor) and not bool(torch.isfinite(y).all()):
        return masked_mse_loss, "loss: targets hold NaN/inf, so the default MSE is taken over finite targets only"
    return plain_mse_loss, None


def read_step_metrics(task: Task) -> dict[str, float]:
    """The task's extra device scalars (NORM_EVERY), read back in one go."""
    m = task.step_metrics() if task.step_metrics is not None else {}
    # note: sync point (NORM_EVERY): the task's device scalars, read back together
    return dict(zip(m, torch.stack([v.float().reshape(()) for v in m.values()]).tolist())) if m else {}
