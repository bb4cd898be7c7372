"""plainloop's engine: copy this folder into your repo and `from trainer import Trainer, TrainConfig, Task`.

Self-contained: torch, numpy and the standard library (tqdm optional); nothing from the rest of plainloop.
SPDX-License-Identifier: MIT. Copyright (c) 2026 The plainloop authors; keep this line in a copy (text: LICENSE).
"""

from . import layers
from .cli.command import rerun_command, resume_command
from .compat.base_trainer import BaseTrainer
from .compat.lightning import adapt_lightning_task
from .compat.nanogpt import adapt_targets_task
from .config import TrainConfig
from .evaluation import accuracy, top_k_accuracy
from .extras.ema import EMA
from .extras.summary import ModelSummary
from .hooks import Callback
from .loop import Trainer
from .task import Task

# the layers plug into the core here; the core never imports them (trainer/layers.py)
layers.TASK_ADAPTERS += [adapt_lightning_task, adapt_targets_task]
layers.CONFIG_CALLBACKS += [EMA.for_config, ModelSummary.for_config]
layers.RESUME_COMMANDS.append(resume_command)
layers.RERUN_COMMANDS.append(rerun_command)

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)
__all__ = ["BaseTrainer", "Callback", "TrainConfig", "Task", "Trainer", "accuracy", "top_k_accuracy"]
