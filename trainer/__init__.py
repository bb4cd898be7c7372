"""plainloop's engine: copy this folder into your repo and `from trainer import Trainer, TrainConfig, Task`.

Self-contained: torch, numpy and the standard library (tqdm optional); nothing from the rest of plainloop.
SPDX-License-Identifier: MIT. Copyright (c) 2026 The plainloop authors; keep this line in a copy (text: LICENSE).
"""

import sys

from . import layers, runtime
from .cli import options
from .cli.app_tools import APP_TOOLS  # noqa: F401 (trainer.APP_TOOLS: scripts/docs_api.py reads it)
from .cli.app_tools import app_tool as __getattr__  # noqa: F401 (the measuring tools, utils/, on first use)
from .cli.command import rerun_command, resume_command
from .compat.base_trainer import BaseTrainer, LoaderDraws
from .compat.lightning import adapt_lightning_task
from .compat.nanogpt import adapt_targets_task, refuse_criterion_loss
from .config import TrainConfig
from .evaluation import accuracy, top_k_accuracy
from .extras import autobatch, ema, loggers
from .extras.ema import EMA
from .extras.fsdp import export_model, shard_model
from .extras.loggers import CSVLogger, WandbLogger
from .extras.summary import ModelSummary
from .hooks import Callback
from .loop import Trainer
from .task import Task

# the layers plug into the core here; the core never imports them (trainer/layers.py)
layers.TASK_ADAPTERS += [refuse_criterion_loss, adapt_lightning_task, adapt_targets_task]
layers.CONFIG_CALLBACKS += [EMA.for_config, ModelSummary.for_config, LoaderDraws.for_config]
layers.RESUME_COMMANDS.append(resume_command)
layers.RERUN_COMMANDS.append(rerun_command)
layers.SHARDERS.append(shard_model)
# module paths earlier docs showed (`from trainer.ema import EMA`) name the same modules still
for _old, _module in (("ema", ema), ("loggers", loggers), ("autobatch", autobatch), ("setup", runtime),
                      ("options", options)):  # fmt: skip
    sys.modules.setdefault(f"{__name__}.{_old}", _module)

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)
__all__ = ["BaseTrainer", "CSVLogger", "Callback", "EMA", "ModelSummary", "TrainConfig", "Task", "Trainer",
           "WandbLogger", "accuracy", "export_model", "top_k_accuracy",
           # APP_TOOLS' names, written out for the API reference's reader (griffe); a test keeps them equal
           "measuring_tools", "TrainingMonitor", "TensorBoardLogger", "plot_run", "diagnose", "hardware_info"]  # fmt: skip
