"""BaseTrainer: the door of the seed guides, `BaseTrainer(title, uid, area, model_class, dataset_class, ...).train()`.

A script written for the Lightning-based BaseTrainer the guides describe runs with only its import lines changed:

    from trainer import BaseTrainer
    from trainer.compat.base_trainer import MODEL_SAVE_PATH, load_model

Called with the same arguments it trains on the same feed, with the same cadence: one dataset cut in time order
(`int(n * split_ratio[0])` training samples, the rest validation), every sample in that order each epoch, the
last short batch kept, validation after every epoch, and the global random state left to the caller unless
trainer_params gives `seed`. Where plainloop still runs differently on purpose (precision, loader workers, data
held in memory, cudnn autotuning), one line at the start of training says so and names the key that matches.

What BaseTrainer hands to your classes (each decision is one line printed at the start of training):
- the dataset gets `lon=area.lon, lat=area.lat` when its `__init__` names `lon`/`lat` (else `area=` when it
  names `area`), and `split=` / `split_ratio=` when it names them; a dataset that names no `split` is cut in
  time order by `split_ratio`. `area=None` is fine for data without an area.
- the model gets the area as `area=` when its `__init__` names `area`, else as `lon_range`/`lat_range` when it
  names those, unless model_params already gives them.
- parameters absorbed by a `**kwargs` never count as "named": nothing is passed on a guess.

`save()` writes the weights and the constructor arguments (tuples, nested tuples and areas kept as their types)
in a file that loads with weights_only=True; `load_model(path)` rebuilds the model from it in one call.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, Protocol, TypeGuard

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from ..checkpoint import CheckpointError, atomic_save, load_checkpoint
from ..config import ConfigError, TrainConfig, run_name_problem, unknown_keys, writable_dir_problem
from ..extras.autobatch import auto_batch_size
from ..extras.loggers import WandbLogger
from ..loop import Trainer
from ..runtime import rng_state, set_rng_state
from ..task import Task

# Where the scripts keep trained models (their MODEL_SAVE_PATH).
MODEL_SAVE_PATH = os.environ.get("PLAINLOOP_MODEL_DIR", "saved_models")

_CONFIG_KEYS = [f.name for f in dataclasses.fields(TrainConfig)]
_OWN_KEYS = ["split_ratio", "auto_batch_size"]  # BaseTrainer's own, beside every TrainConfig field
# Keys of the Lightning-based BaseTrainer, honoured (or noted) by BaseTrainer itself
LIGHTNING_KEYS = ["save_top_k", "monitor", "mode", "matmul_precision", "accelerator", "devices"]
# What the Lightning-based BaseTrainer did with a key left out: its run length and batch, its loaders (no
# shuffling, the last short batch kept) and Lightning's validation after every epoch.
FEED_DEFAULTS: dict[str, int | bool] = {
    "epochs": 100,
    "batch_size": 20,
    "shuffle": False,
    "drop_last": False,
    "validation_interval": 1,
}
DEFAULT_SPLIT = (0.8, 0.2)
LIGHTNING_WORKERS = 8  # its loaders' num_workers (validation: half)
_CHECKPOINTS = (
    "checkpoints are always written (checkpoints/last.pt every checkpoint_interval seconds of training, at the end "
    "and on a stop signal): use 'checkpoint_interval', 'checkpoint_every' (every N optimizer steps) and 'save_best' "
    "(best.pt by the validation metric)"
)
# Keys that users of Lightning-based trainers reach for, and where each lives.
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
    "strategy": "DDP is used automatically when the script is launched with torchrun (WORLD_SIZE > 1)",
    "learning_rate": "use 'lr' here, or model_params['learning_rate'] as the guides do",
    "use_gradient_checkpointing": "a model setting: put it in model_params",
    "auto_num_workers": "give 'num_workers' here; the measured search is the CLI's --auto_num_workers",
    "auto_scale_batch_size": "use 'auto_batch_size': True",
}

# The guides switch the optimisations off with exactly these three: that is the "before" run.
BEFORE_SETTINGS = {"num_workers": 0, "precision": "32", "pin_memory": False}
_LOADER_KEYS = (
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
    "multiprocessing_context",
)


class AreaLike(Protocol):
    """What BaseTrainer reads of an area (datasets.area.Area): its longitude and latitude bounds."""

    @property
    def lon(self) -> Sequence[float]: ...

    @property
    def lat(self) -> Sequence[float]: ...


class _Samples(Protocol):
    """A map-style dataset: its length and its samples by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> object: ...


def _is_area(x: object) -> TypeGuard[AreaLike]:
    return hasattr(x, "lon") and hasattr(x, "lat")


def _params(cls: Callable[..., object]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # a builtin or C extension: no signature to read
        return {}


def _names(cls: Callable[..., object], name: str) -> bool:
    """`cls(...)` names `name` as a parameter of its own (a **kwargs catch-all does not count)."""
    p = _params(cls).get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _required(cls: Callable[..., object], name: str) -> bool:
    p = _params(cls).get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty


def check_trainer_params(tp: Mapping[str, object]) -> None:
    """Unknown trainer_params keys are an error naming the supported alternative or the nearest key."""
    known = _CONFIG_KEYS + _OWN_KEYS + LIGHTNING_KEYS
    special = [k for k in tp if k not in known and k in ALTERNATIVES]
    if special:
        raise ConfigError(
            "trainer_params: unsupported key(s): " + "; ".join(f"{k!r}: {ALTERNATIVES[k]}" for k in special)
        )
    unknown = unknown_keys(tp, known)
    if unknown:
        raise ConfigError(
            f"trainer_params: unknown key(s) {'; '.join(unknown)}. Valid keys: {', '.join(sorted(set(known)))}"
        )


def _same(a: object, b: object) -> bool:
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


def same_samples(a: _Samples, b: _Samples) -> bool:
    """True when two splits are the same samples: equal length and equal first, middle and last samples."""
    n = len(a)
    if n == 0 or len(b) != n:
        return False
    return all(_same(a[i], b[i]) for i in sorted({0, n // 2, n - 1}))


class BaseTrainer:
    """`BaseTrainer(title, uid, area, model_class, dataset_class, save_path, ...).train()`.

    The arguments and their order are those of the Lightning-based BaseTrainer: (title, uid, area, model_class,
    dataset_class, save_path, checkpoint_path, pre_model, dataset_params, trainer_params, model_params,
    use_checkpoint, use_wandb).
    area: an object with `.lon = [west, east]` and `.lat = [south, north]` (datasets.area.Area), or None for
    data without an area. checkpoint_path: a plainloop checkpoint or run directory (resumed exactly), or a
    Lightning .ckpt (its weights are the starting point). pre_model: start from the weights in save_path.
    use_checkpoint: False keeps no best.pt (last.pt is always written: resume needs it). use_wandb: log to
    Weights & Biases (trainer.extras.loggers.WandbLogger; offline when no login is found).
    callbacks: hook objects handed to the Trainer (trainer/hooks.py); monitor: an object with the TrainingMonitor
    API (utils.performance_monitor.TrainingMonitor), fed every iteration; log: where the run's lines go.
    trainer_params: every TrainConfig field by its own name, plus `split_ratio` ([train, val] or [train, val,
    test], default [0.8, 0.2]), `auto_batch_size` (True: search the largest batch that fits first) and the
    Lightning keys save_top_k, monitor, mode, matmul_precision, accelerator, devices. Left out, epochs (100),
    batch_size (20), shuffle (False), drop_last (False) and validation_interval (1) are the Lightning-based
    BaseTrainer's; `seed`, when given, seeds the model's initial weights and the run, else the global random
    state is the caller's (`torch.manual_seed(0)` before BaseTrainer decides the initial weights).
    """

    def __init__(
        self,
        title: str,
        uid: str,
        area: AreaLike | None,
        model_class: type[nn.Module],
        dataset_class: type,
        save_path: str | os.PathLike | None = None,
        checkpoint_path: str | os.PathLike | None = None,
        pre_model: bool = False,
        dataset_params: Mapping[str, object] | None = None,
        trainer_params: Mapping[str, object] | None = None,
        model_params: Mapping[str, object] | None = None,
        use_checkpoint: bool = True,
        use_wandb: bool = False,
        *,
        callbacks: list[object] | None = None,
        monitor: object = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.notes: list[str] = []  # printed when training starts and kept in config.json
        if isinstance(area, str) and (uid is None or (hasattr(uid, "lon") and hasattr(uid, "lat"))):
            uid, area = area, uid  # the order of an earlier plainloop (title, area, uid): accepted, named
            self.notes.append(
                "BaseTrainer: area and uid were given in the order (title, area, uid); the usual order is "
                "(title, uid, area, ...), and keywords work in any order"
            )
        self.title, self.area, self.uid = title, area, uid
        self.model_class, self.dataset_class = model_class, dataset_class
        self.save_path = Path(save_path) if save_path is not None else Path(MODEL_SAVE_PATH) / f"{title}-{uid}.pt"
        # checked now, not after training: a run name outside output_dir or an unwritable save_path loses the run
        run_name = f"{title}-{uid}"
        problem = run_name_problem(run_name)
        if problem and not (trainer_params or {}).get("run_name"):
            raise ConfigError(
                f"BaseTrainer: title={title!r} and uid={uid!r} name the run {run_name!r}, which {problem}"
            )
        if self.save_path.is_dir():
            raise ConfigError(
                f"BaseTrainer: save_path={str(self.save_path)!r} is a directory; give a file path for the model, "
                f"e.g. save_path={str(self.save_path / 'model.pt')!r}"
            )
        problem = writable_dir_problem(self.save_path.parent)
        if problem:
            raise ConfigError(f"BaseTrainer: save_path={str(self.save_path)!r} cannot be written: {problem}")
        self.pre_model = pre_model
        self.use_checkpoint, self.use_wandb = bool(use_checkpoint), bool(use_wandb)
        self.dataset_params = dict(dataset_params or {})
        self.model_params = dict(model_params or {})
        self.callbacks = list(callbacks or [])
        self.monitor = monitor
        self.log = log
        if area is not None and not _is_area(area):
            raise TypeError(
                f"BaseTrainer: area={area!r} has no .lon/.lat; give a datasets.area.Area "
                f"(Area('Global', lon=[-180, 180], lat=[-80, 80])) or None for data without an area"
            )
        self.config = self._config_from(trainer_params, checkpoint_path)
        self.trainer: Trainer | None = None
        self.model: nn.Module | None = None
        self.summary: dict[str, object] | None = None
        self._init_notes = list(self.notes)

    def _config_from(
        self, trainer_params: Mapping[str, object] | None, checkpoint_path: str | os.PathLike | None
    ) -> TrainConfig:
        """The TrainConfig of `trainer_params`, after BaseTrainer's own keys (split_ratio, auto_batch_size,
        Lightning's monitor keys) are taken out and its defaults put in; a note for each setting changed."""
        # values are checked where they are read (TrainConfig.from_dict for its fields)
        tp: dict[str, Any] = dict(trainer_params or {})
        check_trainer_params(tp)
        # what the user wrote, to name every setting the run does not honour
        self.explicit: dict[str, object] = dict(tp)
        self.seed_given = "seed" in tp  # else the caller's random state decides, as under Lightning
        self.split_ratio: tuple[float, ...] = tuple(tp.pop("split_ratio", DEFAULT_SPLIT))
        if (
            not (2 <= len(self.split_ratio) <= 3)
            or any(r < 0 for r in self.split_ratio)
            or sum(self.split_ratio) > 1 + 1e-9
        ):
            raise ValueError(
                f"trainer_params['split_ratio']={list(self.split_ratio)}: give 2 or 3 non-negative "
                f"fractions (train, val[, test]) that sum to at most 1"
            )
        self.auto_batch_size: bool = tp.pop("auto_batch_size", False)
        if not isinstance(self.auto_batch_size, bool):
            raise ValueError(f"trainer_params['auto_batch_size']={self.auto_batch_size!r}: give True or False")
        self.monitor_metric, self.monitor_mode = self._lightning_keys(tp)
        if not self.use_checkpoint:
            tp.setdefault("save_best", False)
            self.notes.append(
                "use_checkpoint=False: no best.pt; checkpoints/last.pt is still written (a resume needs it)"
            )
        if "baseline" not in tp and all(k in tp and tp[k] == v for k, v in BEFORE_SETTINGS.items()):
            tp["baseline"] = True
            self.notes.append(
                "baseline: trainer_params switch the optimisations off "
                '(num_workers 0, precision 32, pin_memory False), so this is the "before" '
                "loop: also data read through the loader instead of held in memory, .item() every "
                "step, validation every epoch (add 'baseline': False to keep those optimisations)"
            )
        for k, v in FEED_DEFAULTS.items():
            tp.setdefault(k, v)
        tp.setdefault("run_name", f"{self.title}-{self.uid}")
        self.init_weights: Path | None = None  # a Lightning .ckpt given as checkpoint_path: weights only
        if checkpoint_path is not None:
            if _is_lightning_ckpt(Path(checkpoint_path)):
                self.init_weights = Path(checkpoint_path)
            else:
                tp["resume"] = str(checkpoint_path)
        # The learning rate belongs to the optimizer; a model that does not take it never sees it.
        lr = self.model_params.get("learning_rate")
        self.lr_source = "trainer_params['lr']" if "lr" in tp else None  # named on the optimizer's start-up line
        if lr is not None and not _names(self.model_class, "learning_rate"):
            self.model_params.pop("learning_rate")
            tp.setdefault("lr", lr)
            self.lr_source = self.lr_source or "model_params['learning_rate']"
        return TrainConfig.from_dict(tp, where="trainer_params")

    def _lightning_keys(self, tp: dict[str, object]) -> tuple[str | None, str | None]:
        """The Lightning-style keys: each honoured, or named in one line when it cannot be."""
        monitor = tp.pop("monitor", None)
        mode = tp.pop("mode", None)
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"trainer_params['mode']={mode!r}: give 'min' or 'max'")
        if monitor is not None and not isinstance(monitor, str):
            raise ValueError(f"trainer_params['monitor']={monitor!r}: give a metric name such as 'val_loss'")
        if "save_top_k" in tp:
            k = tp.pop("save_top_k")
            if not isinstance(k, int) or isinstance(k, bool) or k < -1:
                raise ValueError(f"trainer_params['save_top_k']={k!r}: give an int (0: none, 1: the best, -1: all)")
            if k == 0:
                tp.setdefault("save_best", False)
            elif k == -1:
                self.notes.append(
                    f"save_top_k=-1: plainloop keeps the best checkpoint (best.pt, by {monitor or 'val_loss'}) and "
                    f"the latest (last.pt), not every one; give save_top_k=K to keep the K best"
                )
            else:
                tp["save_top_k"] = k
        if "matmul_precision" in tp:
            mp = tp.pop("matmul_precision")
            if mp not in ("highest", "high", "medium"):
                raise ValueError(f"trainer_params['matmul_precision']={mp!r}: give 'highest', 'high' or 'medium'")
            tp.setdefault("tf32", mp != "highest")  # high/medium: TF32 matmuls on Ampere+ (Lightning's set-up)
        if "accelerator" in tp:
            acc = str(tp.pop("accelerator")).lower()
            dev = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "mps": "mps", "auto": None}
            if acc not in dev:
                raise ValueError(f"trainer_params['accelerator']={acc!r}: give 'auto', 'cpu', 'gpu' or 'cuda'")
            if dev[acc] is not None:
                tp.setdefault("device", dev[acc])
        if "devices" in tp:
            d = tp.pop("devices")
            if isinstance(d, list | tuple) and len(d) == 1:
                if tp.get("device", "cuda") == "cuda":
                    tp["device"] = f"cuda:{int(d[0])}"
            elif d not in (1, "1", "auto", None):
                n = len(d) if isinstance(d, list | tuple) else d
                self.notes.append(
                    f"devices={d!r}: this process trains on one device; for {n} GPUs launch the script with "
                    f"torchrun --nproc_per_node {n} (DDP is then automatic)"
                )
        return monitor, mode

    # ------------------------------------------------------------------ data
    def _dataset_kwargs(self) -> dict[str, object]:
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

    def _datasets(self) -> tuple[Dataset, Dataset | None, Dataset | None]:
        """(train, val, test): val None when it is empty, test None when there is no test split."""
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
            _check_arguments(cls, {"split": "train", **kw}, "dataset_params")
            train, val = cls(split="train", **kw), cls(split="val", **kw)
            test = cls(split="test", **kw) if len(ratio) == 3 and ratio[2] > 0 else None
            how = f"{name}(split=...) builds each split itself"
        else:
            _check_arguments(cls, kw, "dataset_params")
            full = cls(**kw)
            n = len(full)
            cuts = split_points(n, ratio)
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
        return train, val if len(val) else None, test

    # ------------------------------------------------------------------ model
    def _model_kwargs(self) -> dict[str, object]:
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
        if self.seed_given:  # asked for: the initial weights follow from the seed
            torch.manual_seed(self.config.seed)
        self._model_kwargs_used = kw = self._model_kwargs()
        _check_arguments(self.model_class, kw, "model_params")
        model = self.model_class(**kw)
        if self.init_weights is not None:
            load_weights_into(model, self.init_weights)
            self.notes.append(
                f"checkpoint_path: {self.init_weights} is a Lightning checkpoint: its weights are the starting "
                f"point; its optimizer, scheduler and epoch are not restored (plainloop resumes exactly from its "
                f"own checkpoints/last.pt)"
            )
        elif self.pre_model and self.save_path.is_file():
            load_weights_into(model, self.save_path)
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
            val,
            test,
            monitor_metric=self.monitor_metric or "val_loss",
            monitor_mode=self.monitor_mode or "min",
            info={"title": self.title, "uid": self.uid, "area": area},
            lr=v if isinstance(v := kw.get("learning_rate"), float | int) else None,  # model_params' is the lr
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
        if t.data.on_device:
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
        elif t.data.loader_kw.get("num_workers", 0) == 0:
            unused = [k for k in ("prefetch_factor", "multiprocessing_context") if k in ex]
            if unused:
                notes.append(
                    f"{', '.join(f'{k}={ex[k]!r}' for k in unused)} not used: they only apply to loader "
                    f"worker processes and num_workers is 0"
                )
        return notes

    def _differences(self, t: Trainer) -> None:
        """Where this run computes or feeds differently from the Lightning-based BaseTrainer on purpose: one line
        each, naming the trainer_params key that matches it (added to the engine's own line on the matter)."""
        ex, cfg, cuda = self.explicit, t.cfg, t.rt.device.type == "cuda"
        if cfg.baseline:
            return  # the "before" loop: fp32, no workers, a DataLoader
        lit = "the Lightning-based BaseTrainer"
        if cuda and "precision" not in ex and t.rt.precision != "16-mixed":
            _say(
                t.notes,
                "precision: auto",
                f"precision: auto -> {t.rt.precision}",
                f"{lit} trained in 16-mixed; trainer_params['precision']='16-mixed' matches it",
            )
        if cuda and "cudnn_benchmark" not in ex and cfg.cudnn_benchmark:
            _say(
                t.notes,
                "cudnn_benchmark",
                "cudnn_benchmark: on, so convolutions may pick other kernels, equal up to rounding",
                "Lightning leaves it off; trainer_params['cudnn_benchmark']=False matches it",
            )
        if t.data.on_device and "device_cache" not in ex:
            _say(
                t.notes,
                "data: held on",
                f"data: held on {t.rt.device.type}",
                f"the same batches in the same order as {lit}'s DataLoader; trainer_params['device_cache']=False "
                f"reads through a DataLoader as it did",
            )
        workers = t.data.loader_kw.get("num_workers", 0)
        if not t.data.on_device and "num_workers" not in ex and workers != LIGHTNING_WORKERS:
            _say(
                t.notes,
                "num_workers: auto",
                f"num_workers: auto -> {workers}",
                f"the same batches in the same order as {lit}'s {LIGHTNING_WORKERS} workers (half for validation); "
                f"trainer_params['num_workers']={LIGHTNING_WORKERS} matches it",
            )

    def train(self) -> nn.Module:
        """Train and return the model; save() writes its weights and constructor arguments to save_path."""
        task = self.build_task()
        # the caller's random state after the model is built: the engine seeds as it starts, and without a
        # seed in trainer_params that state goes on as if nothing had seeded it (as under Lightning)
        caller_rng = None if self.seed_given else rng_state()
        if self.auto_batch_size:
            self.config, note = auto_batch_size(self.config, task)
            self.notes.append(note)
        # the Lightning-based BaseTrainer's loaders: workers (8 unless given) persistent unless switched off
        workers = self.explicit.get("num_workers", LIGHTNING_WORKERS)
        persistent = bool(workers) and bool(self.explicit.get("persistent_workers", True))
        callbacks = [*self.callbacks, LoaderDraws(persistent)]
        if self.use_wandb:
            try:
                callbacks.append(WandbLogger())
            except ImportError:
                self.notes.append(
                    "use_wandb: wandb is not installed (pip install wandb); the run logs to its run directory only"
                )
        try:
            self.trainer = t = Trainer(self.config, task, log=self.log, callbacks=callbacks, monitor=self.monitor)
        except ValueError as e:  # the engine names the Task field; the user wrote trainer_params['monitor']
            own = f"Task(monitor_metric={self.monitor_metric!r})"
            if self.monitor_metric is None or not str(e).startswith(own):
                raise
            raise ValueError(str(e).replace(own, f"trainer_params['monitor']={self.monitor_metric!r}", 1)) from None
        if self.lr_source:  # the engine's line says --lr / TrainConfig.lr: BaseTrainer's user gave it here
            t.notes[:] = [n.replace("(from --lr / TrainConfig.lr)", f"(from {self.lr_source})") for n in t.notes]
        if caller_rng is not None:
            set_rng_state(caller_rng)
        self._differences(t)
        t.notes[:0] = self.notes + self._loader_notes(t)  # printed first by fit() and written to config.json
        self.summary = t.fit()
        self.model = model = t.raw_model
        if t.rt.is_main:
            self.save()
            self.log(f"[plainloop] saved the model (weights + constructor arguments) to {self.save_path}")
        return model

    # ------------------------------------------------------------------ save, load, predict
    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the model's weights and constructor arguments (weights_only-safe); `load_model(path)` rebuilds it.

        An argument that is not a plain value (numbers, strings, None, lists, tuples, dicts of them, an area) is
        not written; a line names it, and load_model asks for it."""
        if self.model is None:
            raise RuntimeError("BaseTrainer.save(): no model yet; call train() first (or load one with pre_model)")
        kwargs = getattr(self, "_model_kwargs_used", None) or self._model_kwargs()
        _, unsaved = encode_arguments(kwargs)
        if unsaved:
            self.log(
                f"[plainloop] save: model argument(s) {', '.join(unsaved)} are not plain values and are not written; "
                f"give them to load_model(path, {unsaved[0]}=...)"
            )
        return save_model(self.model, path or self.save_path, kwargs)

    def _trained_model(self) -> nn.Module:
        if self.model is not None:
            return self.model
        if not self.save_path.is_file():
            raise FileNotFoundError(
                f"BaseTrainer.predict: no trained model: train() first, or point save_path at a saved model "
                f"({self.save_path} does not exist)"
            )
        self.model = load_model(self.save_path, self.model_class, **self._model_kwargs())
        return self.model

    def predict(self, offset: int = 0, plot: bool = False, index: int = 0) -> Prediction:
        """Predict one sample and score it: RMSE and R² over the finite cells of the target map.

        The dataset is built with `offset=offset` when its class takes one, else `offset` is the sample index.
        Returns (input, target, prediction, rmse, r2, ssta): input, target and prediction as 2-D maps (the first
        frame and channel of each, e.g. (32, 32) for an input of (2, 1, 32, 32) and a target of (1, 32, 32)),
        land (a NaN target) NaN in the prediction; ssta is the dataset's `read_ssta(offset)` when it has one,
        else None. The model runs in eval mode without gradients. plot=True also draws target, prediction and
        their difference (matplotlib) next to save_path (`self.last_plot`).
        """
        model = self._trained_model()
        cls, kw = self.dataset_class, self._dataset_kwargs()
        if _names(cls, "split"):
            kw["split"] = None if "split" not in self.dataset_params else self.dataset_params["split"]
        if _names(cls, "offset"):
            kw["offset"] = offset
        else:
            index = offset
        _check_arguments(cls, kw, "dataset_params")
        ds = cls(**kw)
        x, y = ds[index][0], ds[index][1]
        device = next(model.parameters()).device
        was = model.training
        model.eval()
        with torch.no_grad():
            out = model(torch.as_tensor(x)[None].to(device))
        model.train(was)
        pred = out[0] if isinstance(out, tuple | list) else out
        pred = pred[0].float().cpu().numpy()
        target = torch.as_tensor(y).float().cpu().numpy()
        pred = pred.reshape(target.shape) if pred.size == target.size else pred
        target, pred = first_map(target), first_map(pred)
        rmse, r2 = rmse_r2(pred, target)
        pred = np.where(np.isfinite(target), pred, np.nan) if pred.shape == target.shape else pred
        ssta = ds.read_ssta(offset) if hasattr(ds, "read_ssta") else None
        self.log(
            f"[plainloop] predict offset={offset}: RMSE {rmse:.4g}, R² {r2:.4g} ({np.isfinite(target).sum()} cells)"
        )
        if plot:
            self.last_plot = plot_prediction(
                target, pred, self.save_path.with_name(f"{self.save_path.stem}-predict-{offset}.png"), self.title
            )
            self.log(f"[plainloop] predict: figure saved to {self.last_plot}")
        return Prediction(first_map(np.asarray(torch.as_tensor(x).float().cpu())), target, pred, rmse, r2, ssta)


class Prediction(NamedTuple):
    """BaseTrainer.predict's result; unpacks as (input, output, pred_output, rmse, r2, ssta)."""

    input: np.ndarray
    target: np.ndarray
    prediction: np.ndarray
    rmse: float
    r2: float
    ssta: object  # the dataset's read_ssta(offset), or None


class LoaderDraws:
    """The global random draws of the Lightning-based BaseTrainer's DataLoaders, so that a model with dropout draws
    the same masks as under lightning.Trainer: a DataLoader draws one int64 from the global state as it starts an
    epoch (its workers' base seed), and one with persistent workers only the first time. The validation loader has
    persistent workers exactly when the training loader has them. TrainConfig(data_order="plain") draws as a plain
    DataLoader (no persistent workers) does, so a hand-written loop's port with dropout trains the same weights."""

    all_ranks = True  # every rank keeps its own stream in step
    state_key = "base_trainer_loader_draws"

    def __init__(self, persistent: bool) -> None:
        self.persistent = persistent
        self.started = {"train": False, "val": False}

    @classmethod
    def for_config(cls, cfg: TrainConfig, given: list[object]) -> tuple[LoaderDraws, None] | None:
        """The draws `data_order="plain"` asks for, unless BaseTrainer gave its own (trainer/layers.py)."""
        if cfg.data_order != "plain" or any(isinstance(cb, LoaderDraws) for cb in given):
            return None
        return cls(persistent=False), None

    def _draw(self, loader: str) -> None:
        if not (self.persistent and self.started[loader]):
            torch.empty((), dtype=torch.int64).random_()
        self.started[loader] = True

    def on_train_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        if trainer.progress.batches_done == 0:  # resumed mid-epoch: this epoch's draw came before the checkpoint
            self._draw("train")

    def on_validation_start(self, trainer: Trainer) -> None:
        self._draw("val")

    def state_dict(self) -> dict[str, bool]:
        return dict(self.started)

    def load_state_dict(self, state: dict[str, bool]) -> None:
        self.started = {"train": bool(state.get("train")), "val": bool(state.get("val"))}


def _say(notes: list[str], prefix: str, own: str, extra: str) -> None:
    """One line per matter: `extra` added to the engine's note that starts with `prefix`, else `own; extra`."""
    for i, n in enumerate(notes):
        if n.startswith(prefix):
            notes[i] = f"{n}; {extra}"
            return
    notes.append(f"{own}; {extra}")


def split_points(n: int, ratio: tuple[float, ...]) -> list[int]:
    """Where each split of n samples ends, in time order: training = the first int(n * ratio[0]) samples (int, not
    round: 45 of 57 at 0.8), each next split up to int(n * the ratios so far); the last split takes every sample
    left when the ratios sum to 1."""
    cuts = [min(n, int(n * ratio[0]))]
    for i in range(1, len(ratio)):
        cuts.append(min(n, int(n * sum(ratio[: i + 1]) + 1e-9)))  # 0.7 + 0.2 is 0.8999...: 90 of 100, not 89
    if abs(sum(ratio) - 1) < 1e-9:
        cuts[-1] = n
    return cuts


def first_map(a: np.ndarray) -> np.ndarray:
    """The first 2-D map of an array: (2, 1, 32, 32) -> (32, 32), (1, 32, 32) -> (32, 32); 2-D or less unchanged."""
    return a.reshape(-1, *a.shape[-2:])[0] if a.ndim > 2 else a


def rmse_r2(pred: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """RMSE and R² over the cells where the target is finite (land is NaN)."""
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if pred.shape != target.shape:
        return math.nan, math.nan
    ok = np.isfinite(target) & np.isfinite(pred)
    if not ok.any():
        return math.nan, math.nan
    diff = pred[ok] - target[ok]
    mse = float(np.mean(diff**2))
    var = float(np.mean((target[ok] - target[ok].mean()) ** 2))
    return math.sqrt(mse), (1 - mse / var) if var > 0 else math.nan


def _check_arguments(cls: Callable[..., object], kwargs: Mapping[str, object], where: str) -> None:
    """The constructor accepts these keyword arguments: else one line naming `where`, not a TypeError from
    inside the class (which the user did not write as a call)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # a builtin or C class: let the call speak for itself
        return
    try:
        sig.bind(**kwargs)
    except TypeError as e:
        params = [n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        named = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = unknown_keys([k for k in kwargs if k not in params], named)  # with "did you mean"
        problem = f"unknown key(s) {'; '.join(unknown)}" if unknown else str(e)
        name = getattr(cls, "__name__", str(cls))
        raise ConfigError(
            f"{where}: {problem} for {name}; it takes {', '.join(params) or 'no arguments'} "
            f"(given: {', '.join(kwargs) or 'none'})"
        ) from None


def plot_prediction(target: np.ndarray, pred: np.ndarray, path: Path, title: str) -> Path:
    """Target, prediction and difference of the first 2-D map, side by side (matplotlib, an optional package)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("BaseTrainer.predict(plot=True) draws with matplotlib: pip install matplotlib") from None
    t2, p2 = (first_map(a) if a.ndim >= 2 else a[None] for a in (target, pred))
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.5), constrained_layout=True)
    lo, hi = np.nanmin(t2), np.nanmax(t2)
    for ax, data, name, kw in (
        (axes[0], t2, "target", {"vmin": lo, "vmax": hi}),
        (axes[1], p2, "prediction", {"vmin": lo, "vmax": hi}),
        (axes[2], p2 - t2, "prediction - target", {"cmap": "RdBu_r"}),
    ):
        im = ax.imshow(data, origin="upper", **kw)
        ax.set_title(f"{title}: {name}")
        fig.colorbar(im, ax=ax, shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _is_lightning_ckpt(path: Path) -> bool:
    return path.suffix == ".ckpt" and path.is_file()


# ---------------------------------------------------------------------- the model file
MODEL_FORMAT = "plainloop-model-2"  # -1: the same, with tuples written as lists and areas without their class
_TUPLE, _AREA = "__tuple__", "__area__"  # tags of the values a weights_only file has no type for


def _encode(v: object) -> tuple[bool, object]:
    """(True, a form torch.load(weights_only=True) reads and `_decode` turns back into an equal value of the same
    type), or (False, None) for a value that is not plain."""
    if v is None or type(v) in (bool, int, float, str):
        return True, v
    if type(v) is list or type(v) is tuple:
        parts = [_encode(x) for x in v]
        if not all(ok for ok, _ in parts):
            return False, None
        items = [x for _, x in parts]
        return True, (items if type(v) is list else {_TUPLE: items})
    if type(v) is dict:
        if not all(type(k) is str and k not in (_TUPLE, _AREA) for k in v):
            return False, None
        parts_d = {k: _encode(x) for k, x in v.items()}
        if not all(ok for ok, _ in parts_d.values()):
            return False, None
        return True, {k: x for k, (_, x) in parts_d.items()}
    if _is_area(v) and isinstance(title := getattr(v, "title", None), str):  # an area
        box: dict[str, object] = {"title": title, "lon": list(v.lon), "lat": list(v.lat)}
        if isinstance(description := getattr(v, "description", None), str):
            box["description"] = description
        ok, enc = _encode(box)
        if ok and isinstance(enc, dict):
            cls = type(v)
            return True, {_AREA: {"class": f"{cls.__module__}:{cls.__qualname__}", **enc}}
    return False, None


def _import(name: str) -> type:
    """'package.module:Qual.Name' -> the class, from a module the program has already imported: a file names the
    class, and plainloop never imports (runs) what a file names. ImportError or AttributeError when it is not there."""
    mod, _, qual = name.partition(":")
    *path, last = qual.split(".")
    obj = sys.modules.get(mod)
    if obj is None:
        raise ImportError(f"{mod} is not imported")
    for part in path:
        obj = getattr(obj, part)
    cls = getattr(obj, last)
    if not (isinstance(cls, type) and (issubclass(cls, nn.Module) or {"title", "lon", "lat"} <= set(_params(cls)))):
        raise AttributeError(f"{name} is neither a model (nn.Module) nor an area class")
    return cls


def _decode(v: object, where: str) -> object:
    if isinstance(v, list):
        return [_decode(x, where) for x in v]
    if isinstance(v, dict) and set(v) == {_TUPLE}:
        return tuple(_decode(x, where) for x in v[_TUPLE])
    if isinstance(v, dict) and set(v) == {_AREA}:
        box = {k: _decode(x, where) for k, x in v[_AREA].items()}
        name = str(box.pop("class"))
        try:
            cls = _import(name)
        except (ImportError, AttributeError):
            raise ValueError(
                f"{where} is a {name}, not a class this program has imported; import it first, or give it to load_model"
            ) from None
        if "description" in box and not _names(cls, "description"):
            box.pop("description")
        title = box.pop("title")
        return cls(title, **box)
    if isinstance(v, dict):
        return {k: _decode(x, where) for k, x in v.items()}
    return v


def encode_arguments(kwargs: Mapping[str, object]) -> tuple[dict[str, object], list[str]]:
    """(the constructor arguments in their saved form, the names of those that are not plain values)."""
    saved, unsaved = {}, []
    for k, v in kwargs.items():
        ok, enc = _encode(v)
        if ok:
            saved[k] = enc
        else:
            unsaved.append(k)
    return saved, unsaved


def save_model(model: nn.Module, path: str | os.PathLike, model_kwargs: Mapping[str, object] | None = None) -> Path:
    """Weights + constructor arguments, loadable with weights_only=True (no pickled code runs on load)."""
    saved, unsaved = encode_arguments(model_kwargs or {})
    cls = type(model)
    state = {
        "format": MODEL_FORMAT,
        "model_class": f"{cls.__module__}:{cls.__qualname__}",
        "model_params": saved,
        "unsaved_params": unsaved,
        "state_dict": model.state_dict(),
    }
    return atomic_save(state, Path(path))


def _load_any(path: Path) -> object:
    """torch.load with weights_only=True; a pickled module is one line saying how to load it, not a traceback."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises several kinds here)
        raise CheckpointError(
            f"{path}: cannot be read as weights ({type(e).__name__}: {str(e).splitlines()[0][:200]}). A file saved "
            f"with torch.save(model) (a pickled module) is not loaded here, as it would run code: load it yourself "
            f"with torch.load(path, weights_only=False) if you trust it, then save its state_dict()"
        ) from None


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from: save_model's file, a plainloop checkpoint, a Lightning .ckpt, or a bare state dict."""
    try:
        state = load_checkpoint(path)  # a plainloop checkpoint: its digest is verified
        return state["model"]
    except CheckpointError as e:
        if "no 'model' entry" not in str(e):
            raise
    obj = _load_any(path)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        return obj["state_dict"]  # save_model's file, or a Lightning .ckpt
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        return obj["model"]
    if isinstance(obj, dict):
        return obj
    raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict")


def load_weights_into(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load weights from any of the files `_read_state` knows; a Lightning "model." prefix is handled."""
    p = Path(path)
    state = _read_state(p)
    own = model.state_dict()
    if state and not (set(state) & set(own)):
        for prefix in ("model.", "module.", "_orig_mod.", "net."):
            cut = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            if cut and set(cut) & set(own):
                state = cut
                break
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()][:4]
        raise CheckpointError(f"{p}: its weights do not fit {type(model).__name__}: {' '.join(lines)[:500]}") from None
    return model


def load_model(
    path: str | os.PathLike, model_class: type[nn.Module] | None = None, **model_params: object
) -> nn.Module:
    """Rebuild a model saved by BaseTrainer in one call: `model = load_model("saved_models/m.pt")`.

    The one-line replacement of `model = torch.load(path, weights_only=False)` for a file written by save(): the
    class named with the weights is looked up among the modules the program has imported (a file never makes
    plainloop import or run anything) unless `model_class` is given, and is called with the
    saved constructor arguments (tuples, nested tuples and areas as the types they were); `model_params` override
    or add to them. The model comes back in eval mode, on the CPU.
    """
    p = Path(path)
    loaded = _load_any(p)
    obj = loaded if isinstance(loaded, dict) else {}
    fmt = obj.get("format")
    if fmt not in ("plainloop-model-1", MODEL_FORMAT):
        if model_class is None:
            raise ValueError(
                f"{p} holds weights without the model's class and arguments; give load_model(path, model_class, "
                f"**model_params)"
            )
        return load_weights_into(model_class(**model_params), p).eval()
    if model_class is None:
        try:
            model_class = _import(obj["model_class"])
        except (ImportError, AttributeError):
            raise ValueError(
                f"{p} was saved from {obj['model_class']}, which is not a class this program has imported (a file "
                f"never makes plainloop import anything); import it first, or give load_model(path, model_class=YourModel)"
            ) from None
    saved = dict(obj.get("model_params") or {})
    if fmt == MODEL_FORMAT:
        kwargs = {k: _decode(v, f"{p}: model argument {k!r}") for k, v in saved.items() if k not in model_params}
    else:  # the first format: lists as written, an area as a box with its title, lon and lat
        kwargs = {
            k: SimpleNamespace(**{a: v[a] for a in ("title", "lon", "lat")})
            if isinstance(v, dict) and v.get(_AREA)
            else v
            for k, v in saved.items()
        }
    missing = [k for k in obj.get("unsaved_params") or [] if k not in model_params]
    if missing:
        raise ValueError(
            f"{p}: the model was saved without its argument(s) {', '.join(missing)} (not plain values); give "
            f"them: load_model(path, {', '.join(f'{k}=...' for k in missing)})"
        )
    kwargs.update(model_params)
    model = model_class(**kwargs)
    model.load_state_dict(obj["state_dict"])
    return model.eval()
