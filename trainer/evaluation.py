"""Evaluation and the best checkpoint: the task's own scores, or the mean loss over a split."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .data import ShardedBatchSampler, batch_size_of, build_loader, to_device
from .hooks import call
from .setup import Runtime
from .usercode import eval_batches, is_stream


def mean_loss(
    ds: Any,
    model: nn.Module,
    rt: Runtime,
    loss_fn: Any,
    batch_size: int,
    loader_kw: dict[str, Any],
    resident: dict[int, Any],
    seed: int,
    collate_fn: Any = None,
) -> float:
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


def warn_slow_validation(self: Any, t_start: float, t_end: float) -> None:
    """Once per run: a validation that took longer than the training since the previous one, with the fixes."""
    prev = getattr(self, "_t_val_end", None)
    self._t_val_end = t_end
    if prev is None or getattr(self, "_warned_slow_val", False):
        return
    val_s, train_s = t_end - t_start, t_start - prev
    if val_s > train_s > 0:
        self._warned_slow_val = True
        msg = (
            f"validation took {val_s:.1f} s, longer than the {train_s:.1f} s of training since the previous one: "
            f"validate less often (validation_interval, val_check_steps) or score fewer batches (limit_val_batches)"
        )
        self.notes.append(msg)
        self.log(f"[plainloop] {msg}")


def split_batches(self: Any, ds: Any) -> Any:
    """(index, batch on the device) over a split in order, at most cfg.limit_val_batches of them."""
    if is_stream(ds):
        batches = eval_batches(
            ds, self.cfg.batch_size, self.loader_kw, self.task.collate_fn, self.cfg.limit_val_batches
        )
        for i, batch in enumerate(batches):
            yield i, to_device(batch, self.rt.device)
        return
    rt, gatherer = self.rt, self.resident.get(id(ds))
    sampler = ShardedBatchSampler(len(ds), min(self.cfg.batch_size, len(ds)), shuffle=False, drop_last=False)
    kw = {k: v for k, v in self.loader_kw.items() if k != "persistent_workers"}
    kw["generator"] = torch.Generator().manual_seed(self.cfg.seed)  # evaluation must not draw from the global RNG
    loader = build_loader(ds, sampler, rt.device, kw, self.task.collate_fn, gatherer)
    cap = self.cfg.limit_val_batches
    for i, batch in enumerate(loader):
        if cap is not None and i >= cap:
            break
        yield i, (to_device(batch, rt.device) if gatherer is None else batch)


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


def validate(self: Any) -> dict[str, float]:
    """Score the val split on rank 0, log it, keep best.pt when it improved; every rank gets the scores.

    Under DDP the scores are broadcast from rank 0, so every rank tracks the same best and takes the same
    early-stopping decision (rank 1 used to train on alone after rank 0 stopped).
    """
    self._last_val_step = self.step
    t_start = time.perf_counter()
    self.val_pending = None  # the validation a checkpoint announced is under way; checkpoints from now on say so
    if self.task.val_set is None:
        return {}
    metrics: dict[str, float] = {}
    if self.rt.is_main:
        metrics = self.evaluate("val")
        call(self.callbacks, "on_validation_end", self, metrics)
    if self.rt.distributed:
        box = [metrics]
        dist.broadcast_object_list(box, src=0)  # also the barrier: no rank runs ahead while rank 0 scores
        metrics = box[0]
    improved = self.best.update(metrics)
    self.last_val_metrics = metrics
    warn_slow_validation(self, t_start, time.perf_counter())
    if self.rt.is_main:
        epoch = self.epoch + (1 if self.batches_done else 0)  # 1-based, also mid-epoch
        self._row({"kind": "val", "step": self.step, "epoch": epoch, **metrics})
        shown = self.task.console_metrics or tuple(metrics)
        self.log(
            f"[val] step {self.step} epoch {epoch}: "
            + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k in shown)
            + (" (best so far; best.pt saved)" if improved and self.cfg.save_best else "")
        )
        if improved and self.cfg.save_best:
            self._save("best.pt")
    return metrics


def evaluate_split(self: Any, split: str) -> dict[str, float]:
    """The task's scores on `split` ("val" or "test") in eval mode, without gradients; {} without that split."""
    task, model, rt = self.task, self.raw_model, self.rt
    ds = task.val_set if split == "val" else task.test_set
    if ds is None:
        return {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), rt.autocast():
            if task.evaluate_fn is not None:
                out = task.evaluate_fn(model, split, rt.device)
            elif self.parts is not None and self.parts.evaluates:
                out = self.parts.adapter.evaluate(model, split, split_batches(self, ds))
            else:
                total, count = torch.zeros((), device=rt.device), 0
                for _, batch in split_batches(self, ds):
                    n = batch_size_of(batch)
                    total += self.loss_fn(model, batch).float() * n
                    count += n
                out = {f"{split}_loss": (total / max(count, 1)).item()}  # note: sync point (validation)
    finally:
        model.train(was_training)
    return {k: float(v) for k, v in out.items()}
