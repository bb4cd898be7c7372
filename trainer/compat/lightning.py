"""Your model as it is: a duck-typed LightningModule (or nanoGPT-style module) trained by plainloop unchanged.

Nothing here imports Lightning. `adapt_lightning_task` (in trainer/layers.TASK_ADAPTERS, filled by
trainer/__init__.py) turns a Task whose model defines `configure_optimizers` or `training_step` into a plain Task:
its loss_fn, batch_evaluate_fn, optimizer_fn, log_metrics_fn and a callback (`ModelHooks`); the loop trains that
Task as any other. What the model defines is used, what it does not define falls back to plainloop's defaults:

- `configure_optimizers()` in every form Lightning accepts -> the optimizer and schedule that run (plainloop's
  warm-up/cosine and lr scaling are then not applied). Parameters named `weight_decay`, `learning_rate`/`lr`,
  `betas`, `eps`, `device_type` (nanoGPT) get the run's values.
- `training_step(batch, batch_idx)` -> the loss (a tensor, or a dict with "loss").
- `validation_step` / `test_step` -> evaluation, scored by what they `self.log`; a model with a training_step and
  no validation_step (test_step) is not validated (tested), as under Lightning.
- `self.log` / `self.log_dict` -> values kept on the device, averaged and read back at log points and per
  validation (no host sync per step).
- `self.current_epoch`, `self.global_step`, `self.trainer.*` (a documented subset), `self.optimizers()`,
  `self.lr_schedulers()` -> answered by a small stand-in for Lightning's trainer.
- the usual hooks (on_fit_start ... on_load_checkpoint) -> called through one callback (`ModelHooks`).

Anything else Lightning would do for the model fails with one line naming it (`UnsupportedLightningFeature`).
While a fit runs, the model answers `self.log`, `self.trainer` ... from plainloop (`ModelAdapter.attach`); the fit's
end gives the model back as it was, and a later fit on the same model undoes what a failed one left.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn, Protocol, TypedDict, TypeGuard

import torch
from torch import nn

from ..checkpoint import StateDict
from ..config import TrainConfig
from ..hooks import TrainerView
from ..optim import ConstantSchedule, OptimizerFn, OptimizerSetup, build_adamw, group_lr, optimizer_hparams
from ..task import BatchEvaluateFn, LogMetricsFn, LossFn, Task
from ..usercode import UNKNOWN_LENGTH
from .nanogpt import LrFnSchedule, ModelProtocolError, skipped_on_device

_SENTINEL = "_plainloop_training_step"  # routes a wrapped (DDP/compiled) call to training_step
_EVAL_MODE = (
    "plainloop puts the model in eval mode without gradients for validation and test, and back after; set a "
    "module's mode inside validation_step / test_step instead"
)
# A LightningModule's hooks that plainloop's loop has no point for: one the module overrides is refused at start-up
# with the way out, never skipped in silence (every other hook of Lightning's fit and test runs at its point)
NOT_RUN = {
    "on_before_backward": "compute it in training_step, before returning the loss",
    "on_after_backward": "move it to on_before_optimizer_step (once per optimizer step, after unscaling, before "
    "clipping)",
    "on_before_zero_grad": "move it to on_train_batch_end (plainloop clears the gradients after each step)",
    "optimizer_step": "plainloop steps the optimizer itself (with its non-finite guard); move per-step work to "
    "on_before_optimizer_step, or the schedule to a step-interval lr_scheduler",
    "optimizer_zero_grad": "plainloop clears the gradients itself after each optimizer step",
    "configure_gradient_clipping": "set TrainConfig(gradient_clip_val=..., gradient_clip_algorithm=...) "
    "(--gradient_clip_val)",
    "backward": "plainloop calls backward on the loss (scaled under fp16); move extra work to "
    "on_before_optimizer_step",
    "configure_callbacks": "pass them to Trainer(..., callbacks=[...]) as plainloop callbacks (trainer/hooks.py)",
    "transfer_batch_to_device": "plainloop moves tensors and tuples, lists and dicts of them; give "
    "Task(collate_fn=...) that makes such batches",
    "on_before_batch_transfer": "do it in the dataset or in Task(collate_fn=...)",
    "on_after_batch_transfer": "do it at the top of training_step",
    **dict.fromkeys(("on_validation_model_eval", "on_validation_model_train", "on_validation_model_zero_grad",
                     "on_test_model_eval", "on_test_model_train"), _EVAL_MODE),
}  # fmt: skip


ModelMethod = Callable[..., object]  # a method of the user's model, called with what Lightning would pass


class ModelScheduler(Protocol):
    """An LR scheduler from configure_optimizers: torch's, or any object with a step()."""

    def step(self, *metric: float) -> object: ...

    def state_dict(self) -> StateDict: ...

    def load_state_dict(self, state_dict: StateDict) -> object: ...


Stepper = Callable[[ModelScheduler, float | None], object]  # steps one scheduler, with a metric or without


class UnsupportedLightningFeature(AttributeError):
    """A Lightning feature plainloop does not provide; the message names it and the way out.

    An AttributeError, so `hasattr(self.trainer, "x")` in a model answers False instead of raising.
    """


def is_lightning_style(model: nn.Module) -> bool:
    """The module brings its own optimizer or training step (a LightningModule or any module shaped like one)."""
    return _own(model, "configure_optimizers") is not None or _own(model, "training_step") is not None


def _own(model: nn.Module, name: str) -> ModelMethod | None:
    """The model's method `name`, unless it is LightningModule's (LightningDataModule's) own default."""
    fn = getattr(model, name, None)
    if fn is None or not callable(fn):
        return None
    # The framework base, found in the model's MRO (never imported). Only the very function it resolves (its own
    # or its hooks mixins') is a default: classes such as lightning.pytorch.demos.BoringModel are users' models
    base = next((c for c in type(model).__mro__ if c.__name__ in ("LightningModule", "LightningDataModule")
                 and c.__module__.startswith(("lightning.", "pytorch_lightning."))), None)  # fmt: skip
    return None if base is not None and getattr(fn, "__func__", fn) is getattr(base, name, None) else fn


# ------------------------------------------------------------------ configure_optimizers
def _is_optimizer(x: object) -> TypeGuard[torch.optim.Optimizer]:
    return isinstance(x, torch.optim.Optimizer) or (hasattr(x, "param_groups") and hasattr(x, "step"))


def _is_plateau(s: object) -> bool:
    return isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau)


class SchedulerConfig:
    """One model scheduler with Lightning's config keys: interval ("epoch" or "step"), frequency, monitor."""

    def __init__(self, scheduler: ModelScheduler, interval: str = "epoch", frequency: int = 1,
                 monitor: str | None = None, strict: bool = True, name: str | None = None) -> None:  # fmt: skip
        if interval not in ("epoch", "step"):
            raise ModelProtocolError(
                f"configure_optimizers: lr_scheduler interval={interval!r}; Lightning (and plainloop) accept "
                f"'epoch' or 'step'"
            )
        if not (isinstance(frequency, int) and frequency >= 1):
            raise ModelProtocolError(f"configure_optimizers: lr_scheduler frequency={frequency!r}; give an int >= 1")
        self.scheduler, self.interval, self.frequency = scheduler, interval, frequency
        self.monitor, self.strict, self.name = monitor, strict, name
        self.plateau = _is_plateau(scheduler)
        if self.plateau and not monitor:
            raise ModelProtocolError(
                f"configure_optimizers: a {type(scheduler).__name__} needs the metric it watches: return "
                f'{{"optimizer": opt, "lr_scheduler": {{"scheduler": sched, "monitor": "val_loss"}}}}'
            )

    def describe(self) -> str:
        what = f"{type(self.scheduler).__name__}"
        if self.plateau:
            return f"{what} on {self.monitor!r} (after each validation)"
        unit = "optimizer step" if self.interval == "step" else "epoch"
        return f"{what}, stepped every {unit if self.frequency == 1 else f'{self.frequency} {unit}s'}"

    def hparams(self) -> dict[str, str | int | None]:
        return {"type": type(self.scheduler).__name__, "interval": self.interval, "frequency": self.frequency,
                "monitor": self.monitor}  # fmt: skip


_SCHED_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau", "opt_idx"}


def _is_scheduler(s: object) -> TypeGuard[ModelScheduler]:
    return hasattr(s, "step")


def _scheduler_config(s: object, monitor: str | None) -> SchedulerConfig:
    if isinstance(s, dict):
        if "scheduler" not in s:
            raise ModelProtocolError(
                f"configure_optimizers: the lr_scheduler dict has keys {sorted(s)} but no 'scheduler'; "
                f'give {{"scheduler": sched, "interval": "epoch"}}'
            )
        unknown = sorted(set(s) - _SCHED_KEYS)
        if unknown:
            raise ModelProtocolError(
                f"configure_optimizers: unknown lr_scheduler key(s) {unknown}; Lightning's keys are "
                f"{sorted(_SCHED_KEYS - {'opt_idx', 'reduce_on_plateau'})}"
            )
        return SchedulerConfig(s["scheduler"], s.get("interval", "epoch"), s.get("frequency", 1),
                               s.get("monitor", monitor), s.get("strict", True), s.get("name"))  # fmt: skip
    if not _is_scheduler(s):
        raise ModelProtocolError(
            f"configure_optimizers: lr_scheduler {type(s).__name__} has no step(); give a torch.optim.lr_scheduler "
            f"object or a dict with 'scheduler'"
        )
    return SchedulerConfig(s, monitor=monitor)


def parse_optimizers(conf: object) -> tuple[torch.optim.Optimizer | None, list[SchedulerConfig]]:
    """Lightning's configure_optimizers return forms -> (the one optimizer or None, its scheduler configs)."""
    several = (
        "configure_optimizers returned {n} optimizers: several optimizers means Lightning's manual "
        "optimization (self.automatic_optimization = False), which plainloop does not support. Return one "
        "optimizer (use parameter groups for different learning rates)"
    )
    if conf is None:
        return None, []
    if _is_optimizer(conf):
        return conf, []
    if isinstance(conf, dict):
        if "optimizer" not in conf:
            raise ModelProtocolError(
                f"configure_optimizers returned a dict with keys {sorted(conf)} and no 'optimizer'; return "
                f'{{"optimizer": opt, "lr_scheduler": sched}}'
            )
        unknown = sorted(set(conf) - {"optimizer", "lr_scheduler", "monitor"})
        if unknown:
            raise ModelProtocolError(
                f"configure_optimizers: unknown key(s) {unknown}; Lightning's are optimizer, lr_scheduler, monitor"
            )
        scheds = conf.get("lr_scheduler")
        scheds = [] if scheds is None else scheds if isinstance(scheds, list | tuple) else [scheds]
        return parse_optimizers(conf["optimizer"])[0], [_scheduler_config(s, conf.get("monitor")) for s in scheds]
    if isinstance(conf, list | tuple):
        if len(conf) == 2 and isinstance(conf[0], list | tuple) and all(_is_optimizer(o) for o in conf[0]):
            opts, scheds = list(conf[0]), conf[1]
            scheds = list(scheds) if isinstance(scheds, list | tuple) else [scheds]
            if len(opts) != 1:
                raise ModelProtocolError(several.format(n=len(opts)))
            return opts[0], [_scheduler_config(s, None) for s in scheds]
        if conf and all(isinstance(d, dict) for d in conf):
            if len(conf) != 1:
                raise ModelProtocolError(several.format(n=len(conf)))
            return parse_optimizers(conf[0])
        if conf and all(_is_optimizer(o) for o in conf):
            if len(conf) != 1:
                raise ModelProtocolError(several.format(n=len(conf)))
            return conf[0], []
    raise ModelProtocolError(
        f"configure_optimizers returned {type(conf).__name__} {_short(conf)}, which is none of Lightning's forms: "
        f"an optimizer, [optimizers], ([optimizers], [schedulers]), or "
        f'{{"optimizer": opt, "lr_scheduler": sched or {{"scheduler": sched, "interval": "step"}}}}'
    )


def _short(x: object) -> str:
    r = repr(x)
    return r if len(r) < 120 else r[:117] + "..."


def run_values(cfg: TrainConfig, device: torch.device, lr: float) -> dict[str, object]:
    """What a nanoGPT-style `configure_optimizers(weight_decay, learning_rate, betas, device_type)` is given."""
    return {"weight_decay": cfg.weight_decay, "learning_rate": lr, "lr": lr, "betas": tuple(cfg.adam_betas),
            "eps": cfg.adam_eps, "device_type": device.type, "device": device}  # fmt: skip


# knobs that shape plainloop's own optimizer or schedule -> the configure_optimizers parameters that carry them
_FILLED = {"lr": ("learning_rate", "lr"), "weight_decay": ("weight_decay",), "adam_betas": ("betas",),
           "adam_eps": ("eps",)}  # fmt: skip
_SCHEDULE_ONLY = ("warmup_steps", "lr_decay_steps", "min_lr_ratio", "ref_batch_size", "lr_scaling", "fused")


def unused_optimizer_knobs(cfg: TrainConfig, given: Mapping[str, object]) -> list[str]:
    """'name=value' for each optimizer/schedule knob set away from its default that the model's own
    configure_optimizers does not receive: without a word, a user's warmup_steps would silently do nothing."""
    if not dataclasses.is_dataclass(cfg):
        return []
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    out = []
    for name in (*_FILLED, *_SCHEDULE_ONLY):
        if defaults.get(name, dataclasses.MISSING) is dataclasses.MISSING or any(
            k in given for k in _FILLED.get(name, ())
        ):
            continue
        value = getattr(cfg, name, defaults[name])
        if value != defaults[name] and not (isinstance(value, tuple | list) and tuple(value) == defaults[name]):
            out.append(f"{name}={value!r}")
    return out


def unused_text(unused: list[str]) -> str:
    if not unused:
        return ""
    return (
        f", so {', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing: set {'it' if len(unused) == 1 else 'them'} "
        f"in configure_optimizers (it is given lr, weight_decay, adam_betas, adam_eps as parameters named "
        f"learning_rate, weight_decay, betas, eps)"
    )


def call_configure_optimizers(model: nn.Module, values: Mapping[str, object]) -> tuple[object, dict[str, object]]:
    """Call configure_optimizers, giving its required parameters the run's values by name."""
    fn: ModelMethod = getattr(model, "configure_optimizers")  # noqa: B009 (a Module attribute to mypy)
    try:
        params = dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = {}
    given: dict[str, object] = {}
    missing: list[str] = []
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        if name in values:
            given[name] = values[name]
        else:
            missing.append(name)
    if missing:
        raise ModelProtocolError(
            f"{type(model).__name__}.configure_optimizers needs {missing}, which plainloop cannot fill: it gives "
            f"parameters named {sorted(k for k in values if k != 'device')} the run's values. Give the others "
            f"defaults, or build the optimizer yourself"
        )
    return fn(**given), given


def describe_optimizer(optimizer: torch.optim.Optimizer) -> str:
    g = optimizer.param_groups[0]
    keys = [k for k in ("lr", "weight_decay", "betas", "momentum", "eps") if k in g]
    vals = []
    for k in keys:
        v = g[k]
        v = v.tolist() if isinstance(v, torch.Tensor) else v  # note: sync point (start-up, once)
        vals.append(f"{k}={tuple(v) if isinstance(v, list) else v:g}" if isinstance(v, float) else f"{k}={v}")
    more = f", {len(optimizer.param_groups)} groups" if len(optimizer.param_groups) > 1 else ""
    return f"{type(optimizer).__name__}({', '.join(vals)}{more})"


class ModelStepSchedule:
    """The `Schedule` the optimizer step drives, for a model's step-interval schedulers (torch LR schedulers).

    With no step-interval scheduler it does nothing, and `current_lr` reads the optimizer's param groups (an
    epoch-interval or plateau scheduler is stepped by `ModelHooks`). A skipped step (non-finite gradients)
    known on the host does not advance it; where only the device knows (fp16, or a fused optimizer on a GPU)
    it advances, as under Lightning, so that no step waits for the device.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, configs: list[SchedulerConfig], stepper: Stepper) -> None:
        self.optimizer, self.stepper = optimizer, stepper
        self.configs = [c for c in configs if c.interval == "step" and not c.plateau]
        self.steps = 0  # optimizer steps taken
        # Lightning's `frequency` for a step interval counts the batches of the epoch (batch_idx + 1 of the batch
        # that closed the accumulation window), not optimizer steps: the adapter tells which batch that was
        self.batch_index: Callable[[], int] | None = None

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        self.steps += 1
        n = self.batch_index() + 1 if self.batch_index is not None else self.steps
        for c in self.configs:
            if n % c.frequency == 0:
                self.stepper(c.scheduler, None)

    def current_lr(self) -> float:
        return group_lr(self.optimizer)

    def state_dict(self) -> dict[str, object]:
        return {"steps": self.steps, "schedulers": [c.scheduler.state_dict() for c in self.configs]}

    def load_state_dict(self, state: StateDict) -> None:
        self.steps = int(state.get("steps", 0))
        for c, s in zip(self.configs, state.get("schedulers", [])):
            c.scheduler.load_state_dict(s)


class OptimizerChoice:
    """What configure_optimizers decided: optimizer, per-step schedule, the scheduler configs, notes, hparams."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: ModelStepSchedule, configs: list[SchedulerConfig],
                 notes: list[str], hparams: dict[str, object]) -> None:  # fmt: skip
        self.optimizer, self.schedule, self.configs, self.notes, self.hparams = (
            optimizer, schedule, configs, notes, hparams
        )  # fmt: skip


def model_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device, lr: float) -> OptimizerChoice | None:
    """The model's own optimizer and schedule, or None when it has no configure_optimizers."""
    if _own(model, "configure_optimizers") is None:
        return None
    if getattr(model, "automatic_optimization", True) is False:
        raise ModelProtocolError(
            f"{type(model).__name__}.automatic_optimization is False: Lightning's manual optimization "
            f"(self.optimizers(), self.manual_backward) is not supported by plainloop; remove that line so the "
            f"loop does backward, clipping and the optimizer step"
        )
    conf, given = call_configure_optimizers(model, run_values(cfg, device, lr))
    optimizer, configs = parse_optimizers(conf)
    if optimizer is None:  # Lightning warns and runs without an optimizer step: nothing would learn
        raise ModelProtocolError(
            f"{type(model).__name__}.configure_optimizers returned None: Lightning would train without an "
            f"optimizer (the weights never change); plainloop does not. Return an optimizer, or remove "
            f"configure_optimizers to use plainloop's AdamW"
        )
    names = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in names]
    notes = []
    if trainable:
        notes.append(
            f"optimizer: {len(trainable)} trainable parameter(s) are not in the model's optimizer and will not "
            f"be updated (e.g. {trainable[:3]})"
        )
    filled = f" (given {', '.join(f'{k}={v}' for k, v in given.items())})" if given else ""
    sched = "; ".join(c.describe() for c in configs) or "none (constant lr)"
    notes.insert(
        0,
        f"optimizer: the model's own {describe_optimizer(optimizer)} from {type(model).__name__}."
        f"configure_optimizers(){filled}; schedule: {sched}; plainloop's warm-up/cosine and lr scaling are off"
        + unused_text(unused_optimizer_knobs(cfg, given)),
    )
    for c in configs:
        if c.plateau and c.interval == "step":
            notes.append(f"schedule: {c.describe()}: interval 'step' for a plateau scheduler is stepped per validation")
    source, schedulers = f"{type(model).__name__}.configure_optimizers", [c.hparams() for c in configs]
    hparams: dict[str, object] = {"source": source, **optimizer_hparams(optimizer), "schedulers": schedulers}
    schedule = ModelStepSchedule(optimizer, configs, scheduler_stepper(model))
    return OptimizerChoice(optimizer, schedule, configs, notes, hparams)


def scheduler_stepper(model: nn.Module) -> Stepper:
    """How a scheduler is stepped: the model's own lr_scheduler_step(scheduler, metric) when it overrides it (as
    Lightning asks for schedulers of another library), else scheduler.step() or .step(metric)."""
    own = _own(model, "lr_scheduler_step")
    if own is not None:
        return own  # called (scheduler, metric), as Lightning calls it
    return lambda scheduler, metric: scheduler.step() if metric is None else scheduler.step(metric)


# ------------------------------------------------------------------ self.log
class LogStore:
    """`self.log` values of one phase, kept on the device: sums and weights per name, read back in one go."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor | float] = {}
        self.weights: dict[str, float] = {}

    def add(self, name: str, value: object, weight: float) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.numel() != 1:
                raise ModelProtocolError(
                    f"self.log({name!r}, ...): a tensor of shape {tuple(value.shape)}; log a scalar (e.g. .mean())"
                )
            value = value.reshape(()).float()
        elif not isinstance(value, int | float):
            raise ModelProtocolError(
                f"self.log({name!r}, {type(value).__name__}): plainloop logs numbers and scalar tensors (a "
                f"torchmetrics Metric: log metric.compute() in on_validation_epoch_end)"
            )
        prev = self.sums.get(name)
        self.sums[name] = value * weight if prev is None else prev + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def __bool__(self) -> bool:
        return bool(self.sums)

    def read(self) -> dict[str, float]:
        """The weighted means; clears the store. One host read for all tensor values."""
        names = list(self.sums)
        if not names:
            return {}
        tens = {n: v for n, v in self.sums.items() if isinstance(v, torch.Tensor)}
        out = {n: float(v) / self.weights[n] for n, v in self.sums.items() if n not in tens}
        if tens:
            # note: sync point (log points, validation, epoch end): every logged tensor in one read
            device = next(iter(tens.values())).device
            vals = torch.stack([v.to(device) for v in tens.values()]).tolist()
            out.update({n: v / self.weights[n] for n, v in zip(tens, vals)})
        self.sums, self.weights = {}, {}
        return {n: out[n] for n in names}


class ModelLogger:
    """Stands in for LightningModule.log / log_dict: routes values to the store of the phase running."""

    def __init__(self) -> None:
        self.phase = "train"
        self.stores = {"train": LogStore(), "train_epoch": LogStore(), "val": LogStore(), "test": LogStore()}
        self.last: dict[str, float] = {}  # everything read back so far (self.trainer.callback_metrics)
        self.train_names: tuple[str, ...] = ()  # what training_step logs (shown on the epoch lines)
        self.batch_size = 1

    def log(self, name: str, value: object, prog_bar: bool = False, logger: object = None,
            on_step: bool | None = None, on_epoch: bool | None = None, reduce_fx: object = "mean",
            enable_graph: bool = False, sync_dist: bool = False, sync_dist_group: object = None,
            add_dataloader_idx: bool = True,
            batch_size: int | None = None, metric_attribute: str | None = None,
            rank_zero_only: bool = False) -> None:  # fmt: skip
        if reduce_fx not in ("mean", torch.mean):
            raise UnsupportedLightningFeature(
                f"self.log({name!r}, reduce_fx={reduce_fx!r}): plainloop averages logged values (reduce_fx='mean')"
            )
        w = float(batch_size if batch_size is not None else self.batch_size)
        if self.phase == "train":
            if name not in self.train_names:
                self.train_names += (name,)
            self.stores["train"].add(name, value, w)
            if on_epoch:
                self.stores["train_epoch"].add(name, value, w)
        else:
            self.stores[self.phase].add(name, value, w)

    def log_dict(self, dictionary: Mapping[str, object], **kw: Any) -> None:  # kw: log's keywords
        for k, v in dictionary.items():
            self.log(k, v, **kw)

    def read(self, store: str) -> dict[str, float]:
        vals = self.stores[store].read()
        self.last.update(vals)
        return vals


# ------------------------------------------------------------------ the trainer stand-in
class TrainerShim:
    """What `self.trainer` answers inside the model (Lightning's LightningModule properties read it).

    Provided: current_epoch, global_step, global_rank, local_rank, world_size, is_global_zero, max_epochs,
    max_steps, num_training_batches, estimated_stepping_batches, optimizers, lr_scheduler_configs,
    callback_metrics, logged_metrics, logger (None), loggers ([]), training, sanity_checking, accumulate_grad_batches,
    precision, device, plainloop (the plainloop Trainer). Anything else: UnsupportedLightningFeature.
    """

    _PROVIDED = (
        "current_epoch", "global_step", "global_rank", "local_rank", "world_size", "is_global_zero", "max_epochs",
        "max_steps", "num_training_batches", "estimated_stepping_batches", "optimizers", "lr_scheduler_configs",
        "callback_metrics", "logged_metrics", "logger", "loggers", "training", "validating", "testing",
        "sanity_checking", "accumulate_grad_batches", "precision", "device", "plainloop", "num_devices",
        "progress_bar_callback", "should_stop",
    )  # fmt: skip

    def __init__(self) -> None:
        self.plainloop: TrainerView | None = None  # the plainloop Trainer, once the fit started
        self.current_epoch = 0
        self.global_rank = self.local_rank = 0
        self.world_size = self.num_devices = 1
        self.max_epochs: int | None = None
        self.max_steps = -1
        self.num_training_batches: int | float = 0  # inf for a stream without a len(), as under Lightning
        self.estimated_stepping_batches: int | float = 0
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}
        self.logger = self.progress_bar_callback = None
        self.loggers: list[object] = []
        self.training, self.validating, self.testing, self.sanity_checking = True, False, False, False
        self.accumulate_grad_batches = 1
        self.precision = "32"
        self.device = torch.device("cpu")

    @property
    def global_step(self) -> int:
        t = self.plainloop
        return int(t.step) if t is not None else 0

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def should_stop(self) -> bool:
        return bool(getattr(self.plainloop, "should_stop", False))

    @should_stop.setter
    def should_stop(self, value: bool) -> None:  # the plainloop Trainer ends training after this step, as Lightning
        if self.plainloop is not None:
            self.plainloop.should_stop = bool(value)

    def __bool__(self) -> bool:
        return True

    def __getattr__(self, name: str) -> NoReturn:  # only called for what is not provided
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnsupportedLightningFeature(
            f"self.trainer.{name} is a Lightning Trainer attribute plainloop does not provide; it provides "
            f"{', '.join(self._PROVIDED)} (trainer/compat/lightning.py). Read what you need from those, or from "
            f"self.trainer.plainloop (the plainloop Trainer: cfg, step, epoch, run_dir)"
        )


# ------------------------------------------------------------------ loss and evaluation
def _loss_of(out: object, where: str) -> torch.Tensor:
    """The loss in a training_step / forward output: a tensor, a dict with "loss", or (logits, loss)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        if "loss" in out:
            return out["loss"]
        raise ModelProtocolError(f"{where} returned a dict with keys {sorted(out)} and no 'loss'")
    if out is None:
        raise ModelProtocolError(
            f"{where} returned None: skipping a batch that way (Lightning's automatic optimization) is not "
            f"supported by plainloop; return the loss, or leave such samples out of the dataset"
        )
    raise ModelProtocolError(f"{where} returned {type(out).__name__}; return the loss tensor or a dict with 'loss'")


_MISSING = object()
# model -> the adapter attached to it: a fit that failed (no on_fit_end) is undone by the next attach
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, ModelAdapter] = weakref.WeakKeyDictionary()


class ModelAdapter:
    """A Lightning-style module made into plainloop's pieces: loss_fn, evaluate, optimizer_setup, hooks.

    The model object is unchanged except, while a fit runs, for what Lightning's own Trainer provides to it:
    `_trainer` (a `TrainerShim`, read by `self.trainer`, `self.current_epoch`, `self.global_step`) on the model
    and its LightningModule children; `log`, `log_dict`, `optimizers`, `lr_schedulers` as instance attributes
    over the class's methods; `current_epoch` and `global_step` on a plain module shaped like a LightningModule;
    `forward` when DDP or torch.compile wrap the model (their forward must lead to training_step). `detach()`
    puts back what was there before. A nanoGPT-style module (configure_optimizers only) is not touched.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.logger = ModelLogger()
        self.shim = TrainerShim()
        self.batch_idx = 0
        self.last_output: object = None  # the last training_step output, for on_train_batch_end
        self.choice: OptimizerChoice | None = None
        self.epoch_logs: dict[str, float] = {}  # what the model logged with on_epoch=True in the last epoch
        self.training_step = _own(model, "training_step")
        self.validation_step = _own(model, "validation_step")
        self.test_step = _own(model, "test_step")
        self._step_takes_idx = self._takes_idx(self.training_step)
        # what Lightning's Trainer gives a model is given to a LightningModule or a module with a training_step
        self.patches = hasattr(type(model), "trainer") or self.training_step is not None
        self._routed = False
        self.attached = False
        self._saved: list[tuple[dict[str, object], str, object]] = []  # (a module's __dict__, key, value before)
        self._hooks: dict[str, ModelMethod | None] = {}

    @staticmethod
    def _takes_idx(fn: ModelMethod | None) -> bool:
        if fn is None:
            return False
        try:
            ps = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return True
        return any(p.kind == p.VAR_POSITIONAL for p in ps) or len(ps) >= 2 or any(p.name == "batch_idx" for p in ps)

    # ---- attach to / detach from the model
    def attach(self) -> None:
        """Let the model's self.log, self.trainer, self.current_epoch ... answer from plainloop."""
        if self.attached or not self.patches:
            return
        left = _ATTACHED.get(self.model)
        if left is not None and left is not self:
            left.detach()  # a fit that failed left its attributes: the model as it was first
        for m in self.model.modules():  # nested LightningModules read their own _trainer
            if "_trainer" in m.__dict__ or hasattr(type(m), "trainer"):
                self._put(m, "_trainer", self.shim)
        self._put(self.model, "log", self.logger.log)
        self._put(self.model, "log_dict", self.logger.log_dict)
        self._put(self.model, "optimizers", self._optimizers)
        self._put(self.model, "lr_schedulers", self._lr_schedulers)
        if not hasattr(type(self.model), "current_epoch"):  # a plain module shaped like a LightningModule
            self._put(self.model, "current_epoch", 0)
            self._put(self.model, "global_step", 0)
        _ATTACHED[self.model] = self
        self.attached = True

    def _put(self, module: nn.Module, key: str, value: object) -> None:
        d = module.__dict__
        self._saved.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    def detach(self) -> None:
        """Give the model back as it was (a saved or pickled model carries nothing of plainloop)."""
        for d, key, before in reversed(self._saved):
            if before is _MISSING:
                d.pop(key, None)
            else:
                d[key] = before
        self._saved = []
        self._routed = False
        self.attached = False
        if _ATTACHED.get(self.model) is self:
            del _ATTACHED[self.model]

    def _optimizers(self, use_pl_optimizer: bool = True) -> torch.optim.Optimizer:
        if self.choice is None:
            raise UnsupportedLightningFeature("self.optimizers(): the model's configure_optimizers gave no optimizer")
        return self.choice.optimizer

    def _lr_schedulers(self) -> ModelScheduler | list[ModelScheduler] | None:
        scheds = [c.scheduler for c in (self.choice.configs if self.choice else [])]
        return None if not scheds else scheds[0] if len(scheds) == 1 else scheds

    def set_position(self, epoch: int | None = None) -> None:
        if epoch is not None:
            self.shim.current_epoch = epoch
        if self.attached and not hasattr(type(self.model), "current_epoch"):  # plain module: plain attributes
            self.model.__dict__["current_epoch"] = self.shim.current_epoch
            self.model.__dict__["global_step"] = self.shim.global_step

    # ---- the loss
    def _route(self, *args: object, **kwargs: object) -> object:
        """The model's forward, or training_step when a wrapper (DDP, torch.compile) was called for one."""
        idx = kwargs.pop(_SENTINEL, None)
        if idx is None:
            return type(self.model).forward(self.model, *args, **kwargs)
        return self._train_step(args[0], idx)

    def _train_step(self, batch: object, idx: object) -> object:
        step = self.training_step
        if step is None:
            raise ModelProtocolError(f"{type(self.model).__name__} has no training_step")
        return step(batch, idx) if self._step_takes_idx else step(batch)

    def loss_fn(self, model: nn.Module, batch: object) -> torch.Tensor:
        """training_step(batch, batch_idx) as the loss; through the wrapper when DDP or compile wrap the model."""
        if model is self.model:
            out = self._train_step(batch, self.batch_idx)
        else:
            if not self._routed:  # DDP must see the call to sync gradients: its forward leads to training_step
                self._put(self.model, "forward", self._route)
                self._routed = True
            out = model(batch, **{_SENTINEL: self.batch_idx})
        self.last_output = out
        return _loss_of(out, f"{type(self.model).__name__}.training_step")

    def outputs(self) -> object:
        """on_train_batch_end's `outputs`, as Lightning gives them: {"loss": detached loss, **extras}."""
        out = self.last_output
        if isinstance(out, torch.Tensor):
            return {"loss": out.detach()}
        if isinstance(out, dict):
            return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        return out

    # ---- evaluation
    def evaluate(self, model: nn.Module, split: str, batches: Iterator[tuple[int, object]]) -> dict[str, float]:
        """validation_step / test_step over `batches` (index, batch), scored by what they self.log (else by the
        mean of the loss they return, as `<split>_loss`); {} when the model has no such step."""
        step = self.validation_step if split == "val" else self.test_step
        if step is None:
            return {}
        store = "val" if split == "val" else "test"
        stage = "validation" if split == "val" else "test"  # Lightning's hook names: on_validation_start ...
        batch_start, batch_end = f"on_{stage}_batch_start", f"on_{stage}_batch_end"
        self.logger.phase = store
        self.shim.training, self.shim.validating, self.shim.testing = False, split == "val", split == "test"
        returned = LogStore()
        try:
            self.call(f"on_{stage}_start")
            self.call(f"on_{stage}_epoch_start")
            takes_idx = self._takes_idx(step)
            for i, batch in batches:
                n = _batch_size(batch)
                self.logger.batch_size = n
                self.call(batch_start, batch, i)
                out = step(batch, i) if takes_idx else step(batch)
                self.call(batch_end, out, batch, i)
                loss = out.get("loss") if isinstance(out, dict) else out
                if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                    returned.add(f"{split}_loss", loss, n)
            self.call(f"on_{stage}_epoch_end")
            self.call(f"on_{stage}_end")
        finally:
            self.logger.phase = "train"
            self.shim.training, self.shim.validating, self.shim.testing = True, False, False
        metrics = self.logger.read(store)
        if not metrics:  # nothing logged: the mean returned loss, as plainloop's default validation reports
            metrics = returned.read()
        self.shim.callback_metrics.update(metrics)
        return metrics

    # ---- the optimizer (the task's optimizer_fn)
    def optimizer_setup(self, model: nn.Module, cfg: TrainConfig, device: torch.device, lr: float) -> OptimizerSetup:
        """configure_optimizers' optimizer and schedulers, as they are: step-interval ones stepped per optimizer
        step (the setup's schedule), epoch-interval and plateau ones by a callback that keeps their state."""
        choice = model_optimizer(model, cfg, device, lr)
        if choice is None:  # only given as optimizer_fn when the model defines configure_optimizers
            raise ModelProtocolError(f"{type(model).__name__} has no configure_optimizers")
        self.choice = choice
        choice.schedule.batch_index = lambda: self.batch_idx  # Lightning's step frequency counts epoch batches
        epochs = EpochSchedulers(choice.optimizer, choice.configs, choice.schedule.stepper)
        epochs.epoch_values = lambda: self.epoch_logs
        return OptimizerSetup(choice.optimizer, choice.schedule, [epochs] if epochs.configs else [], choice.notes,
                              choice.hparams)  # fmt: skip

    # ---- hooks
    def hook(self, name: str) -> ModelMethod | None:
        """The model's own hook `name` (looked up once)."""
        if name not in self._hooks:
            self._hooks[name] = _own(self.model, name)
        return self._hooks[name]

    def call(self, name: str, *args: object) -> object:
        fn = self.hook(name)
        return fn(*args) if fn is not None else None


def _batch_size(batch: object) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, list | tuple) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 1


class EpochSchedulers:
    """The model's epoch-interval and plateau schedulers, stepped where Lightning steps them: after each epoch
    (every `frequency` epochs), a plateau one after each validation with its `monitor` metric (or at the epoch's
    end with a value the model logged with on_epoch=True). Their state rides in every checkpoint."""

    all_ranks = True
    state_key = "model_schedulers"

    def __init__(self, optimizer: torch.optim.Optimizer, configs: list[SchedulerConfig], stepper: Stepper) -> None:
        self.optimizer, self.stepper = optimizer, stepper
        self.configs = [c for c in configs if c.interval == "epoch" or c.plateau]
        self.epochs_done = 0  # epochs finished (epoch-interval frequency counts them)
        self.plateau_steps = 0
        self.lr_history: list[float] = []  # lr after each epoch's scheduler step
        self.epoch_values: Callable[[], dict[str, float]] | None = None  # the model's on_epoch logs (ModelHooks)
        self._warned = False

    def on_train_epoch_end(self, trainer: TrainerView, epoch: int) -> None:
        vals = self.epoch_values() if self.epoch_values is not None else {}
        self.epochs_done = epoch + 1
        for c in self.configs:
            if self.epochs_done % c.frequency:
                continue
            if not c.plateau:
                self.stepper(c.scheduler, None)
            elif c.monitor in vals:
                self.stepper(c.scheduler, vals[c.monitor])
                self.plateau_steps += 1
        self.lr_history.append(_lr(self.optimizer))

    def on_validation_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        missing = []
        for c in self.configs:
            if c.plateau and c.monitor in metrics:
                self.stepper(c.scheduler, metrics[c.monitor])
                self.plateau_steps += 1
            elif c.plateau and metrics:
                missing.append(c.monitor)
        if missing and not self._warned:
            self._warned = True
            trainer.log(
                f"[plainloop] schedule: the model's plateau scheduler watches {missing[0]!r}, which the validation "
                f"did not report (it reported {sorted(metrics)}); the scheduler does not step"
            )

    def state_dict(self) -> dict[str, object]:
        return {"epochs_done": self.epochs_done, "plateau_steps": self.plateau_steps,
                "schedulers": [c.scheduler.state_dict() for c in self.configs]}  # fmt: skip

    def load_state_dict(self, state: StateDict) -> None:
        self.epochs_done = int(state.get("epochs_done", 0))
        self.plateau_steps = int(state.get("plateau_steps", 0))
        for c, st in zip(self.configs, state.get("schedulers", [])):
            c.scheduler.load_state_dict(st)


class ModelHooks:
    """The one callback that calls the model's own hooks at Lightning's points, on every rank, and hands the
    model's `self.log` values to the metrics rows (`train_logs`, read at log points)."""

    all_ranks = True

    def __init__(self, adapter: ModelAdapter) -> None:
        self.a = adapter

    # -- fit
    def on_fit_start(self, trainer: TrainerView) -> None:
        a, s = self.a, self.a.shim
        a.attach()
        s.plainloop = trainer
        cfg = trainer.cfg
        s.max_steps = cfg.max_steps if cfg.max_steps is not None else -1
        # a stream without a len(): Lightning's inf batches per epoch (and steps, without max_steps)
        s.num_training_batches = n if (n := trainer.batches_per_epoch) < UNKNOWN_LENGTH else float("inf")
        s.estimated_stepping_batches = n if (n := trainer.total_steps) < UNKNOWN_LENGTH else float("inf")
        s.max_epochs = n if (n := trainer.max_epochs) < UNKNOWN_LENGTH else -1
        s.accumulate_grad_batches = cfg.accumulate_grad_batches
        rt = trainer.rt
        s.global_rank, s.local_rank, s.world_size = rt.rank, rt.local_rank, rt.world_size
        s.num_devices = rt.world_size
        s.precision = rt.precision
        s.device = rt.device
        if a.choice is not None:
            s.optimizers = [a.choice.optimizer]
            s.lr_scheduler_configs = list(a.choice.configs)
        s.current_epoch = trainer.epoch
        a.set_position()
        a.call("on_fit_start")

    def on_train_start(self, trainer: TrainerView) -> None:
        self.a.call("on_train_start")

    def on_train_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        self.a.set_position(epoch)
        self.a.call("on_train_epoch_start")

    def on_train_batch_start(self, trainer: TrainerView, batch: object, batch_idx: int) -> None:
        a = self.a
        a.batch_idx = batch_idx
        a.logger.batch_size = _batch_size(batch)
        a.set_position()
        if a.call("on_train_batch_start", batch, batch_idx) == -1:
            raise UnsupportedLightningFeature(
                "on_train_batch_start returned -1 (Lightning: skip the rest of the epoch); plainloop does not "
                "support ending an epoch early from the model"
            )

    def on_before_optimizer_step(self, trainer: TrainerView, optimizer: torch.optim.Optimizer) -> None:
        self.a.call("on_before_optimizer_step", optimizer)

    def on_train_batch_end(self, trainer: TrainerView, outputs: torch.Tensor, batch: object, batch_idx: int) -> None:
        a = self.a
        a.set_position()
        if a.hook("on_train_batch_end") is not None:
            a.call("on_train_batch_end", a.outputs(), batch, batch_idx)

    def on_train_epoch_end(self, trainer: TrainerView, epoch: int) -> None:
        self.a.call("on_train_epoch_end")
        vals = self.a.logger.read("train_epoch")  # note: sync point (epoch end)
        self.a.epoch_logs = vals
        if vals:
            trainer.log_row({"kind": "train_epoch", "step": trainer.step, "epoch": epoch + 1, **vals})

    def train_logs(self) -> dict[str, float]:
        """The model's `self.log` values in training since the last log point, averaged (a log point's read)."""
        return self.a.logger.read("train") if self.a.logger.stores["train"] else {}

    def on_train_end(self, trainer: TrainerView) -> None:
        self.a.call("on_train_end")

    def on_fit_end(self, trainer: TrainerView, summary: dict[str, object] | None = None) -> None:
        self.a.call("on_fit_end")
        self.a.call("teardown", "fit")
        self.a.detach()

    # -- checkpoints
    def on_save_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, object]) -> None:
        self.a.call("on_save_checkpoint", checkpoint)

    def on_load_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, object]) -> None:
        self.a.shim.current_epoch = trainer.epoch
        self.a.call("on_load_checkpoint", checkpoint)


def _lr(optimizer: torch.optim.Optimizer) -> float:
    lr = optimizer.param_groups[0]["lr"]
    return float(lr)  # note: sync point when a device tensor (epoch end only)


# ------------------------------------------------------------------ a hand-written loop's optimizer, as it is
_LR_KNOBS = ("lr", "warmup_steps", "lr_decay_steps", "min_lr_ratio", "ref_batch_size", "lr_scaling")  # lr_fn's


def given_pieces(task: Task) -> bool:
    """The task names a hand-written loop's optimizer, scheduler or lr function (Task(optimizer=...))."""
    return task.optimizer is not None or task.scheduler is not None or task.lr_fn is not None


def check_given(task: Task) -> None:
    """Task(optimizer=, scheduler=, scheduler_interval=, lr_fn=) that cannot run as given: one line saying why."""
    if why := _given_problem(task):
        raise ValueError(f"Task {task.name!r}: {why}")


def _given_problem(task: Task) -> str | None:
    opt, sched = task.optimizer, task.scheduler
    if task.optimizer_fn is not None:
        return "give optimizer_fn or optimizer=/scheduler=/lr_fn=, not both"
    if task.scheduler_interval not in ("epoch", "step"):
        return (
            f"scheduler_interval={task.scheduler_interval!r}; give 'epoch' (scheduler.step() after each epoch, as "
            f"pytorch/examples' mnist) or 'step' (after each optimizer step)"
        )
    if sched is not None and opt is None:
        return "scheduler= without optimizer=: give the optimizer it steps too, Task(optimizer=opt, scheduler=sched)"
    if sched is not None and task.lr_fn is not None:
        return "scheduler= and lr_fn= both set the lr; keep one"
    if task.lr_fn is not None and not callable(task.lr_fn):
        return f"lr_fn={task.lr_fn!r:.60} is not callable; give a function of the step number returning the lr"
    if opt is None:
        return None
    if not _is_optimizer(opt):
        return f"optimizer= is a {type(opt).__name__}; give a torch optimizer, e.g. SGD(model.parameters(), lr=0.1)"
    if task.lr is not None:
        return f"lr={task.lr} and optimizer= both: the optimizer's own lr runs; drop lr"
    own = getattr(sched.get("scheduler") if isinstance(sched, dict) else sched, "optimizer", opt)
    if own is not opt:
        return (
            f"the scheduler steps another optimizer (a {type(own).__name__} at {id(own):#x}, not the one given at "
            f"{id(opt):#x}); build the scheduler on the optimizer you give, e.g. StepLR(optimizer, step_size=1)"
        )
    mine = {id(p) for p in task.model.parameters()}
    if any(id(p) not in mine for g in opt.param_groups for p in g["params"]):
        return (
            f"the optimizer holds parameters that are not {type(task.model).__name__}'s (built on another copy of the "
            f"model?); build it over this model's: torch.optim.X(model.parameters(), ...)"
        )
    return None


class GivenStepSchedule(ModelStepSchedule):
    """A Task's own per-step scheduler: as a model's, except that a step the fp16 scaler (or a fused optimizer's
    guard) skipped does not advance it, as plainloop's own schedule."""

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        if not skipped_on_device(found_inf):
            super().step()


class GivenOptimizer:
    """The task's optimizer_fn for Task(optimizer=, scheduler=, lr_fn=): the user's objects as they are, through
    configure_optimizers' path (parse_optimizers, the step schedule, EpochSchedulers); lr_fn then sets the lr of the
    given optimizer, the model's configure_optimizers' (`model_fn`), or plainloop's AdamW before each step."""

    def __init__(self, task: Task, model_fn: OptimizerFn | None, adapter: ModelAdapter | None) -> None:
        self.task, self.model_fn, self.adapter = task, model_fn, adapter

    def __call__(self, model: nn.Module, cfg: TrainConfig, device: torch.device, lr: float) -> OptimizerSetup:
        t, source = self.task, "Task(optimizer=...)"
        knobs = [k for k in unused_optimizer_knobs(cfg, {}) if t.optimizer is not None or k.split("=")[0] in _LR_KNOBS]
        if knobs:
            what = "optimizer=" if t.optimizer is not None else "lr_fn="
            raise ValueError(
                f"Task {t.name!r}: {what} sets the lr, so {', '.join(knobs)} (plainloop's own optimizer and schedule) "
                f"would do nothing; leave {'it' if len(knobs) == 1 else 'them'} at the default, or drop {what}"
            )
        if t.optimizer is not None:
            one = {"scheduler": t.scheduler, "interval": t.scheduler_interval}
            sched = None if t.scheduler is None else t.scheduler if isinstance(t.scheduler, dict) else one
            # Lightning's dict form; a ReduceLROnPlateau watches the task's monitor metric
            conf = {"optimizer": t.optimizer, "lr_scheduler": sched, "monitor": t.monitor_metric}
            optimizer, configs = parse_optimizers(conf)
            assert optimizer is not None  # check_given: an optimizer
            schedule = GivenStepSchedule(optimizer, configs, scheduler_stepper(model))
            epochs = EpochSchedulers(optimizer, configs, schedule.stepper)
            scheds = "; ".join(c.describe() for c in configs) or "none (the optimizer's lr)"
            notes = [f"optimizer: your {describe_optimizer(optimizer)}, lr as you built it (from {source}); schedule: "
                     f"{scheds}; plainloop's warm-up/cosine and lr scaling are off"]  # fmt: skip
            hparams = {"source": source, **optimizer_hparams(optimizer), "schedulers": [c.hparams() for c in configs]}
            setup = OptimizerSetup(optimizer, schedule, [epochs] if epochs.configs else [], notes, hparams)
            if self.adapter is not None:  # a LightningModule's self.optimizers() / self.lr_schedulers()
                self.adapter.choice = OptimizerChoice(optimizer, schedule, configs, notes, hparams)
        elif self.model_fn is not None:  # lr_fn on top of the model's configure_optimizers
            own = self.model_fn(model, cfg, device, lr)  # the adapter's: never None
            if own is None or own.callbacks or getattr(own.schedule, "configs", None):
                raise ValueError(
                    f"Task {t.name!r}: lr_fn= and {type(model).__name__}.configure_optimizers' lr_scheduler both set "
                    f"the lr; return the optimizer alone, or drop lr_fn="
                )
            setup = own
        else:  # plainloop's AdamW with its weight_decay, betas, eps; a float lr, set by lr_fn
            optimizer = build_adamw(model, lr, cfg.weight_decay, device, False, cfg.adam_betas, cfg.adam_eps, cfg.fused)
            notes = [f"optimizer: plainloop's AdamW, weight_decay {cfg.weight_decay:g} (matrices only), betas "
                     f"{tuple(cfg.adam_betas)}, lr from Task(lr_fn=...)"]  # fmt: skip
            hparams = {"source": "plainloop AdamW + Task(lr_fn=...)", **optimizer_hparams(optimizer)}
            setup = OptimizerSetup(optimizer, ConstantSchedule(optimizer), [], notes, hparams)
        if t.lr_fn is not None:
            setup.schedule = fn = LrFnSchedule(setup.optimizer, t.lr_fn)
            for none in ("schedule: none (constant lr)", "schedule: none (the optimizer's lr)"):  # lr_fn sets it
                setup.notes = [n.replace(none, f"schedule: {fn.name} (Task(lr_fn=...))") for n in setup.notes]
            setup.notes.append(f"schedule: {fn.name}(step) sets the lr of every group before each optimizer step "
                               f"(Task(lr_fn=...)); at step 0: {fn.current_lr():.3g}")  # fmt: skip
            setup.hparams["lr_fn"] = fn.name
        return setup


class TaskChanges(TypedDict, total=False):
    """The Task fields the adapter sets (dataclasses.replace's keywords)."""

    callbacks: list[object]
    notes: list[str]
    lr: float
    loss_fn: LossFn
    optimizer_fn: OptimizerFn
    log_metrics_fn: LogMetricsFn
    batch_evaluate_fn: BatchEvaluateFn
    val_set: None
    test_set: None


def prepare(model: nn.Module, notes: list[str]) -> None:
    """What Lightning's fit does with a LightningModule before its first step: refuse a hook plainloop never calls
    (NOT_RUN), then prepare_data(), setup("fit") and configure_model(), in Lightning's order."""
    name = type(model).__name__
    for hook, way_out in NOT_RUN.items():
        if _own(model, hook) is not None:
            raise UnsupportedLightningFeature(
                f"{name}.{hook} is a Lightning hook plainloop's loop does not call: {way_out}"
            )
    if _own(model, "prepare_data") is not None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # Lightning runs it on one process per node, then waits
            raise UnsupportedLightningFeature(
                f"{name}.prepare_data under torchrun: plainloop runs it only in a single process; call "
                f"model.prepare_data() once before launching (or download the data in the dataset's constructor)"
            )
        model.prepare_data()  # type: ignore[operator]
    for hook, args in (("setup", ("fit",)), ("configure_model", ())):
        fn = _own(model, hook)
        if fn is not None:
            fn(*args)
    unused = [f for f in ("train_dataloader", "val_dataloader", "test_dataloader") if _own(model, f) is not None]
    if unused:
        notes.append(f"data: {name}.{'/'.join(unused)} not used: plainloop reads the Task's datasets")


def adapt_lightning_task(task: Task) -> Task | None:
    """A Task whose model is Lightning-style, as a plain Task (trainer/layers.TASK_ADAPTERS); None otherwise.

    What the task already sets (loss_fn, evaluate_fn, optimizer_fn ...) wins over the model's methods.
    """
    model = task.model
    given = given_pieces(task) and not isinstance(task.optimizer_fn, GivenOptimizer)  # Task(optimizer=...) not yet used
    if given:
        check_given(task)
    if not is_lightning_style(model) or any(isinstance(c, ModelHooks) for c in task.callbacks):
        # a plain model (its hand-written loop's optimizer, if given, is the optimizer_fn), or a task adapted already
        return dataclasses.replace(task, optimizer_fn=GivenOptimizer(task, None, None)) if given else None
    a = ModelAdapter(model)
    hooks = ModelHooks(a)
    name = type(model).__name__
    notes = list(task.notes)
    if hasattr(type(model), "trainer"):  # a LightningModule: its own fit-time hooks
        prepare(model, notes)
    out: TaskChanges = {"callbacks": [*task.callbacks, hooks], "notes": notes}
    if task.loss_fn is None and a.training_step is not None:
        out["loss_fn"] = a.loss_fn
    own_optimizer = a.optimizer_setup if _own(model, "configure_optimizers") is not None else None
    if given:  # the optimizer given wins over configure_optimizers; lr_fn goes on top of it
        out["optimizer_fn"] = GivenOptimizer(task, None if task.optimizer is not None else own_optimizer, a)
        if task.optimizer is not None and own_optimizer is not None:
            notes.append(f"optimizer: Task(optimizer=...) runs; {name}.configure_optimizers is not called")
    elif task.optimizer_fn is None and own_optimizer is not None:
        out["optimizer_fn"] = own_optimizer
    elif task.optimizer_fn is None and task.lr is None and hasattr(type(model), "trainer"):
        # a LightningModule's learning_rate (Lightning's convention) is the rate of plainloop's AdamW; a plain
        # module's attribute of that name is not read: --lr runs
        lr = getattr(model, "learning_rate", None)
        if isinstance(lr, int | float) and not isinstance(lr, bool) and lr > 0:
            out["lr"] = float(lr)
            notes.append(f"lr: {name}.learning_rate = {lr:g} (a LightningModule's own rate) is the task's lr (Task.lr)")
    if task.log_metrics_fn is None and a.patches:
        out["log_metrics_fn"] = hooks.train_logs
    lightning_eval = a.training_step is not None or a.validation_step is not None or a.test_step is not None
    if task.evaluate_fn is None and task.batch_evaluate_fn is None and lightning_eval:
        # Lightning runs the loops the model has steps for, whatever data it is given
        if a.validation_step is None and task.val_set is not None:
            out["val_set"] = None
            notes.append(
                f"validation: {name} has no validation_step, so the val split is not scored (as under Lightning); "
                f"add a validation_step, or give Task(evaluate_fn=...)"
            )
        if a.test_step is None and task.test_set is not None:
            out["test_set"] = None
            notes.append(f"test: {name} has no test_step, so the test split is not scored (as under Lightning)")
        if a.validation_step is not None or a.test_step is not None:
            out["batch_evaluate_fn"] = a.evaluate
    return dataclasses.replace(task, **out)
