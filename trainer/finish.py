"""The end of a run: the test split, early stopping, a stop signal, a diverged run, and the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .build import load_checkpoint_into, position
from .setup import launch_prefix
from .usercode import resume_hint


class TrainingStopped(SystemExit):
    """Raised by fit() after a stop signal: last.pt is written; exit code 128 + the signal number."""


class TrainingDiverged(SystemExit):
    """Raised by fit() when steps kept being non-finite: no non-finite weights were saved; exit code 3."""


def test_split(self: Any) -> dict[str, float]:
    parts = getattr(self, "parts", None)
    own_test = parts is not None and parts.adapter.test_step is not None
    if self.task.test_set is None or (self.task.evaluate_fn is None and not own_test):
        return {}
    if not self.rt.is_main:  # rank 0 scores the test split
        return {}
    best = self.run_dir / "checkpoints" / "best.pt"
    if self.cfg.test_with_best and best.is_file():
        load_checkpoint_into(self, best, weights_only=True)
        value = f"{self.best.best:.4g}" if self.best.best is not None else "?"
        self.notes.append(f"test: scored with the weights of {best} ({self.best.metric}={value})")
    return self.evaluate("test")


def early_stop(self: Any) -> bool:
    patience = self.cfg.early_stopping_patience
    if patience is None or self.best.stale < patience:
        return False
    self.notes.append(
        f"early stopping: {self.best.metric} did not improve for {patience} validations "
        f"(best {self.best.best:.4g}); stopped at step {self.step}"
    )
    self.log(f"[plainloop] {self.notes[-1]}")
    return True


def diverged(self: Any, run: int) -> None:
    msg = (
        f"stopped at step {self.step}: the last {run} optimizer steps had non-finite loss or gradients and "
        f"were skipped (--max_consecutive_skips {self.cfg.max_consecutive_skips}). Nothing non-finite was "
        f"saved; {self.run_dir / 'checkpoints'} holds the last finite weights. Try a lower --lr, "
        f"--gradient_clip_val 1.0, precision 32, or check the data for NaN/inf values."
    )
    self._row({"kind": "event", "step": self.step, "event": "diverged", "message": msg})
    self.log(f"[plainloop] {msg}")
    if self.files is not None:
        self.files.close()
    if self.rt.distributed:
        dist.barrier()  # every rank diverges at the same step (averaged gradients); none exits before rank 0 wrote
    raise TrainingDiverged(3)


def stopped_by_signal(self: Any, signum: int, train_time: float) -> None:
    name = self.stop.name
    msg = (
        f"{name}: stopped after step {self.step} ({position(self)}); "
        f"{self.run_dir / 'checkpoints' / 'last.pt'} written. Resume with: "
        f"{resume_hint(self.run_dir, launch_prefix())}"
    )
    self._row({"kind": "event", "step": self.step, "event": "stopped", "signal": name})
    self.log(f"[plainloop] {msg}")
    summary = summary_of(self, train_time, {}, {})  # on every rank: under DDP it holds a collective
    if self.rt.is_main:
        summary["stopped_by"] = name
        self.files.write_json("summary.json", summary)
        self.files.close()
    if self.rt.distributed:
        dist.barrier()  # no rank exits (and has torchrun end the others) before rank 0 has written
    raise TrainingStopped(128 + signum)


def summary_of(
    t: Any, train_time: float, val: dict[str, float], test: dict[str, float], weight_diff: float | None = None
) -> dict[str, Any]:
    """The run's summary; under DDP with `weight_diff` (ddp_weight_diff of the trained weights) or measured now."""
    st, mon = t.stats, t.monitor.get_summary()
    peak = torch.cuda.max_memory_allocated(t.rt.device) / 2**20 if t.rt.device.type == "cuda" else None
    skipped = t.opt.skip_counts()[0]
    summary: dict[str, Any] = {
        "task": t.task.name, "run_dir": str(t.run_dir), "device": str(t.rt.device), "precision": t.rt.precision,
        "world_size": t.rt.world_size, "steps": t.step, "epochs": t.epoch, "skipped_steps": skipped,
        "steps_this_process": t.step - getattr(t, "_start_step", 0), "train_time_s": train_time,
        "samples_per_s": st["samples"] * t.rt.world_size / st["iter_s"] if st["iter_s"] else None,
        "step_time_s": {"mean": st["iter_s"] / st["iters"] if st["iters"] else None,
                        "data_wait_frac": st["data_s"] / st["iter_s"] if st["iter_s"] else None},
        "peak_memory_mb": peak,
        "final_metrics": {**val, **test},
        "best": {t.best.metric: t.best.best},
        "monitor": mon,
        "notes": t.notes,
        "info": t.task.info,
    }  # fmt: skip
    if "scores" in t.task.artifacts:
        summary["test_scores"] = t.task.artifacts["scores"]
    if t.rt.is_main:
        for name, arrays in t.task.artifacts.items():
            if isinstance(arrays, dict) and arrays and all(hasattr(v, "shape") for v in arrays.values()):
                np.savez(Path(t.run_dir) / f"{name}.npz", **arrays)
    if t.rt.distributed:
        summary["ddp_max_weight_diff"] = weight_diff if weight_diff is not None else ddp_weight_diff(t.raw_model)
    return summary


def ddp_weight_diff(model: torch.nn.Module) -> float:
    """Largest difference of any weight between ranks (0.0 when DDP kept them in step); a collective: every rank."""
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return float((hi - lo).abs().max())
