"""plainloop's engine: copy this folder into your repo and `from trainer import Trainer, TrainConfig, Task`.

Self-contained: torch, numpy and the standard library (tqdm optional); nothing from the rest of plainloop.
SPDX-License-Identifier: MIT. Copyright (c) 2026 The plainloop authors; keep this line in a copy (text: LICENSE).
"""

from .base import BaseTrainer
from .config import TrainConfig
from .hooks import Callback
from .loop import Trainer
from .task import Task

__all__ = ["BaseTrainer", "Callback", "TrainConfig", "Task", "Trainer"]
