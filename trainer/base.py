"""BaseTrainer: the seed guides' door into the loop.

Seed 000's quick start runs with only its import lines changed:

    from trainer.base import BaseTrainer, MODEL_SAVE_PATH
    from models.ratransformer import RecursiveAttentionTransformer
    from datasets.era5 import ERA5SSTMonthlyDataset
    from datasets.area import Area

What BaseTrainer hands to your classes (each decision is one line printed at the start of training):
- the dataset gets `lon=area.lon, lat=area.lat` when its `__init__` names `lon`/`lat` (else `area=` when it
  names `area`), and `split=` / `split_ratio=` when it names them; a dataset that names no `split` is cut in
  time order by `split_ratio`. `area=None` is fine for data without an area.
- the model gets the area as `area=` when its `__init__` names `area`, else as `lon_range`/`lat_range` when it
  names those, unless model_params already gives them.
- parameters absorbed by a `**kwargs` never count as "named": nothing is passed on a guess.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Subset

from .checkpoint import CheckpointError, atomic_save, load_checkpoint
from .config import TrainConfig
from .loop import Trainer
from .options import ConfigError
from .task import Task

# Where the seed's scripts keep trained models (their src.config.params.MODEL_SAVE_PATH).
MODEL_SAVE_PATH = os.environ.get("PLAINLOOP_MODEL_DIR", "saved_models")

_CONFIG_KEYS = [f.name for f in dataclasses.fields(TrainConfig)]
_OWN_KEYS = ["split_ratio", "auto_batch_size"]  # BaseTrainer's own, beside every TrainConfig field
_CHECKPOINTS = (
    "checkpoints are always written (checkpoints/last.pt every epoch): use 'checkpoint_every' (also "
    "every N optimizer steps) and 'save_best' (best.pt by the validation metric)"
)
# Keys that users of Lightning-based trainers (the seeds' original BaseTrainer) reach for, and where each lives.
ALTERNATIVES = {
    "callbacks": "pass hook objects as BaseTrainer(..., callbacks=[...]) instead: objects with on_fit_start(trainer), "
    "on_log(trainer, row), on_fit_end(trainer, summary) (trainer/hooks.py). Early stopping is "
    "trainer_params['early_stopping_patience']; checkpoints are 'checkpoint_every' / 'save_best'",
    "early_stopping": "use 'early_stopping_patience' (validations without improvement before the run stops)",
    "enable_checkpointing": _CHECKPOINTS,
    "checkpoint_callback": _CHECKPOINTS,
    "model_checkpoint": _CHECKPOINTS,
    "max_epochs": "use 'epochs'",
    "check_val_every_n_epoch": "use 'validation_interval' (epochs between validations)",
    "val_check_interval": "use 'val_check_steps' (optimizer steps) or 'val_check_batches' (batches)",
    "log_every_n_steps": "use 'log_every' (LOG_EVERY)",
    "enable_progress_bar": "use 'progress_bar'",
    "accelerator": "use 'device' (e.g. 'cuda:0' or 'cpu'; default: the GPU when there is one)",
    "devices": "use 'device' for one device; for several GPUs launch with torchrun (DDP is automatic)",
    "strategy": "DDP is used automatically when the script is launched with torchrun (WORLD_SIZE > 1)",
    "learning_rate": "use 'lr' here, or model_params['learning_rate'] as seed 000 does",
    "use_gradient_checkpointing": "a model setting: put it in model_params (seed 000's troubleshooting, §8)",
    "auto_num_workers": "give 'num_workers' here; the measured search is the CLI's --auto_num_workers",
    "auto_scale_batch_size": "use 'auto_batch_size': True",
}

# Seed 000 §4/§6 switch the optimisations off with exactly these three: that is the "before" run.
SEED_BEFORE = {"num_workers": 0, "precision": "32", "pin_memory": False}
_LOADER_KEYS = (
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
    "multiprocessing_context",
)


def _params(cls: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # a builtin or C extension: no signature to read
        return {}


def _names(cls: Any, name: str) -> bool:
    """`cls(...)` names `name` as a parameter of its own (a **kwargs catch-all does not count)."""
    p = _params(cls).get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _required(cls: Any, name: str) -> bool:
    p = _params(cls).get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty


def check_trainer_params(tp: dict[str, Any]) -> None:
    """Unknown trainer_params keys are an error naming the supported alternative or the nearest key."""
    known = _CONFIG_KEYS + _OWN_KEYS
    special = [k for k in tp if k not in known and k in ALTERNATIVES]
    if special:
        raise ConfigError(
            "trainer_params: unsupported key(s): " + "; ".join(f"{k!r}: {ALTERNATIVES[k]}" for k in special)
        )
    unknown = [k for k in tp if k not in known]
    if unknown:
        hints = []
        for k in unknown:
            near = difflib.get_close_matches(str(k), known, n=3, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {', '.join(near)}?)" if near else ""))
        raise ConfigError(f"trainer_params: unknown key(s) {'; '.join(hints)}. Valid keys: {', '.join(sorted(known))}")


def _same(a: Any, b: Any) -> bool:
    """Two samples hold the same values (NaN equal to NaN): tensors, arrays, dicts, sequences, scalars."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        try:
            return bool(np.array_equal(a, b, equal_nan=True))
        except TypeError:  # strings and objects have no NaN
            return bool(np.array_equal(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        if a.shape != b.shape:
            return False
        if a.is_floating_point() or b.is_floating_point():
            a, b = a.double(), b.double()
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # objects that do not compare: not provably the same
        return False


def same_samples(a: Any, b: Any) -> bool:
    """True when two splits are the same samples: equal length and equal first, middle and last samples."""
    n = len(a)
    if n == 0 or len(b) != n:
        return False
    return all(_same(a[i], b[i]) for i in sorted({0, n // 2, n - 1}))


class BaseTrainer:
    """Seed-style trainer: `BaseTrainer(title, area, uid, model_class, dataset_class, save_path, ...).train()`.

    area: an object with `.lon = [west, east]` and `.lat = [south, north]` (datasets.area.Area), or None for
    data without an area. callbacks: hook objects handed to the Trainer (trainer/hooks.py); monitor: an object
    with seed 001's TrainingMonitor API (utils.performance_monitor.TrainingMonitor), fed every iteration; log:
    where the run's lines go.
    trainer_params: every TrainConfig field by its own name, plus `split_ratio` ([train, val] or [train, val,
    test], default [0.8, 0.2]) and `auto_batch_size` (True: search the largest batch that fits first).
    """

    def __init__(
        self,
        title: str,
        area: Any,
        uid: str,
        model_class: type[nn.Module],
        dataset_class: type,
        save_path: str | os.PathLike,
        pre_model: bool = False,
        dataset_params: dict | None = None,
        trainer_params: dict | None = None,
        model_params: dict | None = None,
        checkpoint_path: str | os.PathLike | None = None,
        callbacks: list[Any] | None = None,
        monitor: Any = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.title, self.area, self.uid = title, area, uid
        self.model_class, self.dataset_class = model_class, dataset_class
        self.save_path = Path(save_path)
        self.pre_model = pre_model
        self.dataset_params = dict(dataset_params or {})
        self.model_params = dict(model_params or {})
        self.callbacks = list(callbacks or [])
        self.monitor = monitor
        self.log = log
        self.notes: list[str] = []  # printed when training starts and kept in config.json
        if area is not None and not (hasattr(area, "lon") and hasattr(area, "lat")):
            raise TypeError(
                f"BaseTrainer: area={area!r} has no .lon/.lat; give a datasets.area.Area "
                f"(Area('Global', lon=[-180, 180], lat=[-80, 80])) or None for data without an area"
            )
        tp = dict(trainer_params or {})
        check_trainer_params(tp)
        self.explicit = dict(tp)  # what the user wrote, to name every setting the run does not honour
        self.split_ratio = tuple(tp.pop("split_ratio", (0.8, 0.2)))
        if (
            not (2 <= len(self.split_ratio) <= 3)
            or any(r < 0 for r in self.split_ratio)
            or sum(self.split_ratio) > 1 + 1e-9
        ):
            raise ValueError(
                f"trainer_params['split_ratio']={list(self.split_ratio)}: give 2 or 3 non-negative "
                f"fractions (train, val[, test]) that sum to at most 1"
            )
        self.auto_batch_size = tp.pop("auto_batch_size", False)
        if not isinstance(self.auto_batch_size, bool):
            raise ValueError(f"trainer_params['auto_batch_size']={self.auto_batch_size!r}: give True or False")
        if "baseline" not in tp and all(k in tp and tp[k] == v for k, v in SEED_BEFORE.items()):
            tp["baseline"] = True
            self.notes.append(
                "baseline: trainer_params switch the optimisations off as seed 000 §4 does "
                '(num_workers 0, precision 32, pin_memory False), so this is the seed\'s "before" '
                "loop: also data read through the loader instead of held in memory, .item() every "
                "step, validation every epoch (add 'baseline': False to keep those optimisations)"
            )
        tp.setdefault("run_name", f"{title}-{uid}")
        if checkpoint_path is not None:
            tp["resume"] = str(checkpoint_path)
        # The learning rate belongs to the optimizer; a model that does not take it never sees it.
        lr = self.model_params.get("learning_rate")
        if lr is not None and not _names(model_class, "learning_rate"):
            self.model_params.pop("learning_rate")
            tp.setdefault("lr", lr)
        self.config = TrainConfig.from_dict(tp)
        self.trainer: Trainer | None = None
        self._init_notes = list(self.notes)

    # ------------------------------------------------------------------ data
    def _dataset_kwargs(self) -> dict[str, Any]:
        cls, kw, area = self.dataset_class, dict(self.dataset_params), self.area
        name = getattr(cls, "__name__", str(cls))
        given = {k for k in ("lon", "lat", "area") if k in kw}
        if area is not None and not given:
            if _names(cls, "lon") and _names(cls, "lat"):
                kw.update(lon=list(area.lon), lat=list(area.lat))
            elif _names(cls, "area"):
                kw["area"] = area
            else:
                self.notes.append(
                    f"data: {name} takes neither lon/lat nor area, so area "
                    f"{getattr(area, 'title', area)!r} is not applied to the data"
                )
        elif area is None:
            missing = [k for k in ("lon", "lat") if _required(cls, k) and k not in kw]
            if missing:
                raise ValueError(
                    f"BaseTrainer: area=None, but {name} needs {' and '.join(missing)}; give "
                    f"area=Area(...) or put {', '.join(missing)} in dataset_params"
                )
        return kw

    def _datasets(self) -> tuple[Any, Any, Any]:
        cls, kw = self.dataset_class, self._dataset_kwargs()
        name = getattr(cls, "__name__", str(cls))
        ratio = self.split_ratio
        if _names(cls, "split") and "split" not in kw:
            if _names(cls, "split_ratio") and "split_ratio" not in kw:
                kw["split_ratio"] = ratio
            elif "split_ratio" in self.explicit:
                self.notes.append(
                    f"data: {name} builds its splits itself and takes no split_ratio; "
                    f"trainer_params['split_ratio']={list(ratio)} is not used"
                )
            train, val = cls(split="train", **kw), cls(split="val", **kw)
            test = cls(split="test", **kw) if len(ratio) == 3 and ratio[2] > 0 else None
            how = f"{name}(split=...) builds each split itself"
        else:
            full = cls(**kw)
            n = len(full)
            cuts = [int(round(sum(ratio[: i + 1]) * n)) for i in range(len(ratio))]
            train = Subset(full, range(0, cuts[0]))  # time order: no shuffling across the split
            val = Subset(full, range(cuts[0], cuts[1]))
            test = Subset(full, range(cuts[1], cuts[2])) if len(cuts) == 3 and cuts[2] > cuts[1] else None
            how = f"{n} samples split in order by split_ratio {list(ratio)}"
        if same_samples(train, val):
            raise ValueError(
                f"BaseTrainer: the train and val splits of {name} are the same {len(train)} samples, so validation "
                f"would score the training data. {name}.__init__ takes split= but returns the same data for "
                f"'train' and 'val': make it honour split, or remove its split parameter so BaseTrainer cuts one "
                f"dataset in time order by trainer_params['split_ratio']"
            )
        sizes = "/".join(str(len(s)) for s in (train, val, test) if s is not None)
        self.notes.append(f"data: {how}: train/val{'/test' if test is not None else ''} = {sizes} samples")
        return train, val, test

    # ------------------------------------------------------------------ model
    def _model_kwargs(self) -> dict[str, Any]:
        cls, mp, area = self.model_class, dict(self.model_params), self.area
        if area is None or {"area", "lon_range", "lat_range"} & set(mp):
            return mp  # no area, or the user placed it
        name = getattr(cls, "__name__", str(cls))
        if _names(cls, "area"):
            mp["area"] = area
            self.notes.append(
                f"model: {name} gets area={getattr(area, 'title', area)!r} (lon {list(area.lon)}, lat {list(area.lat)})"
            )
        elif _names(cls, "lon_range") or _names(cls, "lat_range"):
            given = {k: tuple(v) for k, v in (("lon_range", area.lon), ("lat_range", area.lat)) if _names(cls, k)}
            mp.update(given)
            self.notes.append(f"model: {name} gets the area as " + ", ".join(f"{k}={v}" for k, v in given.items()))
        return mp

    def build_task(self) -> Task:
        self.notes = list(self._init_notes)  # each build says its own data and model lines once
        train, val, test = self._datasets()
        torch.manual_seed(self.config.seed)
        model = self.model_class(**self._model_kwargs())
        mask = getattr(train, "ocean_mask", None)
        if mask is not None and hasattr(model, "set_ocean_mask"):
            model.set_ocean_mask(mask)
        if self.pre_model and self.save_path.is_file():
            state = torch.load(self.save_path, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"] if isinstance(state, dict) and "model" in state else state)
            self.notes.append(f"pre_model: loaded weights from {self.save_path}")
        elif self.pre_model:
            self.notes.append(f"pre_model: {self.save_path} does not exist yet; starting from scratch")
        elif self.save_path.is_file():
            self.notes.append(f"save_path: {self.save_path} already exists; this run's weights will replace it")
        area = None if self.area is None else getattr(self.area, "title", str(self.area))
        return Task(
            self.title,
            model,
            train,
            val if val is not None and len(val) else None,
            test,
            info={"title": self.title, "uid": self.uid, "area": area},
        )

    # ------------------------------------------------------------------ training
    def _loader_notes(self, t: Trainer) -> list[str]:
        """Explicit loader settings the run does not honour, each named with the reason (once, at start-up)."""
        ex = {k: self.explicit[k] for k in _LOADER_KEYS if k in self.explicit}
        cfg, notes = t.cfg, []
        if t.requested.baseline:
            changed = {k: v for k, v in ex.items() if getattr(cfg, k) != v}
            if changed:
                notes.append(
                    "baseline: "
                    + ", ".join(f"{k}={v!r} -> {getattr(cfg, k)!r}" for k, v in changed.items())
                    + " (the baseline loop fixes these; drop 'baseline' to use yours)"
                )
            return notes
        if t.on_device:
            # the engine already names num_workers (and the other two with it) when it is non-zero
            unused = [
                k
                for k in ex
                if k != "num_workers" and not (cfg.num_workers and k in ("prefetch_factor", "persistent_workers"))
            ]
            unused = [k for k in unused if not (k == "pin_memory" and ex[k] is False)]
            if unused:
                notes.append(
                    f"{', '.join(f'{k}={ex[k]!r}' for k in unused)} not used: the data is held in memory on "
                    f"{t.rt.device.type} and batches are gathered there without a DataLoader; "
                    f"'device_cache': False brings the loader back"
                )
        elif t.loader_kw.get("num_workers", 0) == 0:
            unused = [k for k in ("prefetch_factor", "multiprocessing_context") if k in ex]
            if unused:
                notes.append(
                    f"{', '.join(f'{k}={ex[k]!r}' for k in unused)} not used: they only apply to loader "
                    f"worker processes and num_workers is 0"
                )
        return notes

    def train(self) -> nn.Module:
        """Train and return the model; its state dict is written atomically to save_path."""
        task = self.build_task()
        if self.auto_batch_size:
            from .autobatch import auto_batch_size

            self.config, note = auto_batch_size(self.config, task)
            self.notes.append(note)
        self.trainer = t = Trainer(self.config, task, log=self.log, callbacks=self.callbacks, monitor=self.monitor)
        t.notes[:0] = self.notes + self._loader_notes(t)  # printed first by fit() and written to config.json
        self.summary = t.fit()
        model = t.raw_model
        if t.rt.is_main:
            atomic_save(model.state_dict(), self.save_path)
            self.log(f"[plainloop] saved model state dict to {self.save_path}")
        return model


def load_model_weights(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load a save_path state dict or a plainloop checkpoint into `model` (weights_only)."""
    p = Path(path)
    try:
        state = load_checkpoint(p)  # a plainloop checkpoint: its digest is verified
        state = state["model"]
    except CheckpointError as e:
        if "no 'model' entry" not in str(e):
            raise
        state = torch.load(p, map_location="cpu", weights_only=True)  # a plain state dict (save_path)
    model.load_state_dict(state)
    return model
