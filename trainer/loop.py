"""The training loop: one explicit loop, readable top to bottom.

    Trainer(cfg, task)   runtime, data, model, optimizer + schedule, checkpointer, evaluator, resume
    fit()                open the run dir -> for each epoch: train, validate, decide to stop, checkpoint when
                         due -> end of training (last.pt) -> test -> summary.json
    _train_epoch()       per batch: forward under autocast -> scaled backward -> [every k micro-batches] unscale,
                         check, clip, optimizer step (skipped on the device if not finite), schedule
                         -> [LOG_EVERY] read the loss back -> [NORM_EVERY] grad norm and task step-metrics

Hot-path rule: between two log points nothing here waits for the GPU; the only host-device syncs are marked
"note: sync point". One more file per question: the optimizer step is `step.py`, the optimizer and schedule
`optim.py`, the run's state and checkpoints `state.py` (file format: `checkpoint.py`), evaluation `evaluation.py`,
the run's files `runfiles.py`, data `data.py`, callbacks `hooks.py`, the summary `finish.py`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import operator
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar, cast, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from . import knobs
from .config import TrainConfig, validation_every
from .console import epoch_line, open_bar
from .data import TrainData, batch_size_of, build_data, close_loader, split_batch, start_epoch, to_device
from .evaluation import BestTracker, Evaluator, ValidationCadence
from .finish import TrainingDiverged, TrainingStopped, add_time, closing_lines, ddp_weight_diff, steps_time, summary_of
from .hooks import Hooks, Monitor, TrainerView
from .layers import SHARDERS, adapt_task, config_callbacks
from .optim import OptimizerSetup, build_optimizer
from .runfiles import ROLLED_BACK, RunFiles, resolve_resume, shared_run_dir, write_config_file
from .runtime import Runtime, cpu_threads, launch_prefix, resolve_runtime, seed_everything
from .signals import StopNow, StopRequest, agree_stop
from .state import (
    CallbackStates,
    Checkpointer,
    Progress,
    RunState,
    SamplerState,
    Settings,
    register_run_state,
    weights_finite,
)
from .step import LossError, OptimizerStep, loss_problem
from .task import LossFn, Task, pick_default_loss, read_step_metrics
from .usercode import UNKNOWN_LENGTH, rerun_hint, resume_hint

_NULL = contextlib.nullcontext()  # stateless, so one instance serves every step
_END = object()  # what next() gives at the end of a stream's pass
SLOW_VALIDATION_S = 0.5  # a shorter validation is not worth advice: at a few ms, "longer than training" is noise


T = TypeVar("T")


class _View(Generic[T]):
    """A read-only attribute that reads one value of one of the Trainer's groups ("progress.step")."""

    def __init__(self, path: str, doc: str | None = None) -> None:
        self._get, self.__doc__ = operator.attrgetter(path), doc or path

    @overload
    def __get__(self, trainer: None, owner: type) -> _View[T]: ...
    @overload
    def __get__(self, trainer: object, owner: type | None = None) -> T: ...
    def __get__(self, trainer: object, owner: type | None = None) -> T | _View[T]:
        return self if trainer is None else cast(T, self._get(trainer))  # the class itself: the attribute (help())

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, trainer: object, value: object) -> None:
        raise AttributeError(f"Trainer.{self.name} is read-only")


@dataclass(frozen=True)
class RunLength:
    """How long the run is, decided once from the batches per epoch and the config."""

    batches_per_epoch: int
    steps_per_epoch: int  # optimizer steps
    total_steps: int  # optimizer steps of the whole run
    max_epochs: int
    validation_every: int  # epochs between validations (cfg.validation_interval, auto resolved)

    @classmethod
    def of(cls, batches_per_epoch: int, cfg: TrainConfig) -> tuple[RunLength, str | None]:
        """The length, and the start-up line when the run will not validate every epoch."""
        steps_per_epoch = math.ceil(batches_per_epoch / cfg.accumulate_grad_batches)
        total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
        max_epochs = math.ceil(total_steps / steps_per_epoch)
        if batches_per_epoch >= UNKNOWN_LENGTH and cfg.max_steps:  # a stream's passes restart until max_steps
            max_epochs = UNKNOWN_LENGTH
        every, note = validation_every(cfg.validation_interval, max_epochs if max_epochs < UNKNOWN_LENGTH else 1)
        return cls(batches_per_epoch, steps_per_epoch, total_steps, max_epochs, every), note

    def resharded(self, p: Progress, cfg: TrainConfig) -> RunLength:
        """A sharded run resumed at an epoch's end on another number of processes (its steps per epoch
        differ): the epochs left count this run's steps. A length given in max_steps stays as it is."""
        if cfg.max_steps or p.batches_done or p.step == p.epoch * self.steps_per_epoch:
            return self
        return replace(self, total_steps=p.step + (self.max_epochs - p.epoch) * self.steps_per_epoch)


@dataclass
class FitState:
    """The run while fit() lasts: its files and console, the stop request, what the log points and epoch lines
    share, and the timings for the summary."""

    files: RunFiles | None = None  # rank 0's writer of the run's files
    bar: Any = None  # tqdm bar or None
    stop: StopRequest = field(default_factory=StopRequest)
    stopping: int | None = None  # the last agreed stop signal (None: go on)
    halted: bool = False  # early stopping ended training
    finite: tuple[int, bool] | None = None  # (step, weights finite) read at that step's log point
    last_row: dict[str, Any] = field(default_factory=dict)  # the last train row (for the epoch line)
    row_extra: tuple[str, ...] = ()  # the names log_metrics_fn added to the train rows (epoch lines)
    stats: dict[str, float] = field(  # samples, iterations and their timings (for the summary)
        default_factory=lambda: {"samples": 0, "data_s": 0.0, "iters": 0, "iter_s": 0.0, "val_s": 0.0}
    )
    t_val_end: float | None = None  # when the last validation ended (the slow-validation warning)
    warned_slow_val: bool = False
    start_batches: int = 0  # where this process's fit() began (ETA, steps_this_process)
    start_step: int = 0
    start_skips: int = 0
    fitted: bool = False  # fit() has run: a second call would re-open a closed run
    summarized: bool = False  # summary.json is written: a stop signal no longer stops anything
    loss_checked: bool = False  # the loss's type and shape are checked on the first step
    chunks: int = 1  # micro-batches each batch is cut into after a CUDA out-of-memory error


class Trainer:
    """Train `task` with `cfg`. `fit()` returns the summary that is also written to summary.json.

    callbacks: objects with any of the hooks in trainer/hooks.py (docs/guides/callbacks.md); monitor: an object
    with the TrainingMonitor API (hooks.Monitor's methods), fed every iteration's time, data wait and batch size.
    """

    # what the run was asked for, and what it resolved to
    requested: TrainConfig  # the config as given
    cfg: TrainConfig  # the config in effect (cfg.effective(): the baseline switch applied)
    task: Task  # the task as the layers adapted it (trainer/layers.py)
    rt: Runtime  # device, precision, DDP rank and world size
    notes: list[str]  # one line per decision or correction; printed at the start, kept in summary.json
    # the parts, each built whole here
    data: TrainData  # loader, sampler, whether the data is held on the device (data.py)
    length: RunLength  # batches per epoch, optimizer steps, epochs, the validation cadence
    raw_model: nn.Module  # the user's module
    model: nn.Module  # raw_model, maybe wrapped in DDP and/or torch.compile: what the step calls
    loss_fn: LossFn
    model_size: knobs.ParameterCount  # parameters (total, trainable) and MB of parameters + buffers
    optim: OptimizerSetup  # the optimizer, its schedule and its real hyper-parameters (optim.py)
    opt: OptimizerStep  # backward and the guarded optimizer step (step.py)
    progress: Progress  # epoch, step, position in the epoch, validation bookkeeping (state.py)
    best: BestTracker
    hooks: Hooks  # the callbacks, resolved per hook
    monitor: Monitor  # fed every iteration: hooks.Monitor's methods (the TrainingMonitor API)
    evaluator: Evaluator
    cadence: ValidationCadence  # epochs between validations; auto, spaced by their cost (evaluation.py)
    sampler_state: SamplerState  # the sampler's state as a checkpoint holds it (mid-epoch: from the epoch's start)
    checkpointer: Checkpointer  # the run's state registry, written out and walked back in (state.py)
    # the run while fit() lasts
    run_dir: Path | None
    run: FitState
    should_stop: bool  # a callback (or the model: self.trainer.should_stop) sets it: training ends after this step

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        log: Callable[[str], None] = print,
        callbacks: list[Any] | None = None,
        monitor: Any = None,
        config_sections: Settings | None = None,
    ) -> None:
        # a LightningModule or nanoGPT-style model becomes a plain Task here (trainer/layers.py): its loss,
        # evaluation, optimizer and callbacks are the task's, and nothing below knows where they came from
        task, found, auto = adapt_task(task), list[str](), cfg.resume == "auto"  # found: what "auto" found
        cfg = resolve_resume(cfg, task.name, found)
        self.requested, self.cfg, self.task = cfg, cfg.effective(), task
        cfg = self.cfg
        self._print, self.monitor = log, monitor or Monitor()
        callbacks = [*(callbacks or []), *task.callbacks]
        self.progress, self.run_dir, self.run, self.should_stop = Progress(), None, FitState(), False

        # runtime
        self.rt = rt = resolve_runtime(cfg.precision, cfg.device, cfg.tf32, cfg.cudnn_benchmark)
        seed_everything(cfg.seed)
        self.notes = [*rt.notes, *task.notes, *found]
        if note := cpu_threads(cfg.num_threads, rt.device, knobs.parameter_count(task.model)["total"]):
            self.notes.append(note)
        if self.requested.baseline:
            self.notes.append("baseline: fp32, num_workers=0, no pinning, .item() every step, validate every epoch")
        if cfg.deterministic:  # before the model or the data touch a kernel (cuBLAS reads its setting once)
            self.notes += knobs.deterministic(cfg.seed, rt.device)

        # data, and the run's length
        self.data = data = build_data(task, cfg, rt)
        self.notes += data.notes
        self.length, note = RunLength.of(len(data.sampler), cfg)
        if note and task.val_set is not None and cfg.val_check_steps is None:
            self.notes.append(note)

        self._place_model(task, cfg, rt)  # the model and its knobs before the optimizer sees the parameters

        # optimizer, schedule, the optimizer step
        self.optim = setup = build_optimizer(
            self.raw_model, cfg, rt, self.global_batch, self.length.total_steps, task.optimizer_fn, task.lr
        )
        self.notes += setup.notes
        callbacks += setup.callbacks
        self.opt = OptimizerStep(
            setup.optimizer,
            setup.schedule,
            rt.device,
            rt.amp_dtype == torch.float16,
            cfg.scale_value(),
            cfg.gradient_clip_val,
            cfg.gradient_clip_algorithm,
            before_step=self._before_optimizer_step,
        )
        if self.opt.fp16 and cfg.scale_value():
            self.notes.append(f"loss scale: static {cfg.scale_value():g}")

        # the parts: callbacks, evaluation, checkpoints
        made, notes = config_callbacks(cfg, callbacks)  # EMA for ema_decay: ordinary callbacks (trainer/layers.py)
        self.notes += notes
        self.best = BestTracker(task.monitor_metric, task.monitor_mode, cfg.save_top_k)
        view: TrainerView = self  # mypy checks here that the Trainer is what callbacks are promised
        self.hooks = Hooks([*callbacks, *made], view, rt.is_main)
        added = any(callable(getattr(cb, "on_validation_end", None)) for cb in self.hooks.callbacks)
        self.evaluator = Evaluator(task, self.raw_model, rt, self.loss_fn, cfg, data.loader_kw, data.resident, added)
        self.checkpointer = self._build_checkpointer(setup, config_sections or {})
        if cfg.resume:
            horizon, n = getattr(setup.schedule, "total_steps", None), self.length
            self.run_dir = self.checkpointer.resume(
                Path(cfg.resume), n.total_steps, n.batches_per_epoch, self.notes, horizon, n.max_epochs, auto
            )
            self.length = n.resharded(self.progress, cfg) if self.sharding else n  # onto another world size

        # wrappers last: checkpoints hold the raw model's state
        if rt.distributed and not self.sharding:
            self.model = DDP(self.model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        if cfg.compile_model:
            self.model = torch.compile(self.model, mode=cfg.compile_mode)  # type: ignore[assignment]
            self.notes.append(f"compile: torch.compile(mode={cfg.compile_mode!r}); the first steps include compiling")

    def _place_model(self, task: Task, cfg: TrainConfig, rt: Runtime) -> None:
        """The model on its device with the model knobs (trainer/knobs.py) applied, its size, and the loss."""
        self.model = self.raw_model = task.model.to(rt.device)
        if cfg.sync_batchnorm:
            self.model, done = knobs.sync_batchnorm(self.raw_model, rt.world_size, rt.device)
            self.raw_model = self.model
            self.notes.append(done)
        if cfg.channels_last:
            self.notes.append(knobs.channels_last(self.raw_model, rt.device))
        self.model_size = knobs.parameter_count(self.raw_model)
        if why := model_problem(self.raw_model, task, rt.amp_dtype):  # before any file: one line, no traceback
            raise ValueError(why)
        if task.loss_fn is not None:
            self.loss_fn = task.loss_fn
        else:
            self.loss_fn, note = pick_default_loss(self.raw_model, _first_sample(task.train_set))
            if note:
                self.notes.append(note)
        self.sharding = next((s for f in SHARDERS if (s := f(self.raw_model, cfg, rt, self.notes))), None)  # fsdp

    def _build_checkpointer(self, setup: OptimizerSetup, config_sections: Settings) -> Checkpointer:
        """The run's state: one registry that every checkpoint walks out and every resume walks in (state.py)."""
        self.sampler_state = SamplerState(self.data.sampler, self.progress)
        cfg, rt = self.cfg, self.rt
        run_state = register_run_state(
            RunState(),
            model=self.sharding or self.raw_model,
            optimizer=setup.optimizer,
            schedule=setup.schedule,
            opt_step=self.opt,
            progress=self.progress,
            sampler=self.sampler_state,
            best=self.best,
            callbacks=CallbackStates(self.hooks, self.notes),
        )
        # the validation cadence at auto is measured, so a resume takes the chosen spacing from the checkpoint
        auto = cfg.validation_interval is None
        self.cadence = ValidationCadence(
            self.length.validation_every, auto, rt.distributed, cfg.early_stopping_patience
        )
        run_state.register("validation", self.cadence, optional=True)
        return Checkpointer(
            state=run_state,
            model=self.raw_model,
            progress=self.progress,
            best=self.best,
            hooks=self.hooks,
            cfg=cfg,
            settings=self._settings(config_sections),
            task_name=self.task.name,
            rt=rt,
            # per-interval last.pt from a background thread on a GPU (on a CPU the write would share the cores)
            background=cfg.async_checkpoint if cfg.async_checkpoint is not None else rt.device.type == "cuda",
        )

    # ------------------------------------------------------------------ public state (read-only: hooks.TrainerView)
    step = _View[int]("progress.step", "Optimizer steps done.")
    epoch = _View[int]("progress.epoch", "Finished epochs.")
    batches_done = _View[int]("progress.batches_done", "Batches into the current epoch.")
    device = _View[torch.device]("rt.device")
    is_main = _View[bool]("rt.is_main")
    world_size = _View[int]("rt.world_size")
    optimizer = _View[torch.optim.Optimizer]("optim.optimizer")
    callbacks = _View[list[object]]("hooks.callbacks", "The callbacks; one appended before fit() takes part in it.")
    total_steps = _View[int]("length.total_steps", "Optimizer steps of the whole run.")
    max_epochs = _View[int]("length.max_epochs")
    batches_per_epoch = _View[int]("length.batches_per_epoch")

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all processes (the effective batch)."""
        return self.cfg.batch_size * self.cfg.accumulate_grad_batches * self.rt.world_size

    def log(self, msg: str) -> None:
        if self.rt.is_main:  # printed above a live bar; a log= callable of the caller's gets every line itself
            try:
                (self.run.bar.write if self.run.bar is not None and self._print is print else self._print)(msg)
            except OSError:  # the terminal is gone (SIGHUP, a closed pipe): the run's files still say it all
                pass

    def _note(self, msg: str) -> None:
        """A decision taken during the run: printed now and kept in summary.json's notes."""
        self.notes.append(msg)
        self.log(f"[plainloop] {msg}")

    def batches_total_done(self) -> int:
        p, n = self.progress, self.batches_per_epoch  # a stream of unknown length counts its steps' batches
        return p.epoch * n + p.batches_done if n < UNKNOWN_LENGTH else p.step * self.cfg.accumulate_grad_batches

    # ------------------------------------------------------------------ the run: a table of contents
    def fit(self) -> dict[str, Any]:
        """Train, validate and test; returns the summary (also written to RUN_DIR/summary.json). Once per Trainer."""
        if self.run.fitted:
            raise RuntimeError(
                f"Trainer.fit() runs once, and this Trainer already ran (run dir {self.run_dir}): to train on, make a "
                f"new Trainer with TrainConfig(..., resume={str(self.run_dir)!r}) and a larger epochs or max_steps "
                f"(BaseTrainer: checkpoint_path={str(self.run_dir)!r})"
            )
        self.run.fitted = True
        try:
            return self._fit()
        except BaseException:
            try:  # a failed fit still lets the background write in flight finish: last.pt is whole, old or new
                self.checkpointer.wait()
            except Exception as e:  # the fit's own error is the one raised; this one is reported
                self.log(f"[plainloop] {e}")
            if self.run.files is not None:  # a fit that failed releases its run dir: the same process may resume it
                self.run.files.close()
            raise
        finally:
            close_loader(self.data.loader)  # its workers ignore SIGTERM: none may be left for interpreter exit
            if self.rt.distributed:
                # the DDP wrapper holds the process group: alive, its threads outlive destroy_process_group() into
                # interpreter shutdown, where one freeing a finished all-reduce aborts the process (SIGABRT)
                self.model = self.raw_model
                gc.collect()

    def _fit(self) -> dict[str, Any]:
        self.hooks.resolve()  # callbacks added since the constructor count too
        # from the run directory's first file on, a stop signal is the loop's: it saves last.pt and says how to resume
        with StopRequest() as self.run.stop:
            self._open_run()
            self.monitor.start_monitoring()
            t0 = time.perf_counter()
            self.run.start_batches, self.run.start_step = self.batches_total_done(), self.progress.step
            self.run.start_skips = self.opt.skip_counts()[0]
            # a resumed run's pending validation comes before any training: nothing to compare it with
            self.run.t_val_end = None if self.progress.val_pending is not None else t0
            try:
                self.run.bar = self._open_bar()
                self.hooks("on_train_start")
                stopped = self._train(t0)
                t_wait = time.perf_counter()
                self.checkpointer.wait()  # the last background write is on disk before validation and test
                add_time(self.run.stats, "ckpt_s", t_wait)
            finally:
                self.monitor.stop_monitoring()
                if self.run.bar is not None:
                    self.run.bar.close()
                    self.run.bar = None
            train_time = time.perf_counter() - t0
            if stopped:
                self.hooks("on_train_end")
                self._stopped_by_signal(stopped, train_time)
            self._check_skips_at_end()
            # after training a stop still loses nothing: the last validation finishes and last.pt is marked ended; from
            # then on (the test, the summary) a stop ends the run at once, and its resume only scores and summarises.
            # The same request: a signal after _train's last look at it (the last save, the bar closing) counts too.
            self.run.stop.at_once = lambda: self.progress.ended is not None and not self.run.summarized
            try:
                self._end_training()
                if self.run.stop.signum:
                    raise StopNow(self.run.stop.signum)
                self.hooks("on_train_end")
                # compared before rank 0 alone loads best.pt to score the test split (--test_with_best)
                weight_diff = ddp_weight_diff(self.raw_model) if self.rt.distributed and not self.sharding else None
                test = self._test()
                self.run.stats["wall_s"] = time.perf_counter() - t0  # summary.json's wall_time (finish.wall_split)
                summary = self._finish(train_time, test, weight_diff)
            except StopNow as e:
                self._stopped_after_training(e.signum)
            if self.run.stop.signum:  # after summary.json: the run is complete, so the exit code stays 0
                self.log(f"[plainloop] {self.run.stop.name} after the run finished: it is complete, nothing to resume")
                raise TrainingStopped(0)
            return summary

    def _train(self, t0: float) -> int | None:
        """Epochs until the last step, a stop or early stopping; returns the stop signal all ranks agreed on.
        The checkpointer decides when last.pt is due (its interval, a stop); the end of training always writes it."""
        p, cfg = self.progress, self.cfg
        if p.ended is not None:  # resumed after training ended, before the summary: the test and summary are left
            return self._agree_stop()
        halted = self.run.halted = False
        if p.val_pending is not None:  # resumed from a stop that came right before a validation
            self.validate()
            self._agree_stop()  # a stop during it: last.pt again, at the end of _train
            halted = self.run.halted = not self.run.stopping and self._early_stop()
        elif self._agree_stop():  # a stop during set-up: no epoch starts
            assert self.run_dir is not None
            if (self.rt.is_main or self.sharding) and not (self.run_dir / "checkpoints" / "last.pt").is_file():
                self._save("last.pt")  # the weights the run starts from: the printed resume line continues from them
            return self.run.stopping
        while (
            not halted
            and not self.run.stopping
            and p.epoch < self.length.max_epochs
            and p.step < self.length.total_steps
        ):
            steps_before = steps_time(self.run.stats)
            self._train_epoch()
            self.run.stats["steps_s"] = self.run.stats.get("steps_s", 0.0) + steps_time(self.run.stats) - steps_before
            # DDP: agree once more, so a signal that reached one rank after the epoch's last log point
            # cannot send that rank out of the loop while the others validate
            stopping = self._agree_stop()
            epoch_done, last = p.batches_done == 0, self._last()
            val_now = cfg.val_check_steps is None and (last or (epoch_done and self.cadence.due(p.epoch)))
            if stopping:  # the validation that was due runs first when the run resumes
                due = val_now or (last and cfg.val_check_steps is not None and p.last_val_step != p.step)
                p.val_pending = p.step if due and self.task.val_set is not None else None
            elif val_now:
                self.validate()
                stopping = self._agree_stop()  # a stop during validation: last.pt now, with the validation done
            halted = self.run.halted = self.run.halted or (not stopping and self._early_stop())
            if epoch_done or last or stopping:
                # an epoch's end writes last.pt only when its interval is due; a stop and the end always do
                saved = self.checkpointer.due_at_epoch_end(bool(stopping), ending=last or halted)
                if saved:
                    self._save("last.pt", background=self.checkpointer.background and not stopping)
                self.log(self._epoch_line(t0, saved))
            if stopping:
                return stopping
        stopping = self._agree_stop()
        if stopping:  # after a resumed run's pending validation, or a stop that ended the last epoch early
            self._save("last.pt")
        return stopping

    def _end_training(self) -> None:
        """Training is over: the last validation (val_check_steps), then last.pt marked as ended, so that a resume
        never trains or scores the run again (only the test and the summary, if they were not written)."""
        p = self.progress
        if p.ended is not None:  # resumed after the end: nothing left to train or save
            return
        if not self.run.halted and self._validation_left():
            self.validate()
        p.ended = "early_stopped" if self.run.halted else "finished"
        p.val_pending = None
        self._save("last.pt")

    # ------------------------------------------------------------------ one epoch, one step
    def _train_epoch(self) -> None:
        cfg, p, hooks = self.cfg, self.progress, self.hooks
        if not all(m.training and type(m).train is nn.Module.train for m in self.model.modules()):
            self.model.train()  # it sets every module's flag again: skipped when all are set and none overrides it
        start, nb = p.batches_done, self.length.batches_per_epoch
        it = self._start_epoch(start)
        pending: list[torch.Tensor] = []  # per-batch losses, kept on the device until the next log point
        n_samples = n_iters = 0  # this epoch's totals, and since the last log point (i_*)
        data_s = iter_s = i_data = 0.0
        # read once: what every step below consults
        total, run, device, ddp = self.length.total_steps, self.run, self.rt.device, self.rt.distributed
        move, bar, stop = not self.data.on_device, run.bar, run.stop
        window_start, t0, agreed = start, time.perf_counter(), False
        i_samples, i_t = 0, t0
        norm: torch.Tensor | None = None
        want_norm = False
        for i in range(start, nb):
            batch = next(it, _END)
            if batch is _END:  # a stream's pass is over, and so is its epoch (its length was not known)
                nb = self._pass_ended(i, window_start, pending, i_samples, i_data, i_t)
                break
            if move:
                batch = to_device(batch, device)
            if cfg.channels_last:
                batch = knobs.to_channels_last(batch)
            t_data = time.perf_counter() - t0
            if hooks.batch_start:
                hooks("on_train_batch_start", batch, i)
            window = min(cfg.accumulate_grad_batches, nb - window_start)  # a short last window still averages right
            boundary = i + 1 - window_start == window
            loss = self.forward_backward(batch, window, boundary)
            pending.append(loss)
            bs = batch_size_of(batch)
            i_samples += bs
            i_data += t_data
            if boundary:
                want_norm = (p.step + 1) % cfg.norm_every == 0
                norm, _ = self.opt.step(want_norm)
                p.step += 1  # after the step: a callback's on_before_optimizer_step sees the steps done before it
                window_start = p.batches_done = i + 1
            if hooks.batch_end:
                hooks("on_train_batch_end", loss, batch, i)
            if boundary:
                logged = p.step % cfg.log_every == 0 or p.step >= total or i + 1 == nb
                if logged:
                    # a save may follow: the weights' finiteness rides in the log point's one transfer
                    save_due = self.checkpointer.may_save(epoch_end=i + 1 == nb, at_end=p.step >= total)
                    i_t = self._log_point(pending, i_samples, i_data, i_t, norm if want_norm else None, save_due)
                    i_samples, i_data = 0, 0.0
                    if ddp:  # every rank must stop at the same step: agree at the log point (a sync)
                        agreed = self._agree_stop() is not None
                elif want_norm:
                    self._log_norm(norm)
                if cfg.val_check_steps is not None and p.step % cfg.val_check_steps == 0:
                    self.validate()
                    self.model.train()
                    run.halted = self._early_stop()  # at the validation, not at the epoch's end (a stream has one)
                if i + 1 < nb and self.checkpointer.due_after_step(p.step, logged):
                    self._save("last.pt", background=self.checkpointer.background)
            t1 = time.perf_counter()
            self.monitor.log_iteration(t1 - t0, t_data, bs)
            n_samples += bs
            n_iters += 1
            data_s += t_data
            iter_s += t1 - t0
            if bar is not None and ((i + 1) % cfg.progress_every == 0 or i + 1 == nb):
                bar.update(self.batches_total_done() - bar.n)
            t0 = t1
            if p.step >= total or agreed or run.halted or (boundary and (self.should_stop or stop.signum and not ddp)):
                break
        for k, v in (("samples", n_samples), ("iters", n_iters), ("data_s", data_s), ("iter_s", iter_s)):
            run.stats[k] += v
        if p.batches_done >= nb:  # the epoch ran to its end (not stopped by max_steps or a signal)
            p.epoch += 1
            p.batches_done = 0
            hooks("on_train_epoch_end", p.epoch - 1)
        del it

    def _start_epoch(self, start: int) -> Iterator[Any]:
        """The sampler set to this epoch's order, on_train_epoch_start, then the loader's batches from batch `start`
        on (a sampler without a state of its own replays its epoch, the batches already trained dropped)."""
        p, replay = self.progress, 0
        if start == 0:
            start_epoch(self.data.sampler, p.epoch)
        elif hasattr(self.data.sampler, "load_state_dict"):
            # resuming mid-epoch: the sampler regenerates this epoch's order and skips what was consumed
            self.data.sampler.load_state_dict(
                {**self.data.sampler.state_dict(), "epoch": p.epoch, "batches_done": start}
            )
        else:  # a sampler without state: replay its epoch and drop the batches already trained
            start_epoch(self.data.sampler, p.epoch)
            replay = start
        # the sampler's state before this epoch's order is drawn: a checkpoint mid-epoch saves it, so that a resume
        # draws the same order again (a sampler with its own RNG) and skips the batches already trained
        self.sampler_state.epoch_started()
        self.hooks("on_train_epoch_start", p.epoch)
        it = iter(self.data.loader)
        for _ in range(replay):
            next(it)
        return it

    def _pass_ended(
        self, i: int, window_start: int, pending: list[torch.Tensor], n: int, data_s: float, t: float
    ) -> int:
        """A stream's pass ended after batch `i` of its epoch: a window it cut short steps (as under Lightning), the
        losses since the last log point are logged, and the epoch ends there. A pass without a batch is an error."""
        if i == 0:
            raise ValueError(
                f"{self.task.name}: the train stream ({type(self.task.train_set).__name__}) gave no batch in epoch "
                f"{self.progress.epoch + 1} (batch_size {self.cfg.batch_size}, drop_last {self.cfg.drop_last}): "
                f"each pass must give at least one batch"
            )
        if i > window_start:
            self.opt.step(False)
            self.progress.step += 1
        self.progress.batches_done = i
        if pending:
            self._log_point(pending, n, data_s, t, None)
        return i

    def _last(self) -> bool:
        """Training ends after this epoch: its steps or epochs are done, or a callback (the model) set should_stop."""
        p = self.progress
        return p.step >= self.length.total_steps or p.epoch >= self.length.max_epochs or self.should_stop

    def forward_backward(
        self, batch: Any, window: int, sync_grads: bool = True, split_on_oom: bool = True
    ) -> torch.Tensor:
        """Forward under autocast and a scaled backward; returns the detached loss (on the device). Out of CUDA
        memory, the batch is split into micro-batches, unless split_on_oom is False (a batch-size search)."""
        if not split_on_oom:
            return self._forward_backward(batch, window, sync_grads)
        while True:
            try:
                if self.run.chunks == 1:
                    return self._forward_backward(batch, window, sync_grads)
                parts = split_batch(batch, self.run.chunks)
                losses = [
                    self._forward_backward(b, window * len(parts), sync_grads and j == len(parts) - 1)
                    for j, b in enumerate(parts)
                ]
                return torch.stack(losses).mean()
            except torch.OutOfMemoryError:
                self._shrink_micro_batch(batch)

    def _forward_backward(self, batch: Any, window: int, sync_grads: bool) -> torch.Tensor:
        no_sync = self.model.no_sync() if self.rt.distributed and not sync_grads else _NULL  # type: ignore[operator]
        with no_sync:
            with self.rt.autocast() if self.rt.amp_dtype is not None else _NULL:
                loss = self.loss_fn(self.model, batch)
            # once: a float, detached or vector loss is one line, not backward's traceback
            if not self.run.loss_checked:
                if why := loss_problem(loss):
                    raise LossError(f"{self.task.name}: {why}")
                self.run.loss_checked = True
            self.opt.backward(loss, window)
        return loss.detach()

    def _before_optimizer_step(self) -> None:
        if self.hooks.before_optimizer_step:  # resolved at fit start: callbacks added after the constructor count
            self.hooks("on_before_optimizer_step", self.optim.optimizer)

    def _shrink_micro_batch(self, batch: Any) -> None:
        """CUDA OOM: cut every batch into twice as many micro-batches; the effective batch stays the same."""
        size = batch_size_of(batch)
        for prm in self.opt.params:  # a failed backward may have left partial gradients
            prm.grad = None
        if self.run.chunks * 2 > size:
            raise torch.OutOfMemoryError(f"out of memory even with micro-batches of 1 sample (batch {size})")
        self.run.chunks *= 2
        if self.rt.device.type == "cuda":
            torch.cuda.empty_cache()
        msg = (
            f"out of memory at step {self.progress.step + 1}: micro-batch {-(-size // (self.run.chunks // 2))} -> "
            f"{-(-size // self.run.chunks)} ({self.run.chunks} per batch, gradients accumulated; effective batch "
            f"unchanged{'; this accumulation window restarts' if self.cfg.accumulate_grad_batches > 1 else ''})"
        )
        self._note(msg)

    # ------------------------------------------------------------------ log points
    def _log_point(
        self,
        pending: list[torch.Tensor],
        samples: int,
        data_s: float,
        t_last: float,
        norm: torch.Tensor | None,
        with_finite: bool = False,
    ) -> float:
        # note: sync point (LOG_EVERY): the only read of the loss in the hot path; the skip counters, a device lr
        # and (when a save follows) the weights' finiteness ride along in the same transfer
        loss_t = torch.stack(pending).float().mean().reshape(1)
        parts = [loss_t, self.opt.device_counts().to(loss_t)]
        lr_t = self.optim.optimizer.param_groups[0]["lr"]
        if isinstance(lr_t, torch.Tensor):
            parts.append(lr_t.detach().float().reshape(1).to(loss_t.device))
        if with_finite:
            parts.append(weights_finite(self.raw_model).float().reshape(1).to(loss_t.device))
        vals = torch.cat(parts).tolist()
        pending.clear()
        loss = vals[0]
        skipped, run = self.opt.skip_counts(vals[1:3])
        if with_finite:
            self.run.finite = (self.progress.step, vals[-1] == 1.0)
        now = time.perf_counter()
        elapsed = max(now - t_last, 1e-9)
        row: dict[str, Any] = {
            "kind": "train",
            "step": self.progress.step,
            "epoch": self.progress.epoch + 1,
            "loss": loss,
            "lr": vals[3] if isinstance(lr_t, torch.Tensor) else self.optim.schedule.current_lr(),
            "samples_per_s": samples * self.rt.world_size / elapsed,
            "data_wait_frac": data_s / elapsed,
            "skipped_steps": skipped,
        }
        if self.task.log_metrics_fn is not None:
            extra = self.task.log_metrics_fn()  # e.g. a model's self.log values, averaged since the last point
            row.update(extra)
            self.run.row_extra = tuple(extra)
        if norm is not None:
            row["grad_norm"] = norm.item()  # note: sync point (NORM_EVERY)
            row.update(read_step_metrics(self.task))
        self.log_row(row)
        self.run.last_row = row
        if self.run.bar is not None:
            self.run.bar.set_postfix(
                loss=f"{loss:.4g}",
                sps=f"{row['samples_per_s']:.0f}",
                wait=f"{100 * row['data_wait_frac']:.0f}%",
                refresh=False,
            )
        if run >= self.cfg.max_consecutive_skips:
            self._diverged(run)
        return now

    def _log_norm(self, norm: torch.Tensor | None) -> None:
        row: dict[str, Any] = {"kind": "norm", "step": self.progress.step, **read_step_metrics(self.task)}
        if norm is not None:
            row["grad_norm"] = norm.item()  # note: sync point (NORM_EVERY)
        self.log_row(row)

    # ------------------------------------------------------------------ validation and test
    def evaluate(self, split: str) -> dict[str, float]:
        """The task's scores on "val" or "test" with the weights the model holds now: no files, no callbacks."""
        return self.evaluator(split)

    def validate(self) -> dict[str, float]:
        """Score the val split on rank 0, let the callbacks see (and change) the scores, log them, keep best.pt
        when they improved. Every rank gets rank 0's scores, so every rank tracks the same best and takes the
        same early-stopping decision."""
        p = self.progress
        p.last_val_step = p.step
        p.val_pending = None  # the validation a checkpoint announced is under way; checkpoints from now on say so
        if self.task.val_set is None:
            return {}
        self.hooks("on_validation_start")
        t_start = time.perf_counter()
        metrics = self._from_rank0(self.evaluate("val") if self.rt.is_main or self.sharding else {})  # also the barrier
        t_end = time.perf_counter()
        self.run.stats["val_s"] += t_end - t_start
        since = None if self.run.t_val_end is None else t_start - self.run.t_val_end
        self._warn_slow_validation(t_start, t_end)
        if line := self.cadence.measured(p.epoch, t_end - t_start, since):
            self._note(line)
        self.hooks("on_validation_end", metrics)  # may replace or add scores: what follows reads the dict after it
        metrics = self._from_rank0(metrics)
        if metrics and self.task.batch_evaluate_fn is None and self.best.metric not in metrics:
            raise ValueError(  # best.pt would be picked by another score under this one's name
                f"{self.task.name}: the monitored metric {self.best.metric!r} is not among the scores "
                f"{'evaluate_fn returned' if self.task.evaluate_fn else 'the validation gave'} ({', '.join(map(str, metrics))}); set Task(monitor_metric=...) to the one that picks best.pt"
            )
        improved = self.best.update(metrics)
        if metrics:
            p.last_val = dict(metrics)
        if self.rt.is_main or self.sharding:  # a sharded best.pt is written by every rank
            epoch = p.epoch_number
            self.log_row({"kind": "val", "step": p.step, "epoch": epoch, **metrics})
            shown = self.task.console_metrics or tuple(metrics)
            if improved and self.cfg.save_best:  # saved before the line says so: a full disk raises first
                self._save("best.pt", background=self.checkpointer.background)
            self.log(
                f"[val] step {p.step} epoch {epoch}: "
                + (", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k in shown) or "(no metrics logged)")
                + (" (best so far; best.pt saved)" if improved and self.cfg.save_best else "")
            )
        self._keep_top_k(metrics, p.epoch_number)
        return metrics

    def _keep_top_k(self, metrics: dict[str, float], epoch: int) -> None:
        """save_top_k: this validation's checkpoint when it is among the k best; the one it pushed out removed."""
        name = f"epoch={epoch}-step={self.progress.step}.pt"
        if self.rt.is_main and self.run_dir is not None:  # the files rank 0 keeps and saves
            self.best.forget_missing(self.run_dir / "checkpoints")
        kept, dropped = self.best.rank(metrics, name, self.progress.step)
        if self.rt.is_main and self.run_dir is not None:
            if kept:
                self._save(name)
            for old in dropped:
                (self.run_dir / "checkpoints" / old).unlink(missing_ok=True)

    def _warn_slow_validation(self, t_start: float, t_end: float) -> None:
        """Once per run: a validation that took longer than the training since the previous one (and than
        SLOW_VALIDATION_S), with the fixes."""
        prev, self.run.t_val_end = self.run.t_val_end, t_end
        if prev is None or self.run.warned_slow_val:
            return
        val_s, train_s = t_end - t_start, t_start - prev
        if val_s > max(train_s, SLOW_VALIDATION_S) and train_s > 0:
            self.run.warned_slow_val = True
            msg = (
                f"validation took {val_s:.1f} s, longer than the {train_s:.1f} s of training since the previous "
                f"one: validate less often (validation_interval, val_check_steps) or score fewer batches "
                f"(limit_val_batches)"
            )
            self._note(msg)

    def _validation_left(self) -> bool:
        """With val_check_steps, the last step gets a validation unless it just had one."""
        return (
            self.cfg.val_check_steps is not None
            and self.task.val_set is not None
            and self.progress.last_val_step != self.progress.step
        )

    def _from_rank0(self, metrics: dict[str, float]) -> dict[str, float]:
        if not self.rt.distributed:
            return metrics
        box = [metrics]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _test(self) -> dict[str, float]:
        """Rank 0 scores the test split (with best.pt's weights under test_with_best); then on_test_end."""
        if self.task.test_set is None or not (self.rt.is_main or self.sharding):
            return {}
        assert self.run_dir is not None
        best = self.run_dir / "checkpoints" / "best.pt"
        if self.cfg.test_with_best and best.is_file():
            self.checkpointer.load_weights(best, self.notes)
            value = f"{self.best.best:.4g}" if self.best.best is not None else "?"
            self.notes.append(f"test: scored with the weights of {best} ({self.best.metric}={value})")
        t = time.perf_counter()
        metrics = self.evaluate("test")
        add_time(self.run.stats, "test_s", t)
        self.hooks("on_test_end", metrics)
        if metrics:
            self.log_row({"kind": "test", "step": self.progress.step, **metrics})
            shown = [k.replace("val_", "test_", 1) for k in self.task.console_metrics or ()] or list(metrics)
            self.log("[test] " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k in shown))
        return metrics

    # ------------------------------------------------------------------ deciding to stop
    def _agree_stop(self) -> int | None:
        """The stop request every rank acts on (trainer/signals.py agree_stop), kept in self.run.stopping."""
        self.run.stopping = agree_stop(self.run.stop, self.rt)
        return self.run.stopping

    def _early_stop(self) -> bool:
        if self.should_stop:  # Lightning's trainer.should_stop, set by a callback or the model: as early stopping
            self._note(f"should_stop: set by a callback or the model; training stopped at step {self.progress.step}")
            return True
        patience = self.cfg.early_stopping_patience
        if patience is None or self.best.stale < patience:
            return False
        self._note(
            f"early stopping: {self.best.metric} did not improve for {patience} validations "
            f"(best {self.best.best:.4g}); stopped at step {self.progress.step}"
        )
        return True

    def _check_skips_at_end(self) -> None:
        """Skips are checked at log points; a short run can end between two with most of its steps skipped."""
        skipped, run = self.opt.skip_counts()  # note: sync point (end of training)
        steps, new = self.progress.step - self.run.start_step, skipped - self.run.start_skips
        if run >= self.cfg.max_consecutive_skips:
            self._diverged(run)
        if new >= 2 and 2 * new > steps:
            self._diverged(run, f"{new} of the {steps} optimizer steps of this run had non-finite loss or gradients")

    def _stopped_after_training(self, signum: int) -> NoReturn:
        """A stop signal after training ended (the last validation, the test, the summary): last.pt holds the
        trained weights, marked ended; the resume scores the test split and writes summary.json, training nothing."""
        assert self.run_dir is not None
        name = signal.Signals(signum).name
        msg = (
            f"{name} after training ended at step {self.progress.step}, before summary.json was written; "
            f"{self.run_dir / 'checkpoints' / 'last.pt'} holds the trained weights. To score the test split and "
            f"write the summary (nothing is trained again): {resume_hint(self.run_dir, launch_prefix())}"
        )
        self._event_and_close({"event": "stopped", "signal": name}, msg)
        raise TrainingStopped(128 + signum)

    def _diverged(self, run: int, what: str | None = None) -> None:
        assert self.run_dir is not None
        what = what or f"the last {run} optimizer steps had non-finite loss or gradients"
        msg = (
            f"stopped at step {self.progress.step}: {what} "
            f"and were skipped (--max_consecutive_skips {self.cfg.max_consecutive_skips}). Nothing non-finite was "
            f"saved; {self.run_dir / 'checkpoints'} holds the last finite weights. Try a lower --lr, "
            f"--gradient_clip_val 1.0, precision 32, or check the data for NaN/inf values."
        )
        self._event_and_close({"event": "diverged", "message": msg}, msg)
        if self.rt.distributed:
            dist.barrier()  # every rank diverges at the same step (averaged gradients); none exits before rank 0
        raise TrainingDiverged(3)

    def _event_and_close(self, event: dict[str, Any], msg: str) -> None:
        """A run that ends early: its event row, its console line, and the run's files closed."""
        self.log_row({"kind": "event", "step": self.progress.step, **event})
        self.log(f"[plainloop] {msg}")
        if self.run.files is not None:
            self.run.files.close()

    def _stopped_by_signal(self, signum: int, train_time: float) -> None:
        assert self.run_dir is not None
        name, p = self.run.stop.name, self.progress
        where = f"after step {p.step} ({p.position(self.length.batches_per_epoch)})"
        where = where if p.step or p.epoch or p.batches_done else "before the first step"  # not "end of epoch 0"
        msg = (
            f"{name}: stopped {where}; "
            f"{self.run_dir / 'checkpoints' / 'last.pt'} written. Resume with: "
            f"{resume_hint(self.run_dir, launch_prefix())}"
        )
        self.log_row({"kind": "event", "step": self.progress.step, "event": "stopped", "signal": name})
        self.log(f"[plainloop] {msg}")
        summary = self._summary(train_time, {}, {})  # on every rank: under DDP it holds a collective
        if self.run.files is not None:
            summary["stopped_by"] = name
            self.run.files.write_json("summary.json", summary)
            self.run.files.close()
        if self.rt.distributed:
            dist.barrier()  # no rank exits (and has torchrun end the others) before rank 0 has written
        raise TrainingStopped(128 + signum)

    # ------------------------------------------------------------------ the run's files
    def _open_run(self) -> None:
        """Claim (or, resuming, reuse) the run directory; write config.json and config.toml; on_fit_start; print
        the notes and the run's one-line description."""
        cfg, rt = self.cfg, self.rt
        self.run_dir, note = shared_run_dir(self.run_dir, cfg.output_dir, cfg.run_name, self.task.name, rt)
        if note:
            self.notes.append(note)
        if rt.is_main:
            self.run.files = files = RunFiles(
                self.run_dir,
                self._on_row,
                resumed_step=self.progress.step if cfg.resume else None,
                val_pending=self.progress.val_pending is not None,
            )
            self.notes += files.notes  # e.g. the lock of a process that died, taken over
            if files.removed:
                self.notes.append(f"removed {len(files.removed)} temp file(s) left by an interrupted write")
            if files.rolled_back:
                self.notes.append(
                    f"resume: {files.rolled_back} metrics row(s) written after the checkpoint's step "
                    f"{self.progress.step} are trained again; moved from metrics.jsonl to {ROLLED_BACK}"
                )
            if gone := self.best.prune(self.run_dir / "checkpoints"):  # save_top_k lowered on resume
                self.notes.append(f"save_top_k {cfg.save_top_k}: removed {', '.join(gone)}, beyond the k best")
            self._write_config(files, self.run_dir)
        self.hooks("on_fit_start")
        for n in self.notes:
            self.log(f"[plainloop] {n}")
        self.log(
            f"[plainloop] {self.task.name}: {_samples(self.task.train_set)} train samples, "
            f"{_known(self.length.batches_per_epoch) or '?'} batches/epoch, {_known(self.length.total_steps) or '?'} "
            f"optimizer steps, device {rt.device}, "
            f"precision {rt.precision}, model {knobs.describe_parameters(self.model_size)}, run dir {self.run_dir}"
        )

    def _settings(self, sections: Settings) -> Settings:
        """The run's full resolved settings: the task's and run's tables (`sections`) and [train], as config.toml and
        every checkpoint hold them."""
        resolved = {
            **self.requested.to_dict(),
            "precision": self.rt.precision,
            "num_workers": self.data.loader_kw.get("num_workers", 0),
            "warmup_steps": self.optim.warmup_steps,
            "resume": None,
        }
        return {**sections, "train": resolved}

    def _write_config(self, files: RunFiles, run_dir: Path) -> None:
        rt, train = self.rt, self.checkpointer.settings["train"]
        files.write_json(
            "config.json",
            {
                "requested": self.requested.to_dict(),
                "effective": {
                    **self.cfg.to_dict(),
                    **{k: train[k] for k in ("precision", "num_workers", "warmup_steps")},
                },
                "runtime": {
                    "device": str(rt.device),
                    "precision": rt.precision,
                    "world_size": rt.world_size,
                    "notes": self.notes,
                },
                "task": {"name": self.task.name, **self.task.info},
                "optimizer": self.optim.hparams,  # the real hyper-parameters of the optimizer that runs
            },
        )
        write_config_file(run_dir / "config.toml", self.checkpointer.settings, rerun_hint(run_dir / "config.toml"))

    def _on_row(self, row: dict[str, Any]) -> None:
        self.hooks("on_log", row)

    def log_row(self, row: dict[str, Any]) -> None:
        """Append `row` to metrics.jsonl (rank 0; other ranks drop it); callbacks see it in on_log. A row has
        "kind" ("train", "val", "test", "norm", "event" or a kind of its own) and "step"."""
        if self.run.files is not None:  # rank 0
            self.run.files.log(row)

    def _save(self, name: str, background: bool = False) -> None:
        t = time.perf_counter()
        if self.rt.is_main or self.sharding:  # a sharded state is written by every rank
            assert self.run_dir is not None
            if self.run.files is not None:  # a removed run directory stops the run: never recreated by the save
                self.run.files.check(f"checkpoints/{name}")
            # the weights' finiteness was read at this step's log point, with the loss: no second sync
            finite = (
                self.run.finite[1] if self.run.finite is not None and self.run.finite[0] == self.progress.step else None
            )
            self.checkpointer.save(name, self.run_dir, self.run.files, background=background, finite=finite)
        add_time(self.run.stats, "ckpt_s", t)

    def _open_bar(self) -> Any:
        return open_bar(self.cfg.progress_bar and self.rt.is_main, self._total_batches(), self.batches_total_done())

    def _total_batches(self) -> int | None:
        return _known(
            min(
                self.length.max_epochs * self.length.batches_per_epoch,
                self.length.total_steps * self.cfg.accumulate_grad_batches,
            )
        )

    def _epoch_line(self, t0: float, saved: bool) -> str:
        done, total = self.batches_total_done(), self._total_batches()
        ran = done - self.run.start_batches
        eta = (time.perf_counter() - t0) / ran * (total - done) if ran > 0 and total is not None else float("nan")
        p = self.progress
        return epoch_line(
            epoch=p.epoch_number,  # stopped mid-epoch (max_steps, a signal), the one the run is inside
            max_epochs=_known(self.length.max_epochs),
            step=p.step,
            total_steps=_known(self.length.total_steps),
            row=self.run.last_row,
            saved=("last.pt writing in the background" if self.checkpointer.writing else "last.pt saved")
            if saved
            else "",
            eta_s=eta,
            extra=self.run.row_extra,
        )

    # ------------------------------------------------------------------ the summary
    def _summary(
        self, train_time: float, val: dict[str, float], test: dict[str, float], weight_diff: float | None = None
    ) -> dict[str, Any]:
        return summary_of(
            task=self.task,
            rt=self.rt,
            run_dir=self.run_dir,
            progress=self.progress,
            start_step=self.run.start_step,
            train_time=train_time,
            stats=self.run.stats,
            monitor=self.monitor.get_summary(),
            skipped=self.opt.skip_counts()[0],
            best=self.best,
            notes=self.notes,
            val=val,
            test=test,
            model=self.raw_model,
            weight_diff=weight_diff,
        )

    def _finish(self, train_time: float, test: dict[str, float], weight_diff: float | None) -> dict[str, Any]:
        summary = self._summary(train_time, self.progress.last_val, test, weight_diff)
        summary["model"] = {
            "parameters": self.model_size["total"],
            "trainable": self.model_size["trainable"],
            "size_mb": self.model_size["size_mb"],
        }
        self.hooks("on_fit_end", summary)  # a callback may add what the closing lines print (the verdict, re-run)
        if self.run.files is not None:
            self.run.files.write_json("summary.json", summary)
            self.run.files.close()
        self.run.summarized = True
        for line in closing_lines(summary, self.run_dir):
            self.log(line)
        return summary


def _known(n: int) -> int | None:
    """`n`, or None where it counts a stream's unknown length (UNKNOWN_LENGTH or more)."""
    return n if n < UNKNOWN_LENGTH else None


def _first_sample(ds: Any) -> Any:
    """The first sample when the dataset can be indexed (for the default loss's look at the targets), else None."""
    try:
        return ds[0]
    except Exception:  # an iterable or lazily opened dataset: no peek, plain MSE
        return None


def _samples(ds: Any) -> str:
    try:
        return str(len(ds))
    except TypeError:  # a stream (IterableDataset)
        return "streamed"


def model_problem(model: nn.Module, task: Task, amp_dtype: torch.dtype | None) -> str | None:
    """Why `model` and `task` cannot be trained as given (checked before the run directory is made), or None."""
    if task.monitor_mode not in ("min", "max"):
        guess = "max" if str(task.monitor_mode).lower().startswith("max") else "min"
        return f"Task(monitor_mode={task.monitor_mode!r}): use 'min' or 'max' (did you mean {guess!r}?)"
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return (
            f"{task.name}: the model has no trainable parameters (every one has requires_grad=False, or it has none): "
            f"nothing to train; unfreeze the layers to train (p.requires_grad_(True))"
        )
    wide = any(p.dtype == torch.float64 for p in params)
    if wide and amp_dtype is not None:
        return (
            f"{task.name}: the model's parameters are torch.float64, which mixed precision ({amp_dtype}) does not "
            f"train: call model.float() (and give float32 inputs), or use --precision 32"
        )
    sample = _first_sample(task.train_set)
    x = sample[0] if isinstance(sample, list | tuple) and sample else None
    if wide and isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return (
            f"{task.name}: the model's parameters are torch.float64 and the data's inputs {x.dtype}: a layer cannot "
            f"take them together; call model.float() (plainloop trains float32 weights), or give float64 inputs"
        )
    return None
