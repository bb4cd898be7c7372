"""The CLI's measurement tools wired to the engine: --profile, --auto_batch_size / --auto_num_workers,
--system_report. The tools themselves live in utils/ and never import the engine; this file hands them
callables made from a Trainer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer import TrainConfig
from trainer.data import to_device
from trainer.loop import Trainer
from trainer.runfiles import claim_run_dir
from trainer.task import clone_task_model


def step_fn(t: Trainer) -> Callable[[], None]:
    """One full training step of trainer `t` on its next batch, for the profiler and the system report."""
    it = iter(t.loader)
    t.model.train()

    def run() -> None:
        nonlocal it
        try:
            batch = next(it)
        except StopIteration:
            it = iter(t.loader)
            batch = next(it)
        if not t.on_device:
            batch = to_device(batch, t.rt.device)
        t.forward_backward(batch, 1)
        t.opt.step(False)

    return run


def profile(cfg: TrainConfig, task: Any, sections: dict[str, dict[str, Any]]) -> Path:
    """A torch.profiler trace of 5 steps (after 2 warm-up steps, on a copy of the model) into RUN_DIR/profile."""
    from utils.profiling import profile_steps

    t = Trainer(dataclasses.replace(cfg, resume=None, progress_bar=False), clone_task_model(task), log=lambda _s: None)
    run_dir, _ = claim_run_dir(cfg.output_dir, cfg.run_name, f"{task.name}-profile")
    res = profile_steps(step_fn(t), run_dir / "profile", steps=5, warmup=2)
    print(f"[plainloop] profiler trace: {res['trace']} (open in https://ui.perfetto.dev); top ops: {res['table']}")
    for m in res.get("messages") or []:
        print(f"[plainloop] profiler: {m}")
    return run_dir


def autotune(cfg: TrainConfig, task: Any, opts: Any) -> TrainConfig:
    from utils.autotune import tune_num_workers

    if opts.auto_batch_size:  # the search is the engine's own (trainer/extras/autobatch.py), shared with BaseTrainer
        from trainer.extras.autobatch import auto_batch_size

        cfg, note = auto_batch_size(cfg, task)
        print(f"[plainloop] {note}")
    if opts.auto_num_workers:
        from torch.utils.data import DataLoader

        ds = task.train_set
        res = tune_num_workers(
            lambda n: DataLoader(ds, batch_size=cfg.batch_size, shuffle=True, num_workers=n, persistent_workers=False),
            batches=20,
        )
        print(
            f"[plainloop] auto_num_workers: {res['num_workers']} (samples/s by workers: "
            f"{json.dumps({str(k): round(v) for k, v in res['samples_per_s'].items()})})"
        )
        best = res["num_workers"]
        # workers only matter when the data is read through a DataLoader
        cfg = dataclasses.replace(cfg, num_workers=best, device_cache=False if best > 0 else cfg.device_cache)
    return cfg


def system_report(cfg: TrainConfig, opts: Any, task_kw: dict[str, Any]) -> int:
    from tasks import build_task, task_label
    from utils.callbacks import VerdictCallback
    from utils.performance_monitor import TrainingMonitor
    from utils.system_report import run_system_report

    out, _ = claim_run_dir(cfg.output_dir, cfg.run_name, f"{task_label(opts.task)}-report")
    trials = out / "trials"
    trial_no = 0

    def run_trial(overrides: dict[str, Any], steps: int) -> dict[str, Any]:
        nonlocal trial_no
        trial_no += 1
        task = build_task(opts.task, cfg, **task_kw)
        c = dataclasses.replace(
            cfg,
            **overrides,
            max_steps=steps,
            progress_bar=False,
            save_best=False,
            resume=None,
            val_check_steps=None,
            validation_interval=10**6,
            output_dir=str(trials),
            run_name=f"trial{trial_no}",
        )
        t = Trainer(
            c,
            task,
            log=lambda m: None,
            monitor=TrainingMonitor(batch_size=c.batch_size),
            callbacks=[VerdictCallback()],
        )
        warm = step_fn(t)
        for _ in range(2):  # warm-up outside the timing: worker start-up, compilation, allocator
            warm()
        s = t.fit()
        mon = s["monitor"]
        return {
            "samples_per_s": s["samples_per_s"],
            "data_wait_frac": mon.get("data_wait_frac"),
            "step_time_ms": 1000 * ((mon.get("iter_time_s") or {}).get("p50") or 0.0),
            "peak_mem_mb": s["peak_memory_mb"],
            "monitor": mon,
            "device_type": t.rt.device.type,
            "step_stats": {
                "num_workers": 0 if t.on_device else t.loader_kw.get("num_workers", 0),
                "torch_threads": torch.get_num_threads(),
            },
        }

    base = {
        k: getattr(cfg, k)
        for k in ("batch_size", "num_workers", "precision", "pin_memory", "compile_model", "device_cache")
    }
    probe = Trainer(
        dataclasses.replace(cfg, resume=None, progress_bar=False),
        build_task(opts.task, cfg, **task_kw),
        log=lambda m: None,
    )
    steps = cfg.max_steps or cfg.epochs * probe.steps_per_epoch  # the configured job, for the projection
    job_samples = steps * cfg.accumulate_grad_batches * cfg.batch_size * probe.rt.world_size
    held = bool(probe.on_device)  # what device_cache resolved to: a candidate equal to it measures nothing new
    del probe
    path = run_system_report(
        run_trial,
        base,
        candidates=_report_candidates(cfg, held),
        steps=opts.report_steps,
        out_path=out / "report.md",
        config={"task": opts.task, **cfg.to_dict(), **task_kw},
        repeats=opts.report_repeats,
        job_samples=job_samples,
        price_per_kwh=opts.price_per_kwh,
        price_per_gpu_hour=opts.price_per_gpu_hour,
        currency=opts.currency,
        power_w=opts.power_w,
        gpus=1,
        trial_dir=trials,
    )  # removes the trial runs
    print(Path(path).read_text(encoding="utf-8"))
    print(f"[plainloop] report written to {path}")
    return 0


def _report_candidates(cfg: TrainConfig, held: bool | None = None) -> list[dict[str, Any]]:
    """Settings worth measuring against the user's, whatever the verdict turns out to be.

    `held`: whether the user's run holds the data on the device (device_cache auto resolves to that when it
    fits); then "device_cache=True" is the user's own setting again, and its noise must not read as a gain."""
    c: list[dict[str, Any]] = [{"batch_size": cfg.batch_size * 2}]
    if cfg.device_cache is not True and not held:
        c.append({"device_cache": True, "num_workers": 0})
    if cfg.device_cache is not False:
        c.append({"device_cache": False, "num_workers": 2})
    if cfg.precision != "bf16-mixed":  # on a CPU too: whether it wins depends on the CPU's bf16 units
        c.append({"precision": "bf16-mixed"})
    if torch.cuda.is_available():
        c.append({"compile_model": True})
    return c
