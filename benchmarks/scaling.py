"""Cost as the work grows: the ERA5 path at 5, 10, 20 and 40 years of ERA5's native 0.25° grid, and the re-ID
sampler at 1x, 4x and 16x SYSU-MM01's size.

    .venv/bin/python -m benchmarks.scaling                       # the full grid (~1 h on 2 cores, ~6 GB of files)
    .venv/bin/python -m benchmarks.scaling --years 5,10 --peers xarray_dask
    .venv/bin/python -m benchmarks.scaling --quick               # tiny files, in-process, seconds (a test)

ERA5 files (legacy and CDS-2024 layouts) are generated once into --cache-dir and read warm from the OS page cache.
Per file: plainloop's coarse cache built from scratch (time, peak resident memory, cache size), the xarray peer doing
the same area mean with dask (xarray_dask) and without (xarray: the whole field in memory, skipped above
--eager-max-gb decoded), and plainloop's Trainer on the built cache with a small model (task build, first and steady
epochs). Each measurement runs in a fresh Python process (peak RSS = its ru_maxrss); --quick runs them in-process
with a sampled RSS peak. The sampler: construction and one epoch of CachedModalAwarePKSampler against the seed's
per-batch modality inference (benchmarks/sampler.py) on SYSU-like metadata. docs/benchmarks/index.md ("Cost as the
work grows") reads the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.sizes import TINY_MODEL

AREA = {"lon": [-180.0, 180.0], "lat": [-80.0, 80.0]}
LAYOUTS, PEERS = ("legacy", "cds2024"), ("xarray_dask", "xarray")
FULL: dict[str, Any] = {"years": (5, 10, 20, 40), "grid": 0.25, "resolution": 2.0, "sampler_scales": (1.0, 4.0, 16.0)}
QUICK: dict[str, Any] = {"years": (1, 2), "grid": 5.0, "resolution": 10.0, "sampler_scales": (0.05,)}
FLAGS = [("--years", None, "comma list of file lengths (default: 5,10,20,40)"),
         ("--layouts", "legacy,cds2024", "comma list"),
         ("--peers", None, f"comma list from {','.join(PEERS)} (default: those installed)"),
         ("--eager-max-gb", 1.5, "largest decoded field (GB, float64) the eager xarray peer is given"),
         ("--epochs", 4, "training epochs, the first one cold"), ("--batch", 16, "training batch (5 years: 47 samples)"),
         ("--threads", 0, "torch threads in training, 0 = default"), ("--no-train", False, "skip the training epochs"),
         ("--sampler-scales", None, "comma list of SYSU multiples (default: 1,4,16)"),
         ("--sampler-reps", 5, "sampler repetitions"), ("--parts", "era5,sampler", "what to run: era5, sampler"),
         ("--cache-dir", None, "where the generated files go (default: ~/.cache/plainloop)"),
         ("--keep-caches", False, "keep the built caches (default: deleted after use)"),
         ("--quick", False, "tiny files, in-process, 2 sizes (a test)"),
         ("--wait-load", 0.0, "before each size, wait for a 1-minute load average below this, at most an hour in "
          "all; 0 = do not wait"),
         ("--out", None, "JSON path (default: benchmarks/results/scaling_cpu.json)")]  # fmt: skip


# ------------------------------------------------------------------------------------------ memory
def _rss_mb() -> float:
    """Resident memory of this process now (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss / 2**20


class PeakRSS:
    """Samples this process's RSS every 5 ms while open: the peak of an in-process measurement. `memory()` is the
    record: ru_maxrss (exact) in a fresh process, else the sampled peak."""

    def __init__(self, isolated: bool = False) -> None:
        self.start = self.peak = _rss_mb()
        self.isolated, self._stop = isolated, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mb())

    def __enter__(self) -> PeakRSS:
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss_mb())

    def memory(self) -> dict[str, Any]:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if self.isolated else self.peak
        src = "ru_maxrss of a fresh process" if self.isolated else "RSS sampled every 5 ms (in-process)"
        return {"peak_rss_mb": peak, "start_rss_mb": self.start, "rss_above_start_mb": peak - self.start,
                "peak_source": src}  # fmt: skip


# ------------------------------------------------------------------------------------------ measurements
def measure_build(spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    """plainloop's cache, built from scratch into an empty directory."""
    from datasets.era5 import ERA5SSTMonthlyDataset

    out = Path(spec["out_dir"])
    with PeakRSS(isolated) as rss:
        t0 = time.perf_counter()
        ds = ERA5SSTMonthlyDataset(lon=AREA["lon"], lat=AREA["lat"], resolution=spec["resolution"],
                                   data_path=spec["file"], split=None, cache_dir=out, device_cache=False)  # fmt: skip
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cache_bytes": sum(p.stat().st_size for p in out.glob("era5_*")),
            "months": int(ds.months.size), "grid": [ds.height, ds.width], "npy": str(ds._npy), **rss.memory()}  # fmt: skip


def xarray_area_mean(file: str, resolution: float, dask: bool) -> Any:
    """The peer: the same area mean as plainloop's cache, the way an xarray user writes it. Returns (T, H, W)
    float32 °C with latitudes ascending (plainloop's orientation) and land NaN at every month."""
    import numpy as np
    import xarray as xr

    if dask:
        with xr.open_dataset(file) as probe:  # metadata only: which name the time axis has in this layout
            tdim = "valid_time" if "valid_time" in probe.dims else "time"
        # chunks given at open: rechunking after open would read the whole field first (one native chunk)
        ds = xr.open_mfdataset([file], chunks={tdim: 12}, combine="by_coords")
    else:
        ds = xr.open_dataset(file)
    sst = ds["sst"]
    lat, lon = sst["latitude"].values, sst["longitude"].values
    rows = np.flatnonzero((lat >= AREA["lat"][0]) & (lat < AREA["lat"][1]))  # cells [edge, edge + res)
    sst = sst.isel(latitude=rows).roll(longitude=-int((lon < 180).sum()), roll_coords=True)  # start at 180°E
    f = int(round(resolution / np.abs(np.diff(lat)).min()))
    if sst.attrs.get("units", "K") == "K":
        sst = sst - 273.15
    w = np.cos(np.deg2rad(sst["latitude"]))
    num = (sst * w).coarsen(latitude=f, longitude=f).sum()
    den = w.where(sst.notnull()).coarsen(latitude=f, longitude=f).sum()
    mean = (num / den.where(den > 0)).astype("float32")
    out = mean.where(~mean.isnull().any(mean.dims[0])).values  # land: missing in any month; computes (dask)
    return out[:, ::-1] if lat[rows[0]] > lat[rows[-1]] else out


def measure_xarray(spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    import numpy as np

    npy = Path(spec["out_dir"]) / "xarray.npy"
    with PeakRSS(isolated) as rss:
        t0 = time.perf_counter()
        arr = xarray_area_mean(spec["file"], spec["resolution"], spec["peer"] == "xarray_dask")
        np.save(npy, arr)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "shape": list(arr.shape), "npy": str(npy), **rss.memory()}


def measure_train(spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    """First and steady epochs of plainloop's Trainer on the (already built) cache, small model."""
    import torch

    from benchmarks.common import epoch_ends
    from tasks.era5 import build_era5_task
    from trainer import TrainConfig, Trainer

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    with PeakRSS(isolated) as rss, tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        task = build_era5_task(data_path=spec["file"], resolution=spec["resolution"], cache_dir=spec["cache_dir"],
                               seq_len=2, seed=0, **TINY_MODEL)  # fmt: skip
        task_s, t_start = time.perf_counter() - t0, time.time()  # metrics.jsonl "time" is wall clock
        cfg = TrainConfig(epochs=spec["epochs"], batch_size=spec["batch"], output_dir=tmp, device="cpu",
                          progress_bar=False)  # fmt: skip
        _, ends = epoch_ends(Path(Trainer(cfg, task, log=lambda _s: None).fit()["run_dir"]) / "metrics.jsonl")
    epochs = [ends[e] - ends.get(e - 1, t_start) for e in sorted(ends)]
    steady, n = sorted(epochs[1:]), len(task.train_set)  # type: ignore[arg-type]
    med = steady[len(steady) // 2] if steady else None
    return {"task_build_s": task_s, "train_samples": n, "epochs_s": epochs, "first_epoch_s": epochs[0],
            "steady_epoch_s": med, "steady_ms_per_sample": 1e3 * med / n if med else None, **rss.memory()}  # fmt: skip


MEASURES = {"build": measure_build, "xarray": measure_xarray, "train": measure_train}


def run_measure(kind: str, spec: dict[str, Any], isolated: bool, timeout: float = 3600.0) -> dict[str, Any]:
    """Run one measurement in a fresh process (isolated) or here; errors come back as {"error": ...}."""
    if not isolated:
        try:
            return MEASURES[kind](spec, False)
        except Exception as e:  # a peer failing (memory, missing module) is a result, not a crash
            return {"error": f"{type(e).__name__}: {e}"}
    cmd = [sys.executable, "-m", "benchmarks.scaling", "--child", kind, json.dumps(spec)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).parents[1])
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


# ------------------------------------------------------------------------------------------ the grid
def era5_grid(a: argparse.Namespace, sizes: dict[str, Any], cache_dir: Path, work: Path) -> dict[str, Any]:
    import numpy as np

    from benchmarks.common import wait_for_quiet
    from datasets.era5_sample import ensure_sample_file, grid_coords

    out: dict[str, Any] = {"rows": [], "train": []}
    for layout in a.layouts:
        for years in sizes["years"]:
            if a.wait_load > 0:  # each size starts on a quiet machine (at most an hour of waiting in all)
                a.waited.append(wait_for_quiet(a.wait_load, max(0.0, a.deadline - time.monotonic())))
            t0 = time.perf_counter()
            f = ensure_sample_file(cache_dir, layout=layout, years=years, grid=sizes["grid"])
            row: dict[str, Any] = {"layout": layout, "years": years, "file": str(f), "file_bytes": f.stat().st_size,
                                   "file_s": time.perf_counter() - t0}  # fmt: skip
            d = work / f"{layout}_{years}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            spec = {"file": str(f), "resolution": sizes["resolution"], "out_dir": str(d)}
            row["build"] = run_measure("build", spec, not a.quick)
            lat, lon = grid_coords(layout, sizes["grid"])
            decoded_gb = years * 12 * lat.size * lon.size * 8 / 1e9  # float64 after CF decoding
            for peer in a.peers:
                if peer == "xarray" and decoded_gb > a.eager_max_gb:
                    row[peer] = {"skipped": f"needs the whole field decoded in memory (~{decoded_gb:.1f} GB as "
                                 f"float64) > --eager-max-gb {a.eager_max_gb:g}"}  # fmt: skip
                    continue
                row[peer] = run_measure("xarray", {**spec, "peer": peer}, not a.quick)
                if a.quick and "npy" in row[peer] and "npy" in row["build"]:  # the same numbers, land included
                    x, y = np.load(row["build"]["npy"]), np.load(row[peer]["npy"])
                    same = x.shape == y.shape and (np.isnan(x) == np.isnan(y)).all()
                    diff = (float(np.nanmax(np.abs(x - y))) if np.isfinite(x).any() else 0.0) if same else None
                    row[peer]["max_abs_diff_c"] = diff
            if layout == a.layouts[0] and not a.no_train:
                tspec = {"file": str(f), "resolution": sizes["resolution"], "cache_dir": str(d), "epochs": a.epochs,
                         "batch": a.batch, "threads": a.threads}  # fmt: skip
                out["train"].append({"years": years, **run_measure("train", tspec, not a.quick)})
            out["rows"].append(row)
            print(f"[scaling] {layout} {years}y: " + ", ".join(f"{k} {_cell(row.get(k))}" for k in ("build", *a.peers)),
                  flush=True)  # fmt: skip
            if not a.keep_caches:
                for p in d.glob("*.npy"):
                    p.unlink()
    return out


def sampler_grid(scales: tuple[float, ...], reps: int) -> list[dict[str, Any]]:
    """CachedModalAwarePKSampler at k x SYSU-MM01 (k x 395 identities, SYSU's per-identity sizes)."""
    import logging

    import numpy as np

    from benchmarks.sampler import PathMeta, split_counts, time_before, time_sampler

    logging.getLogger("datasets.cached_sampler").setLevel(logging.WARNING)
    out = []
    for k in scales:
        rng, ids, t0 = np.random.default_rng(0), max(8, int(round(395 * k))), time.perf_counter()
        meta = PathMeta(f"sysu_x{k:g}", split_counts(int(round(22258 * k)), ids, rng, 10),
                        split_counts(int(round(11909 * k)), ids, rng, 4), 0)  # fmt: skip
        make_s = time.perf_counter() - t0
        with PeakRSS() as rss:
            cons, epoch, s = time_sampler(meta, reps, batch_size=32, num_instances=4, seed=42)
            before = time_before(meta, s, 1, "per-sample")["seconds"]
        out.append({"scale": k, "samples": len(meta), "ids": ids, "batches": s.num_batches, "metadata_s": make_s,
                    "construction_s": cons, "epoch_s": epoch, "before_per_sample_s": before,
                    "construction_median_s": float(np.median(cons)), "epoch_median_s": float(np.median(epoch)),
                    "rss_above_start_mb": rss.peak - rss.start})  # fmt: skip
        print(f"[scaling] sampler x{k:g}: {len(meta)} samples, construction {np.median(cons) * 1e3:.1f} ms, "
              f"epoch {np.median(epoch) * 1e3:.1f} ms, before {before[0] * 1e3:.0f} ms", flush=True)  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ report
def growth(rows: list[dict[str, Any]], key: str, what: str) -> dict[str, Any] | None:
    """How `what` of measurement `key` grows from the smallest to the largest size: ratio, and per year."""
    pts = [(r["years"], r[key][what]) for r in rows if isinstance(r.get(key), dict) and what in r[key]]
    if len(pts) < 2:
        return None
    (y0, v0), (y1, v1) = min(pts), max(pts)
    return {"from_years": y0, "to_years": y1, "ratio": v1 / v0 if v0 else None, "years_ratio": y1 / y0,
            "per_year_ratio": (v1 / y1) / (v0 / y0) if v0 else None}  # fmt: skip


def _cell(m: dict[str, Any] | None) -> str:
    if not m:
        return "n/a"
    if "skipped" in m or "error" in m:
        return "skipped (memory)" if "skipped" in m else "failed: " + m["error"][:60]
    return f"{m['seconds']:.1f} s / {m['peak_rss_mb']:.0f} MB"


def render(result: dict[str, Any]) -> str:
    from benchmarks.common import fmt, md_table

    env, cfg = result["environment"], result["config"]
    parts = [f"Scaling on {env['device_name']}, torch {env['torch']}, commit `{env['commit'][:12]}`, {env['time_utc']}, "
             f"load average {fmt((result['loadavg_start'] or [None])[0], '.2f')} at the start. Files: ERA5-format, "
             f"{cfg['grid']:g}° grid, coarsened to {cfg['resolution']:g}° over lon {AREA['lon']}, lat {AREA['lat']}. "
             f"Command: `{result['command']}`."]  # fmt: skip
    rows = []
    for r in result["era5"]["rows"]:
        b = r["build"]
        cells = [f"{b['seconds']:.1f}", f"{b['seconds'] / r['years']:.2f}", f"{b['peak_rss_mb']:.0f}",
                 f"{b['rss_above_start_mb']:.0f}", f"{b['cache_bytes'] / 1e6:.1f}"] if "error" not in b else \
            ["failed", "", "", "", ""]  # fmt: skip
        rows.append([r["layout"], r["years"], f"{r['file_bytes'] / 1e9:.2f}", *cells,
                     *(_cell(r.get(p)) for p in cfg["peers"])])  # fmt: skip
    header = ["layout", "years", "file GB", "build s", "build s/year", "peak RSS MB", "RSS above start MB", "cache MB",
              *(f"{p} (time / peak RSS)" for p in cfg["peers"])]  # fmt: skip
    parts.append("**Cache build** (plainloop) and the xarray peer doing the same area mean:\n\n"
                 + md_table(header, rows))  # fmt: skip
    parts.append("\n".join(
        f"- {layout} {key} {what}: {x['from_years']} -> {x['to_years']} years (x{x['years_ratio']:g}) grew "
        f"x{fmt(x['ratio'], '.2f')} (per year x{fmt(x['per_year_ratio'], '.2f')})"  # None: it started at 0
        for key, what in (("build", "seconds"), ("build", "rss_above_start_mb"), ("build", "peak_rss_mb"))
        for layout, gl in result["growth"].items() if (x := gl.get(f"{key}.{what}"))
    ))  # fmt: skip
    if result["era5"]["train"]:
        keys = [("task_build_s", ".2f"), ("first_epoch_s", ".2f"), ("steady_epoch_s", ".2f"),
                ("steady_ms_per_sample", ".2f"), ("peak_rss_mb", ".0f")]  # fmt: skip
        trows = [[t["years"], t.get("train_samples", ""), *(fmt(t.get(k), f) for k, f in keys), t.get("error", "")]
                 for t in result["era5"]["train"]]  # fmt: skip
        head = ["years", "train samples", "task build s", "first epoch s", "steady epoch s", "steady ms/sample",
                "peak RSS MB", "error"]  # fmt: skip
        parts.append(f"**Training** on the built cache ({cfg['layouts'][0]} files), plainloop defaults, batch "
                     f"{cfg['batch']}, model {TINY_MODEL}:\n\n" + md_table(head, trows))  # fmt: skip
    if result.get("sampler"):
        srows = [[f"x{s['scale']:g}", s["samples"], s["ids"], s["batches"], f"{s['construction_median_s'] * 1e3:.1f}",
                  f"{s['epoch_median_s'] * 1e3:.1f}", f"{s['before_per_sample_s'][0] * 1e3:.0f}",
                  f"{s['rss_above_start_mb']:.0f}"] for s in result["sampler"]]  # fmt: skip
        head = ["size", "samples", "ids", "batches", "construction ms", "epoch ms", "before (per-sample inference) ms",
                "RSS above start MB"]  # fmt: skip
        parts.append("**Sampler** (CachedModalAwarePKSampler, batch 32 = 8 x 4) at k x SYSU-MM01:\n\n"
                     + md_table(head, srows))  # fmt: skip
    return "\n\n".join(parts + [f"- {n}" for n in result["notes"]]) + "\n"


def _peers(ap: argparse.ArgumentParser, arg: str | None, notes: list[str]) -> list[str]:
    have_xr, have_dask = (importlib.util.find_spec(m) is not None for m in ("xarray", "dask"))
    if arg is None:
        if not have_xr or not have_dask:
            notes.append("xarray is not installed: no peer rows (pip install -r requirements-bench.txt)" if not have_xr
                         else "dask is not installed: only the eager xarray peer (pip install 'dask[array]')")  # fmt: skip
        return [p for p in PEERS if have_xr and (p != "xarray_dask" or have_dask)]
    peers = [p for p in arg.split(",") if p]
    if bad := [p for p in peers if p not in PEERS]:
        ap.error(f"--peers: unknown {bad}; choose from {','.join(PEERS)}")
    if (peers and not have_xr) or ("xarray_dask" in peers and not have_dask):
        ap.error(f"--peers {arg}: xarray (and dask for xarray_dask) must be installed: pip install -r "
                 "requirements-bench.txt")  # fmt: skip
    return peers


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from benchmarks.common import RESULTS_DIR, cache_dir_of, command, environment, loadavg, parser, write_result

    ap = parser(__doc__, FLAGS)
    a = ap.parse_args(argv)

    sizes = dict(QUICK if a.quick else FULL)
    if a.quick:
        a.epochs, a.batch, a.sampler_reps = 2, 4, 1
    try:
        if a.years:
            sizes["years"] = tuple(int(y) for y in a.years.split(","))
        if a.sampler_scales:
            sizes["sampler_scales"] = tuple(float(k) for k in a.sampler_scales.split(","))
    except ValueError as e:
        ap.error(f"--years / --sampler-scales: {e}; give comma-separated numbers, e.g. --years 5,10")
    if any(y < 1 for y in sizes["years"]) or any(k <= 0 for k in sizes["sampler_scales"]):
        ap.error(f"--years {sizes['years']} / --sampler-scales {sizes['sampler_scales']}: must be positive")
    a.layouts, parts, notes = [x for x in a.layouts.split(",") if x], set(a.parts.split(",")), list[str]()
    if not a.layouts or set(a.layouts) - set(LAYOUTS) or parts - {"era5", "sampler"}:
        ap.error(f"--layouts {a.layouts} / --parts {a.parts}: choose from {','.join(LAYOUTS)} / era5,sampler")
    a.peers, cache_dir = _peers(ap, a.peers, notes), cache_dir_of(a.cache_dir)
    env, load_start = environment(torch.device("cpu")), loadavg()  # at the start: the commit that is measured
    a.waited, a.deadline = [], time.monotonic() + 3600.0
    with tempfile.TemporaryDirectory(dir=cache_dir if not a.quick else None) as work:
        era5 = era5_grid(a, sizes, cache_dir, Path(work)) if "era5" in parts else {"rows": [], "train": []}
    result = {
        "schema": "plainloop-bench-scaling-1", "command": command("scaling", argv), "environment": env,
        "loadavg_start": load_start, "loadavg_end": loadavg(), "waited_for_quiet": a.waited,
        "config": {"years": list(sizes["years"]), "grid": sizes["grid"], "resolution": sizes["resolution"],
                   "layouts": a.layouts, "peers": a.peers, "epochs": a.epochs, "batch": a.batch, "isolated": not a.quick,
                   "sampler_scales": list(sizes["sampler_scales"]), "train_model": TINY_MODEL, "area": AREA},
        "era5": era5,
        "growth": {layout: {f"{k}.{w}": growth([r for r in era5["rows"] if r["layout"] == layout], k, w)
                            for k in ("build", *a.peers) for w in ("seconds", "peak_rss_mb", "rss_above_start_mb")}
                   for layout in a.layouts},
        "sampler": sampler_grid(sizes["sampler_scales"], a.sampler_reps) if "sampler" in parts else [],
        "notes": notes,
    }  # fmt: skip
    write_result(Path(a.out) if a.out else RESULTS_DIR / "scaling_cpu.json", result, render(result))
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # one measurement in a fresh process: torch not imported before it
        print("RESULT " + json.dumps(MEASURES[sys.argv[2]](json.loads(sys.argv[3]), True)), flush=True)
    else:
        main()
