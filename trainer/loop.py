"""The training loop: one explicit loop, readable top to bottom.

    Trainer(cfg, task)   runtime, data, model, optimizer + schedule, checkpointer, evaluator, resume
    fit()                open the run dir -> for each epoch: train, checkpoint, validate, decide to stop
                         -> test -> summary.json
    _train_epoch()       per batch: forward under autocast -> scaled backward -> [every k micro-batches] unscale,
                         check, clip, optimizer step (skipped on the device if not finite), schedule
                         -> [LOG_EVERY] read the loss back -> [NORM_EVERY] grad norm and task step-metrics

Hot-path rule: between two log points nothing here waits for the GPU; the only host-device syncs are marked
"note: sync point". One more file per question: the optimizer step is `step.py`, the optimizer and schedule
`optim.py`, checkpoints `checkpointer.py` (state) and `checkpoint.py` (file format), evaluation `evaluation.py`,
the run's files `runfiles.py`, data `data.py`, callbacks `hooks.py`, the summary `finish.py`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from . import knobs
from .checkpointer import Checkpointer, Progress
from .compat.lightning import ModelParts, model_parts
from .config import TrainConfig
from .console import epoch_line, open_bar
from .data import batch_size_of, build_data, close_loader, split_batch, to_device
from .evaluation import BestTracker, Evaluator
from .finish import TrainingDiverged, TrainingStopped, ddp_weight_diff, summary_of
from .hooks import Hooks, Monitor
from .layers import config_callbacks
from .optim import Schedule, build_optimizer
from .runfiles import ROLLED_BACK, RunFiles, shared_run_dir, write_config_file
from .runtime import Runtime, launch_prefix, resolve_runtime, seed_everything
from .signals import StopRequest, agree_stop
from .step import OptimizerStep
from .task import LossFn, Task, pick_default_loss, read_step_metrics
from .usercode import is_stream, rerun_hint, resume_hint

_NULL = contextlib.nullcontext()  # stateless, so one instance serves every step


class Trainer:
    """Train `task` with `cfg`. `fit()` returns the summary that is also written to summary.json.

    callbacks: objects with any of the hooks in trainer/hooks.py (docs/guides/callbacks.md); monitor: an object
    with seed 001's TrainingMonitor API, fed every iteration's time, data wait and batch size.
    """

    # what the run was asked for, and what it resolved to
    requested: TrainConfig  # the config as given
    cfg: TrainConfig  # the config in effect (cfg.effective(): the baseline switch applied)
    task: Task
    rt: Runtime  # device, precision, DDP rank and world size
    notes: list[str]  # one line per decision or correction; printed at the start, kept in summary.json
    config_sections: dict[str, dict[str, Any]]  # task/run settings written beside [train] in config.toml
    # data
    loader: Any  # DataLoader, or DeviceBatches when the data is held on the device
    sampler: Any  # batch sampler: set_epoch / state_dict / load_state_dict
    on_device: bool
    resident: dict[int, Any]
    loader_kw: dict[str, Any]
    batches_per_epoch: int
    steps_per_epoch: int
    total_steps: int  # optimizer steps of the whole run
    max_epochs: int
    # model and optimization
    raw_model: nn.Module  # the user's module
    model: nn.Module  # raw_model, maybe wrapped in DDP and/or torch.compile: what the step calls
    parts: ModelParts | None  # a Lightning-style model's training_step, hooks and self.log (model_protocol.py)
    loss_fn: LossFn
    global_batch: int  # samples per optimizer step over all processes
    optimizer: torch.optim.Optimizer
    scheduler: Schedule
    warmup_steps: int
    optimizer_hparams: dict[str, Any]  # the optimizer's real hyper-parameters (build_optimizer)
    opt: OptimizerStep  # backward and the guarded optimizer step
    chunks: int  # micro-batches each batch is cut into after a CUDA out-of-memory error
    model_size: dict[str, Any]  # parameters (total, trainable) and MB of parameters + buffers (knobs.parameter_count)
    # the parts
    progress: Progress  # epoch, step, position in the epoch, validation bookkeeping
    best: BestTracker
    callbacks: list[Any]
    hooks: Hooks
    monitor: Any
    evaluator: Evaluator
    checkpointer: Checkpointer
    async_checkpoint: bool  # per-epoch last.pt written from a background thread (cfg.async_checkpoint resolved)
    # the run while it lasts
    run_dir: Path | None
    files: RunFiles | None  # rank 0's writer of the run's files
    bar: Any  # tqdm bar or None
    stop: StopRequest
    stopping: int | None  # the last agreed stop signal (None: go on)
    last_row: dict[str, Any]  # the last train row (for the epoch line)
    last_val: dict[str, float]  # the last validation's scores (for the summary)
    stats: dict[str, float]  # samples, iterations and their timings (for the summary)
    _t_val_end: float | None  # when the last validation ended (the slow-validation warning)
    _warned_slow_val: bool
    _start_batches: int  # where this process's fit() began (ETA, steps_this_process)
    _start_step: int

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        log: Callable[[str], None] = print,
        callbacks: list[Any] | None = None,
        monitor: Any = None,
        config_sections: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.requested, self.cfg, self.task = cfg, cfg.effective(), task
        self._print, self.callbacks, self.monitor = log, list(callbacks or []), monitor or Monitor()
        self.config_sections = config_sections or {}
        self.progress, self.chunks = Progress(), 1
        self.run_dir, self.files, self.bar, self.stopping = None, None, None, None
        self.last_row, self.last_val = {}, {}
        self._t_val_end, self._warned_slow_val = None, False
        self.stats = {"samples": 0, "data_s": 0.0, "iters": 0, "iter_s": 0.0}
        self._start_batches = self._start_step = 0
        cfg = self.cfg

        # runtime
        self.rt = rt = resolve_runtime(cfg.precision, cfg.device, cfg.tf32, cfg.cudnn_benchmark)
        seed_everything(cfg.seed)
        self.notes = list(rt.notes)
        if cfg.num_threads is not None and rt.device.type == "cpu" and cfg.num_threads != torch.get_num_threads():
            self.notes.append(f"threads: {torch.get_num_threads()} -> {cfg.num_threads} torch intra-op thread(s)")
            torch.set_num_threads(cfg.num_threads)
        if self.requested.baseline:
            self.notes.append("baseline: fp32, num_workers=0, no pinning, .item() every step, validate every epoch")
        if cfg.deterministic:  # before the model or the data touch a kernel (cuBLAS reads its setting once)
            self.notes += knobs.deterministic(cfg.seed, rt.device)

        # data, and the run's length
        data = build_data(task, cfg, rt)
        self.notes += data.notes
        self.loader, self.sampler, self.on_device = data.loader, data.sampler, data.on_device
        self.resident, self.loader_kw = data.resident, data.loader_kw
        self.batches_per_epoch = len(self.sampler)
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / cfg.accumulate_grad_batches)
        self.total_steps = cfg.max_steps or cfg.epochs * self.steps_per_epoch
        self.max_epochs = math.ceil(self.total_steps / self.steps_per_epoch)

        # model and loss; the model knobs (trainer/knobs.py) before the optimizer sees the parameters
        self.model = self.raw_model = task.model.to(rt.device)
        if cfg.sync_batchnorm:
            self.model, note = knobs.sync_batchnorm(self.raw_model, rt.world_size, rt.device)
            self.raw_model = self.model
            self.notes += [note] if note else []
        if cfg.channels_last:
            self.notes.append(knobs.channels_last(self.raw_model, rt.device))
        self.model_size = knobs.parameter_count(self.raw_model)
        # a Lightning-style model brings its training_step and hooks (trainer/model_protocol.py)
        self.parts = model_parts(self.raw_model)
        if self.parts is not None:
            self.callbacks.append(self.parts.hooks)  # before the schedulers' callback: on_train_epoch_end logs first
        if task.loss_fn is not None:
            self.loss_fn = task.loss_fn
        elif self.parts is not None and self.parts.loss_fn is not None:
            self.loss_fn = self.parts.loss_fn
        else:
            self.loss_fn, note = pick_default_loss(self.raw_model, _first_sample(task.train_set))
            if note:
                self.notes.append(note)

        # optimizer, schedule, the optimizer step
        self.global_batch = cfg.batch_size * cfg.accumulate_grad_batches * rt.world_size
        setup = build_optimizer(self.raw_model, cfg, rt, self.global_batch, self.total_steps)
        self.optimizer, self.scheduler, self.optimizer_hparams = setup.optimizer, setup.schedule, setup.hparams
        self.warmup_steps = int(setup.hparams.get("warmup_steps", 0))
        self.notes += setup.notes
        self.callbacks += setup.callbacks
        if self.parts is not None:
            self.parts.bind(self.optimizer, self.scheduler, setup.callbacks)
        fp16 = rt.amp_dtype == torch.float16
        self.opt = OptimizerStep(
            self.optimizer,
            self.scheduler,
            rt.device,
            fp16,
            cfg.scale_value(),
            cfg.gradient_clip_val,
            cfg.gradient_clip_algorithm,
        )
        if fp16 and cfg.scale_value():
            self.notes.append(f"loss scale: static {cfg.scale_value():g}")

        # the parts: callbacks, evaluation, checkpoints
        made, notes = config_callbacks(cfg, self.callbacks)  # EMA for ema_decay: ordinary callbacks (trainer/layers.py)
        self.callbacks += made
        self.notes += notes
        self.best = BestTracker(task.monitor_metric, task.monitor_mode)
        self.hooks = Hooks(self.callbacks, self, rt.is_main)
        self.evaluator = Evaluator(task, self.raw_model, rt, self.loss_fn, cfg, self.loader_kw, self.resident)
        if self.parts is not None and self.parts.evaluates and task.evaluate_fn is None:
            self.evaluator.own = self.parts.adapter.evaluate  # validation_step / test_step
        self.checkpointer = Checkpointer(
            model=self.raw_model,
            optimizer=self.optimizer,
            schedule=self.scheduler,
            opt_step=self.opt,
            sampler=self.sampler,
            best=self.best,
            progress=self.progress,
            hooks=self.hooks,
            cfg=cfg,
            task_name=task.name,
            rt=rt,
        )
        self.async_checkpoint = cfg.async_checkpoint if cfg.async_checkpoint is not None else rt.device.type == "cuda"
        if cfg.resume:
            path = Path(cfg.resume)
            self.run_dir = self.checkpointer.resume(path, self.total_steps, self.batches_per_epoch, self.notes)
            if is_stream(task.train_set):  # a stream is one long epoch of this run's length: count its batches
                self.progress.epoch, self.progress.batches_done = 0, self.progress.step * cfg.accumulate_grad_batches

        # wrappers last: checkpoints hold the raw model's state
        if rt.distributed:
            self.model = DDP(self.model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        if cfg.compile_model:
            self.model = torch.compile(self.model, mode=cfg.compile_mode)  # type: ignore[assignment]
            self.notes.append(f"compile: torch.compile(mode={cfg.compile_mode!r}); the first steps include compiling")

    # ------------------------------------------------------------------ public state
    @property
    def step(self) -> int:
        """Optimizer steps done."""
        return self.progress.step

    @step.setter
    def step(self, value: int) -> None:
        self.progress.step = value

    @property
    def epoch(self) -> int:
        """Finished epochs."""
        return self.progress.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.progress.epoch = value

    @property
    def batches_done(self) -> int:
        """Batches into the current epoch."""
        return self.progress.batches_done

    @batches_done.setter
    def batches_done(self, value: int) -> None:
        self.progress.batches_done = value

    @property
    def device(self) -> torch.device:
        return self.rt.device

    @property
    def is_main(self) -> bool:
        return self.rt.is_main

    @property
    def world_size(self) -> int:
        return self.rt.world_size

    def log(self, msg: str) -> None:
        if self.rt.is_main:  # printed above a live bar; a log= callable of the caller's gets every line itself
            try:
                (self.bar.write if self.bar is not None and self._print is print else self._print)(msg)
            except OSError:  # the terminal is gone (SIGHUP, a closed pipe): the run's files still say it all
                pass

    def batches_total_done(self) -> int:
        return self.progress.epoch * self.batches_per_epoch + self.progress.batches_done

    # ------------------------------------------------------------------ the run: a table of contents
    def fit(self) -> dict[str, Any]:
        """Train, validate and test; returns the summary (also written to RUN_DIR/summary.json)."""
        try:
            return self._fit()
        except BaseException:
            self._settle_checkpoint()
            if self.files is not None:  # a fit that failed releases its run dir: the same process may resume it
                self.files.close()
            raise
        finally:
            close_loader(self.loader)  # its workers ignore SIGTERM: none may be left for interpreter exit
            if self.rt.distributed:
                # the DDP wrapper holds the process group: alive, its threads outlive destroy_process_group() into
                # interpreter shutdown, where one freeing a finished all-reduce aborts the process (SIGABRT)
                self.model = self.raw_model
                gc.collect()

    def _settle_checkpoint(self) -> None:
        """A failed fit still lets the background write in flight finish: last.pt is whole, old or new."""
        try:
            self.checkpointer.wait()
        except Exception as e:  # the fit's own error is the one raised; this one is reported
            self.log(f"[plainloop] {e}")

    def _fit(self) -> dict[str, Any]:
        self.hooks.resolve()  # callbacks added since the constructor count too
        self.opt.before_step = self._before_optimizer_step if self.hooks.before_optimizer_step else None
        # from the run directory's first file on, a stop signal is the loop's: it saves last.pt and says how to resume
        with StopRequest() as self.stop:
            self._open_run()
            self.monitor.start_monitoring()
            t0 = time.perf_counter()
            self._start_batches, self._start_step = self.batches_total_done(), self.progress.step
            # a resumed run's pending validation comes before any training: nothing to compare it with
            self._t_val_end = None if self.progress.val_pending is not None else t0
            try:
                self.bar = self._open_bar()
                self.hooks("on_train_start")
                stopped = self._train(t0)
                self.checkpointer.wait()  # the last background write is on disk before validation and test
            finally:
                self.monitor.stop_monitoring()
                if self.bar is not None:
                    self.bar.close()
                    self.bar = None
        train_time = time.perf_counter() - t0
        if not stopped and self._validation_left():
            self.validate()
        self.hooks("on_train_end")
        if stopped:
            self._stopped_by_signal(stopped, train_time)
        # compared before rank 0 alone loads best.pt to score the test split (--test_with_best)
        weight_diff = ddp_weight_diff(self.raw_model) if self.rt.distributed else None
        test = self._test()
        return self._finish(train_time, test, weight_diff)

    def _train(self, t0: float) -> int | None:
        """Epochs until the last step, a stop or early stopping; returns the stop signal all ranks agreed on."""
        p, cfg = self.progress, self.cfg
        halted = False
        if p.val_pending is not None:  # resumed from a checkpoint written right before a validation
            self._validate_pending()
            halted = self._early_stop()
        elif self._agree_stop():  # a stop during set-up: no epoch starts
            assert self.run_dir is not None
            if self.rt.is_main and not (self.run_dir / "checkpoints" / "last.pt").is_file():
                self._save("last.pt")  # the weights the run starts from: the printed resume line continues from them
        while not halted and not self.stopping and p.epoch < self.max_epochs and p.step < self.total_steps:
            self._train_epoch()
            # DDP: agree once more, so a signal that reached one rank after the epoch's last log point
            # cannot send that rank out of the loop while the others validate
            stopping = self._agree_stop()
            epoch_done, last = p.batches_done == 0, p.step >= self.total_steps
            val_now = cfg.val_check_steps is None and (last or (epoch_done and p.epoch % cfg.validation_interval == 0))
            if epoch_done or last or stopping:
                # before validation: a stop during it (or before it) loses nothing, the resume runs it first
                due = val_now or (last and cfg.val_check_steps is not None and p.last_val_step != p.step)
                p.val_pending = p.step if due and self.task.val_set is not None else None
                # in the background except the run's last and a stop's save (the process may exit right after)
                self._save("last.pt", background=self.async_checkpoint and not (stopping or last))
                self.log(self._epoch_line(t0))
            if stopping:
                break
            if val_now:
                self._validate_pending()
            halted = self._early_stop()
        return self._agree_stop()

    # ------------------------------------------------------------------ one epoch, one step
    def _train_epoch(self) -> None:
        cfg, p, hooks = self.cfg, self.progress, self.hooks
        self.model.train()
        start, nb = p.batches_done, self.batches_per_epoch
        replay = 0
        if start == 0:
            self.sampler.set_epoch(p.epoch)
        elif hasattr(self.sampler, "load_state_dict"):
            # resuming mid-epoch: the sampler regenerates this epoch's order and skips what was consumed
            self.sampler.load_state_dict({**self.sampler.state_dict(), "epoch": p.epoch, "batches_done": start})
        else:  # a sampler without state: replay its epoch and drop the batches already trained
            self.sampler.set_epoch(p.epoch)
            replay = start
        # the sampler's state before this epoch's order is drawn: a checkpoint mid-epoch saves it, so that a resume
        # draws the same order again (a sampler with its own RNG) and skips the batches already trained
        self.checkpointer.sampler_epoch_state = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}
        hooks("on_train_epoch_start", p.epoch)
        pending: list[torch.Tensor] = []  # per-batch losses, kept on the device until the next log point
        n_samples = n_iters = 0  # this epoch's totals, and since the last log point (i_*)
        data_s = iter_s = i_data = 0.0
        it: Iterator[Any] = iter(self.loader)
        for _ in range(replay):
            next(it)
        window_start, t0, agreed = start, time.perf_counter(), False
        i_samples, i_t = 0, t0
        norm: torch.Tensor | None = None
        want_norm = False
        for i in range(start, nb):
            batch = next(it)
            if not self.on_device:
                batch = to_device(batch, self.rt.device)
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
                if p.step % cfg.log_every == 0 or p.step >= self.total_steps or i + 1 == nb:
                    i_t = self._log_point(pending, i_samples, i_data, i_t, norm if want_norm else None)
                    i_samples, i_data = 0, 0.0
                    if self.rt.distributed:  # every rank must stop at the same step: agree at the log point (a sync)
                        agreed = self._agree_stop() is not None
                elif want_norm:
                    self._log_norm(norm)
                if cfg.val_check_steps is not None and p.step % cfg.val_check_steps == 0:
                    self.validate()
                    self.model.train()
                if cfg.checkpoint_every is not None and p.step % cfg.checkpoint_every == 0 and i + 1 < nb:
                    self._save("last.pt", background=self.async_checkpoint)
            t1 = time.perf_counter()
            self.monitor.log_iteration(t1 - t0, t_data, bs)
            n_samples += bs
            n_iters += 1
            data_s += t_data
            iter_s += t1 - t0
            if self.bar is not None and ((i + 1) % cfg.progress_every == 0 or i + 1 == nb):
                self.bar.update(self.batches_total_done() - self.bar.n)
            t0 = t1
            if p.step >= self.total_steps or agreed or (boundary and self.stop.signum and not self.rt.distributed):
                break
        for k, v in (("samples", n_samples), ("iters", n_iters), ("data_s", data_s), ("iter_s", iter_s)):
            self.stats[k] += v
        if p.batches_done >= nb:  # the epoch ran to its end (not stopped by max_steps or a signal)
            p.epoch += 1
            p.batches_done = 0
            hooks("on_train_epoch_end", p.epoch - 1)
        del it

    def forward_backward(self, batch: Any, window: int, sync_grads: bool = True) -> torch.Tensor:
        """Forward under autocast and a scaled backward; returns the detached loss (on the device)."""
        while True:
            try:
                if self.chunks == 1:
                    return self._forward_backward(batch, window, sync_grads)
                parts = split_batch(batch, self.chunks)
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
            self.opt.backward(loss, window)
        return loss.detach()

    def _before_optimizer_step(self) -> None:
        self.hooks("on_before_optimizer_step", self.optimizer)

    def _shrink_micro_batch(self, batch: Any) -> None:
        """CUDA OOM: cut every batch into twice as many micro-batches; the effective batch stays the same."""
        size = batch_size_of(batch)
        for prm in self.opt.params:  # a failed backward may have left partial gradients
            prm.grad = None
        if self.chunks * 2 > size:
            raise torch.OutOfMemoryError(f"out of memory even with micro-batches of 1 sample (batch {size})")
        self.chunks *= 2
        if self.rt.device.type == "cuda":
            torch.cuda.empty_cache()
        msg = (
            f"out of memory at step {self.progress.step + 1}: micro-batch {-(-size // (self.chunks // 2))} -> "
            f"{-(-size // self.chunks)} ({self.chunks} per batch, gradients accumulated; effective batch "
            f"unchanged{'; this accumulation window restarts' if self.cfg.accumulate_grad_batches > 1 else ''})"
        )
        self.notes.append(msg)
        self.log(f"[plainloop] {msg}")

    # ------------------------------------------------------------------ log points
    def _log_point(
        self,
        pending: list[torch.Tensor],
        samples: int,
        data_s: float,
        t_last: float,
        norm: torch.Tensor | None,
    ) -> float:
        # note: sync point (LOG_EVERY): the only read of the loss in the hot path; the skip counters ride along
        vals = torch.cat([torch.stack(pending).float().mean().reshape(1), self.opt.device_counts()]).tolist()
        pending.clear()
        loss = vals[0]
        skipped, run = self.opt.skip_counts(vals[1:])
        now = time.perf_counter()
        elapsed = max(now - t_last, 1e-9)
        row: dict[str, Any] = {
            "kind": "train",
            "step": self.progress.step,
            "epoch": self.progress.epoch + 1,
            "loss": loss,
            "lr": self.scheduler.current_lr(),
            "samples_per_s": samples * self.rt.world_size / elapsed,
            "data_wait_frac": data_s / elapsed,
            "skipped_steps": skipped,
        }
        if self.parts is not None:
            row.update(self.parts.hooks.train_logs())  # the model's self.log values, averaged since the last point
        if norm is not None:
            row["grad_norm"] = norm.item()  # note: sync point (NORM_EVERY)
            row.update(read_step_metrics(self.task))
        self._row(row)
        self.last_row = row
        if self.bar is not None:
            self.bar.set_postfix(
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
        self._row(row)

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
        metrics = self._from_rank0(self.evaluate("val") if self.rt.is_main else {})  # also the barrier
        self._warn_slow_validation(t_start, time.perf_counter())
        self.hooks("on_validation_end", metrics)  # may replace or add scores: what follows reads the dict after it
        metrics = self._from_rank0(metrics)
        improved = self.best.update(metrics)
        if metrics:
            self.last_val = metrics
        if self.rt.is_main:
            epoch = p.epoch + (1 if p.batches_done else 0)  # 1-based, also mid-epoch
            self._row({"kind": "val", "step": p.step, "epoch": epoch, **metrics})
            shown = self.task.console_metrics or tuple(metrics)
            self.log(
                f"[val] step {p.step} epoch {epoch}: "
                + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k in shown)
                + (" (best so far; best.pt saved)" if improved and self.cfg.save_best else "")
            )
            if improved and self.cfg.save_best:
                self._save("best.pt")
        return metrics

    def _warn_slow_validation(self, t_start: float, t_end: float) -> None:
        """Once per run: a validation that took longer than the training since the previous one, with the fixes."""
        prev, self._t_val_end = self._t_val_end, t_end
        if prev is None or self._warned_slow_val:
            return
        val_s, train_s = t_end - t_start, t_start - prev
        if val_s > train_s > 0:
            self._warned_slow_val = True
            msg = (
                f"validation took {val_s:.1f} s, longer than the {train_s:.1f} s of training since the previous "
                f"one: validate less often (validation_interval, val_check_steps) or score fewer batches "
                f"(limit_val_batches)"
            )
            self.notes.append(msg)
            self.log(f"[plainloop] {msg}")

    def _validate_pending(self) -> dict[str, float]:
        """The validation last.pt announced; a stop during it writes last.pt again, without the pending mark."""
        metrics = self.validate()
        if self._agree_stop():
            self._save("last.pt")
        return metrics

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
        own_test = self.parts is not None and self.parts.adapter.test_step is not None
        if self.task.test_set is None or (self.task.evaluate_fn is None and not own_test) or not self.rt.is_main:
            return {}
        assert self.run_dir is not None
        best = self.run_dir / "checkpoints" / "best.pt"
        if self.cfg.test_with_best and best.is_file():
            ckpt = self.checkpointer.load_weights(best)
            if str(ckpt.get("integrity", "")).startswith("unverified"):
                self.notes.append(f"checkpoint {best}: {ckpt['integrity']}")
            value = f"{self.best.best:.4g}" if self.best.best is not None else "?"
            self.notes.append(f"test: scored with the weights of {best} ({self.best.metric}={value})")
        metrics = self.evaluate("test")
        self.hooks("on_test_end", metrics)
        return metrics

    # ------------------------------------------------------------------ deciding to stop
    def _agree_stop(self) -> int | None:
        """The stop request every rank acts on (trainer/signals.py agree_stop), kept in self.stopping."""
        self.stopping = agree_stop(self.stop, self.rt)
        return self.stopping

    def _early_stop(self) -> bool:
        patience = self.cfg.early_stopping_patience
        if patience is None or self.best.stale < patience:
            return False
        self.notes.append(
            f"early stopping: {self.best.metric} did not improve for {patience} validations "
            f"(best {self.best.best:.4g}); stopped at step {self.progress.step}"
        )
        self.log(f"[plainloop] {self.notes[-1]}")
        return True

    def _diverged(self, run: int) -> None:
        assert self.run_dir is not None
        msg = (
            f"stopped at step {self.progress.step}: the last {run} optimizer steps had non-finite loss or gradients "
            f"and were skipped (--max_consecutive_skips {self.cfg.max_consecutive_skips}). Nothing non-finite was "
            f"saved; {self.run_dir / 'checkpoints'} holds the last finite weights. Try a lower --lr, "
            f"--gradient_clip_val 1.0, precision 32, or check the data for NaN/inf values."
        )
        self._row({"kind": "event", "step": self.progress.step, "event": "diverged", "message": msg})
        self.log(f"[plainloop] {msg}")
        if self.files is not None:
            self.files.close()
        if self.rt.distributed:
            dist.barrier()  # every rank diverges at the same step (averaged gradients); none exits before rank 0
        raise TrainingDiverged(3)

    def _stopped_by_signal(self, signum: int, train_time: float) -> None:
        assert self.run_dir is not None
        name = self.stop.name
        msg = (
            f"{name}: stopped after step {self.progress.step} ({self.progress.position(self.batches_per_epoch)}); "
            f"{self.run_dir / 'checkpoints' / 'last.pt'} written. Resume with: "
            f"{resume_hint(self.run_dir, launch_prefix())}"
        )
        self._row({"kind": "event", "step": self.progress.step, "event": "stopped", "signal": name})
        self.log(f"[plainloop] {msg}")
        summary = self._summary(train_time, {}, {})  # on every rank: under DDP it holds a collective
        if self.files is not None:
            summary["stopped_by"] = name
            self.files.write_json("summary.json", summary)
            self.files.close()
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
            self.files = files = RunFiles(
                self.run_dir,
                self._on_row,
                resumed_step=self.progress.step if cfg.resume else None,
                val_pending=self.progress.val_pending is not None,
            )
            if files.removed:
                self.notes.append(f"removed {len(files.removed)} temp file(s) left by an interrupted write")
            if files.rolled_back:
                self.notes.append(
                    f"resume: {files.rolled_back} metrics row(s) written after the checkpoint's step "
                    f"{self.progress.step} are trained again; moved from metrics.jsonl to {ROLLED_BACK}"
                )
            self._write_config(files, self.run_dir)
        self.hooks("on_fit_start")
        for n in self.notes:
            self.log(f"[plainloop] {n}")
        self.log(
            f"[plainloop] {self.task.name}: {_samples(self.task.train_set)} train samples, "
            f"{self.batches_per_epoch} batches/epoch, {self.total_steps} optimizer steps, device {rt.device}, "
            f"precision {rt.precision}, model {knobs.describe_parameters(self.model_size)}, run dir {self.run_dir}"
        )

    def _write_config(self, files: RunFiles, run_dir: Path) -> None:
        rt = self.rt
        resolved = {
            **self.requested.to_dict(),
            "precision": rt.precision,
            "num_workers": self.loader_kw.get("num_workers", 0),
            "warmup_steps": self.warmup_steps,
            "resume": None,
        }
        files.write_json(
            "config.json",
            {
                "requested": self.requested.to_dict(),
                "effective": {
                    **self.cfg.to_dict(),
                    **{k: resolved[k] for k in ("precision", "num_workers", "warmup_steps")},
                },
                "runtime": {
                    "device": str(rt.device),
                    "precision": rt.precision,
                    "world_size": rt.world_size,
                    "notes": self.notes,
                },
                "task": {"name": self.task.name, **self.task.info},
                "optimizer": self.optimizer_hparams,  # the real hyper-parameters of the optimizer that runs
            },
        )
        settings = {**self.config_sections, "train": resolved}
        self.checkpointer.settings = settings  # every checkpoint carries them: config.toml is not the only copy
        write_config_file(
            run_dir / "config.toml",
            settings,
            rerun_hint(run_dir / "config.toml"),
        )

    def _on_row(self, row: dict[str, Any]) -> None:
        self.hooks("on_log", row)

    def _row(self, row: dict[str, Any]) -> None:
        if self.files is not None:  # rank 0
            self.files.log(row)

    def _save(self, name: str, background: bool = False) -> None:
        if self.rt.is_main:
            assert self.run_dir is not None
            self.checkpointer.save(name, self.run_dir, self.files, background=background)

    def _open_bar(self) -> Any:
        return open_bar(self.cfg.progress_bar and self.rt.is_main, self._total_batches(), self.batches_total_done())

    def _total_batches(self) -> int:
        return min(self.max_epochs * self.batches_per_epoch, self.total_steps * self.cfg.accumulate_grad_batches)

    def _epoch_line(self, t0: float) -> str:
        done, total = self.batches_total_done(), self._total_batches()
        ran = done - self._start_batches
        eta = (time.perf_counter() - t0) / ran * (total - done) if ran > 0 else float("nan")
        p = self.progress
        return epoch_line(
            # p.epoch counts finished epochs; stopped mid-epoch (max_steps, a signal) the run is inside the next one
            epoch=p.epoch + (1 if p.batches_done else 0),
            max_epochs=self.max_epochs,
            step=p.step,
            total_steps=self.total_steps,
            row=self.last_row,
            saved="last.pt writing in the background" if self.checkpointer.writing else "last.pt saved",
            eta_s=eta,
            extra=self.parts.adapter.logger.train_names if self.parts is not None else (),
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
            start_step=self._start_step,
            train_time=train_time,
            stats=self.stats,
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
        summary = self._summary(train_time, self.last_val, test, weight_diff)
        summary["model"] = {
            "parameters": self.model_size["total"],
            "trainable": self.model_size["trainable"],
            "size_mb": self.model_size["size_mb"],
        }
        self.hooks("on_fit_end", summary)
        if self.files is not None:
            self.files.write_json("summary.json", summary)
            self.files.close()
        return summary


def _first_sample(ds: Any) -> Any:
    """The first (x, y) sample when the dataset can be indexed (for the default loss's look at the targets)."""
    try:
        sample = ds[0]
    except Exception:  # an iterable or lazily opened dataset: no peek, plain MSE
        return None
    if isinstance(sample, list | tuple) and len(sample) > 1 and isinstance(sample[1], torch.Tensor):
        return sample
    return None


def _samples(ds: Any) -> str:
    try:
        return str(len(ds))
    except TypeError:  # a stream (IterableDataset)
        return "streamed"
