"""Everything the loop needs before its first step, and the files it leaves: set-up, checkpoints, summary.

Decided once, reported in one line each: data placement and loader settings,
model and optimizer, schedule, precision, resume.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .checkpoint import atomic_save, load_checkpoint
from .data import ShardedBatchSampler, build_loader, loader_settings, place_on_device
from .evaluation import BestTracker
from .hooks import call
from .model_protocol import model_parts, optimizer_hparams
from .optim import WarmupCosine, build_adamw, scaled_lr
from .options import write_config_file
from .runfiles import ROLLED_BACK, RunDirError, RunFiles, claim_run_dir, finished
from .setup import launch_prefix, resolve_runtime, rng_state, seed_everything, set_rng_state
from .step import OptimizerStep
from .task import pick_default_loss
from .usercode import (
    StreamBatches,
    auto_workers_for,
    batch_sampler_state_note,
    is_stream,
    rerun_hint,
    resume_hint,
    stream_steps_error,
)


class ResumeError(ValueError):
    """A checkpoint that cannot continue this run (other model shapes, another task)."""


def build_run(t: Any) -> None:
    """Set up trainer `t`: runtime, data, model, optimizer, schedule, and the resumed state."""
    cfg, task = t.cfg, t.task
    t.rt = rt = resolve_runtime(cfg.precision, cfg.device, cfg.tf32, cfg.cudnn_benchmark)
    seed_everything(cfg.seed)
    t.notes = list(rt.notes)
    if cfg.num_threads is not None and rt.device.type == "cpu" and cfg.num_threads != torch.get_num_threads():
        t.notes.append(f"threads: {torch.get_num_threads()} -> {cfg.num_threads} torch intra-op thread(s)")
        torch.set_num_threads(cfg.num_threads)
    if t.requested.baseline:
        t.notes.append("baseline: fp32, num_workers=0, no pinning, .item() every step, validate every epoch")
    t.run_dir, t._last_val_step, t.last_row = None, -1, {}

    # data: on the device when the dataset speaks the residency protocol and fits, else a DataLoader
    gatherer = place_on_device(task.train_set, cfg, rt.device)
    t.on_device = gatherer is not None
    t.resident = {id(task.train_set): gatherer} if t.on_device else {}  # dataset id -> what serves its batches
    t.loader_kw = {}
    if t.on_device:
        for ds in (task.val_set, task.test_set):
            g = place_on_device(ds, cfg, rt.device)
            if g is not None:
                t.resident[id(ds)] = g
        t.notes.append(f"data: held on {rt.device.type}, batches gathered there (no loader workers)")
        if cfg.num_workers:
            t.notes.append(
                f"num_workers={cfg.num_workers}, prefetch_factor and persistent_workers are not used: "
                f"the data is held on {rt.device.type}; device_cache off (--device_cache off) brings the loader back"
            )
    else:
        lcfg = cfg
        if cfg.num_workers is None and is_stream(task.train_set):
            lcfg = dataclasses.replace(cfg, num_workers=0, persistent_workers=False)
            t.notes.append(
                "num_workers: auto -> 0 for a stream (IterableDataset); give num_workers to read it in workers"
            )
        elif cfg.num_workers is None:  # an in-memory dataset cheap to index is faster without workers (measured)
            workers, note = auto_workers_for(task.train_set)
            if workers == 0:
                lcfg = dataclasses.replace(cfg, num_workers=0, persistent_workers=False)
                t.notes.append(note)
        t.loader_kw, notes = loader_settings(lcfg, rt.device, rt.world_size)
        t.notes += notes
    if is_stream(task.train_set):
        if cfg.max_steps is None:
            raise ValueError(stream_steps_error(f"Task {task.name!r} train_set"))
        nb = cfg.max_steps * cfg.accumulate_grad_batches
        t.sampler = t.loader = StreamBatches(
            task.train_set, cfg.batch_size, nb, t.loader_kw, task.collate_fn, cfg.drop_last, cfg.seed + rt.rank
        )
        if t.loader_kw.get("num_workers"):
            t.notes.append(
                f"data: {type(task.train_set).__name__} is a stream read by {t.loader_kw['num_workers']} worker(s): "
                f"each worker runs the whole stream unless it splits itself with torch.utils.data.get_worker_info()"
            )
    elif task.batch_sampler_fn is not None:
        t.sampler = task.batch_sampler_fn(
            task.train_set, cfg.batch_size, cfg.seed, rt.rank, rt.world_size, cfg.drop_last
        )
    else:
        t.sampler = ShardedBatchSampler(
            len(task.train_set),
            cfg.batch_size,
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            rank=rt.rank,
            world_size=rt.world_size,
            drop_last=cfg.drop_last,
        )
    note = batch_sampler_state_note(t.sampler)
    if note:
        t.notes.append(note)
    if not is_stream(task.train_set):
        kw = {} if t.on_device else dict(t.loader_kw, generator=torch.Generator().manual_seed(cfg.seed + rt.rank))
        t.loader = build_loader(task.train_set, t.sampler, rt.device, kw, task.collate_fn, gatherer)
    t.batches_per_epoch = len(t.sampler)
    t.steps_per_epoch = math.ceil(t.batches_per_epoch / cfg.accumulate_grad_batches)
    t.total_steps = cfg.max_steps or cfg.epochs * t.steps_per_epoch
    t.max_epochs = math.ceil(t.total_steps / t.steps_per_epoch)

    # model, loss, optimizer, schedule, scaler
    t.model = t.raw_model = task.model.to(rt.device)
    fp16 = rt.amp_dtype == torch.float16
    t.global_batch = cfg.batch_size * cfg.accumulate_grad_batches * rt.world_size
    base_lr = getattr(t.raw_model, "learning_rate", None) or cfg.lr
    t.parts = parts = model_parts(t.raw_model, cfg, rt.device, base_lr)
    if parts is not None:
        t.notes += parts.notes
        t.callbacks.append(parts.hooks)
    t.loss_fn = task.loss_fn
    if t.loss_fn is None and parts is not None and parts.loss_fn is not None:
        t.loss_fn = parts.loss_fn
    if t.loss_fn is None:
        t.loss_fn, note = pick_default_loss(t.raw_model, _first_sample(task.train_set))
        if note:
            t.notes.append(note)
    if parts is not None and parts.choice is not None:
        optimizer = parts.choice.optimizer
        t.scheduler = parts.choice.schedule
        t.optim_hparams = parts.choice.hparams
        t.warmup_steps = 0
    else:
        lr = scaled_lr(base_lr, t.global_batch, cfg.ref_batch_size, cfg.lr_scaling)
        if lr != base_lr:
            t.notes.append(
                f"lr: {base_lr:.3g} -> {lr:.3g} ({cfg.lr_scaling} scaling, batch {cfg.ref_batch_size} "
                f"-> {t.global_batch})"
            )
        # a device-side schedule never needs to ask whether a step was skipped (CUDA, and fp16 anywhere)
        tensor_lr = (rt.device.type == "cuda" or fp16) and cfg.fused is not False
        optimizer = build_adamw(
            t.raw_model, lr, cfg.weight_decay, rt.device, tensor_lr, cfg.adam_betas, cfg.adam_eps, cfg.fused
        )
        horizon = cfg.lr_decay_steps or t.total_steps
        t.warmup_steps = cfg.warmup_steps if cfg.warmup_steps is not None else min(500, int(0.05 * horizon))
        t.scheduler = WarmupCosine(optimizer, horizon, t.warmup_steps, cfg.min_lr_ratio, on_device=tensor_lr)
        t.optim_hparams = {
            "source": "plainloop AdamW + warm-up/cosine",
            **optimizer_hparams(optimizer),
            "schedule": {"warmup_steps": t.warmup_steps, "decay_steps": horizon, "min_lr_ratio": cfg.min_lr_ratio},
        }
    t.optimizer = optimizer
    t.opt = OptimizerStep(
        optimizer,
        t.scheduler,
        rt.device,
        fp16,
        cfg.scale_value(),
        cfg.gradient_clip_val,
        cfg.gradient_clip_algorithm,
    )
    if parts is not None:
        t.opt.before_step = lambda o: call(t.callbacks, "on_before_optimizer_step", t, o)
    if fp16 and cfg.scale_value():
        t.notes.append(f"loss scale: static {cfg.scale_value():g}")
    t.best = BestTracker(task.monitor_metric, task.monitor_mode)
    t._amp = rt.amp_dtype is not None

    if cfg.resume:
        load_checkpoint_into(t, Path(cfg.resume))
    if rt.distributed:
        t.model = DDP(t.model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
    if cfg.compile_model:
        t.model = torch.compile(t.model, mode=cfg.compile_mode)
        t.notes.append(f"compile: torch.compile(mode={cfg.compile_mode!r}); the first steps include compiling")


def _first_sample(ds: Any) -> Any:
    try:
        sample = ds[0]
    except Exception:  # an iterable or lazily opened dataset: no peek, plain MSE
        return None
    if isinstance(sample, list | tuple) and len(sample) > 1 and isinstance(sample[1], torch.Tensor):
        return sample
    return None


# ------------------------------------------------------------------ checkpoints
def state_of(t: Any) -> dict[str, Any]:
    return {
        "model": t.raw_model.state_dict(),
        "optimizer": t.optimizer.state_dict(),
        "scheduler": t.scheduler.state_dict(),
        "opt_step": t.opt.state_dict(),
        "epoch": t.epoch,
        "step": t.step,
        "batches_done": t.batches_done,
        "sampler": {**_sampler_state(t), "epoch": t.epoch, "batches_done": t.batches_done},
        "best": t.best.state_dict(),
        # a checkpoint written right before a validation: a resume runs that validation first (None: none due)
        "val_pending": t.val_pending,
        "last_val_step": t._last_val_step,  # a resume at this step does not validate it again (val_check_steps)
        "rng": rng_state(),
        "config": t.cfg.to_dict(),
        "task": t.task.name,
        # steps and the position in the epoch count batches of this many processes: a resume needs as many
        "world_size": t.rt.world_size,
        "launch": launch_prefix(),
        "format": "plainloop-2",
        "callbacks": {
            getattr(cb, "state_key", type(cb).__qualname__): cb.state_dict()
            for cb in t.callbacks
            if hasattr(cb, "state_dict")
        },
    }


def _sampler_state(t: Any) -> dict[str, Any]:
    """Mid-epoch: the sampler's state from the epoch's start (its order is drawn again on resume); else its own."""
    if t.batches_done and t.sampler_epoch_state is not None:
        return dict(t.sampler_epoch_state)
    return t.sampler.state_dict() if hasattr(t.sampler, "state_dict") else {}


def save_checkpoint(t: Any, name: str) -> None:
    """Write checkpoints/<name> atomically, refusing non-finite weights (they would poison a resume)."""
    params = dict(t.raw_model.named_parameters())
    finite = torch.stack([torch.isfinite(p).all() for p in params.values()]) if params else torch.ones(1, dtype=bool)
    if not bool(finite.all()):  # note: sync point (checkpoint)
        bad = [n for n, ok in zip(params, finite.tolist()) if not ok]
        raise RunDirError(
            f"refusing to write {name}: parameter(s) {bad[:5]} are not finite; the previous "
            f"checkpoint in {t.run_dir / 'checkpoints'} is kept"
        )
    state = state_of(t)
    call(t.callbacks, "on_save_checkpoint", t, state)
    path = atomic_save(state, t.run_dir / "checkpoints" / name)
    if name == "best.pt":
        t.files.write_json(
            "best.json", {"metric": t.best.metric, "value": t.best.best, "step": t.step, "epoch": t.epoch}
        )
    call(t.callbacks, "on_log", t, {"kind": "checkpoint", "name": name, "step": t.step, "path": str(path)})


def load_checkpoint_into(t: Any, path: Path, weights_only: bool = False) -> None:
    """Restore a checkpoint (or a run directory's last.pt) into trainer `t`; weights only for test_with_best."""
    ckpt = load_checkpoint(path, map_location=t.rt.device)
    if str(ckpt.get("integrity", "")).startswith("unverified"):
        t.notes.append(f"checkpoint {path}: {ckpt['integrity']}")
    model = t.raw_model
    try:
        model.load_state_dict(ckpt["model"])
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
    if weights_only:
        return
    if ckpt.get("task") not in (None, t.task.name):
        raise ResumeError(f"{path} is a checkpoint of task {ckpt['task']!r}, not {t.task.name!r}")
    _check_world_size(t, path, ckpt)
    t.optimizer.load_state_dict(ckpt["optimizer"])
    t.scheduler.load_state_dict(ckpt["scheduler"])
    if "opt_step" in ckpt:
        t.opt.load_state_dict(ckpt["opt_step"])
    else:  # plainloop-1 checkpoints kept the scaler at the top level
        t.opt.scaler.load_state_dict(ckpt["scaler"])
    t.epoch, t.step, t.batches_done = int(ckpt["epoch"]), int(ckpt["step"]), int(ckpt["batches_done"])
    if is_stream(t.task.train_set):  # a stream is one long epoch, of this run's length: count its batches
        t.epoch, t.batches_done = 0, t.step * t.cfg.accumulate_grad_batches
    if hasattr(t.sampler, "load_state_dict") and "sampler" in ckpt:
        t.sampler.load_state_dict(ckpt["sampler"])  # its own state (an RNG, a stream's position) and where it was
    for cb in t.callbacks:
        key = getattr(cb, "state_key", type(cb).__qualname__)
        if hasattr(cb, "load_state_dict") and key in ckpt.get("callbacks", {}):
            cb.load_state_dict(ckpt["callbacks"][key])
    call(t.callbacks, "on_load_checkpoint", t, ckpt)
    best = ckpt.get("best")
    t.best.load_state_dict(best if isinstance(best, dict) else {"best": best})
    set_rng_state(ckpt["rng"])
    t.val_pending = t.step if ckpt.get("val_pending") == t.step else None
    t._last_val_step = int(ckpt.get("last_val_step", -1))
    run_dir = path if path.is_dir() else path.parent.parent
    if (run_dir / "checkpoints").is_dir():
        t.run_dir = run_dir
        if t.val_pending is None:  # a pending validation is redone from the checkpoint's own best state
            _read_best_json(t, run_dir)
    old = ckpt.get("config", {})
    for k in ("batch_size", "accumulate_grad_batches", "seed"):
        if k in old and old[k] != getattr(t.cfg, k):
            t.notes.append(
                f"resume: {k} was {old[k]} in the checkpoint, now {getattr(t.cfg, k)}; the run will not "
                f"match an uninterrupted one"
            )
    old_total = ckpt["scheduler"].get("total_steps")
    if old_total is not None and int(old_total) != getattr(t.scheduler, "total_steps", old_total):
        t.notes.append(
            f"schedule: the run now has {t.total_steps} optimizer steps (was {old_total}); warm-up and "
            f"cosine are recomputed for the new length and continue from step {t.step}"
        )
    in_run_dir = (run_dir / "checkpoints").is_dir()
    # a finished run's last.pt still announces its final validation (written right before it): finished wins
    if t.step >= t.total_steps and (t.val_pending is None or (in_run_dir and finished(run_dir))):
        if not in_run_dir or finished(run_dir):
            raise ResumeError(
                f"{path} is already at step {t.step} of {t.total_steps}: nothing left to train. Give more "
                f"--epochs or --max_steps to extend it"
            )
        # stopped after its last step but before its summary (e.g. killed while scoring the test split)
        t.notes.append(f"resume: training had ended at step {t.step}; the run ends with its test scores and summary")
    t.notes.append(f"resume: {path} at step {t.step} ({position(t)})")
    if t.val_pending is not None:
        t.notes.append(f"resume: the validation at step {t.step} may not have finished before the stop; it runs first")


def _check_world_size(t: Any, path: Path, ckpt: dict[str, Any]) -> None:
    """Refuse a resume with another number of processes: the step count, the position inside the epoch and the
    effective batch (batch_size x processes) were counted for the old number, and would silently mean other data
    and another schedule (checkpoints written before plainloop recorded it are not checked)."""
    old = ckpt.get("world_size")
    if old is None or int(old) == t.rt.world_size:
        return
    launch = ckpt.get("launch") or ("python" if int(old) == 1 else f"torchrun --nproc_per_node {old}")
    raise ResumeError(
        f"{path} was written by a run of {old} process{'es' if int(old) > 1 else ''} and this one has "
        f"{t.rt.world_size}: its steps, its position in the epoch and its effective batch (batch_size x processes) "
        f"do not carry over to another number. Resume it with {old}: {resume_hint(path, launch)}"
    )


def position(t: Any) -> str:
    """Where the run stands, with epochs counted from 1 as the epoch lines count them."""
    if t.batches_done:  # inside epoch t.epoch + 1 (t.epoch counts finished epochs)
        return f"epoch {t.epoch + 1}, batch {t.batches_done} of {t.batches_per_epoch}"
    return f"end of epoch {t.epoch}"


def _read_best_json(t: Any, run_dir: Path) -> None:
    """best.pt may be newer than last.pt (validation runs after the epoch checkpoint): its value wins."""
    import json

    try:
        v = json.loads((run_dir / "best.json").read_text(encoding="utf-8")).get("value")
    except (OSError, ValueError):
        return
    if v is not None and v != t.best.best:
        t.best.best, t.best.stale = float(v), 0


# ------------------------------------------------------------------ run directory and summary
def open_run_dir(t: Any) -> RunFiles | None:
    """Claim (or, resuming, reuse) the run directory; write config.json and config.toml; start callbacks."""
    cfg, rt = t.cfg, t.rt
    if t.run_dir is None:
        if rt.is_main:
            t.run_dir, note = claim_run_dir(cfg.output_dir, cfg.run_name, t.task.name)
            if note:
                t.notes.append(note)
        if rt.distributed:  # every rank must agree on one directory
            box = [t.run_dir]
            dist.broadcast_object_list(box, src=0)
            t.run_dir = box[0]
    if not rt.is_main:
        return None
    files = RunFiles(
        Path(t.run_dir),
        t.callbacks,
        t,
        resumed_step=t.step if cfg.resume else None,
        val_pending=t.val_pending is not None,
    )
    if files.removed:
        t.notes.append(f"removed {len(files.removed)} temp file(s) left by an interrupted write")
    if files.rolled_back:
        t.notes.append(
            f"resume: {files.rolled_back} metrics row(s) written after the checkpoint's step {t.step} are trained "
            f"again; moved from metrics.jsonl to {ROLLED_BACK}"
        )
    resolved = {
        **t.requested.to_dict(),
        "precision": rt.precision,
        "num_workers": t.loader_kw.get("num_workers", 0),
        "warmup_steps": t.warmup_steps,
        "resume": None,
    }
    files.write_json(
        "config.json",
        {
            "requested": t.requested.to_dict(),
            "effective": {
                **t.cfg.to_dict(),
                **{k: resolved[k] for k in ("precision", "num_workers", "warmup_steps")},
            },
            "runtime": {
                "device": str(rt.device),
                "precision": rt.precision,
                "world_size": rt.world_size,
                "notes": t.notes,
            },
            "task": {"name": t.task.name, **t.task.info},
            "optimizer": t.optim_hparams,
        },
    )
    write_config_file(
        Path(t.run_dir) / "config.toml",
        {**t.config_sections, "train": resolved},
        rerun_hint(Path(t.run_dir) / "config.toml"),
    )
    call(t.callbacks, "on_fit_start", t)
    return files
