"""EMA: an exponential moving average of the model's weights, written as an ordinary callback.

    from trainer import EMA, Trainer, TrainConfig   # the module: trainer.extras.ema
    Trainer(cfg, task, callbacks=[EMA(decay=0.999)]).fit()   # or TrainConfig(ema_decay=0.999): the same callback

It uses only the public hooks (trainer/hooks.py), so it doubles as the example of a callback of your own:
- `on_train_batch_end`: when `trainer.step` moved on (an optimizer step closed this batch), every `every` steps,
  the copy moves towards the weights: ema = d * ema + (1 - d) * w, one `torch._foreach_lerp_` over all floating
  tensors, on the device. `d` is a Python float computed from the step count, so nothing waits for the device.
- `on_validation_end` / `on_test_end`: scores the EMA weights (copied into the model for `trainer.evaluate`, then
  the trained weights are copied back), puts them under the usual names and the trained weights' scores under
  `raw_<name>`. The engine reads the dict after the callbacks, so best.pt is chosen by the EMA score.
- `state_dict` / `load_state_dict`: the copy and its counters ride in every checkpoint under
  `checkpoint["callbacks"]["EMA"]` (`weights` is a state_dict of the model: `model.load_state_dict(
  ckpt["callbacks"]["EMA"]["weights"])` puts the averaged weights into a model), so a resume continues exactly.

Decay (timm's ModelEmaV3, `get_decay`): with t = step - update_after_step - 1, d = 0 while t <= 0 (the first update
copies the weights); with warm-up d = clamp(1 - (1 + t / warmup_gamma) ** -warmup_power, min_decay, decay), without
it d = decay. warmup_power 2/3 reaches 0.999 at about 31.6k steps; 3/4 at about 10k (timm's advice: 3/4 for
shorter runs). Floating-point buffers (BatchNorm running statistics) are averaged too, integer ones
(num_batches_tracked) copied, as timm does; `average_buffers=False` copies every buffer instead.

With `every` N > 1 the copy is updated on every N-th optimizer step with the same decay, so it averages over
about N / (1 - decay) steps; use decay ** N to keep the horizon of an update every step.

DDP: after every optimizer step the weights are identical on every rank, so one copy on rank 0 (the rank that
validates and writes checkpoints) equals what each rank would compute. With `all_ranks=True` every rank keeps
and updates its own, identical copy (nothing is communicated either way).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import TypedDict

import torch
from torch import nn

from ..checkpoint import load_checkpoint
from ..config import TrainConfig
from ..hooks import TrainerView


class EMAState(TypedDict, total=False):
    """EMA.state_dict(): the settings, the progress and the averaged weights (None before the model was seen)."""

    decay: float
    every: int
    warmup: bool
    warmup_power: float
    updates: int
    last_step: int
    weights: dict[str, torch.Tensor] | None


def ema_decay_at(
    step: int,
    decay: float,
    warmup: bool = True,
    warmup_power: float = 2 / 3,
    warmup_gamma: float = 1.0,
    update_after_step: int = 0,
    min_decay: float = 0.0,
) -> float:
    """The decay of the update made after optimizer step `step` (1 = the first): timm ModelEmaV3.get_decay."""
    t = max(0, step - update_after_step - 1)
    if t <= 0:
        return 0.0
    if not warmup:
        return decay
    return max(min(1.0 - (1.0 + t / warmup_gamma) ** -warmup_power, decay), min_decay)


class EMA:
    """An exponential moving average of a model's weights, kept on its device; see the module docstring.

    Args:
        decay: the decay once warmed up, in [0, 1) (timm's default 0.9999 suits long runs; 0.999 a few thousand
            steps).
        every: update every N optimizer steps (1 = every step).
        warmup: ramp the decay up as timm's ModelEmaV3 with use_warmup=True.
        warmup_power: the ramp's exponent: decay 1 - (1 + t / warmup_gamma) ** -warmup_power (timm's names).
        warmup_gamma: the ramp's time scale, in optimizer steps.
        update_after_step: optimizer steps during which the average copies the weights (decay 0).
        min_decay: the lowest decay once averaging starts.
        average_buffers: average floating-point buffers (timm's default) or copy every buffer.
        all_ranks: keep a copy on every DDP rank instead of rank 0 only.
    """

    state_key = "EMA"  # checkpoint["callbacks"]["EMA"]

    def __init__(
        self,
        decay: float = 0.9999,
        every: int = 1,
        warmup: bool = True,
        warmup_power: float = 2 / 3,
        warmup_gamma: float = 1.0,
        update_after_step: int = 0,
        min_decay: float = 0.0,
        average_buffers: bool = True,
        all_ranks: bool = False,
    ) -> None:
        checks = (
            ("decay", decay, isinstance(decay, int | float) and 0.0 <= decay < 1.0, "a number in [0, 1), e.g. 0.999"),
            ("every", every, isinstance(every, int) and not isinstance(every, bool) and every >= 1, "an int >= 1"),
            ("warmup_power", warmup_power, _positive(warmup_power), "a number > 0 (timm: 2/3 or 3/4)"),
            ("warmup_gamma", warmup_gamma, _positive(warmup_gamma), "a number > 0 (timm: 1)"),
            ("update_after_step", update_after_step, isinstance(update_after_step, int) and update_after_step >= 0,
             "an int >= 0"),
            ("min_decay", min_decay, isinstance(min_decay, int | float) and 0.0 <= min_decay <= decay,
             "a number in [0, decay]"),
        )  # fmt: skip
        for name, value, ok, want in checks:
            if not ok:
                raise ValueError(f"EMA({name}={value!r}): use {want}")
        self.decay, self.every, self.warmup = float(decay), every, bool(warmup)
        self.warmup_power, self.warmup_gamma = float(warmup_power), float(warmup_gamma)
        self.update_after_step, self.min_decay = update_after_step, float(min_decay)
        self.average_buffers, self.all_ranks = bool(average_buffers), bool(all_ranks)
        self.updates = 0  # updates made to the copy
        self.last_step = 0  # the optimizer step the copy was last brought up to date with
        self.names: list[str] = []  # state_dict names of the tensors below, in order
        self._live: list[torch.Tensor] = []  # the model's own tensors (parameters, then buffers)
        self._ema: list[torch.Tensor] = []  # the copy, same order, same device
        self._lerp: list[int] = []  # indices averaged (floating point); the others are copied
        self._copy: list[int] = []
        self._pending: EMAState | None = None  # a checkpoint's state loaded before the model was seen
        self._trainer: TrainerView | None = None

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> EMA:
        """The EMA a TrainConfig asks for (ema_decay, ema_every, ema_warmup, ema_warmup_power); errors name the
        TrainConfig field."""
        if cfg.ema_decay is None:  # what EMA(decay=None) would say
            raise ValueError("TrainConfig: ema_decay=None; use a number in [0, 1), e.g. 0.999")
        try:
            return cls(
                decay=cfg.ema_decay, every=cfg.ema_every, warmup=cfg.ema_warmup, warmup_power=cfg.ema_warmup_power
            )
        except ValueError as e:
            field = {"decay": "ema_decay", "every": "ema_every", "warmup_power": "ema_warmup_power"}
            name = str(e).split("(", 1)[1].split("=", 1)[0] if "(" in str(e) else "decay"
            value = getattr(cfg, field.get(name, "ema_decay"))
            raise ValueError(
                f"TrainConfig: {field.get(name, 'ema_decay')}={value!r}; {str(e).split(': ', 1)[-1]}"
            ) from None

    @classmethod
    def for_config(cls, cfg: TrainConfig, given: list[object]) -> tuple[EMA, str] | None:
        """The EMA callback `cfg.ema_decay` asks for, unless one is given already (trainer/layers.py)."""
        if cfg.ema_decay is None or any(isinstance(cb, EMA) for cb in given):
            return None
        ema = cls.from_config(cfg)  # an ordinary callback; its state rides in the checkpoints
        return ema, ema.describe()

    def describe(self) -> str:
        """One line for the start-up report."""
        warm = f"timm warm-up, power {self.warmup_power:g}" if self.warmup else "no warm-up"
        every = f", every {self.every} steps" if self.every > 1 else ""
        return (
            f"ema: weights averaged with decay {self.decay:g} ({warm}{every}); validation and test score the "
            f"average, raw_<metric> the trained weights"
        )

    # ------------------------------------------------------------------ the moving average itself
    def decay_at(self, step: int) -> float:
        return ema_decay_at(
            step,
            self.decay,
            self.warmup,
            self.warmup_power,
            self.warmup_gamma,
            self.update_after_step,
            self.min_decay,
        )

    def attach(self, model: nn.Module) -> None:
        """Start the copy from `model`'s current weights (and apply a state loaded before this)."""
        named: list[tuple[str, torch.Tensor, bool]] = [
            (n, t, True) for n, t in model.named_parameters(remove_duplicate=False)
        ]
        named += [(n, t, False) for n, t in model.named_buffers(remove_duplicate=False) if t is not None]
        self.names, self._live, is_param = [], [], []
        for n, t, param in named:  # state_dict's names and order (a tied weight under each of its names)
            if not _persistent(model, n):
                continue
            self.names.append(n)
            self._live.append(t)
            is_param.append(param)
        with torch.no_grad():
            self._ema = [t.detach().clone() for t in self._live]
        lerp = [t.is_floating_point() and (self.average_buffers or p) for t, p in zip(self._ema, is_param)]
        self._lerp = [i for i, x in enumerate(lerp) if x]
        self._copy = [i for i, x in enumerate(lerp) if not x]
        if self._pending is not None:
            state, self._pending = self._pending, None
            self.load_state_dict(state)

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Blend the model's weights after optimizer step `step` into the copy (no host-device sync)."""
        if not self._live:
            raise RuntimeError("EMA.update before EMA.attach(model)")
        w = 1.0 - self.decay_at(step)  # a Python float: the kernels need nothing from the device
        if self._lerp:
            torch._foreach_lerp_([self._ema[i] for i in self._lerp], [self._live[i] for i in self._lerp], w)
        if self._copy:
            torch._foreach_copy_([self._ema[i] for i in self._copy], [self._live[i] for i in self._copy])
        self.updates += 1
        self.last_step = step

    def catch_up(self, step: int) -> None:
        """Bring the copy up to optimizer step `step` (a no-op when it is there already): the update of a new step
        when it is due, else only the step count."""
        if step == self.last_step or not self._live:
            return
        if step % self.every == 0:
            self.update(step)
        else:
            self.last_step = step

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The EMA weights inside the model for the duration; the trained weights are put back exactly."""
        with torch.no_grad():
            backup = [t.detach().clone() for t in self._live]
            torch._foreach_copy_(self._live, self._ema)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self._live, backup)

    def evaluate(self, trainer: TrainerView, split: str) -> dict[str, float]:
        """The task's scores on `split` with the EMA weights."""
        with self.swapped_in():
            return trainer.evaluate(split)

    # ------------------------------------------------------------------ the hooks
    def _ensure(self, trainer: TrainerView) -> None:
        self._trainer = trainer
        if not self._live:
            loaded = self._pending is not None
            self.attach(trainer.raw_model)
            if not loaded:
                self.last_step = trainer.step  # a fresh start, or a resume of a run that had no EMA

    def on_train_start(self, trainer: TrainerView) -> None:
        self._ensure(trainer)
        shown = trainer.task.console_metrics
        if shown and not any(m.startswith("raw_") for m in shown):  # the console shows the trained weights' too
            trainer.task.console_metrics = (*shown, *(f"raw_{m}" for m in shown))

    def on_train_batch_end(self, trainer: TrainerView, outputs: torch.Tensor, batch: object, batch_idx: int) -> None:
        self._ensure(trainer)
        self.catch_up(trainer.step)  # nothing to do inside an accumulation window (the step did not move)

    def on_validation_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        self._score(trainer, "val", metrics)

    def on_test_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        best = trainer.run_dir / "checkpoints" / "best.pt" if trainer.run_dir is not None else None
        if metrics and trainer.cfg.test_with_best and best is not None and best.is_file():
            # the engine scores best.pt's trained weights: score the copy saved beside them, not the last one
            ckpt = load_checkpoint(best, map_location=trainer.device)
            state = (ckpt.get("callbacks") or {}).get(self.state_key)
            if state is not None:
                self._ensure(trainer)
                self.load_state_dict(state)
        self._score(trainer, "test", metrics)

    def _score(self, trainer: TrainerView, split: str, metrics: dict[str, float]) -> None:
        if not metrics:
            return  # no such split
        self._ensure(trainer)
        self.catch_up(trainer.step)
        ema = self.evaluate(trainer, split)
        raw = {f"raw_{k}": v for k, v in metrics.items()}
        metrics.clear()
        metrics.update({**ema, **raw})

    def on_save_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, object]) -> None:
        self._ensure(trainer)
        self.catch_up(trainer.step)  # a checkpoint written before this step's on_train_batch_end

    def on_load_checkpoint(self, trainer: TrainerView, checkpoint: Mapping[str, object]) -> None:
        states = checkpoint.get("callbacks")
        if not (isinstance(states, dict) and self.state_key in states):
            msg = f"ema: the checkpoint holds no EMA state; the average starts from the weights at step {trainer.step}"
            notes = getattr(trainer, "notes", None)  # printed with the run's other start-up notes
            notes.append(msg) if isinstance(notes, list) else trainer.log(f"[plainloop] {msg}")

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> EMAState:
        if self._trainer is not None and self._live:
            self.catch_up(self._trainer.step)
        return {
            "decay": self.decay,
            "every": self.every,
            "warmup": self.warmup,
            "warmup_power": self.warmup_power,
            "updates": self.updates,
            "last_step": self.last_step,
            "weights": dict(zip(self.names, self._ema)) if self._live else None,
        }

    def load_state_dict(self, state: EMAState) -> None:
        weights = state.get("weights")
        if weights is None:
            return
        if not self._live:
            self._pending = state  # applied when the model is seen (attach)
            return
        missing = [n for n in self.names if n not in weights]
        if missing:
            raise ValueError(
                f"EMA state: the checkpoint's averaged weights lack {missing[:5]} of this model; it was written for "
                f"another model (start the average afresh by leaving out --ema_decay for the resume)"
            )
        with torch.no_grad():
            for n, e in zip(self.names, self._ema):
                e.copy_(weights[n])
        self.updates, self.last_step = int(state.get("updates", 0)), int(state.get("last_step", 0))


def _positive(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v > 0 and math.isfinite(v)


def _persistent(model: nn.Module, name: str) -> bool:
    """Whether `name` is in model.state_dict() (a buffer registered with persistent=False is not)."""
    owner, _, leaf = name.rpartition(".")
    mod = model.get_submodule(owner) if owner else model
    return leaf not in getattr(mod, "_non_persistent_buffers_set", set())
