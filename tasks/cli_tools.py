"""The CLI's measurement tools wired to the engine: --profile, --auto_batch_size / --auto_num_workers,
--system_report. The tools themselves live in utils/ and never import the engine; this file hands them
callables made from a Trainer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trainer import TrainConfig
from trainer.extras.autobatch import clone_task_model
from trainer.loop import Trainer
from trainer.runfiles import claim_run_dir
from utils.tools import measured_report, report_candidates, step_fn


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
    """--system_report: the measured report of the configured job (utils/tools.py measured_report), then exit."""
    from tasks import build_task, task_label

    out, _ = claim_run_dir(cfg.output_dir, cfg.run_name, f"{task_label(opts.task)}-report")
    probe = Trainer(
        dataclasses.replace(cfg, resume=None, progress_bar=False),
        build_task(opts.task, cfg, **task_kw),
        log=lambda m: None,
    )
    job_steps, held = probe.total_steps, bool(probe.data.on_device)  # the configured job; what device_cache resolved to
    del probe
    path = measured_report(
        Trainer,
        cfg,
        lambda: build_task(opts.task, cfg, **task_kw),
        out / "report.md",
        steps=opts.report_steps,
        repeats=opts.report_repeats,
        job_steps=job_steps,
        held=held,
        config={"task": opts.task, **cfg.to_dict(), **task_kw},
        price_per_kwh=opts.price_per_kwh,
        price_per_gpu_hour=opts.price_per_gpu_hour,
        currency=opts.currency,
        power_w=opts.power_w,
    )
    print(Path(path).read_text(encoding="utf-8"))
    print(f"[plainloop] report written to {path}")
    return 0


_report_candidates = report_candidates  # the name the tests knew
