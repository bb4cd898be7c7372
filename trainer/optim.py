"""AdamW, warmup + cosine schedule, learning-rate scaling with the batch size."""

from __future__ import annotations

import math

import torch
from torch import nn


def scaled_lr(lr: float, batch_size: int, ref_batch_size: int | None, rule: str) -> float:
    """Seed 000's rule: new_lr = old_lr * sqrt(new_bs / old_bs) ("sqrt"), or "linear", or "none"."""
    if ref_batch_size is None or rule == "none" or batch_size == ref_batch_size:
        return lr
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
    # A tensor lr lets the schedule skip steps without a host sync (fused AdamW accepts it). Fused on a CPU too:
    # one kernel per group instead of a Python loop over parameters (benchmarks/loop_overhead.py).
    lr_arg: float | torch.Tensor = torch.tensor(lr, device=device) if tensor_lr else lr
    if fused is False and tensor_lr:
        lr_arg = lr  # the for-each kernel wants a float lr unless capturable
    return torch.optim.AdamW(groups, lr=lr_arg, betas=tuple(betas), eps=eps, fused=fused is not False)


class WarmupCosine:
    """Linear warmup then cosine decay, indexed by the number of optimizer steps actually taken.

    With fp16 a GradScaler may skip a step (inf/NaN gradients). The schedule must not advance then, and
    finding out on the host would cost a sync every step, so in that mode the step counter and the lr
    live on the device and advance by (1 - found_inf). Otherwise plain Python floats are used.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        warmup_steps: int,
        min_lr_ratio: float = 0.05,
        on_device: bool = False,
    ) -> None:
        self.optimizer = optimizer
        self.total_steps = max(1, total_steps)
        self.warmup_steps = max(0, warmup_steps)
        self.min_lr_ratio = min_lr_ratio
        self.on_device = on_device
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        device = optimizer.param_groups[0]["params"][0].device
        self.steps: torch.Tensor | int = torch.zeros((), device=device) if on_device else 0
        self._apply()

    def factor(self, s):
        """lr multiplier after s steps (works for a Python number and for a tensor)."""
        if self.on_device:
            warm = (s + 1) / max(1, self.warmup_steps)
            p = ((s - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)).clamp(0.0, 1.0)
            cos = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + torch.cos(math.pi * p))
            return torch.where(s < self.warmup_steps, warm, cos)
        if s < self.warmup_steps:
            return (s + 1) / self.warmup_steps
        p = min(1.0, (s - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))

    def _apply(self) -> None:
        f = self.factor(self.steps)
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            if self.on_device:
                g["lr"].copy_(f * base)
            else:
                g["lr"] = f * base

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        if self.on_device:
            self.steps += 1 - found_inf if found_inf is not None else 1
        else:
            self.steps += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"steps": self.steps, "base_lrs": self.base_lrs, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.base_lrs = list(state["base_lrs"])
        s = state["steps"]
        if self.on_device:
            self.steps = torch.as_tensor(s, dtype=torch.float32).to(self.steps.device).reshape(())
        else:
            self.steps = int(s)
        self._apply()

    def current_lr(self) -> float:
        lr = self.optimizer.param_groups[0]["lr"]
        return float(lr)  # note: a sync when lr is a device tensor; called at log points only
