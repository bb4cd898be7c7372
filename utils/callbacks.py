"""Callbacks the CLI hands to the engine (duck-typed to trainer/hooks.py; utils/ never imports trainer/)."""

from __future__ import annotations

from typing import Any

import torch


class VerdictCallback:
    """Adds the measured bottleneck verdict (utils/bottleneck.py) to summary.json at the end of a run."""

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        from utils.bottleneck import diagnose

        workers = 0 if trainer.data.on_device else trainer.data.loader_kw.get("num_workers", 0)
        try:
            summary["verdict"] = diagnose(
                summary.get("monitor") or {},
                device_type=trainer.rt.device.type,
                step_stats={
                    "num_workers": workers,
                    "torch_threads": torch.get_num_threads(),
                    "world_size": trainer.rt.world_size,  # the monitor's samples/s are this rank's
                    # the time between steps, for the epoch-boundary verdict
                    "train_s": summary.get("train_time_s"),
                    "steps_s": trainer.run.stats.get("iter_s"),
                    "val_s": trainer.run.stats.get("val_s"),
                    "epochs": summary.get("epochs"),
                    "wall_time": summary.get("wall_time"),  # the validation- and checkpoint-bound verdicts
                },
            )
        except (KeyError, TypeError, ValueError) as e:  # advice only: a finished run is never lost over it
            summary["verdict"] = {"verdict": "unknown", "evidence": [f"diagnose failed: {e}"], "advice": ""}
