"""BaseTrainer: the seed guides' door into the loop.

Seed 000's quick start runs with only its import lines changed:

    from trainer.base import BaseTrainer, MODEL_SAVE_PATH
    from models.ratransformer import RecursiveAttentionTransformer
    from datasets.era5 import ERA5SSTMonthlyDataset
    from datasets.area import Area
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Subset

from .checkpoint import atomic_save, load_checkpoint
from .config import TrainConfig
from .loop import Trainer
from .task import Task

# Where the seed's scripts keep trained models (their src.config.params.MODEL_SAVE_PATH).
MODEL_SAVE_PATH = os.environ.get("PLAINLOOP_MODEL_DIR", "saved_models")

_CONFIG_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}
_DATA_KEYS = {"split_ratio"}


def _accepts(fn: Any, name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class BaseTrainer:
    """Seed-style trainer: `BaseTrainer(title, area, uid, model_class, dataset_class, save_path, ...).train()`."""

    def __init__(self, title: str, area: Any, uid: str, model_class: type[nn.Module], dataset_class: type,
                 save_path: str | os.PathLike, pre_model: bool = False, dataset_params: dict | None = None,
                 trainer_params: dict | None = None, model_params: dict | None = None,
                 checkpoint_path: str | os.PathLike | None = None) -> None:
        self.title, self.area, self.uid = title, area, uid
        self.model_class, self.dataset_class = model_class, dataset_class
        self.save_path = Path(save_path)
        self.pre_model = pre_model
        self.dataset_params = dict(dataset_params or {})
        self.model_params = dict(model_params or {})
        tp = dict(trainer_params or {})
        unknown = sorted(set(tp) - _CONFIG_KEYS - _DATA_KEYS)
        if unknown:
            raise ValueError(f"trainer_params: unknown key(s) {unknown}; known keys: {sorted(_CONFIG_KEYS | _DATA_KEYS)}")
        self.split_ratio = tuple(tp.pop("split_ratio", (0.8, 0.2)))
        if not (2 <= len(self.split_ratio) <= 3) or any(r < 0 for r in self.split_ratio) or sum(self.split_ratio) > 1 + 1e-9:
            raise ValueError(f"trainer_params['split_ratio']={list(self.split_ratio)}: give 2 or 3 non-negative "
                             f"fractions (train, val[, test]) that sum to at most 1")
        tp.setdefault("run_name", f"{title}-{uid}")
        if checkpoint_path is not None:
            tp["resume"] = str(checkpoint_path)
        # The learning rate belongs to the optimizer; a model that does not take it never sees it.
        lr = self.model_params.get("learning_rate")
        if lr is not None and not _accepts(model_class.__init__, "learning_rate"):
            self.model_params.pop("learning_rate")
            tp.setdefault("lr", lr)
        self.config = TrainConfig.from_dict(tp)
        self.trainer: Trainer | None = None

    def _datasets(self) -> tuple[Any, Any, Any]:
        kw = dict(lon=self.area.lon, lat=self.area.lat, **self.dataset_params)
        if _accepts(self.dataset_class.__init__, "split"):
            ratio = self.split_ratio
            mk = lambda split: self.dataset_class(split=split, split_ratio=ratio, **kw)  # noqa: E731
            return mk("train"), mk("val"), (mk("test") if len(ratio) == 3 and ratio[2] > 0 else None)
        full = self.dataset_class(**kw)
        n = len(full)
        cuts = [int(round(sum(self.split_ratio[: i + 1]) * n)) for i in range(len(self.split_ratio))]
        train = Subset(full, range(0, cuts[0]))  # time order: no shuffling across the split
        val = Subset(full, range(cuts[0], cuts[1]))
        test = Subset(full, range(cuts[1], cuts[2])) if len(cuts) == 3 and cuts[2] > cuts[1] else None
        return train, val, test

    def build_task(self) -> Task:
        train, val, test = self._datasets()
        torch.manual_seed(self.config.seed)
        model = self.model_class(**self.model_params)
        mask = getattr(train, "ocean_mask", None)
        if mask is not None and hasattr(model, "set_ocean_mask"):
            model.set_ocean_mask(mask)
        if self.pre_model and self.save_path.is_file():
            state = torch.load(self.save_path, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"] if isinstance(state, dict) and "model" in state else state)
            print(f"[plainloop] pre_model: loaded weights from {self.save_path}")
        elif self.pre_model:
            print(f"[plainloop] pre_model: {self.save_path} does not exist yet; starting from scratch")
        return Task(self.title, model, train, val if val is not None and len(val) else None, test,
                    info={"title": self.title, "uid": self.uid, "area": getattr(self.area, "title", str(self.area))})

    def train(self) -> nn.Module:
        """Train and return the model; its state dict is written atomically to save_path."""
        task = self.build_task()
        self.trainer = Trainer(self.config, task)
        self.summary = self.trainer.fit()
        model = self.trainer.raw_model
        if self.trainer.rt.is_main:
            atomic_save(model.state_dict(), self.save_path)
            print(f"[plainloop] saved model state dict to {self.save_path}")
        return model


def load_model_weights(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load a save_path state dict or a plainloop checkpoint into `model` (weights_only)."""
    p = Path(path)
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception:
        state = load_checkpoint(p)  # raises the clear error
    model.load_state_dict(state["model"] if "model" in state else state)
    return model
