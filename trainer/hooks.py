"""What the loop reports to, handed in from outside: callbacks with do-nothing defaults.

The engine imports nothing from the rest of plainloop. The CLI plugs in the TrainingMonitor, the
bottleneck verdict, TensorBoard and plots through these hooks; a user's own repo plugs in its own.
A callback is any object with some of the methods below (duck-typed: subclassing `Callback` is optional).
It is called on rank 0 only, unless it sets `all_ranks = True` (then on every DDP rank). Hooks that run per
batch must stay cheap and must not sync the device. docs/guides/callbacks.md has the full contract.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from .config import TrainConfig
from .runtime import Runtime
from .task import Task


class TrainerView(Protocol):
    """What a callback may read of the Trainer and do with it (the Trainer in trainer/loop.py has all of it)."""

    cfg: TrainConfig  # the settings in effect
    task: Task
    rt: Runtime  # device, precision, DDP rank and world size
    raw_model: nn.Module  # the user's module (what checkpoints hold)
    model: nn.Module  # raw_model, maybe wrapped in DDP and/or torch.compile
    optimizer: torch.optim.Optimizer
    run_dir: Path | None
    notes: list[str]  # one line per decision; printed at the start, kept in summary.json
    total_steps: int  # (a stream without a len(): usercode.UNKNOWN_LENGTH, in these three)
    max_epochs: int
    batches_per_epoch: int
    should_stop: bool  # True ends training after this optimizer step, as Lightning's (under DDP: set on every rank)

    @property
    def step(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def is_main(self) -> bool: ...
    @property
    def world_size(self) -> int: ...
    def log(self, msg: str) -> None: ...
    def log_row(self, row: dict[str, Any]) -> None: ...
    def evaluate(self, split: str) -> dict[str, float]: ...


class Callback:
    """Every hook with its do-nothing default, in the order a run calls them (HOOK_NAMES reads them from here);
    subclass it and override what you need (or duck-type)."""

    all_ranks: bool = False  # True: called on every DDP rank; False: on rank 0 only

    def on_fit_start(self, trainer: TrainerView) -> None:
        """After the run directory and config.json exist, before the first step."""

    def on_load_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None:
        """Resuming: after the engine (and every callback's load_state_dict) restored its state."""

    def on_train_start(self, trainer: TrainerView) -> None:
        """After the resumed state is restored, right before the first epoch."""

    def on_train_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        """Before the epoch's first batch; `epoch` counts finished epochs (0 for the first)."""

    def on_train_batch_start(self, trainer: TrainerView, batch: Any, batch_idx: int) -> None:
        """Every batch, already on the device; `batch_idx` counts batches within the epoch."""

    def on_before_optimizer_step(self, trainer: TrainerView, optimizer: torch.optim.Optimizer) -> None:
        """On accumulation boundaries, after unscaling, before clipping and the step (as in Lightning)."""

    def on_train_batch_end(self, trainer: TrainerView, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
        """Every batch, after the optimizer step when it closed a window; `outputs` is the detached device loss."""

    def on_train_epoch_end(self, trainer: TrainerView, epoch: int) -> None:
        """After the epoch's last batch (`epoch` = index of the finished epoch), before its checkpoint."""

    def on_validation_start(self, trainer: TrainerView) -> None:
        """Before each validation."""

    def on_validation_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        """After each validation; `metrics` may be changed in place: best.pt, logging and early stopping read it."""

    def on_save_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None:
        """Before every checkpoint write (rank 0); may add keys."""

    def on_log(self, trainer: TrainerView, row: dict[str, Any]) -> None:
        """Every row written to metrics.jsonl: kind "train" (loss, lr, samples/s ...), "val", "norm", "event"."""

    def on_train_end(self, trainer: TrainerView) -> None:
        """After the last epoch (or a stop), before the test split."""

    def on_test_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        """After the test split was scored (rank 0); `metrics` may be changed in place, as on_validation_end."""

    def on_fit_end(self, trainer: TrainerView, summary: dict[str, Any]) -> None:
        """After training and testing, before summary.json is written; may add keys to `summary`."""


# every hook, in the order a run calls them (on_log and the checkpoint hooks come whenever a row or file is written)
HOOK_NAMES = tuple(n for n in vars(Callback) if n.startswith("on_"))


class Monitor:
    """The per-iteration timing sink (plainloop's TrainingMonitor has this API). The default does nothing."""

    def start_monitoring(self) -> None: ...
    def log_iteration(self, seconds: float, data_seconds: float | None = None, samples: int | None = None) -> None: ...
    def stop_monitoring(self) -> None: ...

    def get_summary(self) -> dict[str, Any]:
        return {}


def state_key(cb: Any) -> str:
    """Where a callback's state_dict is kept in checkpoint["callbacks"]."""
    return str(getattr(cb, "state_key", type(cb).__qualname__))


class Hooks:
    """The callbacks' bound methods per hook name, resolved once (a per-batch hook costs an empty-list check).

    `trainer` is handed to every call as the first argument. On a rank other than 0 only callbacks with
    `all_ranks = True` are called; every callback's state is saved and restored whatever its rank setting.
    """

    def __init__(self, callbacks: list[Any], trainer: TrainerView, is_main: bool) -> None:
        self.callbacks, self.trainer, self.is_main = callbacks, trainer, is_main
        self.bound: dict[str, list[Callable[..., Any]]] = {}
        self.resolve()

    def resolve(self) -> None:
        """Look the hooks up again (the callback list may have grown since); before anything is written, refuse
        two callbacks whose states would be saved under one key."""
        keys = [state_key(cb) for cb in self.callbacks if callable(getattr(cb, "state_dict", None))]
        if dup := next((k for k in keys if keys.count(k) > 1), None):
            raise ValueError(
                f"two callbacks save their state under {dup!r}: give one a `state_key` attribute of its own"
            )
        active = [cb for cb in self.callbacks if self.is_main or getattr(cb, "all_ranks", False)]
        self.bound = {n: [f for cb in active if callable(f := getattr(cb, n, None))] for n in HOOK_NAMES}
        # the per-batch hooks, read by the loop without a dict lookup
        self.batch_start = self.bound["on_train_batch_start"]
        self.batch_end = self.bound["on_train_batch_end"]
        self.before_optimizer_step = self.bound["on_before_optimizer_step"]

    def __call__(self, name: str, *args: Any) -> None:
        for fn in self.bound[name]:
            fn(self.trainer, *args)

    def state_dict(self) -> dict[str, Any]:
        """Every callback's state_dict(), under its state_key."""
        out: dict[str, Any] = {}
        for cb in self.callbacks:
            if callable(getattr(cb, "state_dict", None)):
                out[state_key(cb)] = cb.state_dict()  # one callback per key: resolve() refused two
        return out

    def load_state_dict(self, states: dict[str, Any]) -> list[str]:
        """Restore the callbacks that have a saved state; returns the keys of states no callback took."""
        taken = set()
        for cb in self.callbacks:
            key = state_key(cb)
            if key in states and callable(getattr(cb, "load_state_dict", None)):
                cb.load_state_dict(states[key])
                taken.add(key)
        return sorted(set(states) - taken)
