"""The run's state: one registry of what a checkpoint holds, writing it, resuming from it, and what may change.

    RunState        every part with state registers once (a key and an object with state_dict/load_state_dict);
                    a checkpoint is the registry walked out, a resume the registry walked in, so the two match
    Checkpointer    decides when last.pt is due, writes last.pt / best.pt from the registry (in the background on a
                    GPU) and resumes a run
    resume_changes  the one rule for a resumed run: a setting in RESUME_MAY_CHANGE may differ, any other is fixed
    check_resume    the one resume check (task, processes, fixed settings, length): the command line calls it early

The file format (atomic writes, the digest, safe loading) is the leaf's, `trainer/support/checkpoint_file.py`.
"""

from __future__ import annotations

import json
import math
import shlex
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import nn

from .checkpoint import (
    CheckpointError,
    NotStorable,
    StateDict,
    atomic_save,
    load_checkpoint,
    snapshot_to_host,
    storable,
    storage_error,
)
from .config import TrainConfig
from .evaluation import BestTracker
from .hooks import Hooks
from .runfiles import RunFiles, finished, refuse_if_live
from .runtime import Runtime, launch_prefix
from .support import RngState
from .usercode import UNKNOWN_LENGTH, cli_resume_line, own_settings_hint, resume_hint

Settings = dict[str, dict[str, Any]]  # {table: {key: value}}, as config.toml and every checkpoint hold them

FORMAT = "plainloop-2"  # plainloop-1 (the scaler at the top level, no opt_step) still loads

# ------------------------------------------------------------------------------------------- what may change
# TrainConfig fields a resumed run may change: when and how it logs, validates, saves and loads data, where it
# runs, and how long it is. The fixed ones (RESUME_FIXED): the step count, the data order, the optimizer's state,
# the schedule and the saved weights were made with them. Every field is in one of the two (tests/test_resume_rules.py).
RESUME_MAY_CHANGE = frozenset(
    {
        "output_dir", "run_name", "resume", "epochs", "max_steps", "max_batches", "early_stopping_patience",
        "max_consecutive_skips", "num_threads", "device", "num_workers", "pin_memory", "persistent_workers",
        "prefetch_factor", "multiprocessing_context", "device_cache", "log_every", "norm_every", "progress_every",
        "progress_bar", "validation_interval", "val_check_steps", "val_check_batches", "limit_val_batches",
        "checkpoint_every", "checkpoint_interval", "async_checkpoint", "save_best", "save_top_k", "test_with_best",
        "compile_model", "compile_mode", "cudnn_benchmark", "channels_last", "deterministic", "fused", "summary",
        "warmup_steps",  # derived from the run's length when not given: a longer run recomputes it (a note says so)
        # the EMA only reads the weights: added on resume it starts from them, left out it is dropped (a note each)
        "ema_decay", "ema_every", "ema_warmup", "ema_warmup_power", "fsdp_cpu_offload",
    }
)  # fmt: skip
RESUME_FIXED = frozenset({
    "seed", "baseline", "batch_size", "accumulate_grad_batches", "lr", "ref_batch_size", "lr_scaling", "weight_decay",
    "min_lr_ratio", "gradient_clip_val", "gradient_clip_algorithm", "adam_betas", "adam_eps", "lr_decay_steps",
    "precision", "loss_scale", "tf32", "sync_batchnorm", "drop_last", "shuffle", "data_order", "strategy"})  # fmt: skip
# keys of the other settings tables ([run], [task]) that may change: where files are (a user task's data_root too),
# the loader's workers, the measuring and reporting tools. Every other key is fixed (tasks.RESUME_FIXED_SETTINGS).
TABLE_MAY_CHANGE = frozenset({
    "data_path", "cache_dir", "data_root", "device_cache", "eval_workers", "logger", "plots", "monitor_interval",
    "profile", "profile_then_train", "system_report", "report_steps", "report_repeats", "price_per_kwh", "trust_task",
    "price_per_gpu_hour", "currency", "power_w", "auto_batch_size", "auto_num_workers", "config", "debug"})  # fmt: skip


def resume_changes(old: Settings, new: Settings) -> list[tuple[str, object, object]]:
    """(key, saved value, value now) for each fixed setting that differs between a checkpoint's settings and this
    run's ({table: {key: value}}). None is a value like any other (an unset setting given one is a change); only a
    key the checkpoint's table lacks (written before the setting existed) is not compared."""
    out = []
    for table, values in new.items():
        saved = old.get(table)
        if not isinstance(saved, dict):
            continue
        may = RESUME_MAY_CHANGE if table == "train" else TABLE_MAY_CHANGE
        for key, value in values.items():
            if key in may or key not in saved:
                continue
            a, b = _plain(saved[key]), _plain(value)
            if a != b:
                out.append((key, a, b))
    return out


def _plain(v: object) -> object:
    """TOML and checkpoints bring tuples back as lists and may turn 1.0 into 1: compare the plain forms."""
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


class ResumeError(ValueError):
    """A checkpoint that cannot continue this run (other settings or model shapes, another task)."""


class SettingsChanged(ResumeError):
    """A resume that changes fixed settings (`changed`: (key, saved, now) each) or gives fewer steps than the
    checkpoint's `step`; a door may word it in its own terms (the command line names its flags)."""

    def __init__(self, message: str, changed: list[tuple[str, object, object]], step: int | None = None) -> None:
        super().__init__(message)
        self.changed, self.step = changed, step


class RunFinished(ResumeError):
    """Resuming a run that already ended (trained to its last step, or stopped early): nothing is redone."""


def check_resume(
    ckpt: StateDict,
    path: Path,
    settings: Settings,
    task: str | None = None,
    world_size: int | None = None,
    total_steps: int | None = None,
    config: dict[str, Any] | None = None,
) -> None:
    """The one resume check: can `ckpt` (read from `path`) continue a run of `task` with `settings` ({table: {key:
    value}}, a key left out is not compared), `world_size` processes and `total_steps` optimizer steps? None skips
    that comparison; `config`: the TrainConfig in effect, compared with a checkpoint from before settings were
    kept (default: settings' [train]). A ResumeError names the file and what differs. The command line calls it
    before its long set-up with what it knows then; the Checkpointer calls it at the resume."""
    if task is not None and ckpt.get("task") not in (None, task):
        old_task = ckpt["task"]
        run = ckpt.get("settings", {}).get("run") if isinstance(ckpt.get("settings"), dict) else None
        spec = run.get("task") if isinstance(run, dict) else None
        fix = f"give --task {shlex.quote(spec)}" if isinstance(spec, str) else "give --task with its builder"
        fix = fix if cli_resume_line(path, launch_prefix()) else f"build the Task named {old_task!r}"
        raise ResumeError(
            f"{path} is a checkpoint of task {old_task!r}, not {task!r} (the task this resume builds); to continue "
            f"it, {fix}; or resume a run of task {task!r}"
        )
    old, resharded = ckpt.get("world_size"), "dcp" in (ckpt.get("model") or {}) and not ckpt.get("batches_done")
    if world_size is not None and old is not None and int(old) != world_size and not resharded:
        launch = ckpt.get("launch") or ("python" if int(old) == 1 else f"torchrun --nproc_per_node {old}")
        raise ResumeError(
            f"{path} was written by a run of {old} process{'es' if int(old) > 1 else ''} and this one has "
            f"{world_size}: its steps, its position in the epoch and its effective batch (batch_size x "
            f"processes) do not carry over to another number. Resume it with {old}: {resume_hint(path, launch)}"
        )
    if isinstance(ckpt.get("settings"), dict):
        changed = resume_changes(ckpt["settings"], settings)
    else:  # written before checkpoints carried the settings: the TrainConfig in effect then and now
        changed = resume_changes({"train": ckpt.get("config") or {}}, {"train": config or settings.get("train", {})})
    if changed:
        raise SettingsChanged(
            f"{path}: a resumed run keeps the settings its state was made with, and these differ: "
            f"{'; '.join(f'{k} {a!r} -> {b!r}' for k, a, b in changed)}. Resume with the run's own values "
            f"({own_settings_hint(path)}), or start a new run with the new ones",
            changed,
        )
    step = ckpt.get("step")
    if total_steps is not None and isinstance(step, int) and step > total_steps:
        raise SettingsChanged(
            f"{path} is at step {step}, beyond this run's {total_steps} optimizer steps: give at least as many "
            f"steps (max_steps {step} or more, or more epochs), or leave the length as the run had it",
            [],
            step,
        )


# ------------------------------------------------------------------------------------------- the parts
class Stateful(Protocol):
    def state_dict(self) -> StateDict: ...

    def load_state_dict(self, state: StateDict) -> object: ...


@dataclass
class Progress:
    """Where the run stands; the loop advances it and every checkpoint records it (at the top level of the file)."""

    epoch: int = 0  # finished epochs
    step: int = 0  # optimizer steps done
    batches_done: int = 0  # batches into the current epoch
    val_pending: int | None = None  # a stop came before this step's validation: a resume runs it first
    last_val_step: int = -1  # the step of the last validation (val_check_steps: not run twice at one step)
    ended: str | None = None  # "finished" or "early_stopped": training is over; a resume does not redo it
    last_val: dict[str, float] = field(default_factory=dict)  # the last validation's scores (for the summary)

    @property
    def epoch_number(self) -> int:
        """The epoch the run is in, counted from 1 (at an epoch's end, that epoch's): rows, files and lines use it."""
        return self.epoch + (1 if self.batches_done else 0)

    def position(self, batches_per_epoch: int) -> str:
        """Where the run stands, with epochs counted from 1 as the epoch lines count them."""
        if self.batches_done:  # a stream of unknown length: no "of N"
            of = f" of {batches_per_epoch}" if batches_per_epoch < UNKNOWN_LENGTH else ""
            return f"epoch {self.epoch_number}, batch {self.batches_done}{of}"
        return f"end of epoch {self.epoch}"

    def state_dict(self) -> StateDict:
        return asdict(self)

    def load_state_dict(self, state: StateDict) -> None:
        self.epoch, self.step, self.batches_done = int(state["epoch"]), int(state["step"]), int(state["batches_done"])
        self.val_pending = self.step if state.get("val_pending") == self.step else None
        self.last_val_step = int(state.get("last_val_step", -1))
        self.ended = state.get("ended")
        self.last_val = {k: float(v) for k, v in (state.get("last_val") or {}).items()}


class SamplerState:
    """The batch sampler's state as a resume needs it: mid-epoch, its state from the epoch's start (the resume
    draws that epoch's order again and skips what was trained); at an epoch's end, its state now. A sampler
    without state_dict saves its position only (the resume replays its epoch)."""

    def __init__(self, sampler: object, progress: Progress) -> None:
        self.progress = progress
        has = callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None))
        self.own = cast(Stateful, sampler) if has else None  # a sampler with a state of its own
        self._epoch_start: StateDict | None = None

    def epoch_started(self) -> None:
        """Called before an epoch's order is drawn from the sampler."""
        self._epoch_start = self.own.state_dict() if self.own is not None else {}

    def state_dict(self) -> StateDict:
        p = self.progress
        # a sampler that resumes from its state now (a stateful stream) needs no replay from the epoch's start
        if p.batches_done and self._epoch_start is not None and not getattr(self.own, "resumes_from_now", False):
            own = self._epoch_start
        else:
            own = self.own.state_dict() if self.own is not None else {}
        return {**own, "epoch": p.epoch, "batches_done": p.batches_done}

    def load_state_dict(self, state: StateDict) -> None:
        if self.own is not None:
            self.own.load_state_dict(state)  # its own state (an RNG, a stream's position) too


class ModelWeights:
    """The model's parameters and buffers; weights of another shape are one error naming the checkpoint (the
    registry's `source`) and the differences."""

    def __init__(self, model: nn.Module, state: RunState) -> None:
        self.model, self.run_state = model, state

    def state_dict(self) -> StateDict:
        return self.model.state_dict()

    def load_state_dict(self, state: StateDict) -> None:
        load_model_state(self.model, state, self.run_state.source)


def load_model_state(model: nn.Module, state: StateDict, source: Path | str | None) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        shapes = [
            line.strip()
            for line in str(e).splitlines()
            if "size mismatch" in line or "Missing" in line or "Unexpected" in line
        ]
        raise ResumeError(
            f"{source or 'the checkpoint'}: its weights do not fit this model; the run that wrote it used other "
            f"model settings. Differences: {'; '.join(shapes[:6]) or str(e)[:300]}. Resume with the run's own "
            f"settings ({own_settings_hint(source or 'RUN_DIR')})."
        ) from None


class CallbackStates:
    """The callbacks' states under their state keys; a saved state no callback takes is one note."""

    def __init__(self, hooks: Hooks, notes: list[str]) -> None:
        self.hooks, self.notes = hooks, notes

    def state_dict(self) -> StateDict:
        return self.hooks.state_dict()

    def load_state_dict(self, state: StateDict) -> None:
        unused = self.hooks.load_state_dict(state or {})
        if unused:
            self.notes.append(f"resume: no callback of this run takes the saved state of {', '.join(unused)}")


class RunState:
    """The registry: each part registers once, under its key ("" puts its entries at the file's top level).

    `state_dict()` walks it out and `load_state_dict()` walks it in, in registration order (callbacks last,
    so on_load_checkpoint sees the engine's state complete). A part marked optional may be absent from a
    checkpoint (an older one, or one without that part), and is left as it is; an empty optional state is not
    written."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, Stateful, bool]] = []
        self.source: Path | None = None  # the checkpoint being loaded, for the parts' errors to name
        self.target: Path | None = None  # the checkpoint being written (a sharded state writes its folder beside it)

    def register(self, key: str, part: Stateful, *, optional: bool = False) -> None:
        if any(k == key and key for k, _, _ in self._parts):
            raise ValueError(f"two parts of the run's state under {key!r}")
        self._parts.append((key, part, optional))

    def state_dict(self) -> StateDict:
        out: StateDict = {}
        for key, part, optional in self._parts:
            state = part.state_dict()
            if not key:
                out.update(state)
            elif state or not optional:
                out[key] = state
        return out

    def load_state_dict(self, ckpt: StateDict, source: Path | None = None) -> None:
        self.source = source
        for key, part, optional in self._parts:
            if not key:
                part.load_state_dict(ckpt)
            elif key in ckpt:
                part.load_state_dict(ckpt[key])
            elif not optional:
                raise ResumeError(f"the checkpoint has no {key!r} state")


def upgrade(ckpt: StateDict) -> StateDict:
    """Older checkpoints in today's layout: plainloop-1 kept the scaler at the top level and best as a number."""
    if "opt_step" not in ckpt and "scaler" in ckpt:
        ckpt["opt_step"] = {"scaler": ckpt["scaler"]}
    if "best" in ckpt and not isinstance(ckpt["best"], dict):
        ckpt["best"] = {"best": ckpt["best"]}
    return ckpt


def _not_written_by_a_run(ckpt: StateDict) -> str | None:
    """What no plainloop run writes, or None: the digest proves a file whole, not that plainloop wrote it."""
    fmt, step, model = ckpt.get("format"), ckpt.get("step", 0), ckpt.get("model")
    if fmt not in (None, FORMAT, "plainloop-1"):
        return f"format {fmt!r} (this plainloop reads {FORMAT} and plainloop-1)"
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step {step!r}, not a whole number >= 0"
    tensors = model.items() if isinstance(model, dict) else ()
    # note: a sync per floating-point tensor, once at the resume
    bad = [k for k, v in tensors if torch.is_tensor(v) and v.is_floating_point() and not bool(v.isfinite().all())]
    return f"non-finite values in the model's {bad[0]!r}" if bad else None


# ------------------------------------------------------------------------------------------- the checkpointer
@dataclass
class SaveClock:
    """When last.pt is due: every `interval_s` seconds of training (0: at every epoch end)."""

    interval_s: float
    last: float = field(default_factory=lambda: time.perf_counter())

    def due(self, epoch_end: bool) -> bool:
        if self.interval_s <= 0:
            return epoch_end
        return time.perf_counter() - self.last >= self.interval_s

    def reset(self) -> None:
        self.last = time.perf_counter()


class Checkpointer:
    """Writes last.pt / best.pt from the run's state (rank 0) and restores a run from one (every rank).

    `header` is what says which run a checkpoint belongs to (task, config, settings, processes); `state` the
    registry. `settings` ({table: {key: value}}, as config.toml holds them) rides in every checkpoint, so
    `--resume RUN_DIR` alone restores the run even with config.toml missing or empty."""

    def __init__(
        self,
        *,
        state: RunState,
        model: nn.Module,
        progress: Progress,
        best: BestTracker,
        hooks: Hooks,
        cfg: TrainConfig,
        settings: Settings,
        task_name: str,
        rt: Runtime,
        background: bool,
    ) -> None:
        self.state, self.model, self.progress, self.best, self.hooks = state, model, progress, best, hooks
        self.cfg, self.settings, self.task_name, self.rt = cfg, settings, task_name, rt
        self.background = background  # last.pt written from a thread while training goes on
        self._clock = SaveClock(0 if cfg.strategy == "fsdp" else cfg.checkpoint_interval)  # fsdp: ranks save together
        # save(background=True): the one write in flight, its on_log row, and what it failed with
        self._writer: threading.Thread | None = None
        self._written: StateDict = {}
        self._write_error: BaseException | None = None

    # ------------------------------------------------------------------ when: the loop says what happened
    def due_after_step(self, step: int, logged: bool) -> bool:
        """last.pt after this optimizer step, inside an epoch: every checkpoint_every steps, or at a log point once
        checkpoint_interval seconds of training have passed (an epoch's last batch leaves it to the epoch's end)."""
        every = self.cfg.checkpoint_every
        return (every is not None and step % every == 0) or (logged and self._clock.due(epoch_end=False))

    def due_at_epoch_end(self, stopping: bool, ending: bool) -> bool:
        """last.pt at an epoch's end: always on a stop; never when training is `ending` (the last epoch, early
        stopping: the end of training writes it, marked ended); else when its interval is due."""
        return stopping or (not ending and self._clock.due(epoch_end=True))

    def may_save(self, epoch_end: bool, at_end: bool) -> bool:
        """A save may follow this log point (at_end: the run's last step), so the weights' finiteness is read
        with the loss."""
        return at_end or self._clock.due(epoch_end=epoch_end)

    # ------------------------------------------------------------------ out
    def checkpoint(self) -> StateDict:
        """The registry's state plus the header: what a file holds."""
        return {
            **self.state.state_dict(),
            "config": self.cfg.to_dict(),
            "settings": self.settings,
            "task": self.task_name,
            # steps and the position in the epoch count batches of this many processes: a resume needs as many
            "world_size": self.rt.world_size,
            "launch": launch_prefix(),
            "format": FORMAT,
        }

    def save(
        self,
        name: str,
        run_dir: Path,
        files: RunFiles | None,
        *,
        background: bool = False,
        finite: bool | None = None,
    ) -> Path:
        """Write checkpoints/<name> atomically, refusing non-finite weights (they would poison a resume).

        best.pt also writes best.json. Rank 0 only: the other ranks hold the same state. `finite`: the weights'
        finiteness when the caller read it already (in the log point's one transfer); else read here.
        background: copy the state to host memory (the loop's only wait) and write it from a thread. One write
        at a time: a save first waits for the one in flight, so files land in order, and a crash mid-write
        leaves the previous file whole (atomic_save's rename).
        """
        if finite is None:
            finite = bool(weights_finite(self.model))  # note: sync point (checkpoint)
        if not finite:
            bad = [n for n, w in self.model.named_parameters() if not bool(torch.isfinite(w).all())]
            raise CheckpointError(
                f"refusing to write {name}: parameter(s) {bad[:5]} are not finite; the previous "
                f"checkpoint in {run_dir / 'checkpoints'} is kept"
            )
        self.wait()
        self.state.target = run_dir / "checkpoints" / name
        state = self.checkpoint()
        if not self.rt.is_main:  # a sharded state: every rank wrote its part of the folder; rank 0 writes the file
            return self.state.target
        self.hooks("on_save_checkpoint", state)
        try:  # before any file is touched: what weights_only=True could not load back is refused, naming its key
            state = {k: {n: storable(v, f"callback {n!r} state") for n, v in state[k].items()}
                     if k == "callbacks" else storable(state[k], f"checkpoint[{k!r}]") for k in state}  # fmt: skip
        except NotStorable as e:
            raise NotStorable(f"refusing to write {name}: {e}; nothing written (an earlier {name} is kept)") from None
        p = self.progress
        path = run_dir / "checkpoints" / name
        best = {"metric": self.best.metric, "value": self.best.best, "step": p.step, "epoch": p.epoch_number}
        row = {"kind": "checkpoint", "name": name, "step": p.step, "path": str(path)}
        if name == "last.pt":
            self._clock.reset()
        # one batched copy to host: the digest and torch.save then read it, and training may go on changing the
        # weights while a background write runs
        if background or self.rt.device.type == "cuda":
            state = snapshot_to_host(state)
        args = (state, path, best if name == "best.pt" else None, files)
        if not background:
            self._write(*args)
            self.hooks("on_log", row)
            return path
        self._written, self._write_error = row, None
        self._writer = threading.Thread(target=self._write_in_background, args=args, name=f"plainloop-save-{name}")
        self._writer.start()
        return path

    @staticmethod
    def _write(state: StateDict, path: Path, best: StateDict | None, files: RunFiles | None) -> None:
        try:  # checkpoints/ in the run directory, never the run directory itself: one removed stays removed
            path.parent.mkdir(exist_ok=True)
        except FileNotFoundError as e:
            raise storage_error(path, e) from None
        atomic_save(state, path)
        if best is not None and files is not None:
            files.write_json("best.json", best)

    def _write_in_background(
        self, state: StateDict, path: Path, best: StateDict | None, files: RunFiles | None
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
        if self._write_error is not None:
            raise CheckpointError(
                f"writing {self._written['path']} in the background failed: {self._write_error}; the previous file "
                f"is kept (free disk space or check the output directory, then resume)"
            ) from self._write_error
        self.hooks("on_log", self._written)

    @property
    def writing(self) -> bool:
        """A background write is still in flight."""
        return self._writer is not None and self._writer.is_alive()

    # ------------------------------------------------------------------ in
    def load_weights(self, path: Path, notes: list[str]) -> None:
        """Load only the model's weights (test_with_best); a checkpoint without a digest gets a line in `notes`."""
        ckpt = self._load(path, notes)
        if "dcp" in ckpt["model"]:  # fsdp: the registry's model part reads the folder the file names (every rank)
            self.state.source = path
            next(part for key, part, _ in self.state._parts if key == "model").load_state_dict(ckpt["model"])
        else:
            load_model_state(self.model, ckpt["model"], path)

    def _load(self, path: Path, notes: list[str]) -> StateDict:
        ckpt = load_checkpoint(path, map_location=self.rt.device)
        if why := _not_written_by_a_run(ckpt):
            file = path / "checkpoints" / "last.pt" if path.is_dir() else path
            raise ResumeError(f"{file} holds {why}: no plainloop run writes that; resume from another checkpoint")
        if str(ckpt.get("integrity", "")).startswith("unverified"):
            notes.append(f"checkpoint {path}: {ckpt['integrity']}")
        return ckpt

    def resume(
        self,
        path: Path,
        total_steps: int,
        batches_per_epoch: int,
        notes: list[str],
        schedule_steps: int | None = None,
        max_epochs: int = UNKNOWN_LENGTH,
        auto: bool = False,
    ) -> Path | None:
        """Check that `path` (a checkpoint or a run directory's last.pt) can continue this run, then walk the
        registry in; one line per remark goes to `notes`. Returns the run directory it lives in, or None."""
        found = path if path.is_dir() else path.parent.parent
        refuse_if_live(found, main=self.rt.is_main)  # a live run is named as such, not "last.pt does not exist"
        ckpt = upgrade(self._load(path, notes))
        # before any part changes (the command line ran this same check before its set-up)
        check_resume(ckpt, path, self.settings, self.task_name, self.rt.world_size, total_steps, self.cfg.to_dict())
        self.state.load_state_dict(ckpt, source=path)
        p = self.progress
        run_dir = found if (found / "checkpoints").is_dir() else None
        # best.pt may be newer than last.pt (a validation after the last save): its value wins; a pending
        # validation is redone from the checkpoint's own best
        if run_dir is not None and p.val_pending is None:
            try:
                v = json.loads((run_dir / "best.json").read_text(encoding="utf-8")).get("value")
            except (OSError, ValueError, AttributeError):
                v = None
            if isinstance(v, int | float) and math.isfinite(v):
                self.best.newer_best(float(v))
        old_total = ckpt["scheduler"].get("total_steps")
        now_total = schedule_steps or total_steps  # lr_decay_steps: the schedule's own horizon
        if old_total is not None and int(old_total) != now_total and p.step < total_steps:
            notes.append(
                f"schedule: the run now has {total_steps} optimizer steps (was {old_total}); warm-up and "
                f"cosine are recomputed for the new length and continue from step {p.step}"
            )
        try:
            self._check_not_finished(path, run_dir, total_steps, notes, max_epochs)
        except RunFinished as e:  # resume="auto" found it ended (a requeued job): one line, exit 0, as --resume auto
            if not auto:
                raise
            self.hooks.trainer.log(f"[plainloop] {e}")
            raise SystemExit(0) from None
        notes.append(f"resume: {path} at step {p.step} ({p.position(batches_per_epoch)})")
        if p.val_pending is not None:
            notes.append(f"resume: the validation at step {p.step} was due when the run stopped; it runs first")
        self.hooks("on_load_checkpoint", ckpt)
        return run_dir

    def _check_not_finished(
        self, path: Path, run_dir: Path | None, total_steps: int, notes: list[str], max_epochs: int
    ) -> None:
        """A run that ended is never trained or scored again: refused with RunFinished once its summary is written."""
        p = self.progress
        at_end = p.step >= total_steps or p.epoch >= max_epochs  # (a stream's passes may end before its steps)
        if p.ended == "finished" and not at_end:  # given more steps or epochs: training goes on
            p.ended = None
            return
        ended = p.ended is not None or (at_end and p.val_pending is None)
        # a summary written at this step leaves nothing to do, even with a validation pending
        summary = (ended or at_end) and run_dir is not None and finished(run_dir, p.step)
        if summary or (ended and run_dir is None):
            if p.ended == "early_stopped":  # more steps do not restart it: its stop is part of its state
                raise RunFinished(
                    f"{path}: the run stopped early at step {p.step} (early stopping, or should_stop); its "
                    f"summary is written and nothing is left to do. To train again, start a new run (a larger "
                    f"early_stopping_patience lets it go on longer)"
                )
            raise RunFinished(
                f"{path}: the run finished at step {p.step}; its summary is written and nothing is left to do. To "
                f"train it longer, resume it with more steps: {self._longer(run_dir or path, total_steps)}"
            )
        if ended:  # stopped while scoring the test split: only the test and the summary are left
            p.ended = p.ended or "finished"
            p.val_pending = None
            notes.append(f"resume: training had ended at step {p.step}; the run ends with its test scores and summary")

    def _longer(self, target: Path, total_steps: int) -> str:
        """A resume that gives the run more optimizer steps, in the words of the door in use."""
        key, now = ("max_steps", total_steps) if self.cfg.max_steps else ("epochs", self.cfg.epochs)
        if line := cli_resume_line(target, launch_prefix()):
            return f"{line} --{key} N, with N above {now}"
        return f"TrainConfig(..., resume={str(target)!r}, {key}=N), with N above {now}"


def weights_finite(model: nn.Module) -> torch.Tensor:
    """One device flag: every parameter finite (read it with the log point's other values, or alone)."""
    params = list(model.parameters())
    if not params:
        return torch.ones((), dtype=torch.bool)
    flag = torch.stack([torch.isfinite(p).all() for p in params]).all()
    return flag.full_tensor() if hasattr(flag, "full_tensor") else flag  # sharded (fsdp): every rank's shards


def register_run_state(
    state: RunState,
    *,
    model: Any,  # the model, or --strategy fsdp's Sharding: its parts write the sharded state beside the file
    optimizer: torch.optim.Optimizer,
    schedule: Stateful,
    opt_step: Stateful,
    progress: Progress,
    sampler: SamplerState,
    best: BestTracker,
    callbacks: CallbackStates,
) -> RunState:
    """The engine's parts, in the order a resume restores them (callbacks last)."""
    sharded = getattr(model, "sharded_parts", None)
    parts = sharded(optimizer, state) if sharded else (ModelWeights(model, state), optimizer)
    state.register("model", parts[0])
    state.register("optimizer", parts[1])
    state.register("scheduler", schedule)
    state.register("opt_step", opt_step)
    state.register("", progress)
    state.register("sampler", sampler, optional=True)
    state.register("best", best, optional=True)
    state.register("rng", RngState())
    state.register("callbacks", callbacks, optional=True)
    return state
