"""Evaluation: the task's own scores, or the mean loss over a split, and the best value seen so far."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from pathlib import Path
from typing import Any, TypedDict, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .checkpoint import StateDict
from .config import TrainConfig
from .data import ShardedBatchSampler, batch_size_of, build_loader, to_device
from .runtime import Runtime
from .task import LossFn, Task
from .usercode import is_stream


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Task(metrics=...): 1.0 where the highest score is the target class, per sample (output N x C, target N;
    N x T x C with N x T targets counts each position)."""
    return (output.argmax(dim=-1) == target).float()


def top_k_accuracy(k: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Task(metrics=...): 1.0 where the target is among the k highest scores, per sample."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top_k_accuracy({k!r}): k must be a whole number >= 1, e.g. top_k_accuracy(5)")

    def top_k(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        top = output.topk(min(k, output.shape[-1]), dim=-1).indices
        return (top == target.unsqueeze(-1)).any(dim=-1).float()

    top_k.__name__ = f"top{k}_accuracy"
    return top_k


def _output_and_target(outputs: list[object], batch: object, split: str) -> tuple[object, torch.Tensor]:
    """What the metrics score: the last forward's output (a (logits, loss) pair: the logits) and the batch's y."""
    if not outputs:
        raise ValueError(
            f"Task(metrics=...) on {split}: the loss never called the model's forward, so there is no output to "
            f"score; compute the scores in evaluate_fn instead"
        )
    out = outputs[-1]
    if isinstance(out, tuple | list) and out:
        out = out[0]
    elif isinstance(out, dict):
        out = out.get("logits", next(iter(out.values()), None))
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], torch.Tensor):
        raise ValueError(
            f"Task(metrics=...) on {split}: metrics score (x, y) batches against y; this batch is a "
            f"{type(batch).__name__}. Compute the scores in evaluate_fn instead"
        )
    return out, batch[1]


VALIDATION_SHARE = 0.1  # auto cadence: validation takes at most about this share of the wall time
THROTTLE_FROM_S = 0.25  # a shorter validation is never spaced out: timer noise, not a cost


def throttled_every(val_s: float, other_s: float, every: int, share: float = VALIDATION_SHARE) -> int:
    """Epochs between validations so that validation takes at most `share` of the wall time: one validation costs
    `val_s`, one epoch `other_s` of wall time outside validation. Never fewer than `every` (the count cadence);
    `every` itself when a validation costs under THROTTLE_FROM_S (cheap validation runs every epoch)."""
    if val_s < THROTTLE_FROM_S:
        return every
    return max(every, math.ceil(val_s * (1 - share) / (share * max(other_s, 1e-9)) - 1e-9))


class ValidationCadence:
    """The epochs between validations: `every` as given (validation_interval, or auto's count cadence); auto, also
    spaced by cost after each validation: throttled_every of the mean validation and the mean epoch measured in
    this process (rank 0's under DDP; its first validation, with the warm-up, is not measured). The spacing it
    chose is run state (an int in last.pt): a resume keeps it, then measures again. The last epoch always
    validates (the loop's rule)."""

    def __init__(self, every: int, auto: bool, distributed: bool = False, patience: int | None = None) -> None:
        self.base = self.every = every
        self.auto, self.distributed, self.patience = auto, distributed, patience
        self.ends = 0  # epoch ends since the last validation
        self.sums = [0.0, 0.0, 0, 0]  # validation s, other s, validations, epochs (this process)
        self.seen = 0  # validations this process fed: the first (caches, workers starting) is not measured

    def due(self, epoch: int) -> bool:
        """At an epoch's end (`epoch` finished): validate now?"""
        self.ends += 1
        return epoch % self.every == 0

    def measured(self, epoch: int, val_s: float, since_s: float | None) -> str | None:
        """The validation after `epoch` took `val_s`, `since_s` after the previous one ended (None: not known);
        the line to print when the spacing changes."""
        ends, self.ends = self.ends, 0
        if not self.auto:
            return None
        if self.distributed:  # every rank takes rank 0's figures: the same cadence everywhere
            box = [(val_s, since_s)]
            dist.broadcast_object_list(box, src=0)
            val_s, since_s = box[0]
        self.seen += 1
        if since_s is None or ends == 0 or self.seen == 1:
            return None
        s = self.sums
        s[0], s[1], s[2], s[3] = s[0] + val_s, s[1] + since_s, s[2] + 1, s[3] + ends
        mean_val, mean_epoch = s[0] / s[2], s[1] / s[3]
        new = throttled_every(mean_val, mean_epoch, self.base)
        if not (new > 1.25 * self.every or new < self.every / 1.25):  # a small drift: no change, no line
            return None
        self.every = new
        share = 100 * mean_val / (mean_val + new * mean_epoch)
        why = (
            f"{share:.0f}% of the wall time, at most {100 * VALIDATION_SHARE:.0f}%"
            if mean_val >= THROTTLE_FROM_S
            else f"under {THROTTLE_FROM_S} s, never spaced out"
        )
        n = self.patience or 0
        spans = f"; early stopping's patience of {n} validations spans {n * new} epochs" if n and new > 1 else ""
        return (
            f"validation: {f'every {new} epochs and the last' if new > 1 else 'every epoch'} from epoch "
            f"{new * (epoch // new + 1)} (auto: one takes {mean_val:.2f} s, an epoch {mean_epoch:.2f} s: {why}"
            f"{spans}); --validation_interval N sets it"
        )

    def state_dict(self) -> dict[str, object]:
        return {"every": self.every} if self.every != self.base else {}

    def load_state_dict(self, state: StateDict) -> None:
        if self.auto and "every" in state:
            self.every = max(self.base, int(state["every"]))


class KeptCheckpoint(TypedDict):
    """save_top_k: one of the kept checkpoints."""

    name: str
    value: float
    step: int


class BestTracker:
    """The best value of the task's monitor metric, and validations since it last improved."""

    def __init__(self, metric: str, mode: str, keep: int = 1) -> None:
        self.metric, self.mode, self.keep = metric, mode, keep
        self.best: float | None = None
        self.stale = 0  # validations without improvement (early stopping)
        self.top: list[KeptCheckpoint] = []  # save_top_k: the kept checkpoints, best first

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

    def rank(self, metrics: dict[str, float], name: str, step: int) -> tuple[bool, list[str]]:
        """save_top_k: whether the checkpoint `name` of this validation is among the `keep` best (a tie keeps the
        earlier one), and the names that fell out of them."""
        key = self.key(metrics)
        if self.keep <= 1 or key is None or not math.isfinite(metrics[key]):
            return False, []
        entry = KeptCheckpoint(name=name, value=metrics[key], step=step)
        entries = [e for e in self.top if e["name"] != name] + [entry]
        entries.sort(key=lambda e: e["value"], reverse=self.mode == "max")  # stable: the earlier first on a tie
        self.top = entries[: self.keep]
        return any(e["name"] == name for e in self.top), [e["name"] for e in entries[self.keep :]]

    def forget_missing(self, folder: Path) -> None:
        """save_top_k: forget the kept checkpoints no longer in `folder` (removed by hand, or after the checkpoint
        this run resumed from was written)."""
        self.top = [e for e in self.top if (folder / e["name"]).is_file()]

    def prune(self, folder: Path) -> list[str]:
        """save_top_k lowered on resume: the kept checkpoints beyond the new k removed from `folder`; their names."""
        keep = self.keep if self.keep > 1 else 0  # 1: best.pt alone
        gone, self.top = [e["name"] for e in self.top[keep:]], self.top[:keep]
        for name in gone:
            (folder / name).unlink(missing_ok=True)
        return gone

    def state_dict(self) -> dict[str, object]:
        return {"best": self.best, "stale": self.stale, **({"top": [dict(e) for e in self.top]} if self.top else {})}

    def load_state_dict(self, state: StateDict) -> None:
        self.best, self.stale = state.get("best"), int(state.get("stale", 0))
        self.top = [KeptCheckpoint(name=e["name"], value=e["value"], step=e["step"]) for e in state.get("top", [])]

    def newer_best(self, value: float) -> None:
        """best.pt was written after the checkpoint this run resumes from: its value is the best so far."""
        if value != self.best:
            self.best, self.stale = value, 0


class Evaluator:
    """The task's scores on a split with the weights the model holds now: eval mode, no gradients, no files written.

    The task's own `evaluate_fn`, else its `batch_evaluate_fn` over the split's batches, else the mean of the
    training loss over the split.
    """

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        rt: Runtime,
        loss_fn: LossFn,
        cfg: TrainConfig,
        loader_kw: dict[str, object],
        resident: Mapping[int, object],
        scores_added: bool = False,  # a callback's on_validation_end may add scores: the monitor is checked then
    ) -> None:
        self.task, self.model, self.rt, self.loss_fn = task, model, rt, loss_fn
        self.cfg, self.loader_kw, self.resident = cfg, loader_kw, resident
        for k, fn in (task.metrics or {}).items():
            if not isinstance(k, str) or not k.isidentifier():  # it becomes val_<name> in metrics.jsonl
                raise ValueError(f"Task(metrics=...): {k!r} is not a plain name; use letters, digits, _ ('top5')")
            if not callable(fn):
                raise ValueError(
                    f"Task(metrics=...): {k!r}: {fn!r} is not a function; give {{name: fn(output, "
                    f"target) -> tensor}}, e.g. metrics={{'acc': accuracy, 'top5': top_k_accuracy(5)}}"
                )
        if task.metrics and (task.evaluate_fn is not None or task.batch_evaluate_fn is not None):
            raise ValueError(
                "Task(metrics=...) scores plainloop's own evaluation (the mean loss over the split); this task "
                "brings its own (evaluate_fn or a validation_step): compute those scores there"
            )
        if "loss" in (task.metrics or {}):  # it would replace val_loss, the mean loss (and the usual monitor)
            raise ValueError("Task(metrics={'loss': ...}): 'loss' is the built-in val_loss; name the metric otherwise")
        names = ["val_loss", *(f"val_{k}" for k in task.metrics or {})]  # what the built-in evaluation reports
        builtin = task.evaluate_fn is None and task.batch_evaluate_fn is None and task.val_set is not None
        if builtin and not scores_added and task.monitor_metric not in names:
            raise ValueError(
                f"Task(monitor_metric={task.monitor_metric!r}): the validation reports {', '.join(names)}; monitor "
                f"one of them, add the score with Task(metrics=...), or compute yours in evaluate_fn"
            )

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
                elif task.batch_evaluate_fn is not None:
                    out = task.batch_evaluate_fn(model, split, self.batches(ds))
                else:
                    out = self.mean_loss(split, ds)
        finally:
            model.train(was_training)
        return {k: float(v) for k, v in out.items()}

    def mean_loss(self, split: str, ds: Dataset) -> dict[str, float]:
        """The loss averaged over the split, and the task's `metrics` on the output of the same forward (a hook
        keeps it): every sum stays on the device until one read at the end."""
        model, device, metrics = self.model, self.rt.device, self.task.metrics or {}
        outputs: list[object] = []
        hook = model.register_forward_hook(lambda m, i, o: outputs.append(o)) if metrics else None
        total, count = torch.zeros((), device=device), 0
        sums = {k: torch.zeros((), device=device) for k in metrics}
        counts = dict.fromkeys(metrics, 0)
        try:
            for _, batch in self.batches(ds):
                n = batch_size_of(batch)
                outputs.clear()
                total += self.loss_fn(model, batch).float() * n
                count += n
                if metrics:
                    pred, target = _output_and_target(outputs, batch, split)
                    for k, fn in metrics.items():
                        v = fn(pred, target).float()
                        if v.dim() and v.numel() != n:  # a shape is known without a sync
                            raise ValueError(
                                f"Task(metrics=...) {k!r} on {split}: gave shape {tuple(v.shape)} for a batch of {n}; "
                                f"return one value per sample (shape ({n},)) or the batch's mean (a 0-d tensor)"
                            )
                        sums[k] += v * n if v.dim() == 0 else v.sum()
                        counts[k] += n if v.dim() == 0 else v.numel()
        finally:
            if hook is not None:
                hook.remove()
        means = torch.stack([total / max(count, 1), *(sums[k] / max(counts[k], 1) for k in metrics)])
        values = means.tolist()  # note: sync point (validation)
        return {f"{split}_loss": values[0], **{f"{split}_{k}": v for k, v in zip(metrics, values[1:])}}

    def batches(self, ds: Dataset) -> Iterator[tuple[int, object]]:
        """(index, batch on the device) over a split in order, at most cfg.limit_val_batches of them; a private
        generator, so evaluating never draws from the global RNG (exact resume)."""
        cfg, rt, collate = self.cfg, self.rt, self.task.collate_fn
        kw: dict[str, Any] = {k: v for k, v in self.loader_kw.items() if k != "persistent_workers"}
        kw["generator"] = torch.Generator().manual_seed(cfg.seed)
        gatherer = None
        loader: Iterable[object]
        if is_stream(ds):  # no length: read in order
            loader = DataLoader(ds, batch_size=cfg.batch_size, collate_fn=collate, **kw)
        else:
            gatherer = self.resident.get(id(ds))
            n = len(cast(Sized, ds))  # a map-style split has a length; torch's Dataset type declares none
            sampler = ShardedBatchSampler(n, min(cfg.batch_size, n), shuffle=False, drop_last=False)
            loader = build_loader(ds, sampler, rt.device, kw, collate, gatherer)
        for i, batch in enumerate(itertools.islice(loader, cfg.limit_val_batches)):
            yield i, (to_device(batch, rt.device) if gatherer is None else batch)
