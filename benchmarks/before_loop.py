"""The seed guides' unoptimised "before" loop (seed 000 §6, seed 003 §2), written plainly.

What the seeds' users ran: a Dataset whose __getitem__ opens the netCDF file, reads the sample's months,
subsets and coarsens them (the same arithmetic as plainloop's cached path, once per sample), a DataLoader
with num_workers=0 and no pinned memory, fp32, batch 50, `loss.item()` every step, validation every epoch.
Nothing here is tuned: this is the baseline every ratio in benchmarks/run.py divides by.
"""

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
    """Every sample opens the netCDF file(s), reads its months and coarsens them to the grid.

    `ref` is the cached dataset of the same split: it supplies the split bounds, the ocean mask and the
    normalisation statistics, so both paths produce the same numbers (the test checks this).
    """

    def __init__(self, ref: ERA5SSTMonthlyDataset, data_path: str | Path | Sequence[str | Path]) -> None:
        self.ref = ref
        self.source = NetCDFSource(resolve_files(data_path), ref.area, ref.resolution)
        self.land = ~ref.ocean_mask.numpy()

    def __len__(self) -> int:
        return len(self.ref)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.ref
        j = r._start + i
        c = self.source.read_months(j, j + r._span + 1)  # opens the file, reads 0.25° rows, coarsens
        c[:, self.land] = np.nan
        x = r._normalise(c[: r.seq_len - 1], r._cal[j : j + r.seq_len - 1])
        y = r._normalise(c[-1], r._cal[j + r._span])
        if r.calendar:  # the same two calendar planes the cached dataset appends
            x = np.concatenate([x, r._calendar_planes(np.array([i]))[0]])
        return torch.from_numpy(x), torch.from_numpy(y)


def run_before(model: Any, train_set: Any, val_set: Any, device: torch.device, epochs: int = 1, batch_size: int = 50,
               lr: float = 1e-3, warmup_steps: int = 2, monitor: Any = None, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Warm up for `warmup_steps` batches, then train `epochs` full epochs, validating after each.

    Returns the measured wall time of those epochs (training + validation), the samples trained and the
    per-step split into data wait and compute.
    """
    torch.manual_seed(seed)
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=0, pin_memory=False)
    val_loader = (
        DataLoader(val_set, batch_size=batch_size, num_workers=0) if val_set is not None and len(val_set) else None
    )

    def train_step(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        optimizer.step()
        return float(loss.item())  # every step, as the seeds' loops did: a host-device sync per step

    # warm-up: allocator, kernels, file cache; not measured
    model.train()
    for k, (x, y) in enumerate(train_loader):
        if k >= warmup_steps:
            break
        train_step(x, y)

    samples = steps = 0
    data_s = step_s = val_s = 0.0
    step_times: list[float] = []
    if monitor is not None:
        monitor.start_monitoring()
    t_start = time.perf_counter()
    for _epoch in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in train_loader:
            t_data = time.perf_counter() - t0
            train_step(x, y)
            t1 = time.perf_counter()
            step_times.append(t1 - t0)
            data_s += t_data
            step_s += t1 - t0
            samples += x.shape[0]
            steps += 1
            if monitor is not None:
                monitor.log_iteration(t1 - t0, t_data, int(x.shape[0]))
            t0 = t1
        if val_loader is not None:  # validation every epoch
            tv = time.perf_counter()
            model.eval()
            total = 0.0
            with torch.no_grad():
                for x, y in val_loader:
                    total += model.loss(model(x.to(device)), y.to(device)).item()
            val_s += time.perf_counter() - tv
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t_start
    if monitor is not None:
        monitor.stop_monitoring()
    return {"wall_s": wall, "samples": samples, "steps": steps, "data_wait_s": data_s, "step_s": step_s, "val_s": val_s,
            "step_times_s": step_times}  # fmt: skip
