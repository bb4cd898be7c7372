"""TrainConfig: every knob of the loop in one dataclass, the one source of flags, config files and docs.

Each field carries its help text and argparse group in its metadata; `trainer/options.py` turns the fields
into `--flags` and reads/writes config files from them. Defaults are the optimised setup; `baseline=True`
turns every optimisation off and reproduces the seed guides' "before" run, so the two differ by one flag.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

PRECISIONS = ("auto", "32", "16-mixed", "bf16-mixed")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
CLIP_ALGORITHMS = ("norm", "value")
LR_SCALING = ("sqrt", "linear", "none")
MP_CONTEXTS = ("spawn", "fork", "forkserver")


def knob(default: Any, help: str, group: str, **meta: Any) -> Any:  # noqa: A002 (argparse's word)
    """A dataclass field with its help text and flag group (meta: choices, metavar, min)."""
    return field(default=default, metadata={"help": help, "group": group, **meta})


RUN, SCHED, OPTIM, PREC, DATA, LOG, SAFE = (
    "run", "schedule", "optimizer", "precision and device", "data loading", "logging, validation and checkpoints",
    "robustness",
)  # fmt: skip


@dataclass
class TrainConfig:
    # run
    seed: int = knob(42, "seeds python, numpy and torch; data order derives from it", RUN)
    output_dir: str = knob("runs", "each run writes into OUTPUT_DIR/RUN_NAME", RUN)
    run_name: str | None = knob(
        None,
        "run directory name; an existing one gets a -2, -3 ... suffix (default: <task>-<timestamp>)",
        RUN,
    )
    resume: str | None = knob(
        None,
        "checkpoint file or run directory to continue exactly; 'auto' = the run named "
        "by --run_name if it has a checkpoint, else the newest resumable run",
        RUN,
    )
    baseline: bool = knob(
        False,
        "the seed guides' unoptimised loop: fp32, num_workers=0, no pinning, .item() every "
        "step, validation every epoch",
        RUN,
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
    batch_size: int = knob(150, "samples per batch per process (seed 000 moved 50 -> 150)", SCHED, min=1)
    accumulate_grad_batches: int = knob(
        1, "micro-batches per optimizer step; effective batch = batch_size x this x world size", SCHED, min=1
    )
    early_stopping_patience: int | None = knob(
        None, "stop after N validations without improvement of the task's monitor metric", SCHED, min=1
    )
    # optimiser
    lr: float = knob(1e-3, "learning rate at ref_batch_size (a model's own learning_rate wins)", OPTIM, gt=0)
    ref_batch_size: int | None = knob(None, "batch size lr was tuned for; enables lr_scaling", OPTIM, min=1)
    lr_scaling: str = knob(
        "sqrt", "how lr follows the batch size: seed 000's sqrt, linear or none", OPTIM, choices=LR_SCALING
    )
    weight_decay: float = knob(0.01, "AdamW weight decay (not on biases and norms)", OPTIM)
    warmup_steps: int | None = knob(None, "linear warm-up steps (default: 5%% of the steps, at most 500)", OPTIM)
    min_lr_ratio: float = knob(0.05, "the cosine schedule decays to lr x this", OPTIM)
    gradient_clip_val: float | None = knob(None, "clip threshold (default: no clipping)", OPTIM, gt=0)
    gradient_clip_algorithm: str = knob(
        "norm", "clip by total norm or by value; after unscaling", OPTIM, choices=CLIP_ALGORITHMS
    )
    # precision and device
    precision: str = knob(
        "auto",
        "auto = bf16-mixed where supported, 16-mixed on older GPUs, 32 on a CPU",
        PREC,
        choices=PRECISIONS,
    )
    loss_scale: str = knob("dynamic", "fp16 GradScaler: dynamic or a fixed number such as 1024", PREC)
    tf32: bool = knob(True, "TF32 matmul/cudnn on Ampere+ (CUDA only)", PREC)
    cudnn_benchmark: bool = knob(True, "cudnn autotuner for fixed shapes (CUDA only)", PREC)
    compile_model: bool = knob(False, "torch.compile the model (the first steps pay the compile time)", PREC)
    compile_mode: str = knob("default", "torch.compile mode", PREC, choices=COMPILE_MODES)
    num_threads: int | None = knob(
        None, "torch intra-op threads on a CPU (default: torch's, one per core)", PREC, min=1
    )
    device: str | None = knob(None, "e.g. cuda:0 or cpu (default: cuda:LOCAL_RANK when available, else cpu)", PREC)
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
    # logging, validation, checkpoints
    log_every: int = knob(
        100, "LOG_EVERY: optimizer steps between loss read-backs (the hot path's only sync)", LOG, min=1
    )
    norm_every: int = knob(200, "NORM_EVERY: steps between gradient-norm (and task step-metric) read-backs", LOG, min=1)
    progress_every: int = knob(10, "refresh the progress bar every N batches (and at every epoch end)", LOG, min=1)
    progress_bar: bool = knob(
        True, "show the tqdm progress bar (rank 0) when stderr is a terminal; piped or redirected it stays off", LOG
    )
    validation_interval: int = knob(
        20, "validate every N epochs (seed 001); the last epoch always validates", LOG, min=1
    )
    val_check_steps: int | None = knob(None, "validate every N optimizer steps instead of by epoch", LOG, min=1)
    val_check_batches: int | None = knob(None, "validate every N batches (mmseg's evaluation.interval)", LOG, min=1)
    checkpoint_every: int | None = knob(
        None, "also write last.pt every N optimizer steps (mid-epoch resume)", LOG, min=1
    )
    save_best: bool = knob(True, "keep best.pt by the task's validation metric", LOG)
    test_with_best: bool = knob(False, "score the test split with best.pt's weights instead of the last ones", LOG)
    # robustness
    max_consecutive_skips: int = knob(
        20,
        "stop the run after N consecutive steps skipped for non-finite loss or gradients (checked at log points)",
        SAFE,
        min=1,
    )
    # your model as it is: training order, AdamW knobs, decay horizon, validation cap
    shuffle: bool = knob(True, "shuffle the training samples each epoch; off trains in time order", DATA)
    adam_betas: tuple[float, float] = knob(
        (0.9, 0.999), "AdamW betas of the built-in optimizer (nanoGPT: 0.9 0.95)", OPTIM
    )
    adam_eps: float = knob(1e-8, "AdamW eps of the built-in optimizer", OPTIM, gt=0)
    fused: bool | None = knob(None, "fused AdamW kernel of the built-in optimizer: auto (on), on or off", OPTIM)
    lr_decay_steps: int | None = knob(
        None,
        "optimizer steps the cosine decay spans, counted from step 0 (nanoGPT's lr_decay_iters); later steps stay "
        "at lr x min_lr_ratio (default: the whole run)",
        OPTIM,
        min=1,
    )
    limit_val_batches: int | None = knob(
        None, "score at most N batches per validation (Lightning's limit_val_batches as a count)", LOG, min=1
    )
    # weight averaging and model knobs (issue 20; one block)
    ema_decay: float | None = knob(
        None,
        "keep an exponential moving average (EMA) of the weights with this decay, e.g. 0.999, in [0, 1); "
        "validation, best.pt and test use it, raw_<metric> = the trained weights' scores (default: off)",
        "weight averaging",
        min=0,
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
    channels_last: bool = knob(
        False, "NHWC memory format for 4-D weights and batches (speeds convolutions on tensor-core GPUs)", PREC
    )
    deterministic: bool = knob(
        False, "torch.use_deterministic_algorithms and seeded loader workers: repeatable runs, often slower", RUN
    )
    sync_batchnorm: bool = knob(False, "DDP: BatchNorm statistics over all processes (SyncBatchNorm)", PREC)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the knob, the value and what is allowed."""
        for f in dataclasses.fields(self):
            v, meta = getattr(self, f.name), f.metadata
            if v is None:
                continue
            if "choices" in meta and v not in meta["choices"]:
                raise ValueError(f"TrainConfig: {f.name}={v!r}; use one of {', '.join(meta['choices'])}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if "min" in meta and not v >= meta["min"]:
                raise ValueError(f"TrainConfig: {f.name}={v}; must be >= {meta['min']}")
            if "gt" in meta and not v > meta["gt"]:
                raise ValueError(f"TrainConfig: {f.name}={v}; must be > {meta['gt']}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"TrainConfig: lr={self.lr}; must be a positive number")
        if self.loss_scale != "dynamic":
            try:
                scale = float(self.loss_scale)
            except (TypeError, ValueError):
                scale = -1.0
            if not scale > 0:
                raise ValueError(f"TrainConfig: loss_scale={self.loss_scale!r}; use 'dynamic' or a positive number")
            self.loss_scale = str(self.loss_scale)
        if self.max_steps is not None and self.max_batches is not None:
            raise ValueError("TrainConfig: give max_steps (optimizer steps) or max_batches (batches), not both")
        if self.val_check_steps is not None and self.val_check_batches is not None:
            raise ValueError("TrainConfig: give val_check_steps or val_check_batches, not both")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"TrainConfig: adam_betas={tuple(self.adam_betas)}; give two numbers in [0, 1)")

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
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Build from a dict; unknown keys are an error naming the nearest valid names."""
        from .options import check_keys

        check_keys(d, [f.name for f in dataclasses.fields(cls)], "TrainConfig")
        return cls(**d)


def default_num_workers(world_size: int = 1) -> int:
    """A sensible worker count: the CPUs this process may use, shared among local ranks, capped at 8."""
    return max(0, min(8, usable_cpus() // max(1, world_size) - 1))  # one core stays with the main process


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Windows, macOS
        return os.cpu_count() or 1
