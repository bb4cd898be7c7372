"""The end of a run: how fit() exits when it does not finish (a stop signal, divergence), and the summary."""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .evaluation import BestTracker
from .runtime import Runtime
from .state import Progress
from .task import Task


class TrainingStopped(SystemExit):
    """Raised by fit() after a stop signal: last.pt is written; exit code 128 + the signal number."""


class TrainingDiverged(SystemExit):
    """Raised by fit() when steps kept being non-finite: no non-finite weights were saved; exit code 3."""


def summary_of(
    *,
    task: Task,
    rt: Runtime,
    run_dir: Path | None,
    progress: Progress,
    start_step: int,
    train_time: float,
    stats: dict[str, float],
    monitor: Mapping[str, object],
    skipped: int,
    best: BestTracker,
    notes: list[str],
    val: dict[str, float],
    test: dict[str, float],
    model: nn.Module,
    weight_diff: float | None = None,
) -> dict[str, object]:
    """The run's summary (summary.json); writes the task's array artifacts beside it on rank 0. Under DDP it holds
    a collective unless `weight_diff` (ddp_weight_diff of the trained weights) is given: every rank calls it."""
    st = stats
    peak = torch.cuda.max_memory_allocated(rt.device) / 2**20 if rt.device.type == "cuda" else None
    summary: dict[str, object] = {
        "task": task.name, "run_dir": str(run_dir), "device": str(rt.device), "precision": rt.precision,
        "world_size": rt.world_size, "steps": progress.step, "epochs": progress.epoch, "skipped_steps": skipped,
        "steps_this_process": progress.step - start_step, "train_time_s": train_time,
        "samples_per_s": st["samples"] * rt.world_size / st["iter_s"] if st["iter_s"] else None,
        "step_time_s": {"mean": st["iter_s"] / st["iters"] if st["iters"] else None,
                        "data_wait_frac": st["data_s"] / st["iter_s"] if st["iter_s"] else None},
        "peak_memory_mb": peak,
        "final_metrics": {**val, **test},
        "best": {best.metric: best.best},
        "monitor": monitor,
        "notes": notes,
        "info": task.info,
    }  # fmt: skip
    if "wall_s" in st:
        summary["wall_time"] = wall_split(st)
    if "scores" in task.artifacts:
        summary["test_scores"] = task.artifacts["scores"]
    if rt.is_main and run_dir is not None:
        for name, arrays in task.artifacts.items():
            if isinstance(arrays, dict) and arrays and all(hasattr(v, "shape") for v in arrays.values()):
                np.savez(Path(run_dir) / f"{name}.npz", **arrays)
    if rt.distributed and not hasattr(next(model.parameters(), None), "full_tensor"):  # fsdp shards: no replicas
        summary["ddp_max_weight_diff"] = weight_diff if weight_diff is not None else ddp_weight_diff(model)
    return summary


def add_time(stats: MutableMapping[str, float], key: str, since: float) -> None:
    """stats[key] += the host time since `since` (time.perf_counter())."""
    stats[key] = stats.get(key, 0.0) + time.perf_counter() - since


def steps_time(stats: Mapping[str, float]) -> float:
    """The iterations' time less the validations and saves inside them (val_check_steps, mid-epoch last.pt)."""
    return stats["iter_s"] - stats.get("val_s", 0.0) - stats.get("ckpt_s", 0.0)


def wall_split(stats: Mapping[str, float]) -> dict[str, float]:
    """Where the fit's wall time (`wall_s`, from the run directory's opening to the summary) went: steps, validation
    (and the test), checkpoints (what the loop waited for: the in-line saves, the snapshot of a background one, the
    wait for the last) and the rest (epoch ends, logging, the summary), adding up to wall_s. Host clocks, read where the run already syncs (log
    points, validation's one read, a save's copy): the steps' own clock is the iterations' (`steps_s`)."""
    got = {k: max(0.0, stats.get(k, 0.0)) for k in ("steps_s", "val_s", "test_s", "ckpt_s")}
    parts = {"steps_s": got["steps_s"], "validation_s": got["val_s"] + got["test_s"], "checkpoints_s": got["ckpt_s"]}
    wall = max(stats["wall_s"], sum(parts.values()))  # clocks read at different points never add past the wall
    return {"wall_s": wall, **parts, "rest_s": wall - sum(parts.values())}


def wall_shares(split: Mapping[str, float]) -> str:
    """'wall 12.3 s: steps 80%, validation 12%, checkpoints 3%, rest 5%'."""
    wall = split["wall_s"]
    shares = [f"{k[:-2]} {100 * split[k] / wall:.0f}%" for k in ("steps_s", "validation_s", "checkpoints_s", "rest_s")]
    return f"wall {wall:.1f} s: {', '.join(shares)}" if wall > 0 else f"wall {wall:.1f} s"


def closing_lines(summary: Mapping[str, object], run_dir: Path | None) -> list[str]:
    """The run's last lines, from the command line and Python alike: steps, time, speed, skipped steps and the
    verdict, then the run directory. The verdict and the re-run command are what callbacks put in the summary
    (the command line's, or utils' measuring tools): the engine measures no bottleneck itself."""
    v, sps, steps = summary.get("verdict"), summary.get("samples_per_s"), summary["steps"]
    verdict = (v.get("headline") or v.get("verdict")) if isinstance(v, dict) else None
    now = summary.get("steps_this_process", steps)
    rerun, wall = summary.get("rerun"), summary.get("wall_time")
    return [
        f"[plainloop] done: {steps} steps{f' ({now} since the resume)' if now != steps else ''} in "
        f"{summary['train_time_s']:.1f} s{f' ({wall_shares(wall)})' if isinstance(wall, dict) else ''}, "
        f"{f'{sps:.0f}' if isinstance(sps, float | int) else '?'} samples/s, "
        f"{summary.get('skipped_steps', 0)} skipped, verdict: {verdict or 'not judged'}",
        f"[plainloop] run directory: {run_dir}{f' (re-run: {rerun})' if rerun else ''}",
    ]


def ddp_weight_diff(model: torch.nn.Module) -> float:
    """Largest difference of any weight between ranks (0.0 when DDP kept them in step); a collective: every rank."""
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return float((hi - lo).abs().max())
