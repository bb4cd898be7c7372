"""The training loop: one explicit loop, readable top to bottom.

    for epoch:
        for batch:  forward under autocast -> scaled backward -> [every k micro-batches] unscale, check, clip,
                    optimizer step (skipped on the device if not finite), schedule -> [LOG_EVERY] read the loss
                    back -> [NORM_EVERY] grad norm and task step-metrics
        last.pt, then validate every `validation_interval` epochs (or `val_check_steps` steps) and best.pt
    test, summary.json

Hot-path rule: between two log points nothing here waits for the GPU; the only host-device syncs are marked
"note: sync point". Set-up (data, model, optimizer, resume) is in `trainer/build.py`, the optimizer step in
`trainer/step.py`, evaluation in `trainer/evaluation.py`, the run's files in `trainer/runfiles.py`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .build import build_run, open_run_dir, save_checkpoint
from .config import TrainConfig
from .data import batch_size_of, close_loader, split_batch, to_device
from .evaluation import evaluate_split, validate
from .finish import (
    ddp_weight_diff,
    diverged,
    early_stop,
    stopped_by_signal,
    summary_of,
    test_split,
)
from .hooks import Monitor, call
from .progress import epoch_line, open_bar
from .runfiles import RunFiles
from .setup import release_ddp
from .signals import StopRequest
from .step import shrink_micro_batch
from .task import Task, read_step_metrics

_NULL = contextlib.nullcontext()  # stateless, so one instance serves every step


class Trainer:
    """Train `task` with `cfg`. `fit()` returns the summary that is also written to summary.json.

    callbacks: objects with on_fit_start / on_log / on_fit_end (trainer/hooks.py); monitor: an object with
    seed 001's TrainingMonitor API, fed every iteration's time, data wait and batch size.
    """

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
        self.config_sections = config_sections or {}  # task/run settings written beside [train] in config.toml
        self.step = self.epoch = self.batches_done = 0  # optimizer steps, finished epochs, batches into the epoch
        self.chunks = 1  # micro-batches each batch is cut into after a CUDA out-of-memory error
        self.files: RunFiles | None = None
        self.bar = None
        self.sampler_epoch_state: dict[str, Any] | None = None  # the sampler's state at this epoch's start
        self.last_val_metrics: dict[str, float] = {}  # the latest validation's scores (final_metrics)
        self.val_pending: int | None = None  # step whose validation the next checkpoint must announce (resume)
        build_run(self)  # runtime, data, model, optimizer, schedule, resume: trainer/build.py

    def log(self, msg: str) -> None:
        if self.rt.is_main:  # printed above a live bar; a log= callable of the caller's gets every line itself
            (self.bar.write if self.bar is not None and self._print is print else self._print)(msg)

    # ------------------------------------------------------------------ one step
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
                shrink_micro_batch(self, batch)

    def _forward_backward(self, batch: Any, window: int, sync_grads: bool) -> torch.Tensor:
        with self.model.no_sync() if self.rt.distributed and not sync_grads else _NULL:
            with self.rt.autocast() if self._amp else _NULL:
                loss = self.loss_fn(self.model, batch)
            self.opt.backward(loss, window)
        return loss.detach()

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        """Train, validate and test; returns the summary (also written to RUN_DIR/summary.json)."""
        try:
            return self._fit()
        except BaseException:
            if self.files is not None:  # a fit that failed releases its run dir: the same process may resume it
                self.files.close()
            raise
        finally:
            close_loader(self.loader)  # its workers ignore SIGTERM: none may be left for interpreter exit
            if self.rt.distributed:
                release_ddp(self)

    def _fit(self) -> dict[str, Any]:
        cfg, rt = self.cfg, self.rt
        self.files = open_run_dir(self)
        for n in self.notes:
            self.log(f"[plainloop] {n}")
        self.log(
            f"[plainloop] {self.task.name}: {_n(self.task.train_set)} train samples, {self.batches_per_epoch} "
            f"batches/epoch, {self.total_steps} optimizer steps, device {rt.device}, precision {rt.precision}, "
            f"run dir {self.run_dir}"
        )
        self.monitor.start_monitoring()
        t0, stopped, last_val = time.perf_counter(), None, {}
        self.stats = {"samples": 0, "data_s": 0.0, "iters": 0, "iter_s": 0.0}
        call(self.callbacks, "on_train_start", self)
        self._start_batches, self._start_step = self.batches_total_done(), self.step
        try:
            with StopRequest() as stop:
                self.stop, self.stopping = stop, None
                open_bar(self)
                halted = False
                if self.val_pending is not None:  # resumed from a checkpoint written right before a validation
                    last_val = self._validate_pending() or last_val
                    halted = early_stop(self)
                else:
                    self._agree_stop()  # a stop during set-up: no epoch starts
                # self.stopping: the last agreed stop (after the epoch's end or its validation)
                while (
                    not halted and not self.stopping and self.epoch < self.max_epochs and self.step < self.total_steps
                ):
                    self._train_epoch()
                    # DDP: agree once more, so a signal that reached one rank after the epoch's last log point
                    # cannot send that rank out of the loop while the others validate
                    stopping = self._agree_stop()
                    epoch_done, last = self.batches_done == 0, self.step >= self.total_steps
                    val_now = cfg.val_check_steps is None and (
                        last or (epoch_done and self.epoch % cfg.validation_interval == 0)
                    )
                    if epoch_done or last or stopping:
                        # before validation: a stop during it (or before it) loses nothing, the resume runs it first
                        due = val_now or (last and cfg.val_check_steps is not None and self._last_val_step != self.step)
                        self.val_pending = self.step if due and self.task.val_set is not None else None
                        self._save("last.pt")
                        epoch_line(self, t0)
                    if stopping:
                        break
                    if val_now:
                        last_val = self._validate_pending() or last_val
                    if early_stop(self):
                        break
                stopped = self._agree_stop()
        finally:
            self.monitor.stop_monitoring()
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        train_time = time.perf_counter() - t0
        call(self.callbacks, "on_train_end", self)
        if stopped:
            stopped_by_signal(self, stopped, train_time)
        if cfg.val_check_steps is not None and self.task.val_set is not None and self._last_val_step != self.step:
            last_val = validate(self)
        # compared before rank 0 alone loads best.pt to score the test split (--test_with_best)
        weight_diff = ddp_weight_diff(self.raw_model) if rt.distributed else None
        test = test_split(self)
        summary = summary_of(self, train_time, last_val or self.last_val_metrics, test, weight_diff)
        if rt.is_main:
            call(self.callbacks, "on_fit_end", self, summary)
            self.files.write_json("summary.json", summary)
            self.files.close()
        return summary

    def _validate_pending(self) -> dict[str, float]:
        """The validation last.pt announced; a stop during it writes last.pt again, without the pending mark."""
        metrics = validate(self)
        if self._agree_stop():
            self._save("last.pt")
        return metrics

    def _agree_stop(self) -> int | None:
        """The stop request every rank acts on, kept in self.stopping: the live flag (a signal handler may set it
        at any moment) on one process; under DDP the ranks' flags all-reduced, so they all take the same branch."""
        signum = self.stop.signum
        if self.rt.distributed:
            flag = torch.tensor(float(signum or 0), device=self.rt.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            signum = int(flag.item()) or None  # note: sync point (log points, epoch ends, validations)
            self.stop.signum = self.stop.signum or signum  # a rank that was not signalled names the signal too
        self.stopping = signum
        return signum

    def _train_epoch(self) -> None:
        cfg, model, accum = self.cfg, self.model, self.cfg.accumulate_grad_batches
        model.train()
        start, nb = self.batches_done, self.batches_per_epoch
        cbs = self.callbacks
        call(cbs, "on_train_epoch_start", self, self.epoch)
        replay = 0
        if start == 0:
            self.sampler.set_epoch(self.epoch)
        elif hasattr(self.sampler, "load_state_dict"):
            # resuming mid-epoch: the sampler regenerates this epoch's order and skips what was consumed
            self.sampler.load_state_dict({**self.sampler.state_dict(), "epoch": self.epoch, "batches_done": start})
        else:  # a sampler without state: replay its epoch and drop the batches already trained
            self.sampler.set_epoch(self.epoch)
            replay = start
        pending: list[torch.Tensor] = []  # per-batch losses, kept on the device until the next log point
        # locals: this loop runs once per batch, and on small models its Python cost is measurable
        perf, fb, opt_step, log_iter = (
            time.perf_counter,
            self.forward_backward,
            self.opt.step,
            self.monitor.log_iteration,
        )
        log_every, norm_every, total = cfg.log_every, cfg.norm_every, self.total_steps
        val_steps, ckpt_steps, bar, bar_every = (
            cfg.val_check_steps,
            cfg.checkpoint_every,
            self.bar,
            cfg.progress_every,
        )
        move, stop, ddp = (None if self.on_device else self.rt.device), self.stop, self.rt.distributed
        n_samples = n_iters = 0  # this epoch's totals, and since the last log point (i_*)
        data_s = iter_s = i_data = 0.0
        # the sampler's state before this epoch's order is drawn: a checkpoint mid-epoch saves it, so that a resume
        # draws the same order again (a sampler with its own RNG) and skips the batches already trained
        self.sampler_epoch_state = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}
        it, window_start, t0, agreed = iter(self.loader), start, perf(), False
        for _ in range(replay):
            next(it)
        i_samples, i_t = 0, t0
        for i in range(start, nb):
            batch = next(it)
            if move is not None:
                batch = to_device(batch, move)
            t_data = perf() - t0
            call(cbs, "on_train_batch_start", self, batch, i)
            window = min(accum, nb - window_start)  # a short last window still averages correctly
            boundary = i + 1 - window_start == window
            last_loss = fb(batch, window, boundary)
            pending.append(last_loss)
            bs = batch_size_of(batch)
            i_samples += bs
            i_data += t_data
            if boundary:
                self.step += 1
                window_start = self.batches_done = i + 1
                want_norm = self.step % norm_every == 0
                norm, _ = opt_step(want_norm)
                if self.step % log_every == 0 or self.step >= total or i + 1 == nb:
                    i_t = self._log_point(pending, i_samples, i_data, i_t, norm if want_norm else None)
                    i_samples, i_data = 0, 0.0
                    if ddp:  # every rank must stop at the same step: agree at the log point (already a sync)
                        agreed = self._agree_stop() is not None
                elif want_norm:
                    self._log_norm(norm)
                if val_steps is not None and self.step % val_steps == 0:
                    validate(self)
                    model.train()
                if ckpt_steps is not None and self.step % ckpt_steps == 0 and i + 1 < nb:
                    self._save("last.pt")
            call(cbs, "on_train_batch_end", self, last_loss, batch, i)
            t1 = perf()
            log_iter(t1 - t0, t_data, bs)
            n_samples += bs
            n_iters += 1
            data_s += t_data
            iter_s += t1 - t0
            if bar is not None and ((i + 1) % bar_every == 0 or i + 1 == nb):
                bar.update(self.batches_total_done() - bar.n)
            t0 = t1
            if self.step >= total or agreed or (boundary and stop.signum and not ddp):
                break
        for k, v in (("samples", n_samples), ("iters", n_iters), ("data_s", data_s), ("iter_s", iter_s)):
            self.stats[k] += v
        if self.batches_done >= nb:  # the epoch ran to its end (not stopped by max_steps or a signal)
            call(cbs, "on_train_epoch_end", self, self.epoch)
            self.epoch += 1
            self.batches_done = 0
        del it

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
        row = {
            "kind": "train",
            "step": self.step,
            "epoch": self.epoch + 1,
            "loss": loss,
            "lr": self.scheduler.current_lr(),
            "samples_per_s": samples * self.rt.world_size / elapsed,
            "data_wait_frac": data_s / elapsed,
            "skipped_steps": skipped,
        }
        if self.parts is not None:
            row.update(self.parts.hooks.train_logs())
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
            diverged(self, run)
        return now

    def _log_norm(self, norm: torch.Tensor | None) -> None:
        row = {"kind": "norm", "step": self.step, **read_step_metrics(self.task)}
        if norm is not None:
            row["grad_norm"] = norm.item()  # note: sync point (NORM_EVERY)
        self._row(row)

    # ------------------------------------------------------------------ validation, stopping, files
    def evaluate(self, split: str) -> dict[str, float]:
        """The task's scores on "val" or "test" with the current weights."""
        return evaluate_split(self, split)

    def batches_total_done(self) -> int:
        return self.epoch * self.batches_per_epoch + self.batches_done

    def _row(self, row: dict[str, Any]) -> None:
        if self.rt.is_main and self.files is not None:
            self.files.log(row)

    def _save(self, name: str) -> None:
        if self.rt.is_main:
            save_checkpoint(self, name)


def _n(ds: Any) -> str:
    try:
        return str(len(ds))
    except TypeError:  # a stream
        return "streamed"
