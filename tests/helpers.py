"""Plain helpers shared by several test modules (fixtures are in conftest.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trainer import TrainConfig, Trainer

# CLI flags that shrink the ERA5 task to seconds on a CPU: a 10° grid and a one-layer d_model 32 model.
SMALL = [
    "--resolution",
    "10",
    "--d_model",
    "32",
    "--dim_feedforward",
    "64",
    "--num_layers",
    "1",
    "--no-progress_bar",
    "--no-plots",
]


def toy_config(tmp_path: Path, **kw: Any) -> TrainConfig:
    """The engine tests' TrainConfig: 2 epochs of batch 32 in the main process, a run in tmp_path; kw overrides.
    last.pt at every epoch end (checkpoint_interval 0), so that a test can stop or kill a run at any epoch; the
    default interval has its own tests (test_checkpoint_cadence.py)."""
    base = dict(
        epochs=2,
        batch_size=32,
        num_workers=0,
        output_dir=str(tmp_path),
        run_name="run",
        progress_bar=False,
        log_every=4,
        validation_interval=1,
        warmup_steps=2,
        checkpoint_interval=0,
    )
    return TrainConfig(**{**base, **kw})


def metric_rows(run_dir: Path) -> list[dict]:
    """The rows of a run directory's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cut_short(trainer: Trainer, **length: int) -> None:
    """The job interrupted early: the run's length (max_epochs, total_steps) lowered before fit()."""
    trainer.length = dataclasses.replace(trainer.length, **length)
