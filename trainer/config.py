"""TrainConfig: every knob of the loop in one dataclass, the one source of flags, config files, checks and docs.

Each field is a `knob(default, help, group, **rule)`: its metadata gives the flag, the config-file key and the
check (the rule keywords: trainer/support/values.py). `check_value` is the only validator: the CLI's argparse
types, config files, a resumed run's config.toml, BaseTrainer's dicts and `TrainConfig.__post_init__` all call it,
so a bad value is the same one line whichever door it came through. Defaults are the optimised setup;
`baseline=True` turns every optimisation off (the unoptimised "before" loop).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .support import (
    INT_LIMIT,
    RULE_KEYS,
    STORAGE_PROBLEMS,
    ConfigError,
    Rule,
    Rules,
    TypeForm,
    check_value,
    describe,
    field_rules,
    knob,
    show_value,
    unknown_keys,
    unwrap,
    writable_dir_problem,
)
from .support import check_settings as _check_settings

__all__ = [  # the validator is the leaf's (trainer/support/values.py), public here too
    "AUTO_VALIDATIONS", "INT_LIMIT", "RULE_KEYS", "ConfigError", "Rule", "Rules", "TrainConfig", "TypeForm",
    "check_output_dirs", "check_settings", "check_value", "default_num_workers", "describe", "field_rules", "knob",
    "run_name_problem", "unknown_keys", "unwrap", "usable_cpus", "validation_every", "writable_dir_problem",
]  # fmt: skip
VALID = "Valid settings are TrainConfig's fields and a task's own (the --flags of train_optimized.py --help-all)"


def check_settings(
    values: Mapping[str, object], rules: Rules, where: str, notes: list[str] | None = None, style: str = "key"
) -> dict[str, Any]:
    """The leaf's check_settings, naming where the valid settings are listed."""
    return _check_settings(values, rules, where, notes, style, VALID)


PRECISIONS = ("auto", "32", "16-mixed", "bf16-mixed")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
STRATEGIES = ("auto", "ddp", "fsdp")
CLIP_ALGORITHMS = ("norm", "value")
LR_SCALING = ("sqrt", "linear", "none")
MP_CONTEXTS = ("spawn", "fork", "forkserver")
AUTO_VALIDATIONS = 100  # validation_interval auto: runs of up to this many epochs validate every epoch
NAME_MAX = 120  # run names: well under NAME_MAX 255, leaving room for "-N" suffixes and temp names


# ------------------------------------------------------------------------------------------- special rules
def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run directory (None: it can): one plain path component, no '.'/'..'."""
    if name in (".", ".."):
        return "not a name: a run directory is named, '.' and '..' would write outside it"
    if "/" in name or "\\" in name or (os.altsep and os.altsep in name):
        return "holds a path separator; give a plain name (--output_dir chooses the folder)"
    if name.startswith("-"):
        return "starts with '-' (it would read as a flag); give a plain name"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"longer than {NAME_MAX} bytes; give a shorter name"
    return None


def _device_problem(device: str) -> str | None:
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return "not a device; use e.g. cpu, cuda, cuda:0 or mps"
    return None


def _loss_scale_problem(scale: str) -> str | None:
    try:
        ok = scale == "dynamic" or 0 < float(scale) < math.inf
    except ValueError:
        ok = False
    return None if ok else "use 'dynamic' or a positive number such as 1024"


def check_output_dirs(pairs: Iterable[tuple[str, str | os.PathLike | None]]) -> None:
    """ConfigError naming the first (label, directory) a run cannot write to."""
    for label, path in pairs:
        if path is None:
            continue
        why = writable_dir_problem(path)
        if why:
            err = next((n for text, n in STORAGE_PROBLEMS.items() if text in why), None)
            raise ConfigError(f"{label} {show_value(os.fspath(path))}: {why}") from (OSError(err, why) if err else None)


RUN, SCHED, OPTIM, PREC, DATA, LOG, SAFE = (
    "run", "schedule", "optimizer", "precision and device", "data loading", "logging, validation and checkpoints",
    "robustness",
)  # fmt: skip


@dataclass
class TrainConfig:
    # run
    seed: int = knob(42, "seeds python, numpy and torch; data order derives from it", RUN, min=0, max=2**32 - 1)
    output_dir: str = knob("runs", "each run writes into OUTPUT_DIR/RUN_NAME", RUN)
    run_name: str | None = knob(
        None,
        "run directory name, a plain name without '/'; an existing one gets a -2, -3 ... suffix "
        "(default: <task>-<timestamp>)",
        RUN,
        check=run_name_problem,
    )
    resume: str | None = knob(
        None,
        "checkpoint file or run directory to continue exactly; 'auto' = the run named "
        "by --run_name if it has a checkpoint, else the newest resumable <task>-<time> run",
        RUN,
    )
    baseline: bool = knob(
        False,
        "the unoptimised 'before' loop, for comparison: fp32, num_workers=0, no pinning, .item() every "
        "step, validation every epoch",
        RUN,
    )
    deterministic: bool = knob(
        False, "torch.use_deterministic_algorithms and seeded loader workers: repeatable runs, often slower", RUN
    )
    # schedule
    epochs: int = knob(10, "epochs to train (ignored when max_steps or max_batches is set)", SCHED, min=1)
    max_steps: int | None = knob(None, "iteration-based run: stop after N optimizer steps", SCHED, min=1)
    max_batches: int | None = knob(
        None,
        "iteration-based run counted in batches, as mmseg's max_iters: with "
        "accumulation k this is max_batches / k optimizer steps",
        SCHED,
        min=1,
    )
    batch_size: int = knob(150, "samples per batch per process", SCHED, min=1)
    accumulate_grad_batches: int = knob(
        1, "micro-batches per optimizer step; effective batch = batch_size x this x world size", SCHED, min=1
    )
    early_stopping_patience: int | None = knob(
        None,
        "stop after N validations (not epochs; see validation_interval) without improvement of the task's monitor metric",
        SCHED,
        min=1,
    )
    # optimizer
    lr: float = knob(1e-3, "learning rate at ref_batch_size (a task's own lr wins: Task.lr)", OPTIM, gt=0)
    ref_batch_size: int | None = knob(None, "batch size lr was tuned for; enables lr_scaling", OPTIM, min=1)
    lr_scaling: str = knob(
        "sqrt",
        "how lr follows the batch size: sqrt (for Adam-type optimizers), linear (for SGD) or none",
        OPTIM,
        choices=LR_SCALING,
    )
    weight_decay: float = knob(0.01, "AdamW weight decay (not on biases and norms)", OPTIM, min=0)
    warmup_steps: int | None = knob(
        None, "optimizer steps of linear warm-up (default: 5%% of the steps, at most 500)", OPTIM, min=0
    )
    min_lr_ratio: float = knob(0.05, "the cosine schedule decays to lr x this", OPTIM, min=0, max=1)
    gradient_clip_val: float | None = knob(None, "clip threshold (default: no clipping)", OPTIM, gt=0)
    gradient_clip_algorithm: str = knob(
        "norm", "clip by total norm or by value; after unscaling", OPTIM, choices=CLIP_ALGORITHMS
    )
    adam_betas: tuple[float, float] = knob(
        (0.9, 0.999), "AdamW betas of the built-in optimizer (nanoGPT: 0.9 0.95)", OPTIM, min=0,
        check=lambda b: None if all(x < 1 for x in b) else "each beta must be below 1; give two numbers in [0, 1)",
    )  # fmt: skip
    adam_eps: float = knob(1e-8, "AdamW eps of the built-in optimizer", OPTIM, gt=0)
    fused: bool | None = knob(None, "fused AdamW kernel of the built-in optimizer (default: auto = on)", OPTIM)
    lr_decay_steps: int | None = knob(
        None,
        "optimizer steps the cosine decay spans, counted from step 0 (nanoGPT's lr_decay_iters); later steps stay "
        "at lr x min_lr_ratio (default: the whole run)",
        OPTIM,
        min=1,
    )
    # precision and device
    precision: str = knob(
        "auto",
        "auto = bf16-mixed where supported, 16-mixed on older GPUs, 32 on a CPU",
        PREC,
        choices=PRECISIONS,
    )
    loss_scale: str = knob(
        "dynamic", "fp16 GradScaler: dynamic or a fixed number such as 1024", PREC, check=_loss_scale_problem
    )
    tf32: bool = knob(True, "TF32 matmul/cudnn on Ampere+ (CUDA only)", PREC)
    cudnn_benchmark: bool = knob(True, "cudnn autotuner for fixed shapes (CUDA only)", PREC)
    compile_model: bool = knob(False, "torch.compile the model (the first steps pay the compile time)", PREC)
    compile_mode: str = knob("default", "torch.compile mode", PREC, choices=COMPILE_MODES)
    num_threads: int | None = knob(
        None, "torch intra-op threads on a CPU (default: torch's, one per core)", PREC, min=1
    )
    device: str | None = knob(
        None, "e.g. cuda:0 or cpu (default: cuda:LOCAL_RANK when available, else cpu)", PREC, check=_device_problem
    )
    channels_last: bool = knob(
        False, "NHWC memory format for 4-D weights and batches (speeds convolutions on tensor-core GPUs)", PREC
    )
    sync_batchnorm: bool = knob(False, "DDP: BatchNorm statistics over all processes (SyncBatchNorm)", PREC)
    strategy: str = knob("auto", "auto/ddp: a replica per process; fsdp: sharded (FSDP2)", PREC, choices=STRATEGIES)
    fsdp_cpu_offload: bool = knob(False, "fsdp: keep the sharded parameters and optimizer state in CPU memory", PREC)
    # data loading
    num_workers: int | None = knob(
        None,
        "loader worker processes (default: CPUs - 1 per rank, at most 8; 0 when the data is held in memory)",
        DATA,
        min=0,
    )
    pin_memory: bool = knob(True, "page-locked host batches make non_blocking copies truly async", DATA)
    persistent_workers: bool = knob(True, "keep loader workers alive across epochs", DATA)
    prefetch_factor: int = knob(2, "batches each worker prepares ahead", DATA, min=1)
    drop_last: bool = knob(True, "drop the last incomplete batch (fixed shapes help cudnn and compile)", DATA)
    multiprocessing_context: str | None = knob(
        None, "worker start method (default: the platform's; spawn on Windows)", DATA, choices=MP_CONTEXTS
    )
    device_cache: bool | None = knob(None, "hold the whole dataset on the device when it fits (default: auto)", DATA)
    shuffle: bool = knob(True, "shuffle the training samples each epoch; off keeps the dataset's order", DATA)
    data_order: str = knob("default", "plain = a plain DataLoader's: the dataset's order, the last incomplete "
                           "batch kept (shuffle, drop_last off); default = as those say", DATA,
                           choices=("default", "plain"))  # fmt: skip
    # logging, validation and checkpoints
    log_every: int = knob(
        100, "LOG_EVERY: optimizer steps between loss read-backs (the steps' only host-device sync)", LOG, min=1
    )
    norm_every: int = knob(
        200, "NORM_EVERY: optimizer steps between gradient-norm (and task step-metric) read-backs", LOG, min=1
    )
    progress_every: int = knob(10, "batches between progress-bar refreshes (and at every epoch end)", LOG, min=1)
    progress_bar: bool = knob(
        True, "show the tqdm progress bar (rank 0) when stderr is a terminal; piped or redirected it stays off", LOG
    )
    validation_interval: int | None = knob(
        None,
        "epochs between validations (Lightning's check_val_every_n_epoch); the last epoch always validates "
        "(default: auto = every epoch while validation is cheap, spaced by its measured cost to about a tenth of the "
        f"wall time, at most about {AUTO_VALIDATIONS} validations; a line says each change)",
        LOG,
        min=1,
    )
    val_check_steps: int | None = knob(None, "optimizer steps between validations, instead of epochs", LOG, min=1)
    val_check_batches: int | None = knob(
        None, "batches between validations, instead of epochs (mmseg's evaluation.interval)", LOG, min=1
    )
    checkpoint_interval: float = knob(
        60.0,
        "seconds of training between last.pt writes, at the next log point or epoch end (also written at the end "
        "and on a stop signal; a kill -9 loses at most this much); 0 = at every epoch end",
        LOG,
        min=0,
    )
    checkpoint_every: int | None = knob(
        None, "optimizer steps between extra last.pt writes, whatever checkpoint_interval says", LOG, min=1
    )
    async_checkpoint: bool | None = knob(
        None,
        "write last.pt and best.pt from a background thread after a copy to host memory, so training waits only "
        "for the copy (default: auto = on a GPU; on a CPU the write would share the cores)",
        LOG,
    )
    save_best: bool = knob(True, "keep best.pt by the task's validation metric", LOG)
    save_top_k: int = knob(
        1,
        "keep the K best checkpoints by the task's validation metric as checkpoints/epoch=E-step=S.pt "
        "(Lightning's ModelCheckpoint(save_top_k)); best.pt is always the best; 1 = best.pt only",
        LOG,
        min=1,
    )
    summary: bool = knob(
        False, "print the model's layers at start: name, type, output shape, parameters (Lightning's ModelSummary)", LOG
    )
    test_with_best: bool = knob(False, "score the test split with best.pt's weights instead of the last ones", LOG)
    limit_val_batches: int | None = knob(
        None, "score at most N batches per validation (Lightning's limit_val_batches as a count)", LOG, min=1
    )
    # robustness
    max_consecutive_skips: int = knob(
        20,
        "stop the run after N consecutive steps skipped for non-finite loss or gradients (checked at log points)",
        SAFE,
        min=1,
    )
    # weight averaging
    ema_decay: float | None = knob(
        None,
        "keep an exponential moving average (EMA) of the weights with this decay, e.g. 0.999, in [0, 1); "
        "validation, best.pt and test use it, raw_<metric> = the trained weights' scores (default: off)",
        "weight averaging",
        min=0,
        check=lambda d: None if d < 1 else "must be below 1; use a number in [0, 1), e.g. 0.999",  # 1 never moves
    )
    ema_every: int = knob(1, "update the EMA every N optimizer steps", "weight averaging", min=1)
    ema_warmup: bool = knob(
        True,
        "ramp the EMA decay up as timm's ModelEmaV3: 1 - (1 + step)^-power, capped at ema_decay",
        "weight averaging",
    )
    ema_warmup_power: float = knob(
        0.75, "EMA warm-up power: 3/4 reaches 0.999 at ~10k steps, 2/3 at ~31.6k (timm)", "weight averaging", gt=0
    )

    def __new__(cls, *args: object, **kwargs: object) -> TrainConfig:
        # a misspelt keyword gets the nearest names, as a flag, a config file or a BaseTrainer dict does
        if unknown := unknown_keys(kwargs, field_rules(cls)):
            raise TypeError(f"{cls.__name__}: unknown setting(s) {'; '.join(unknown)}")
        if kwargs.get("data_order") == "plain" and (kwargs.get("shuffle") or kwargs.get("drop_last")):  # not ignored
            raise ConfigError(f"{cls.__name__}: data_order='plain' turns shuffle and drop_last off: drop shuffle=True/"
                              "drop_last=True or data_order (to shuffle and keep the last batch: drop_last=False alone)")  # fmt: skip
        return super().__new__(cls)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "TrainConfig") -> None:
        """Convert and check every field by its rule (ConfigError, a ValueError, naming the knob, the value and
        what is allowed), then the rules between fields."""
        for name, (tp, rule) in field_rules(type(self)).items():
            setattr(self, name, check_value(f"{where}: {name}=", getattr(self, name), tp, rule))
        if self.data_order == "plain":  # a hand-written loop's DataLoader order (stored so: config.toml rebuilds it)
            self.shuffle = self.drop_last = False
        if self.max_steps is not None and self.max_batches is not None:
            raise ConfigError(f"{where}: give max_steps (optimizer steps) or max_batches (batches), not both")
        if self.val_check_steps is not None and self.val_check_batches is not None:
            raise ConfigError(f"{where}: give val_check_steps or val_check_batches, not both")

    # ---- what the loop runs -------------------------------------------------------------------------------
    def effective(self) -> TrainConfig:
        """The config actually run: baseline switches applied, batch counts turned into optimizer steps."""
        c = self
        if self.baseline:
            c = dataclasses.replace(
                c, precision="32", num_workers=0, pin_memory=False, persistent_workers=False, tf32=False,
                cudnn_benchmark=False, compile_model=False, device_cache=False, validation_interval=1,
                log_every=1, norm_every=1, progress_every=1,  # the "before" loop called loss.item() every step
            )  # fmt: skip
        k = c.accumulate_grad_batches
        if c.max_batches is not None:  # mmseg counts batches; the loop counts optimizer steps
            c = dataclasses.replace(c, max_steps=-(-c.max_batches // k), max_batches=None)
        if c.val_check_batches is not None:
            c = dataclasses.replace(c, val_check_steps=max(1, c.val_check_batches // k), val_check_batches=None)
        return c

    def scale_value(self) -> float | None:
        """The static fp16 loss scale, or None for a dynamic one."""
        return None if self.loss_scale == "dynamic" else float(self.loss_scale)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "TrainConfig", notes: list[str] | None = None) -> TrainConfig:
        """Build from a dict (BaseTrainer's trainer_params, a checkpoint's settings): unknown keys name the nearest
        valid names, every value is converted and checked by its rule; `where` starts each message."""
        return cls(**check_settings(d, field_rules(cls), where, notes))


def validation_every(interval: int | None, max_epochs: int) -> tuple[int, str | None]:
    """The epochs between validations, and the start-up line when the run will not validate every epoch.

    interval None (auto): every epoch, unless the run has more than AUTO_VALIDATIONS epochs (short ones, where
    validating each would cost about as much as training); then every ceil(epochs / AUTO_VALIDATIONS) epochs."""
    auto = interval is None
    every = max(1, math.ceil(max_epochs / AUTO_VALIDATIONS)) if interval is None else interval
    if every == 1 or max_epochs <= 1:
        return every, None
    why = f"auto: about {AUTO_VALIDATIONS} validations in {max_epochs} epochs" if auto else "validation_interval"
    return every, f"validation: every {every} epochs and the last ({why}); --validation_interval 1 validates each"


def default_num_workers(world_size: int = 1) -> int:
    """A sensible worker count: the CPUs this process may use, shared among local ranks, capped at 8."""
    return max(0, min(8, usable_cpus() // max(1, world_size) - 1))  # one core stays with the main process


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Windows, macOS
        return os.cpu_count() or 1
