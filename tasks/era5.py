"""The main job: monthly SST forecasting on ERA5 (dataset + RecursiveAttentionTransformer + scores).

The loop in `trainer/` does the rest.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from trainer import Task

# The seed's configuration (seed 000 quick start) and the reduced CPU preset of the demo.
SEED_PRESET = {"resolution": 2.0, "d_model": 512, "num_heads": 8, "num_layers": 3, "dim_feedforward": 1024,
               "recursion_depth": 2, "dropout": 0.1}
CPU_PRESET = {"resolution": 5.0, "d_model": 128, "num_heads": 4, "num_layers": 2, "dim_feedforward": 256,
              "recursion_depth": 2, "dropout": 0.0}


def _predict_all(model: nn.Module, ds: Any, device: torch.device, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised predictions and targets for every sample of `ds`, in order, on the device."""
    preds, targets = [], []
    for start in range(0, len(ds), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(ds)))
        x, y = ds.gather(idx)  # served from wherever the split is held
        preds.append(model(x.to(device, non_blocking=True)).float())
        targets.append(y.to(device, non_blocking=True))
    return torch.cat(preds), torch.cat(targets)


def build_era5_task(data_path: str | None = None, variable: str = "sst", lon: tuple[float, float] = (-180, 180),
                    lat: tuple[float, float] = (-80, 80), resolution: float = 2.0, seq_len: int = 2, offset: int = 0,
                    split_ratio: tuple[float, ...] = (0.8, 0.1, 0.1), d_model: int = 512, num_heads: int = 8,
                    num_layers: int = 3, dim_feedforward: int = 1024, dropout: float = 0.1,
                    recursion_depth: int = 2, patch_size: int | None = None, learning_rate: float | None = None,
                    device_cache: bool | None = None, seed: int = 42, cache_dir: str | None = None) -> Task:
    """Monthly SST forecasting: ERA5SSTMonthlyDataset + RecursiveAttentionTransformer + lat-weighted scores."""
    from datasets.era5 import ERA5SSTMonthlyDataset
    from models.ratransformer import RecursiveAttentionTransformer
    from utils.metrics import score_forecasts

    common = dict(lon=list(lon), lat=list(lat), seq_len=seq_len, offset=offset, resolution=resolution,
                  data_path=data_path, variable=variable, split_ratio=tuple(split_ratio), device_cache=device_cache,
                  cache_dir=cache_dir)
    train = ERA5SSTMonthlyDataset(split="train", **common)
    val = ERA5SSTMonthlyDataset(split="val", **common)
    test = ERA5SSTMonthlyDataset(split="test", **common)
    torch.manual_seed(seed)  # the model's initial weights follow --seed
    model_kw: dict[str, Any] = dict(width=train.width, height=train.height, seq_len=seq_len, d_model=d_model,
                                    num_heads=num_heads, num_layers=num_layers, dim_feedforward=dim_feedforward,
                                    dropout=dropout, recursion_depth=recursion_depth, learning_rate=learning_rate,
                                    lon_range=tuple(lon), lat_range=tuple(lat))
    if patch_size is not None:
        model_kw["patch_size"] = patch_size
    model = RecursiveAttentionTransformer(**model_kw)
    model.set_ocean_mask(train.ocean_mask)
    artifacts: dict[str, Any] = {}

    def evaluate(m: nn.Module, split: str, device: torch.device) -> dict[str, float]:
        ds = val if split == "val" else test
        if len(ds) == 0:
            return {}
        pred, y = _predict_all(m, ds, device)
        # note: sync point (evaluation) — predictions come to the host once for scoring in °C
        pred_c = ds.denormalize(pred.cpu(), torch.arange(len(ds))).numpy()
        ref = ds.reference_c()
        truth_c = ref["truth_c"]
        mask = ds.ocean_mask.cpu().numpy()
        scores = score_forecasts(pred_c, truth_c, ref["last_input_c"], ref["clim_target_c"], ref["clim_input_c"],
                                 ds.lats, mask)
        out = {f"{split}_rmse_c": scores["model"]["rmse"], f"{split}_acc": scores["model"]["acc"]}
        if split == "val":
            out["val_loss"] = float(m.loss(pred, y))
        else:
            for name, s in scores.items():
                out[f"test_{name}_rmse_c"] = s["rmse"]
                out[f"test_{name}_acc"] = s["acc"]
            artifacts["scores"] = scores
            k = len(ds) // 2  # one test month for the maps
            artifacts["test_month"] = {"truth_c": truth_c[k], "pred_c": pred_c[k], "lats": np.asarray(ds.lats),
                                       "lons": np.asarray(ds.lons), "mask": mask,
                                       "label": np.array(f"test sample {k} (target month {int(ds.target_months[k]) + 1})")}
        return out

    info = {"data": train.info, "grid": [train.height, train.width], "samples": [len(train), len(val), len(test)],
            "model": {k: v for k, v in model_kw.items() if k not in ("lon_range", "lat_range")}}
    flops = model.flops_per_sample(training=True) if hasattr(model, "flops_per_sample") else None
    return Task("era5", model, train, val, test, evaluate_fn=evaluate, monitor_metric="val_loss",
                monitor_mode="min", flops_per_sample=flops, info=info, artifacts=artifacts)
