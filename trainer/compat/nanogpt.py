"""A nanoGPT-style model as it is: `forward(x, targets)` computes the loss and returns it.

`adapt_targets_task` (in trainer/layers.TASK_ADAPTERS, filled by trainer/__init__.py) gives a Task without a loss_fn
whose model's forward takes targets the loss that forward returns: `(logits, loss)`, `{"loss": ...}` or a 0-dim
tensor. Its `configure_optimizers(weight_decay, learning_rate, betas, device_type)` is the Lightning adapter's
(trainer/compat/lightning.py).

`LrFnSchedule` is nanoGPT's `lr = get_lr(iter_num)` before each step: Task(lr_fn=get_lr) (trainer/compat/lightning.py
hands it the optimizer that runs).
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..checkpoint import StateDict
from ..optim import group_lr
from ..task import Task, unwrap_model

TARGET_NAMES = ("targets", "target", "y", "labels", "label", "tgt")


class ModelProtocolError(ValueError):
    """A model whose configure_optimizers / training_step cannot be used as it is; the message says why."""


def forward_takes_targets(model: nn.Module) -> bool:
    """forward(x, targets) as nanoGPT's GPT: the second parameter is named like a target."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
    except (TypeError, ValueError):
        return False
    return len(params) >= 2 and params[1].name in TARGET_NAMES


def forward_output_loss(out: object) -> torch.Tensor:
    """The loss a forward(x, targets) returned: (logits, loss), a dict with "loss", or a 0-dim tensor."""
    if isinstance(out, tuple | list):
        for v in [*out[1:], *out[:1]]:  # nanoGPT: (logits, loss)
            if isinstance(v, torch.Tensor) and v.dim() == 0:
                return v
        raise ModelProtocolError(
            f"forward(x, targets) returned a {type(out).__name__} of {len(out)} without a scalar loss; return "
            f"(logits, loss), a dict with 'loss', or give Task(loss_fn=...)"
        )
    if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor):
        return out["loss"]
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return out
    raise ModelProtocolError(
        f"forward(x, targets) returned {type(out).__name__}"
        f"{' of shape ' + str(tuple(out.shape)) if isinstance(out, torch.Tensor) else ''}, not a loss; return "
        f"(logits, loss), a dict with 'loss' or a 0-dim tensor, or give Task(loss_fn=...)"
    )


def targets_loss(model: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """nanoGPT-style: forward(x, targets) computes the loss and returns (logits, loss), {"loss": ...} or it."""
    return forward_output_loss(model(batch[0], batch[1]))


def adapt_targets_task(task: Task) -> Task | None:
    """The task with forward(x, targets)'s loss as its loss_fn (trainer/layers.TASK_ADAPTERS); None otherwise."""
    inner = unwrap_model(task.model)
    if task.loss_fn is not None or not forward_takes_targets(inner):
        return None
    note = f"loss: {type(inner).__name__}.forward(x, targets) computes it (the loss it returns)"
    return dataclasses.replace(task, loss_fn=targets_loss, notes=[*task.notes, note])


def skipped_on_device(found_inf: torch.Tensor | None) -> bool:
    """Whether the step the optimizer step reports with `found_inf` (given only when the host did not learn it: fp16,
    or a fused optimizer on a GPU) was skipped. note: sync point; after GradScaler's own read for a non-fused
    optimizer it costs no wait, a fused one on a GPU pays it once per step (a host-side schedule must know)."""
    return found_inf is not None and bool(found_inf.item())  # note: sync point (see above)


class LrFnSchedule:
    """The `Schedule` for Task(lr_fn=...): lr_fn(n) set on every parameter group before each optimizer step, n = the
    optimizer steps taken so far (nanoGPT's iter_num; a step skipped for non-finite gradients does not count). The
    count rides in every checkpoint, so a resumed run continues the same curve."""

    def __init__(self, optimizer: torch.optim.Optimizer, lr_fn: Callable[[int], float]) -> None:
        self.optimizer, self.lr_fn, self.steps = optimizer, lr_fn, 0
        self.name = getattr(lr_fn, "__name__", type(lr_fn).__name__)
        self._apply()

    def _apply(self) -> None:
        lr = self.lr_fn(self.steps)
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not 0 <= float(lr) < float("inf"):
            raise ValueError(f"lr_fn: {self.name}({self.steps}) returned {lr!r}; return the lr, a finite float >= 0")
        for g in self.optimizer.param_groups:
            if isinstance(g["lr"], torch.Tensor):  # a tensor lr (fused optimizers) is updated in place
                g["lr"].fill_(float(lr))
            else:
                g["lr"] = float(lr)

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        if not skipped_on_device(found_inf):
            self.steps += 1
            self._apply()

    def current_lr(self) -> float:
        return group_lr(self.optimizer)

    def state_dict(self) -> dict[str, object]:
        return {"steps": self.steps}

    def load_state_dict(self, state: StateDict) -> None:
        self.steps = int(state["steps"])
        self._apply()


def refuse_criterion_loss(task: Task) -> None:
    """A loss of (output, target), such as F.cross_entropy or nn.CrossEntropyLoss(), given where loss_fn(model,
    batch) belongs: one line with the way in, not a traceback at the first step."""
    fn = task.loss_fn
    if fn is None:
        return None
    if not isinstance(fn, nn.Module):
        try:
            first = list(inspect.signature(fn).parameters)[:2]
        except (TypeError, ValueError):
            return None
        if len(first) < 2 or not set(first) <= {"input", "output", "pred", "logits", "target", "y", "labels"}:
            return None
    name = f"nn.{type(fn).__name__}()" if isinstance(fn, nn.Module) else getattr(fn, "__name__", "loss_fn")
    raise ModelProtocolError(
        f"Task(loss_fn={name}): loss_fn(model, batch) returns the loss, and {name} takes (output, target); "
        f"give loss_fn=lambda m, b: {name}(m(b[0]), b[1])"
    )
