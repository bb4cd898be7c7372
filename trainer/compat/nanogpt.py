"""A nanoGPT-style model as it is: `forward(x, targets)` computes the loss and returns it.

`adapt_targets_task` (in trainer/layers.TASK_ADAPTERS, filled by trainer/__init__.py) gives a Task without a loss_fn
whose model's forward takes targets the loss that forward returns: `(logits, loss)`, `{"loss": ...}` or a 0-dim
tensor. Its `configure_optimizers(weight_decay, learning_rate, betas, device_type)` is the Lightning adapter's
(trainer/compat/lightning.py).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence

import torch
from torch import nn

from ..task import ModelProtocolError, Task, unwrap_model

TARGET_NAMES = ("targets", "target", "y", "labels", "label", "tgt")


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
