"""Where the layers plug into the core, so that the core never imports them.

`trainer/__init__.py` fills these lists when the package is imported (as it always is before any of its modules):
- TASK_ADAPTERS: each in turn takes the Task given to `Trainer` (or the one the adapter before it made) and returns a
  Task the core trains as it is (a LightningModule or nanoGPT-style model becomes a loss, an evaluation, an optimizer
  and callbacks), or None to leave it as it is.
- CONFIG_CALLBACKS: each takes the TrainConfig and the callbacks given so far and returns a callback the config
  asks for with its one-line note or None (EMA for `ema_decay`, the model summary for `summary`), or None.
- SHARDERS: each takes the user's model, the TrainConfig, the Runtime and the notes; the first to return a value (its
  model sharded in place, for --strategy fsdp) gives what the loop calls and the registry's model and optimizer parts.
- RESUME_COMMANDS / RERUN_COMMANDS: the command line's own resume and re-run lines while it runs (trainer/cli), or
  None; the core's messages fall back to the Python call.
A copy of `trainer/` used without its `__init__.py` trains plain models only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .config import TrainConfig
from .task import Task

TaskAdapter = Callable[[Task], "Task | None"]
ConfigCallback = Callable[[TrainConfig, list[object]], "tuple[object, str | None] | None"]
ResumeCommand = Callable[[str | os.PathLike[str], str], str | None]  # (run or checkpoint, launch prefix) -> a line
Sharder = Callable[[Any, TrainConfig, Any, list[str]], Any]  # (model, cfg, runtime, notes) -> extras.fsdp.Sharding
RerunCommand = Callable[[str | os.PathLike[str]], str | None]  # (a run's config.toml) -> a line

TASK_ADAPTERS: list[TaskAdapter] = []
CONFIG_CALLBACKS: list[ConfigCallback] = []
RESUME_COMMANDS: list[ResumeCommand] = []
RERUN_COMMANDS: list[RerunCommand] = []
SHARDERS: list[Sharder] = []


def adapt_task(task: Task) -> Task:
    """The task as every adapter in turn leaves it."""
    for adapter in TASK_ADAPTERS:
        task = adapter(task) or task
    return task


def config_callbacks(cfg: TrainConfig, given: list[object]) -> tuple[list[object], list[str]]:
    """The callbacks `cfg` asks for that `given` does not already hold, and a note for each."""
    made: list[object] = []
    notes: list[str] = []
    for factory in CONFIG_CALLBACKS:
        out = factory(cfg, given + made)
        if out is not None:
            made.append(out[0])
            notes += [out[1]] if out[1] else []
    return made, notes
