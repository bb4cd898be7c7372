"""ERA5 data pipeline throughput in samples/s: where the seeds' "read netCDF per sample" time goes.

    .venv/bin/python -m benchmarks.data_pipeline                 # the 1° sample file
    .venv/bin/python -m benchmarks.data_pipeline --grid 0.25     # ERA5's native grid

Modes (same samples, same normalisation, a global 2° grid):
  a  netcdf_per_sample   open the file, read the sample's months, coarsen and normalise in every __getitem__,
                         DataLoader(num_workers=0): the seeds' "before"
  b  memmap_workers      the cached float32 .npy memory-mapped, a DataLoader with --workers persistent workers,
                         timed after a warm-up epoch
  b' gather_cpu          the whole normalised split held in RAM, batches gathered in-process (no workers)
  c  gather_cuda         the same on the GPU (only when CUDA is available)
Writes raw JSON (every repetition) to --out and a Markdown table beside it.
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks.before_loop import NetCDFPerSampleDataset
from benchmarks.common import RESULTS_DIR, environment, md_table, parser, stats, write_result
from datasets.era5 import ERA5SSTMonthlyDataset
from datasets.era5_sample import ensure_sample_file

FLAGS = [("--grid", 1.0, "sample file grid in degrees"), ("--years", 30, "sample file length in years"),
         ("--resolution", 2.0, "coarse grid in degrees"), ("--batch-size", 64, "samples per batch"),
         ("--workers", 2, "DataLoader workers of mode b"), ("--repeats", 3, "timed repetitions per mode"),
         ("--netcdf-samples", 256, "samples timed per repetition of mode a"),
         ("--epochs", 5, "epochs timed per repetition of modes b, b' and c"),
         ("--cache-dir", None, "where the sample file and cache go (default: a temporary directory)"),
         ("--out", None, "JSON path (default: benchmarks/results/data_pipeline_<device>.json)")]  # fmt: skip


def _rate(batches: Any, epochs: int, most: int = 0) -> float:
    """Samples/s over `epochs` passes of `batches` (a loader, or a function making an epoch's batches)."""
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _y in batches() if callable(batches) else batches:
            n += x.shape[0]
            if most and n >= most:
                return n / (time.perf_counter() - t0)
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the end of the timed region
    return n / (time.perf_counter() - t0)


def _gathered(ds: Any, n: int, bs: int, gen: torch.Generator) -> Any:
    """One epoch's batches gathered from a split held in memory."""
    perm = torch.randperm(n, device=gen.device, generator=gen)
    return (ds.gather(perm[s : s + bs]) for s in range(0, n, bs))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parser(__doc__, FLAGS).parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plainloop_bench_") as tmp:
        cache = Path(a.cache_dir or tmp)
        t0 = time.perf_counter()
        sample = ensure_sample_file(cache, years=a.years, grid=a.grid)
        t_gen, t0 = time.perf_counter() - t0, time.perf_counter()
        kw: dict[str, Any] = dict(resolution=a.resolution, data_path=sample, split=None, cache_dir=cache)
        ds = ERA5SSTMonthlyDataset(**kw, device_cache=False)
        t_build, t0 = time.perf_counter() - t0, time.perf_counter()
        ERA5SSTMonthlyDataset(**kw)
        t_hit, n, bs, mb = time.perf_counter() - t0, len(ds), a.batch_size, sample.stat().st_size / 1e6
        slow = NetCDFPerSampleDataset(ds, [Path(f) for f in ds.info["source_files"]])
        (xa, ya), (xb, yb) = slow[5], ds[5]
        assert torch.allclose(xa, xb, atol=1e-5) and torch.allclose(ya, yb, atol=1e-5), "modes a and b disagree"
        loader_a = DataLoader(slow, batch_size=bs, shuffle=True, num_workers=0)
        res = {"a_netcdf_per_sample": [_rate(loader_a, 100, a.netcdf_samples) for _ in range(a.repeats)]}
        loader_b = DataLoader(ds, batch_size=bs, shuffle=True, num_workers=a.workers,
                              persistent_workers=a.workers > 0, pin_memory=torch.cuda.is_available())  # fmt: skip
        _rate(loader_b, 1)  # warm-up: start the workers, fault in the memmap pages
        res["b_memmap_workers"] = [_rate(loader_b, a.epochs) for _ in range(a.repeats)]
        del loader_b
        for dev in [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else []):
            resident = ERA5SSTMonthlyDataset(**kw, device_cache=True)
            assert resident.maybe_to_device(dev)
            gen = torch.Generator(device=dev).manual_seed(0)
            epoch = functools.partial(_gathered, resident, n, bs, gen)
            rates = [_rate(epoch, a.epochs) for _ in range(a.repeats + 1)]  # the first pass is a warm-up
            res["b2_gather_cpu" if dev.type == "cpu" else "c_gather_cuda"] = rates[1:]
    base = stats(res["a_netcdf_per_sample"])["median"]
    summary: dict[str, dict[str, Any]] = {}
    for k, v in res.items():
        summary[k] = {"median_samples_per_s": stats(v)["median"], "reps": v, "speedup_vs_a": stats(v)["median"] / base}
    env = environment(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    report: dict[str, Any] = {
        "benchmark": "data_pipeline", "environment": env,
        "config": {**vars(a), "samples": n, "grid_coarse": [ds.height, ds.width], "seq_len": ds.seq_len,
                   "sample_file": sample.name, "sample_file_mb": round(mb, 1)},
        "setup_s": {"generate_sample_file": t_gen, "build_cache": t_build, "open_cache_hit": t_hit},
        "results": summary, "note": "timings on a shared machine; other processes may have used the cores",
    }  # fmt: skip
    rows = [[k, f"{v['median_samples_per_s']:.0f}", ", ".join(f"{r:.0f}" for r in v["reps"]),
             f"{v['speedup_vs_a']:.0f}x"] for k, v in summary.items()]  # fmt: skip
    md = (f"ERA5 data pipeline, {env['device_name']}, {n} samples of {ds.seq_len - 1}+1 x {ds.height}x{ds.width}, "
          f"batch {bs}, sample file {a.grid:g}° x {a.years} y; set-up: generate {t_gen:.1f} s, build cache "
          f"{t_build:.1f} s, open cached {t_hit:.2f} s\n\n"
          + md_table(["mode", "samples/s (median)", "reps", "vs (a)"], rows) + "\n")  # fmt: skip
    out = Path(a.out) if a.out else RESULTS_DIR / f"data_pipeline_{env['device'].split(':')[0]}.json"
    write_result(out, report, md)
    return report


if __name__ == "__main__":
    main()
