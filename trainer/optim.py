"""The optimizer and its schedule, decided in one place: `build_optimizer` returns an `OptimizerSetup`.

AdamW with decay on matrices only, a warmup + cosine schedule (any object with the `Schedule` protocol),
learning-rate scaling with the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from .checkpoint import StateDict
from .config import TrainConfig
from .runtime import Runtime


@runtime_checkable
class Schedule(Protocol):
    """What OptimizerStep drives after every optimizer step that was not skipped: `step(found_inf)` gets the skip
    flag when only the device knows (a device-side schedule advances by 1 - found_inf); `current_lr()` is read at
    log points only. An epoch-interval or plateau schedule steps from a callback, beside a `ConstantSchedule`."""

    def step(self, found_inf: torch.Tensor | None = None) -> None: ...
    def current_lr(self) -> float: ...
    def state_dict(self) -> dict[str, object]: ...
    def load_state_dict(self, state: StateDict) -> None: ...


def group_lr(optimizer: torch.optim.Optimizer) -> float:
    """The first parameter group's lr, for logs; note: a sync when lr is a device tensor (log points only)."""
    return float(optimizer.param_groups[0]["lr"])


class ConstantSchedule:
    """The per-step Schedule when the lr is left alone per step: constant, or stepped by a callback (per epoch,
    on a plateau) that owns that schedule's state."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        pass

    def current_lr(self) -> float:
        return group_lr(self.optimizer)

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: StateDict) -> None:
        pass


@dataclass
class OptimizerSetup:
    """What `build_optimizer` decided: the optimizer, its per-step schedule, callbacks that step other schedules
    (per epoch, on a plateau), one line per decision for the run's notes, and the real hyper-parameters."""

    optimizer: torch.optim.Optimizer
    schedule: Schedule
    callbacks: list[object] = field(default_factory=list)  # objects with any of the hooks in hooks.py
    notes: list[str] = field(default_factory=list)
    hparams: dict[str, object] = field(default_factory=dict)  # for config.json and summary.json
    warmup_steps: int = 0  # plainloop's warm-up (a task's own schedule has none of ours)


# a task's optimizer_fn(model, cfg, device, base_lr) -> its optimizer and schedule, or None for plainloop's AdamW
# and warm-up/cosine; base_lr is Task.lr or cfg.lr, before any batch-size scaling
OptimizerFn = Callable[[nn.Module, TrainConfig, torch.device, float], OptimizerSetup | None]


def build_optimizer(
    model: nn.Module,
    cfg: TrainConfig,
    runtime: Runtime,
    global_batch: int,
    total_steps: int,
    optimizer_fn: OptimizerFn | None = None,
    task_lr: float | None = None,
) -> OptimizerSetup:
    """The task's `optimizer_fn` when it gives one (a LightningModule's configure_optimizers, or the optimizer a
    Task was given, comes this way, as it is); else plainloop's AdamW with warm-up + cosine and lr scaling, at the
    task's own lr (Task.lr, e.g. a LightningModule's learning_rate) or else cfg.lr (--lr)."""
    base_lr = task_lr or cfg.lr
    if optimizer_fn is not None:
        own = optimizer_fn(model, cfg, runtime.device, base_lr)
        if own is not None:
            own.hparams = own.hparams or {"source": "the task's optimizer_fn", **optimizer_hparams(own.optimizer)}
            return own
    lr = scaled_lr(base_lr, global_batch, cfg.ref_batch_size, cfg.lr_scaling)
    # a tensor lr: the schedule on the device never needs to ask whether a step was skipped (CUDA, fp16 anywhere)
    tensor_lr = runtime.device.type == "cuda" or runtime.amp_dtype == torch.float16
    optimizer = build_adamw(model, lr, cfg.weight_decay, runtime.device, tensor_lr, cfg.adam_betas, cfg.adam_eps,
                            cfg.fused)  # fmt: skip
    horizon = cfg.lr_decay_steps or total_steps  # nanoGPT's lr_decay_iters: the cosine may end before the run
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else min(500, int(0.05 * horizon))
    schedule = WarmupCosine(optimizer, horizon, warmup, cfg.min_lr_ratio)
    source = f"Task.lr; --lr {cfg.lr:g} not used" if task_lr else "--lr / TrainConfig.lr"
    scaling = f" -> {lr:.3g} ({cfg.lr_scaling} scaling, batch {cfg.ref_batch_size} -> {global_batch})" * (lr != base_lr)
    notes = [f"optimizer: plainloop's AdamW, lr {base_lr:.3g} (from {source}){scaling}, {warmup} warm-up steps "
             f"then cosine to lr x {cfg.min_lr_ratio:g}"]  # fmt: skip
    hparams = {
        "source": "plainloop AdamW + warm-up/cosine",
        **optimizer_hparams(optimizer),
        "lr": lr,
        "schedule": "warmup_cosine",
        "warmup_steps": warmup,
        "total_steps": total_steps,
        "decay_steps": horizon,
        "min_lr_ratio": cfg.min_lr_ratio,
    }
    return OptimizerSetup(optimizer, schedule, [], notes, hparams, warmup)


def optimizer_hparams(optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """The optimizer's real hyper-parameters, per parameter group (for config.json and summary.json)."""
    groups = []
    for g in optimizer.param_groups:
        d: dict[str, object] = {}
        for k, v in g.items():
            if k == "params":
                d["num_params"] = sum(p.numel() for p in v)
            elif isinstance(v, torch.Tensor):
                d[k] = v.tolist()  # note: sync point (start-up, once)
            elif isinstance(v, int | float | str | bool | type(None)) or (
                isinstance(v, tuple | list) and all(isinstance(x, int | float) for x in v)
            ):
                d[k] = list(v) if isinstance(v, tuple) else v
        groups.append(d)
    return {"type": type(optimizer).__name__, "param_groups": groups}


def scaled_lr(lr: float, batch_size: int, ref_batch_size: int | None, rule: str) -> float:
    """A learning rate tuned at `ref_batch_size`, rescaled for `batch_size`: new_lr = lr * sqrt(new_bs / ref_bs)
    ("sqrt", Adam-family), lr * new_bs / ref_bs ("linear", SGD), or unchanged ("none", or no reference)."""
    if rule not in ("sqrt", "linear", "none"):
        raise ValueError(f"scaled_lr(rule={rule!r}): choose 'sqrt', 'linear' or 'none' (--lr_scaling)")
    if ref_batch_size is None or rule == "none" or batch_size == ref_batch_size:
        return lr
    if batch_size < 1 or ref_batch_size < 1:
        raise ValueError(
            f"scaled_lr(batch_size={batch_size}, ref_batch_size={ref_batch_size}): batch sizes must be >= 1"
        )
    ratio = batch_size / ref_batch_size
    return lr * (math.sqrt(ratio) if rule == "sqrt" else ratio)


def build_adamw(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    device: torch.device,
    tensor_lr: bool,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """AdamW with decay on matrices only (not on biases/norms); the fused kernel (CUDA and CPU)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    # A tensor lr lets the schedule skip steps without a host sync (fused AdamW accepts it; the for-each kernel
    # wants a float lr unless capturable). Fused on a CPU too: one kernel per group instead of a Python loop over
    # parameters (benchmarks/loop_overhead.py).
    use_fused = fused is not False
    lr_arg: float | torch.Tensor = torch.tensor(lr, device=device) if tensor_lr and use_fused else lr
    return torch.optim.AdamW(groups, lr=lr_arg, betas=betas, eps=eps, fused=use_fused)


class WarmupCosine:
    """Linear warmup then cosine decay, indexed by the number of optimizer steps actually taken.

    A step may be skipped (inf/NaN gradients) where only the device knows. The schedule must not advance then,
    and finding out on the host would cost a sync every step, so when the optimizer's lr is a tensor the step
    counter lives on the device too and advances by (1 - found_inf). Otherwise plain Python floats are used.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.05
    ) -> None:
        self.optimizer = optimizer
        self.total_steps = max(1, total_steps)
        self.warmup_steps = max(0, warmup_steps)
        self.min_lr_ratio = min_lr_ratio
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        lr = optimizer.param_groups[0]["lr"]
        self.steps: torch.Tensor | int = torch.zeros((), device=lr.device) if isinstance(lr, torch.Tensor) else 0
        self.on_device = isinstance(self.steps, torch.Tensor)
        self._apply()

    def factor(self, s: torch.Tensor | int) -> torch.Tensor | float:
        """lr multiplier after s steps (works for a Python number and for a tensor)."""
        w, r, span = self.warmup_steps, self.min_lr_ratio, max(1, self.total_steps - self.warmup_steps)
        if isinstance(s, torch.Tensor):  # on_device: the step count lives on the device
            cos = r + (1 - r) * 0.5 * (1 + torch.cos(math.pi * ((s - w) / span).clamp(0.0, 1.0)))
            return torch.where(s < w, (s + 1) / max(1, w), cos)
        return (s + 1) / w if s < w else r + (1 - r) * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - w) / span)))

    def _apply(self) -> None:
        f = self.factor(self.steps)
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            if self.on_device:
                g["lr"].copy_(f * base)
            else:
                g["lr"] = f * base

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        self.steps += 1 - found_inf if self.on_device and found_inf is not None else 1
        self._apply()

    def state_dict(self) -> dict[str, object]:
        return {"steps": self.steps, "base_lrs": self.base_lrs, "total_steps": self.total_steps}

    def load_state_dict(self, state: StateDict) -> None:
        self.base_lrs = list(state["base_lrs"])
        s = state["steps"]
        if isinstance(self.steps, torch.Tensor):
            self.steps = torch.as_tensor(s, dtype=torch.float32).to(self.steps.device).reshape(())
        else:
            self.steps = int(s)
        self._apply()

    def current_lr(self) -> float:
        return group_lr(self.optimizer)
