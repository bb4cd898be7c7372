"""ERA5 data pipeline throughput in samples/s: where the seeds' "read netCDF per sample" time goes.

    .venv/bin/python -m benchmarks.data_pipeline --grid 1.0 --years 30 --batch-size 64 --workers 2

Modes (same samples, same normalisation, the global 2° grid of seed 000):
  a  netcdf_per_sample   open the file, read the sample's months, coarsen, normalise in every __getitem__,
                         DataLoader(num_workers=0): the seeds' "before"
  b  memmap_workers      the cached float32 .npy memory-mapped, DataLoader with --workers workers
                         (device_cache=False), persistent workers, timed after a warm-up epoch
  b' gather_cpu          the whole normalised split held in RAM, batches gathered in-process (no workers)
  c  gather_cuda         the same on the GPU (only when CUDA is available)
Writes raw JSON (every repetition) to --out and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from benchmarks.before_loop import NetCDFPerSampleDataset
from benchmarks.common import RESULTS_DIR, environment, md_table, write_result
from datasets.era5 import ERA5SSTMonthlyDataset
from datasets.era5_sample import ensure_sample_file


def _time_loader(loader: DataLoader[Any], epochs: int, max_samples: int | None = None) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, _y in loader:
            n += x.shape[0]
            if max_samples and n >= max_samples:
                return time.perf_counter() - t0, n
    return time.perf_counter() - t0, n


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", type=float, default=1.0, help="sample file grid in degrees (default: 1.0)")
    p.add_argument("--years", type=int, default=30, help="sample file length in years (default: 30)")
    p.add_argument("--resolution", type=float, default=2.0, help="coarse grid in degrees (default: 2.0)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default: 64)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers for mode b (default: 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per mode (default: 3)")
    p.add_argument(
        "--netcdf-samples", type=int, default=256, help="samples timed per repetition in mode a (default: 256)"
    )
    p.add_argument("--epochs", type=int, default=5, help="epochs timed per repetition in modes b/b'/c (default: 5)")
    p.add_argument("--cache-dir", default=None, help="where the sample file and cache go (default: a temp dir)")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/data_pipeline_<device>.json)")
    args = p.parse_args(argv)

    tmp = tempfile.TemporaryDirectory(prefix="plainloop_bench_") if args.cache_dir is None else None
    cache = Path(args.cache_dir if tmp is None else tmp.name)
    t0 = time.perf_counter()
    sample = ensure_sample_file(cache, years=args.years, grid=args.grid)
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = ERA5SSTMonthlyDataset(
        resolution=args.resolution, data_path=sample, split=None, cache_dir=cache, device_cache=False
    )
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ERA5SSTMonthlyDataset(resolution=args.resolution, data_path=sample, split=None, cache_dir=cache)
    t_hit = time.perf_counter() - t0
    n = len(ds)
    bs = args.batch_size
    results: dict[str, list[float]] = {}

    # (a) netCDF per sample, num_workers=0 as the seeds' "before"
    slow = NetCDFPerSampleDataset(ds, [Path(f) for f in ds.info["source_files"]])
    xa, ya = slow[5]
    xb, yb = ds[5]
    assert torch.allclose(xa, xb, atol=1e-5) and torch.allclose(ya, yb, atol=1e-5), "modes a and b disagree"
    loader_a = DataLoader(slow, batch_size=bs, shuffle=True, num_workers=0)
    results["a_netcdf_per_sample"] = []
    for _ in range(args.repeats):
        dt, k = _time_loader(loader_a, epochs=100, max_samples=args.netcdf_samples)
        results["a_netcdf_per_sample"].append(k / dt)

    # (b) memmap through DataLoader workers
    loader_b = DataLoader(ds, batch_size=bs, shuffle=True, num_workers=args.workers,
                          persistent_workers=args.workers > 0, pin_memory=torch.cuda.is_available())  # fmt: skip
    _time_loader(loader_b, epochs=1)  # warm-up: start the workers, fault in the memmap pages
    results["b_memmap_workers"] = []
    for _ in range(args.repeats):
        dt, k = _time_loader(loader_b, epochs=args.epochs)
        results["b_memmap_workers"].append(k / dt)
    del loader_b

    # (b') and (c): the normalised split held in memory, batches gathered in-process
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for dev in devices:
        resident = ERA5SSTMonthlyDataset(
            resolution=args.resolution, data_path=sample, split=None, cache_dir=cache, device_cache=True
        )
        assert resident.maybe_to_device(dev)
        key = "b2_gather_cpu" if dev.type == "cpu" else "c_gather_cuda"
        results[key] = []
        gen = torch.Generator(device=dev).manual_seed(0)
        for rep in range(args.repeats + 1):  # the first pass is a warm-up
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            k = 0
            for _ in range(args.epochs):
                perm = torch.randperm(n, device=dev, generator=gen)
                for s in range(0, n, bs):
                    x, y = resident.gather(perm[s : s + bs])
                    k += x.shape[0]
            if dev.type == "cuda":
                torch.cuda.synchronize()  # deliberate: end of the timed region
            if rep:
                results[key].append(k / (time.perf_counter() - t0))

    summary: dict[str, dict[str, Any]] = {
        name: {"median_samples_per_s": float(np.median(v)), "reps": v} for name, v in results.items()
    }
    base = summary["a_netcdf_per_sample"]["median_samples_per_s"]
    for v in summary.values():
        v["speedup_vs_a"] = v["median_samples_per_s"] / base
    report: dict[str, Any] = {
        "benchmark": "data_pipeline",
        "environment": environment(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "config": {**vars(args), "samples": n, "grid_coarse": [ds.height, ds.width], "seq_len": ds.seq_len,
                   "sample_file": sample.name, "sample_file_mb": round(sample.stat().st_size / 1e6, 1)},
        "setup_s": {"generate_sample_file": t_gen, "build_cache": t_build, "open_cache_hit": t_hit},
        "results": summary,
        "note": "timings on a shared machine; other processes may have used the CPU cores at the same time",
    }  # fmt: skip
    tag = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out) if args.out else RESULTS_DIR / f"data_pipeline_{tag}.json"
    rows = [[k, f"{v['median_samples_per_s']:.0f}", ", ".join(f"{r:.0f}" for r in v["reps"]), f"{v['speedup_vs_a']:.0f}x"]
            for k, v in summary.items()]  # fmt: skip
    md = (f"ERA5 data pipeline, {report['environment']['device_name']}, {n} samples of {ds.seq_len - 1}+1 x "
          f"{ds.height}x{ds.width}, batch {bs}, sample file {args.grid:g}° x {args.years} y; set-up: generate "
          f"{t_gen:.1f} s, build cache {t_build:.1f} s, open cached {t_hit:.2f} s\n\n"
          + md_table(["mode", "samples/s (median)", "reps", "vs (a)"], rows) + "\n")  # fmt: skip
    write_result(out, report, md)
    if tmp is not None:
        tmp.cleanup()
    return report


if __name__ == "__main__":
    main()
