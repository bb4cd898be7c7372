"""The seed guides' unoptimised "before" loop, written plainly: the baseline every ratio in benchmarks/run.py divides
by. A Dataset whose __getitem__ opens the netCDF file, reads the sample's months and coarsens them (plainloop's
arithmetic, once per sample), DataLoader(num_workers=0) without pinning, fp32, batch 50, `loss.item()` every step,
validation every epoch. Nothing here is tuned."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from datasets.era5 import ERA5SSTMonthlyDataset, NetCDFSource, resolve_files


class NetCDFPerSampleDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every sample reads the netCDF file(s). `ref`, the cached dataset of the same split, gives the split bounds, the
    ocean mask and the normalisation, so both paths give the same numbers (tests/test_benchmarks.py checks)."""

    def __init__(self, ref: ERA5SSTMonthlyDataset, data_path: str | Path | Sequence[str | Path]) -> None:
        self.ref, self.land = ref, ~ref.ocean_mask.numpy()
        self.source = NetCDFSource(resolve_files(data_path), ref.area, ref.resolution)

    def __len__(self) -> int:
        return len(self.ref)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        r, j = self.ref, self.ref._start + i
        c = self.source.read_months(j, j + r._span + 1)  # opens the file, reads the rows, coarsens
        c[:, self.land] = np.nan
        x = r._normalise(c[: r.seq_len - 1], r._cal[j : j + r.seq_len - 1])
        y = r._normalise(c[-1], r._cal[j + r._span])
        if r.calendar:  # the two calendar planes the cached dataset appends
            x = np.concatenate([x, r._calendar_planes(np.array([i]))[0]])
        return torch.from_numpy(x), torch.from_numpy(y)


def seed_step(model: Any, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> None:
    """One step as the seeds' loops took it: `loss.item()` every step, a host-device sync per step."""
    x, y = x.to(device), y.to(device)
    opt.zero_grad()
    loss = model.loss(model(x), y)
    loss.backward()
    opt.step()
    loss.item()


def run_before(model: Any, train_set: Any, val_set: Any, device: torch.device, epochs: int = 1, batch_size: int = 50,
               lr: float = 1e-3, warmup_steps: int = 2, monitor: Any = None, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Train `warmup_steps` untimed batches, then time `epochs` epochs, each validated: wall time, samples, steps and
    the steps' split into data wait and compute."""
    torch.manual_seed(seed)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    train = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=0, pin_memory=False)
    val = DataLoader(val_set, batch_size=batch_size) if val_set is not None and len(val_set) else None

    model.train()
    for _, (x, y) in zip(range(warmup_steps), train):  # allocator, kernels, file cache: not measured
        seed_step(model, opt, x, y, device)
    samples = steps = 0
    data_s = step_s = val_s = 0.0
    if monitor is not None:
        monitor.start_monitoring()
    t_start = time.perf_counter()
    for _epoch in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in train:
            t_data = time.perf_counter() - t0
            seed_step(model, opt, x, y, device)
            t1 = time.perf_counter()
            data_s, step_s, samples, steps = data_s + t_data, step_s + t1 - t0, samples + x.shape[0], steps + 1
            if monitor is not None:
                monitor.log_iteration(t1 - t0, t_data, int(x.shape[0]))
            t0 = t1
        if val is not None:  # validation every epoch
            tv = time.perf_counter()
            model.eval()
            with torch.no_grad():
                for x, y in val:
                    model.loss(model(x.to(device)), y.to(device)).item()
            val_s += time.perf_counter() - tv
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t_start
    if monitor is not None:
        monitor.stop_monitoring()
    return {"wall_s": wall, "samples": samples, "steps": steps, "data_wait_s": data_s, "step_s": step_s, "val_s": val_s}
