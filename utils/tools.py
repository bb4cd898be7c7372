"""The command line's measuring tools for a run started from Python, one switch each:

    Trainer(cfg, task, callbacks=measuring_tools(plots=True, verdict=True, system_report=True)).fit()

verdict: a TrainingMonitor samples the run and the bottleneck verdict (utils/bottleneck.py) goes into summary.json;
plots: RUN_DIR/plots/*.png (utils/plot.py); system_report: after the run, the measured report of the run's own
settings against the candidates (utils/system_report.py) in RUN_DIR/report.md. The engine's closing line, the
CLI's, "[plainloop] done: ... verdict: ...", then names this verdict, so a slow run says why at its end. The
command line builds its report with the same `measured_report`. utils/ never imports trainer/: these are
duck-typed callbacks (trainer/hooks.py) that get the Trainer they run in as their first argument, and the report's
trial runs are built from its class.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from utils.callbacks import VerdictCallback

Say = Callable[[str], None]


def measuring_tools(
    *,
    plots: bool = True,
    verdict: bool = True,
    system_report: bool = False,
    monitor_interval: float = 1.0,
    report_steps: int = 30,
    report_repeats: int = 3,
    say: Say = print,
) -> list[Any]:
    """Callbacks for Trainer(callbacks=...): the CLI's monitor and verdict, plots, system report and closing line."""
    tools: list[Any] = []
    if verdict:
        tools += [MonitorTool(monitor_interval), VerdictCallback()]
    if system_report:
        tools.append(SystemReportTool(report_steps, report_repeats, say))
    tools.append(ClosingLines(plots, say))
    return tools


def write_plots(run_dir: Path, say: Say = print) -> list[Path]:
    """RUN_DIR/plots/*.png and the line that names them (or says why there are none)."""
    try:
        from utils.plot import plot_run

        paths = plot_run(run_dir)
    except ImportError as e:
        say(f"[plainloop] plots skipped: {e}")
        return []
    say(f"[plainloop] plots: {', '.join(str(p) for p in paths)}")
    return paths


class MonitorTool:
    """Gives the run a TrainingMonitor (CPU/GPU use, step times, data wait) when it has the engine's do-nothing
    one; the engine starts the monitor right after on_fit_start."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval

    def on_fit_start(self, trainer: Any) -> None:
        if type(trainer.monitor).__name__ != "Monitor":  # the caller gave a monitor of their own: kept
            return
        from utils.performance_monitor import TrainingMonitor

        trainer.monitor = TrainingMonitor(
            interval=self.interval, batch_size=trainer.cfg.batch_size, device=trainer.rt.device
        )


class ClosingLines:
    """The plots' and the system report's lines, after the run (rank 0); the engine prints the done line with the
    verdict and the run directory after them (trainer/finish.py closing_lines)."""

    def __init__(self, plots: bool = True, say: Say = print) -> None:
        self.plots, self.say = plots, say

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        if self.plots and trainer.run_dir is not None:
            write_plots(trainer.run_dir, self.say)
        if "system_report" in summary:
            self.say(f"[plainloop] system report: {summary['system_report']}")


class SystemReportTool:
    """After the run: the measured system report of its settings (trials of `steps` steps, `repeats` rounds) in
    RUN_DIR/report.md. The trials train the run's own model; its trained weights are put back afterwards."""

    def __init__(self, steps: int = 30, repeats: int = 3, say: Say = print) -> None:
        self.steps, self.repeats, self.say = steps, repeats, say

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        if trainer.run_dir is None:
            return
        model = trainer.raw_model
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.say(f"[plainloop] system report: measuring {self.repeats} x the trials of {self.steps} steps ...")
        try:
            path = measured_report(
                type(trainer),
                trainer.requested,
                lambda: trainer.task,
                trainer.run_dir / "report.md",
                steps=self.steps,
                repeats=self.repeats,
                job_steps=trainer.total_steps,
                held=bool(trainer.data.on_device),
                config={"task": trainer.task.name, **trainer.requested.to_dict()},
            )
        finally:
            model.load_state_dict(weights)
        summary["system_report"] = str(path)


def measured_report(
    trainer_cls: Any,
    cfg: Any,
    make_task: Callable[[], Any],
    out_path: Path,
    *,
    steps: int,
    repeats: int,
    job_steps: int,
    held: bool,
    config: dict[str, Any],
    price_per_kwh: float | None = None,
    price_per_gpu_hour: float | None = None,
    currency: str = "",
    power_w: float | None = None,
) -> Path:
    """utils/system_report.py's run_system_report with trials made by `trainer_cls(cfg with the trial's settings,
    make_task())`: the CLI's --system_report and SystemReportTool. `job_steps`: the configured job's optimizer
    steps (for the projection); `held`: whether the run holds its data on the device."""
    from utils.performance_monitor import TrainingMonitor
    from utils.system_report import run_system_report

    trials = out_path.parent / "trials"
    trial_no = 0

    def run_trial(overrides: dict[str, Any], n: int) -> dict[str, Any]:
        nonlocal trial_no
        trial_no += 1
        c = dataclasses.replace(
            cfg, **overrides, max_steps=n, max_batches=None, progress_bar=False, save_best=False, save_top_k=1,
            resume=None, val_check_steps=None, val_check_batches=None, validation_interval=10**6,
            output_dir=str(trials), run_name=f"trial{trial_no}",
        )  # fmt: skip
        t = trainer_cls(
            c, make_task(), log=lambda m: None, monitor=TrainingMonitor(batch_size=c.batch_size),
            callbacks=[VerdictCallback()],
        )  # fmt: skip
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
                "num_workers": 0 if t.data.on_device else t.data.loader_kw.get("num_workers", 0),
                "torch_threads": torch.get_num_threads(),
            },
        }

    keys = ("batch_size", "num_workers", "precision", "pin_memory", "compile_model", "device_cache")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return run_system_report(
        run_trial,
        {k: getattr(cfg, k) for k in keys},
        candidates=report_candidates(cfg, held),
        steps=steps,
        out_path=out_path,
        config=config,
        repeats=repeats,
        job_samples=job_steps * cfg.accumulate_grad_batches * cfg.batch_size * world,
        price_per_kwh=price_per_kwh,
        price_per_gpu_hour=price_per_gpu_hour,
        currency=currency,
        power_w=power_w,
        gpus=1,
        trial_dir=trials,
    )  # removes the trial runs


def step_fn(t: Any) -> Callable[[], None]:
    """One full training step of trainer `t` on its next batch, for the profiler and the system report."""
    it = iter(t.data.loader)
    t.model.train()

    def run() -> None:
        nonlocal it
        try:
            batch = next(it)
        except StopIteration:
            it = iter(t.data.loader)
            batch = next(it)
        if not t.data.on_device:
            batch = _to_device(batch, t.rt.device)
        t.forward_backward(batch, 1)
        t.opt.step(False)

    return run


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields"):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def report_candidates(cfg: Any, held: bool | None = None) -> list[dict[str, Any]]:
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
