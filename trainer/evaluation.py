"""Evaluation: the task's own scores, or the mean loss over a split, and the best value seen so far."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .config import TrainConfig
from .data import ShardedBatchSampler, batch_size_of, build_loader, to_device
from .runtime import Runtime
from .task import LossFn, Task
from .usercode import eval_batches, is_stream


def mean_loss(
    ds: Any,
    model: nn.Module,
    rt: Runtime,
    loss_fn: LossFn,
    batch_size: int,
    loader_kw: dict[str, Any],
    resident: dict[int, Any],
    seed: int,
    collate_fn: Any = None,
) -> float:
    """The loss averaged over every sample of `ds` (rank 0's view; a private generator, the global RNG untouched)."""
    gatherer = resident.get(id(ds))
    sampler = ShardedBatchSampler(len(ds), min(batch_size, len(ds)), shuffle=False, drop_last=False)
    # a private generator: evaluation must not advance the global RNG (exact resume)
    kw = {k: v for k, v in loader_kw.items() if k != "persistent_workers"}
    if kw:
        kw["generator"] = torch.Generator().manual_seed(seed)
    loader = build_loader(ds, sampler, rt.device, kw, collate_fn, gatherer)
    total, count = torch.zeros((), device=rt.device), 0
    for batch in loader:
        if gatherer is None:
            batch = to_device(batch, rt.device)
        n = batch_size_of(batch)
        total += loss_fn(model, batch).float() * n
        count += n
    return (total / max(count, 1)).item()  # note: sync point (validation)


class BestTracker:
    """The best value of the task's monitor metric, and validations since it last improved."""

    def __init__(self, metric: str, mode: str) -> None:
        self.metric, self.mode = metric, mode
        self.best: float | None = None
        self.stale = 0  # validations without improvement (early stopping)

    def key(self, metrics: dict[str, float]) -> str | None:
        return self.metric if self.metric in metrics else next(iter(metrics), None)

    def update(self, metrics: dict[str, float]) -> bool:
        """True when this validation improved on the best finite value."""
        key = self.key(metrics)
        if key is None:
            return False
        v = metrics[key]
        better = math.isfinite(v) and (self.best is None or (v < self.best if self.mode == "min" else v > self.best))
        if better:
            self.best, self.stale = v, 0
        else:
            self.stale += 1
        return better

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "stale": self.stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.stale = state.get("best"), int(state.get("stale", 0))


class Evaluator:
    """The task's scores on a split with the weights the model holds now: eval mode, no gradients, no files written.

    The task's own `evaluate_fn`, else the mean of the training loss over the split.
    """

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        rt: Runtime,
        loss_fn: LossFn,
        cfg: TrainConfig,
        loader_kw: dict[str, Any],
        resident: dict[int, Any],
    ) -> None:
        self.task, self.model, self.rt, self.loss_fn = task, model, rt, loss_fn
        self.cfg, self.loader_kw, self.resident = cfg, loader_kw, resident
        # a Lightning-style model's own evaluation: (model, split, batches) -> scores (trainer/model_protocol.py)
        self.own: Callable[[nn.Module, str, Iterator[tuple[int, Any]]], dict[str, float]] | None = None

    def __call__(self, split: str) -> dict[str, float]:
        """Scores on `split` ("val" or "test"); {} when the task has no such split."""
        task, model, rt = self.task, self.model, self.rt
        ds = task.val_set if split == "val" else task.test_set
        if ds is None:
            return {}
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), rt.autocast():
                if task.evaluate_fn is not None:
                    out = task.evaluate_fn(model, split, rt.device)
                elif self.own is not None:
                    out = self.own(model, split, self.batches(ds))
                else:
                    total, count = torch.zeros((), device=rt.device), 0
                    for _, batch in self.batches(ds):
                        n = batch_size_of(batch)
                        total += self.loss_fn(model, batch).float() * n
                        count += n
                    out = {f"{split}_loss": (total / max(count, 1)).item()}  # note: sync point (validation)
        finally:
            model.train(was_training)
        return {k: float(v) for k, v in out.items()}

    def batches(self, ds: Any) -> Iterator[tuple[int, Any]]:
        """(index, batch on the device) over a split in order, at most cfg.limit_val_batches of them; a private
        generator, so evaluating never draws from the global RNG (exact resume)."""
        cfg, rt = self.cfg, self.rt
        if is_stream(ds):
            for i, batch in enumerate(eval_batches(ds, cfg.batch_size, self.loader_kw, self.task.collate_fn,
                                                   cfg.limit_val_batches)):  # fmt: skip
                yield i, to_device(batch, rt.device)
            return
        gatherer = self.resident.get(id(ds))
        sampler = ShardedBatchSampler(len(ds), min(cfg.batch_size, len(ds)), shuffle=False, drop_last=False)
        kw = {k: v for k, v in self.loader_kw.items() if k != "persistent_workers"}
        kw["generator"] = torch.Generator().manual_seed(cfg.seed)
        loader = build_loader(ds, sampler, rt.device, kw, self.task.collate_fn, gatherer)
        for i, batch in enumerate(loader):
            if cfg.limit_val_batches is not None and i >= cfg.limit_val_batches:
                break
            yield i, (to_device(batch, rt.device) if gatherer is None else batch)
