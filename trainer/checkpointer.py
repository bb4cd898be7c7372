"""The run's state in and out of checkpoints: what last.pt / best.pt hold, writing them, and resuming from one.

`Checkpointer` is given every object whose state a checkpoint holds (model, optimizer, schedule, optimizer step,
sampler, best value, callbacks, and the `Progress` the loop advances); the file format itself (atomic writes,
the digest, safe loading) is `trainer/checkpoint.py`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import CheckpointError, atomic_save, load_checkpoint, snapshot_to_host
from .config import TrainConfig
from .evaluation import BestTracker
from .hooks import Hooks
from .optim import Schedule
from .runfiles import RunDirError, RunFiles, finished
from .runtime import Runtime, launch_prefix, rng_state, set_rng_state
from .step import OptimizerStep
from .usercode import resume_hint

FORMAT = "plainloop-2"  # plainloop-1 (the scaler at the top level, no opt_step) still loads


# what a checkpoint's position is counted in: another value cannot continue the run exactly (refused)
FIXED_ON_RESUME = ("batch_size", "accumulate_grad_batches", "seed")


class ResumeError(ValueError):
    """A checkpoint that cannot continue this run (other model shapes, another task)."""


@dataclass
class Progress:
    """Where the run stands; the loop advances it and every checkpoint records it."""

    epoch: int = 0  # finished epochs
    step: int = 0  # optimizer steps done
    batches_done: int = 0  # batches into the current epoch
    val_pending: int | None = None  # the step whose validation the next checkpoint must announce (see resume)
    last_val_step: int = -1  # the step of the last validation (val_check_steps: not run twice at one step)

    def position(self, batches_per_epoch: int) -> str:
        """Where the run stands, with epochs counted from 1 as the epoch lines count them."""
        if self.batches_done:  # inside epoch self.epoch + 1
            return f"epoch {self.epoch + 1}, batch {self.batches_done} of {batches_per_epoch}"
        return f"end of epoch {self.epoch}"


class Checkpointer:
    """Writes last.pt / best.pt (rank 0) and restores a run from one (every rank)."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        opt_step: OptimizerStep,
        sampler: Any,
        best: BestTracker,
        progress: Progress,
        hooks: Hooks,
        cfg: TrainConfig,
        task_name: str,
        rt: Runtime,
    ) -> None:
        self.model, self.optimizer, self.schedule, self.opt_step = model, optimizer, schedule, opt_step
        self.sampler, self.best, self.progress, self.hooks = sampler, best, progress, hooks
        self.cfg, self.task_name, self.rt = cfg, task_name, rt
        # the run's full resolved settings ({table: {key: value}}, as config.toml holds them): every checkpoint
        # carries them, so `--resume RUN_DIR` alone restores the run even with config.toml missing or empty
        self.settings: dict[str, dict[str, Any]] | None = None
        self.sampler_epoch_state: dict[str, Any] | None = None  # the sampler's state at this epoch's start
        # save(background=True): the one write in flight, its on_log row, and what it failed with
        self._writer: threading.Thread | None = None
        self._written: dict[str, Any] | None = None
        self._write_error: BaseException | None = None

    # ------------------------------------------------------------------ out
    def state(self) -> dict[str, Any]:
        p = self.progress
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "opt_step": self.opt_step.state_dict(),
            "epoch": p.epoch,
            "step": p.step,
            "batches_done": p.batches_done,
            "sampler": {**self._sampler_state(), "epoch": p.epoch, "batches_done": p.batches_done},
            "best": self.best.state_dict(),
            # a checkpoint written right before a validation: a resume runs that validation first (None: none due)
            "val_pending": p.val_pending,
            "last_val_step": p.last_val_step,  # a resume at this step does not validate it again (val_check_steps)
            "rng": rng_state(),
            "config": self.cfg.to_dict(),
            "task": self.task_name,
            # steps and the position in the epoch count batches of this many processes: a resume needs as many
            "world_size": self.rt.world_size,
            "launch": launch_prefix(),
            "format": FORMAT,
        }
        if self.settings is not None:
            state["settings"] = self.settings
        callbacks = self.hooks.state_dict()
        if callbacks:  # only when a callback keeps state: checkpoints without one stay as they were
            state["callbacks"] = callbacks
        return state

    def _sampler_state(self) -> dict[str, Any]:
        """Mid-epoch: the sampler's state from the epoch's start (a resume draws that epoch's order again and skips
        what was trained); at an epoch's end: its state now. A sampler without state_dict: position only."""
        if self.progress.batches_done and self.sampler_epoch_state is not None:
            return dict(self.sampler_epoch_state)
        return self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}

    def save(self, name: str, run_dir: Path, files: RunFiles | None, *, background: bool = False) -> Path:
        """Write checkpoints/<name> atomically, refusing non-finite weights (they would poison a resume).

        best.pt also writes best.json. Rank 0 only: the other ranks hold the same state.
        background: copy the state to host memory (the loop's only wait) and write it from a thread while
        training goes on. One write at a time: a save first waits for the one in flight, so files land in
        order, and a crash mid-write leaves the previous file whole (atomic_save's rename).
        """
        params = dict(self.model.named_parameters())
        finite = (
            torch.stack([torch.isfinite(p).all() for p in params.values()])
            if params
            else torch.ones(1, dtype=torch.bool)
        )
        if not bool(finite.all()):  # note: sync point (checkpoint)
            bad = [n for n, ok in zip(params, finite.tolist()) if not ok]
            raise RunDirError(
                f"refusing to write {name}: parameter(s) {bad[:5]} are not finite; the previous "
                f"checkpoint in {run_dir / 'checkpoints'} is kept"
            )
        self.wait()
        state = self.state()
        self.hooks("on_save_checkpoint", state)
        p = self.progress
        path = run_dir / "checkpoints" / name
        best = {"metric": self.best.metric, "value": self.best.best, "step": p.step, "epoch": p.epoch}
        row = {"kind": "checkpoint", "name": name, "step": p.step, "path": str(path)}
        if not background:
            if self.rt.device.type == "cuda":  # one batched copy to host: the digest and torch.save then read it
                state = snapshot_to_host(state)
            self._write(state, path, best if name == "best.pt" else None, files)
            self.hooks("on_log", row)
            return path
        snap = snapshot_to_host(state)
        self._written, self._write_error = row, None
        self._writer = threading.Thread(
            target=self._write_in_background,
            args=(snap, path, best if name == "best.pt" else None, files),
            name=f"plainloop-save-{name}",
        )
        self._writer.start()
        return path

    @staticmethod
    def _write(state: dict[str, Any], path: Path, best: dict[str, Any] | None, files: RunFiles | None) -> None:
        atomic_save(state, path)
        if best is not None and files is not None:
            files.write_json("best.json", best)

    def _write_in_background(
        self, state: dict[str, Any], path: Path, best: dict[str, Any] | None, files: RunFiles | None
    ) -> None:
        try:
            self._write(state, path, best, files)
        except BaseException as e:  # raised on the loop's thread by wait()
            self._write_error = e

    def wait(self) -> None:
        """Until the background write in flight (if any) is on disk; then its on_log event (on the loop's
        thread, so callbacks see the file). A failed write raises here, naming the file."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.join()
        row, self._written = self._written, None
        err, self._write_error = self._write_error, None
        if err is not None:
            path = row["path"] if row else "a checkpoint"
            raise CheckpointError(
                f"writing {path} in the background failed: {err}; the previous file is kept "
                f"(free disk space or check the output directory, then resume)"
            ) from err
        if row is not None:
            self.hooks("on_log", row)

    @property
    def writing(self) -> bool:
        """A background write is still in flight."""
        return self._writer is not None and self._writer.is_alive()

    # ------------------------------------------------------------------ in
    def load_weights(self, path: Path) -> dict[str, Any]:
        """Load only the model's weights (test_with_best); returns the checkpoint."""
        ckpt = load_checkpoint(path, map_location=self.rt.device)
        try:
            self.model.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            shapes = [
                line.strip()
                for line in str(e).splitlines()
                if "size mismatch" in line or "Missing" in line or "Unexpected" in line
            ]
            raise ResumeError(
                f"{path}: its weights do not fit this model; the run that wrote it used other model "
                f"settings. Differences: {'; '.join(shapes[:6]) or str(e)[:300]}. Resume with the run's "
                f"own settings (--resume RUN_DIR alone restores them)."
            ) from None
        return ckpt

    def resume(self, path: Path, total_steps: int, batches_per_epoch: int, notes: list[str]) -> Path | None:
        """Restore every part's state from `path` (a checkpoint or a run directory's last.pt); one line per
        remark goes to `notes`. Returns the run directory the checkpoint lives in, or None."""
        ckpt = self.load_weights(path)
        if str(ckpt.get("integrity", "")).startswith("unverified"):
            notes.append(f"checkpoint {path}: {ckpt['integrity']}")
        if ckpt.get("task") not in (None, self.task_name):
            raise ResumeError(f"{path} is a checkpoint of task {ckpt['task']!r}, not {self.task_name!r}")
        self._check_world_size(path, ckpt)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.schedule.load_state_dict(ckpt["scheduler"])
        if "opt_step" in ckpt:
            self.opt_step.load_state_dict(ckpt["opt_step"])
        else:  # plainloop-1 checkpoints kept the scaler at the top level
            self.opt_step.scaler.load_state_dict(ckpt["scaler"])
        p = self.progress
        p.epoch, p.step, p.batches_done = int(ckpt["epoch"]), int(ckpt["step"]), int(ckpt["batches_done"])
        if hasattr(self.sampler, "load_state_dict") and "sampler" in ckpt:
            self.sampler.load_state_dict(ckpt["sampler"])  # its own state (an RNG, a stream's position) too
        best = ckpt.get("best")
        self.best.load_state_dict(best if isinstance(best, dict) else {"best": best})
        set_rng_state(ckpt["rng"])
        p.val_pending = p.step if ckpt.get("val_pending") == p.step else None
        p.last_val_step = int(ckpt.get("last_val_step", -1))
        run_dir: Path | None = path if path.is_dir() else path.parent.parent
        assert run_dir is not None
        in_run_dir = (run_dir / "checkpoints").is_dir()
        if in_run_dir and p.val_pending is None:  # a pending validation is redone from the checkpoint's own best
            self._read_best_json(run_dir)
        old = ckpt.get("config", {})
        for k in FIXED_ON_RESUME:
            if k in old and old[k] != getattr(self.cfg, k):
                raise ResumeError(
                    f"{path} was trained with {k} {old[k]}, and this run has {getattr(self.cfg, k)}: the step count, "
                    f"the place in the epoch and the data order are counted with it, so the run cannot continue "
                    f"exactly. Resume with {k} {old[k]}, or start a new run with the new value"
                )
        if p.step > total_steps:
            raise ResumeError(
                f"{path} is at step {p.step}, beyond this run's {total_steps} optimizer steps: give at least as many "
                f"steps (--max_steps {p.step} or more --epochs), or leave the length as the run had it"
            )
        old_total = ckpt["scheduler"].get("total_steps")
        now_total = getattr(self.schedule, "total_steps", total_steps)  # lr_decay_steps: the schedule's own horizon
        if old_total is not None and int(old_total) != now_total:
            notes.append(
                f"schedule: the run now has {total_steps} optimizer steps (was {old_total}); warm-up and "
                f"cosine are recomputed for the new length and continue from step {p.step}"
            )
        # a finished run's last.pt still announces its final validation (written right before it): finished wins
        done = in_run_dir and finished(run_dir, p.step)  # from the checkpoint's step and the summary, not file times
        if p.step >= total_steps and (p.val_pending is None or done):
            if not in_run_dir or done:
                raise ResumeError(
                    f"{path} is already at step {p.step} of {total_steps}: nothing left to train. Give more "
                    f"--epochs or --max_steps to extend it"
                )
            # stopped after its last step but before its summary (e.g. killed while scoring the test split)
            notes.append(f"resume: training had ended at step {p.step}; the run ends with its test scores and summary")
        notes.append(f"resume: {path} at step {p.step} ({p.position(batches_per_epoch)})")
        if p.val_pending is not None:
            notes.append(
                f"resume: the validation at step {p.step} may not have finished before the stop; it runs first"
            )
        # the callbacks last: on_load_checkpoint sees the engine's state complete
        unused = self.hooks.load_state_dict(ckpt.get("callbacks") or {})
        if unused:
            notes.append(f"resume: no callback of this run takes the saved state of {', '.join(unused)}")
        self.hooks("on_load_checkpoint", ckpt)
        return run_dir if in_run_dir else None

    def _check_world_size(self, path: Path, ckpt: dict[str, Any]) -> None:
        """Refuse a resume with another number of processes: the step count, the position inside the epoch and the
        effective batch (batch_size x processes) were counted for the old number, and would silently mean other
        data and another schedule (checkpoints written before plainloop recorded it are not checked)."""
        old = ckpt.get("world_size")
        if old is None or int(old) == self.rt.world_size:
            return
        launch = ckpt.get("launch") or ("python" if int(old) == 1 else f"torchrun --nproc_per_node {old}")
        raise ResumeError(
            f"{path} was written by a run of {old} process{'es' if int(old) > 1 else ''} and this one has "
            f"{self.rt.world_size}: its steps, its position in the epoch and its effective batch (batch_size x "
            f"processes) do not carry over to another number. Resume it with {old}: "
            f"{resume_hint(path, launch)}"
        )

    def _read_best_json(self, run_dir: Path) -> None:
        """best.pt may be newer than last.pt (validation runs after the epoch checkpoint): its value wins."""
        try:
            v = json.loads((run_dir / "best.json").read_text(encoding="utf-8")).get("value")
        except (OSError, ValueError):
            return
        if v is not None and v != self.best.best:
            self.best.best, self.best.stale = float(v), 0
