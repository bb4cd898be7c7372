"""The optimizer step: scale -> backward -> unscale -> check -> clip -> step -> update, with a state_dict.

In the spirit of timm's NativeScaler, plus a non-finite guard for every precision: a step whose gradients or loss
are not finite is skipped. The GradScaler (fp16) or a fused optimizer's kernel (`step_unless`) skips on the device,
with no host-device sync; on a CPU the flag is read directly. Skips are counted on the device, read at log points.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checkpoint import StateDict
from .optim import Schedule


class LossError(ValueError):
    """The loss function returned something backward() cannot use; the message says what to return instead."""


def loss_problem(loss: object) -> str | None:
    """Why `loss` cannot be trained on (checked on a run's first step only; attributes, no device sync), or None."""
    if not isinstance(loss, torch.Tensor):
        return (
            f"the loss is a {type(loss).__name__} ({loss!r:.40}), not a tensor: return the tensor the loss was "
            f"computed as (no .item(), float() or numpy), so that backward() reaches the weights"
        )
    if loss.numel() != 1:
        return f"the loss has shape {tuple(loss.shape)}, not one value: reduce it, e.g. loss.mean() or loss.sum()"
    if not loss.requires_grad:
        return (
            "the loss does not depend on any trainable weight (it was detached, computed under torch.no_grad(), "
            "or the model's parameters have requires_grad=False): return the loss computed from the model's output"
        )
    if not loss.is_floating_point():
        return f"the loss is {loss.dtype}, not a floating-point tensor: compute it in float"
    return None


def nonfinite_flag(grads: list[torch.Tensor], out: torch.Tensor, one: torch.Tensor | None = None) -> torch.Tensor:
    """Set `out` (a 0-dim float tensor) to 1.0 if any gradient holds a NaN or inf, else leave it.

    Private torch op, deliberately: it is the single fused kernel GradScaler.unscale_ uses for the same check
    (about 1.5 us on a CPU), where the public `get_total_norm(...).isfinite()` costs ten times more per step.
    """
    if grads:
        one = torch.ones((), device=out.device) if one is None else one  # the "unscale" factor: gradients unchanged
        torch._amp_foreach_non_finite_check_and_unscale_(grads, out, one)
    return out


def step_unless(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> bool | None:
    """optimizer.step(), skipped when found_inf is 1. Returns whether it skipped, or None if only the device knows.

    A fused optimizer skips inside its kernel when given `found_inf` the way GradScaler hands it over (the
    attribute protocol of torch.optim's fused Adam/AdamW/SGD), so the GPU never waits. Any other optimizer
    needs the flag on the host: free on a CPU, a sync on a GPU (docs/concepts/optimizer-step.md).
    """
    if optimizer.defaults.get("fused"):
        optimizer.grad_scale, optimizer.found_inf = None, found_inf  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
        return None
    skipped = bool(found_inf.item())  # note: sync point on a GPU (a non-fused optimizer); free on a CPU
    if not skipped:
        optimizer.step()
    return skipped


class OptimizerStep:
    """Backward and optimizer step for one model; `step()` returns (grad norm or None, found_inf)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: Schedule,
        device: torch.device,
        fp16: bool,
        static_scale: float | None = None,
        clip_val: float | None = None,
        clip_algorithm: str = "norm",
        before_step: Callable[[], None] | None = None,
    ) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.fp16, self.static_scale = fp16, static_scale
        self.clip_val, self.clip_algorithm = clip_val, clip_algorithm
        self.scaler = torch.amp.GradScaler(device.type, enabled=fp16, init_scale=static_scale or 2.0**16)
        # on a CPU the flag costs nothing to read (no device to wait for): the schedule and the skip counters
        # then stay on the host; tests set this False to walk the GPU path on a CPU
        self.host_reads = device.type == "cpu"
        # skipped steps: counted on the host when the host learned of them, else on the device (read at log points)
        self.skips, self.skip_run = 0, 0
        self._dev_skips, self._dev_run = torch.zeros((), device=device), torch.zeros((), device=device)
        # called after unscaling, before clipping and the step (the callbacks' on_before_optimizer_step)
        self.before_step = before_step
        self._loss_bad: torch.Tensor | None = None  # a non-finite loss in this accumulation window (device flag)
        # made once: the checks below run every step
        self.found_inf, self._one = torch.zeros((), device=device), torch.ones((), device=device)
        self._nan, self._zero = torch.full((), float("nan"), device=device), torch.zeros((), device=device)

    def backward(self, loss: torch.Tensor, window: int = 1) -> None:
        """Scaled backward of `loss`, averaged over an accumulation window of `window` micro-batches."""
        bad = ~torch.isfinite(loss.detach())  # a NaN/inf loss can leave finite gradients (relu(nan) has gradient 0)
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        self.scaler.scale(loss / window if window > 1 else loss).backward()

    def step(self, want_norm: bool = False) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Unscale, check, clip, step, update; clears the gradients. found_inf is a device tensor (1 = skipped)."""
        params, found = self.params, self.found_inf
        if self._loss_bad is not None:
            # a non-finite loss counts as a skipped step like non-finite gradients: it makes one gradient NaN on
            # the device (no sync), so the guard and GradScaler see it and skip, count and report it as usual
            first = next((p.grad for p in params if p.grad is not None), None)
            if first is not None:
                first.add_(torch.where(self._loss_bad, self._nan, self._zero))
            self._loss_bad = None
        if self.fp16:
            self.scaler.unscale_(self.optimizer)  # clipping and the check must see true gradients, once per step
        if self.before_step is not None:  # as Lightning: after unscaling, before clipping and the check
            self.before_step()
        grads = [p.grad for p in params if p.grad is not None]
        nonfinite_flag(grads, found.zero_(), self._one)
        norm: torch.Tensor | None = None
        if self.clip_val is not None and self.clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, self.clip_val)
        if self.clip_val is not None and self.clip_algorithm == "norm":
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_val)
        elif want_norm:
            norm = torch.nn.utils.get_total_norm(grads)
        if self.fp16:
            self.scaler.step(self.optimizer)  # skips optimizer.step() on inf/NaN gradients
            self.scaler.update(self.static_scale)  # a static scale is re-imposed, never grown or backed off
            skipped: bool | None = None
        else:
            skipped = step_unless(self.optimizer, found)
            if skipped is None and self.host_reads:
                skipped = bool(found.item())  # a CPU tensor: no sync
        if skipped is None:
            self.scheduler.step(found)  # a device-side schedule does not advance on a skipped step
            self._dev_skips += found
            self._dev_run.mul_(found).add_(found)  # consecutive: reset by a good step
        elif skipped:
            self.skips += 1
            self.skip_run += 1
        else:
            self.skip_run = 0
            self.scheduler.step()
        # what zero_grad(set_to_none=True) does, without its per-call profiler scope (~30 us per step on CPU)
        for p in params:
            p.grad = None
        return norm, found

    def device_counts(self) -> torch.Tensor:
        """The device-side (skipped, consecutive) counters, to read back together with the loss."""
        return torch.stack([self._dev_skips, self._dev_run])

    def skip_counts(self, device_values: list[float] | None = None) -> tuple[int, int]:
        """(skipped steps so far, consecutive skipped steps now); reads the device unless given its values."""
        dev = device_values if device_values is not None else self.device_counts().tolist()  # note: sync point
        return self.skips + int(dev[0]), self.skip_run + int(dev[1])

    def state_dict(self) -> dict[str, object]:
        total, run = self.skip_counts()
        return {"scaler": self.scaler.state_dict(), "skips": total, "skip_run": run}

    def load_state_dict(self, state: StateDict) -> None:
        self.scaler.load_state_dict(state["scaler"])
        self.skips, self.skip_run = int(state.get("skips", 0)), int(state.get("skip_run", 0))
