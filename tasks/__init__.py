"""The built-in tasks the CLI trains: ERA5 SST forecasting (the main job) and cross-modality re-ID.

Each builder returns a `trainer.Task`; the engine in `trainer/` knows nothing about either task.
"""

from __future__ import annotations

from typing import Any

from trainer import Task


def build_task(name: str, **kwargs: Any) -> Task:
    if name == "era5":
        from tasks.era5 import build_era5_task

        return build_era5_task(**kwargs)
    if name == "reid":
        from tasks.reid import build_reid_task

        return build_reid_task(**kwargs)
    raise ValueError(f"unknown task {name!r}; use 'era5' or 'reid'")
