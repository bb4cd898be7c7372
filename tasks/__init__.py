"""The built-in tasks the CLI trains: ERA5 SST forecasting (the main job) and cross-modality re-ID.

Each builder returns a `trainer.Task`; the engine in `trainer/` knows nothing about either task. The CLI makes
one `--flag` per builder parameter (help text from the module's ARGS_HELP).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainer import Task

MODULES = {"era5": ("tasks.era5", "build_era5_task"), "reid": ("tasks.reid", "build_reid_task")}
CLI_DATA_PATH_HOW = "give --data_path a netCDF file, a directory of them or a glob, or set $ERA5_DATA_PATH"
ERA5_MODEL_KEYS = (
    "resolution",
    "d_model",
    "num_heads",
    "num_layers",
    "dim_feedforward",
    "recursion_depth",
    "dropout",
    "seq_len",
)


def task_module(name: str) -> ModuleType:
    if name not in MODULES:
        raise ValueError(f"unknown task {name!r}; use one of {', '.join(MODULES)}")
    return importlib.import_module(MODULES[name][0])


def _builder(name: str) -> Callable[[], Callable[..., Task]]:
    return lambda: getattr(task_module(name), MODULES[name][1])


TASK_BUILDERS: dict[str, Callable[[], Callable[..., Task]]] = {name: _builder(name) for name in MODULES}


def build_task(name: str, **kwargs: Any) -> Task:
    return TASK_BUILDERS[name]()(**kwargs)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def resolve_task_args(
    task: str, kw: dict[str, Any], preset: str, on_gpu: bool, batch_size: int | None = None
) -> tuple[dict[str, Any], str]:
    """ERA5: fill the model and grid from the preset (explicit settings win); returns (kwargs, note).
    Re-ID: check the P x K batch against the flags (`batch_size`: the one given, None = the task's default)."""
    if task == "reid":
        _check_pk_batch(kw, batch_size)
    if task != "era5":
        return kw, ""
    # the library's errors name its keywords (lat=, data_path=); checked here first, they name the flags
    from datasets.area import LAT_LIMITS, LON_LIMITS

    lon, lat = kw.get("lon"), kw.get("lat")
    for flag, values, (lo, hi), what in (("lon", lon, LON_LIMITS, "W E"), ("lat", lat, LAT_LIMITS, "S N")):
        if values is not None and not all(lo <= v <= hi for v in values):  # NaN fails too
            raise ValueError(
                f"--{flag} {' '.join(f'{v:g}' for v in values)}: {what} must each lie in [{lo:g}, {hi:g}] degrees"
                + (" (either convention: -180..180 or 0..360)" if flag == "lon" else "")
            )
    if (lon is not None and lon[0] == lon[1]) or (lat is not None and lat[0] >= lat[1]):
        raise ValueError(
            f"--lon {' '.join(map(str, lon or ()))} / --lat {' '.join(map(str, lat or ()))}: give "
            f"W != E and S < N (W > E crosses the dateline, e.g. --lon 170 -120)"
        )
    if kw.get("data_path") is not None:  # $ERA5_DATA_PATH is checked by the dataset, naming the variable
        from datasets.era5_files import resolve_files

        resolve_files(kw["data_path"], name="--data_path", how=CLI_DATA_PATH_HOW)
    ratio = kw.get("split_ratio")
    if ratio is not None and (sum(ratio) > 1 + 1e-6 or any(r < 0 for r in ratio)):
        raise ValueError(f"--split_ratio {' '.join(map(str, ratio))}: fractions must be >= 0 and sum to at most 1")
    mod = task_module("era5")
    name = {"auto": "full" if on_gpu else "cpu", "seed": "full"}.get(preset, preset)  # seed: full's earlier name
    values = mod.SEED_PRESET if name == "full" else mod.CPU_PRESET
    kw = {**values, **{k: v for k, v in kw.items() if v is not None}}
    layers, depth = kw["num_layers"], kw["recursion_depth"]
    note = (
        f"preset: {name} ({'the full-size model' if name == 'full' else 'reduced for a CPU'}: "
        f"{kw['resolution']:g} deg, d_model {kw['d_model']}, {_count(layers, 'layer')} x "
        f"{_count(depth, 'recursion')}); explicit settings override it"
    )
    return kw, note


def _check_pk_batch(kw: dict[str, Any], batch_size: int | None) -> None:
    """The sampler's own error names its keywords (batch_size=, num_instances=); checked here first, before the
    data is read, it names the flags."""
    import inspect

    k = kw.get("num_instances")
    if k is None:
        k = inspect.signature(_builder("reid")()).parameters["num_instances"].default
    if batch_size is None or isinstance(batch_size, bool) or not isinstance(k, int) or k < 1:
        return  # the task's default batch is P x K; a bad --num_instances is the builder's error
    if batch_size % k:
        lo = batch_size - batch_size % k
        raise ValueError(
            f"--batch_size {batch_size} is not divisible by --num_instances {k}: a P x K batch needs --batch_size = "
            f"P x --num_instances (P identities, K images each), e.g. --batch_size {lo or k} or {lo + k}"
        )


def train_defaults(task: str, on_gpu: bool, kw: dict[str, Any], n_train: int) -> dict[str, Any]:
    """TrainConfig values the task recommends for settings the user did not give."""
    if task == "reid":  # test with the weights val chose
        # a P x K batch: batch_size must be a multiple of K (the engine's 150 is not, for K = 4). The synthetic set
        # on a CPU: P = 8 (32 steps of 8 x 4 per epoch, 60 epochs); image folders and GPUs: P = 16 (64 at K = 4)
        k = int(kw.get("num_instances") or 4)
        small = kw.get("data_path") is None and not on_gpu
        return {"batch_size": (8 if small else 16) * k, **({"epochs": 60} if small else {}), "test_with_best": True}
    out = task_module("era5").era5_train_defaults(on_gpu, kw.get("data_path") is None, n_train)
    if not on_gpu and kw.get("d_model", 512) <= 128:
        # a model this small gains nothing from a second thread, and threads that spin on shared cores lose a lot
        # (the CPU demo's first 40 steps: 8-22 s with 1 thread, 21-44 s with 2, on this 2-core machine under load)
        out["num_threads"] = 1
    return out
