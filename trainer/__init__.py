"""plainloop's engine: copy this folder into your repo and `from trainer import Trainer, TrainConfig, Task`.

Self-contained: torch, numpy and the standard library (tqdm optional); nothing from the rest of plainloop.
SPDX-License-Identifier: MIT. Copyright (c) 2026 The plainloop authors; keep this line in a copy (text: LICENSE).
"""

import importlib
import sys
from typing import Any

from . import layers, runtime
from .cli import options
from .cli.command import rerun_command, resume_command
from .compat.base_trainer import BaseTrainer, LoaderDraws
from .compat.lightning import adapt_lightning_task
from .compat.nanogpt import adapt_targets_task, refuse_criterion_loss
from .config import TrainConfig
from .evaluation import accuracy, top_k_accuracy
from .extras import autobatch, ema, loggers
from .extras.ema import EMA
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
# module paths earlier docs showed (`from trainer.ema import EMA`) name the same modules still
for _old, _module in (("ema", ema), ("loggers", loggers), ("autobatch", autobatch), ("setup", runtime),
                      ("options", options)):  # fmt: skip
    sys.modules.setdefault(f"{__name__}.{_old}", _module)

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)
# The measuring tools live beside the command line (utils/), which installs with the package as plainloop._app and
# is not part of a copied trainer/: imported on first use, so `import plainloop` stays light.
APP_TOOLS = {
    "measuring_tools": "utils.tools",  # Trainer(callbacks=measuring_tools()): monitor, verdict, plots, report
    "TrainingMonitor": "utils.performance_monitor",
    "TensorBoardLogger": "utils.tensorboard_logger",
    "plot_run": "utils.plot",  # plot_run(RUN_DIR): the PNGs of a finished run (plainloop plot RUN_DIR)
    "diagnose": "utils.bottleneck",  # the measured bottleneck verdict of a run's summary
    "hardware_info": "utils.system_report",  # this machine, as the system report's first part
}
__all__ = [
    "BaseTrainer",
    "CSVLogger",
    "Callback",
    "EMA",
    "ModelSummary",
    "TrainConfig",
    "Task",
    "Trainer",
    "WandbLogger",
    "accuracy",
    "top_k_accuracy",
    *APP_TOOLS,
]


def __getattr__(name: str) -> Any:
    if name not in APP_TOOLS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        app = importlib.import_module(f"{__name__}._app")
    except ImportError:
        raise AttributeError(
            f"{name} comes with the installed package (pip install plainloop: from plainloop import {name}); in "
            f"plainloop's repository: from {APP_TOOLS[name]} import {name}"
        ) from None
    return getattr(importlib.import_module(app.rename(APP_TOOLS[name])), name)
