"""TrainConfig: every knob of the loop in one dataclass.

Defaults are the optimised setup. `baseline=True` turns every optimisation off and reproduces the seed
guides' "before" run, so the two can be compared with one flag.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

PRECISIONS = ("auto", "32", "16-mixed", "bf16-mixed")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
CLIP_ALGORITHMS = ("norm", "value")
LR_SCALING = ("sqrt", "linear", "none")


@dataclass
class TrainConfig:
    # run
    task: str = "era5"  # built-in task: "era5" or "reid" (BaseTrainer passes its own model and data)
    seed: int = 42  # seeds python, numpy and torch; data order derives from it
    output_dir: str = "runs"  # each run writes into output_dir/run_name
    run_name: str | None = None  # default: <task>-<timestamp>
    resume: str | None = None  # path to a checkpoint (last.pt) or a run directory to continue
    # schedule
    epochs: int = 10  # ignored when max_steps is set
    max_steps: int | None = None  # iteration-based run: stop after this many optimizer steps
    batch_size: int = 150  # per process; seed 000 moved 50 -> 150
    accumulate_grad_batches: int = 1  # effective batch = batch_size * this * world size
    # optimiser
    lr: float = 1e-3  # learning rate at ref_batch_size (a model's own learning_rate wins in BaseTrainer)
    ref_batch_size: int | None = None  # batch size lr was tuned for; None = no scaling
    lr_scaling: str = "sqrt"  # seed 000: new_lr = lr * sqrt(new_bs / ref_bs); or "linear", "none"
    weight_decay: float = 0.01
    warmup_steps: int | None = None  # None: 5% of the optimizer steps (at most 500)
    min_lr_ratio: float = 0.05  # cosine decays to lr * this
    gradient_clip_val: float | None = None  # None: no clipping
    gradient_clip_algorithm: str = "norm"  # "norm" or "value"; applied after scaler.unscale_
    # precision and device
    precision: str = "auto"  # "auto" = bf16-mixed where supported, else 16-mixed on CUDA, 32 on CPU
    loss_scale: str | float = "dynamic"  # fp16 GradScaler: "dynamic" or a fixed float scale
    tf32: bool = True  # TF32 matmul/cudnn on Ampere+ (CUDA only)
    cudnn_benchmark: bool = True  # autotune conv algorithms for fixed shapes (CUDA only)
    compile_model: bool = False  # torch.compile the model (first steps pay the compile time)
    compile_mode: str = "default"  # "default", "reduce-overhead" (CUDA graphs), "max-autotune"
    device: str | None = None  # None: cuda:LOCAL_RANK when available, else cpu
    # data loading
    num_workers: int | None = None  # None: chosen from the CPU count (0 when data is held in memory)
    pin_memory: bool = True  # page-locked host memory makes non_blocking copies truly async
    persistent_workers: bool = True  # keep workers alive across epochs
    prefetch_factor: int = 2  # batches each worker prepares ahead
    drop_last: bool = True  # fixed shapes help cudnn.benchmark and torch.compile
    multiprocessing_context: str | None = None  # None: platform default; "spawn" works everywhere (Windows)
    device_cache: bool | None = None  # hold the whole dataset on the device when the task supports it
    # logging, validation, checkpoints
    log_every: int = 50  # LOG_EVERY: optimizer steps between loss read-backs (the only hot-path sync)
    norm_every: int = 200  # NORM_EVERY: steps between gradient-norm read-backs
    progress_every: int = 10  # refresh the progress bar every N batches
    progress_bar: bool = True  # tqdm bar (rank 0 only)
    validation_interval: int = 20  # validate every N epochs (seed 001); the last epoch always validates
    val_check_steps: int | None = None  # validate every N optimizer steps instead of by epoch
    checkpoint_every: int | None = None  # also write last.pt every N optimizer steps (mid-epoch resume)
    save_best: bool = True  # keep best.pt by the task's validation metric
    # tools
    profile: bool = False  # write a torch.profiler trace of a few steps into the run directory
    monitor_interval: float = 1.0  # seconds between TrainingMonitor samples
    # the seed guides' unoptimised "before" loop
    baseline: bool = False  # fp32, num_workers=0, no pinning, .item() every step, validate every epoch
    extra: dict[str, Any] = field(default_factory=dict)  # task-specific settings (recorded in config.json)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the knob and the allowed values."""

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"TrainConfig: {msg}")

        self.precision = str(self.precision)
        need(self.precision in PRECISIONS, f"precision={self.precision!r}; use one of {PRECISIONS}")
        need(self.compile_mode in COMPILE_MODES, f"compile_mode={self.compile_mode!r}; use one of {COMPILE_MODES}")
        need(
            self.gradient_clip_algorithm in CLIP_ALGORITHMS,
            f"gradient_clip_algorithm={self.gradient_clip_algorithm!r}; use one of {CLIP_ALGORITHMS}",
        )
        need(self.lr_scaling in LR_SCALING, f"lr_scaling={self.lr_scaling!r}; use one of {LR_SCALING}")
        need(self.batch_size >= 1, f"batch_size={self.batch_size}; must be >= 1")
        need(self.epochs >= 1, f"epochs={self.epochs}; must be >= 1")
        need(self.max_steps is None or self.max_steps >= 1, f"max_steps={self.max_steps}; must be >= 1")
        need(self.accumulate_grad_batches >= 1, f"accumulate_grad_batches={self.accumulate_grad_batches}; must be >= 1")
        need(self.lr > 0, f"lr={self.lr}; must be > 0")
        need(self.log_every >= 1, f"log_every={self.log_every}; must be >= 1")
        need(self.norm_every >= 1, f"norm_every={self.norm_every}; must be >= 1")
        need(self.progress_every >= 1, f"progress_every={self.progress_every}; must be >= 1")
        need(self.validation_interval >= 1, f"validation_interval={self.validation_interval}; must be >= 1")
        need(self.num_workers is None or self.num_workers >= 0, f"num_workers={self.num_workers}; must be >= 0")
        need(self.prefetch_factor >= 1, f"prefetch_factor={self.prefetch_factor}; must be >= 1")
        need(
            self.gradient_clip_val is None or self.gradient_clip_val > 0,
            f"gradient_clip_val={self.gradient_clip_val}; must be > 0 (or None for no clipping)",
        )
        if self.loss_scale != "dynamic":
            try:
                self.loss_scale = float(self.loss_scale)
            except (TypeError, ValueError):
                raise ValueError(
                    f"TrainConfig: loss_scale={self.loss_scale!r}; use 'dynamic' or a positive number"
                ) from None
            need(self.loss_scale > 0, f"loss_scale={self.loss_scale}; must be > 0")
        need(
            self.multiprocessing_context in (None, "spawn", "fork", "forkserver"),
            f"multiprocessing_context={self.multiprocessing_context!r}; use spawn, fork or forkserver",
        )

    def effective(self) -> TrainConfig:
        """The config actually run: baseline switches applied."""
        if not self.baseline:
            return self
        return dataclasses.replace(
            self,
            precision="32",
            num_workers=0,
            pin_memory=False,
            persistent_workers=False,
            tf32=False,
            cudnn_benchmark=False,
            compile_model=False,
            device_cache=False,
            validation_interval=1,
            log_every=1,  # the "before" loop called loss.item() every step
            norm_every=1,
            progress_every=1,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Build from a dict; unknown keys are an error that lists the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown setting(s) {unknown}; known settings: {sorted(known)}")
        return cls(**d)


def default_num_workers(world_size: int = 1) -> int:
    """A sensible worker count: the CPUs this process may use, shared among local ranks, capped at 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # Windows, macOS
        cpus = os.cpu_count() or 1
    per_rank = max(1, cpus // max(1, world_size))
    # keep one core for the main process; on a 2-core box that means 1 worker
    return max(0, min(8, per_rank - 1))
