"""Cost as the work grows: the ERA5 path at 5, 10, 20 and 40 years of ERA5's native 0.25° grid, and the re-ID
sampler at 1x, 4x and 16x SYSU-MM01's size.

    .venv/bin/python -m benchmarks.scaling                       # the full grid (~1 h on 2 cores, ~6 GB of files)
    .venv/bin/python -m benchmarks.scaling --years 5,10 --peers xarray_dask
    .venv/bin/python -m benchmarks.scaling --quick               # tiny files, in-process, seconds (a test)

ERA5 (legacy and CDS-2024 layouts; files generated once into --cache-dir by datasets.era5_sample, one per
layout and length, and left in the OS page cache by that: every reader below reads warm files):
  build        plainloop's coarse cache built from scratch (ERA5SSTMonthlyDataset into an empty cache
               directory): time, peak resident memory of the process and above its start, cache size on disk
  xarray_dask  the peer: xarray.open_mfdataset(chunks of 12 months, dask) -> the area -> cos-latitude
               weighted mean over the finite points of each cell via coarsen -> land (missing in any month)
               masked -> computed and saved as .npy: the same numbers as plainloop's cache (the test checks)
  xarray       the same with xarray.open_dataset and no dask (eager, the whole field in memory); skipped
               above --eager-max-gb of decoded data
  train        plainloop's Trainer (defaults) on the built cache with a small model (the built-in SST task,
               seq_len 2): the task's build (datasets opened from the cache, the LIM prior fitted), the first
               epoch (from the Trainer's construction, data placement included) and steady epochs (median of
               the rest)
Each measurement runs in a fresh Python process (peak RSS = its ru_maxrss); --quick runs them in-process with
a sampled RSS peak instead. Sampler: construction and one epoch of `CachedModalAwarePKSampler`, and the seed's
per-batch modality inference ("before", per-sample variant; benchmarks/sampler.py), on SYSU-like metadata
with k x 395 identities of SYSU's per-identity sizes.
Writes raw JSON to --out and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
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
LAYOUTS = ("legacy", "cds2024")
PEERS = ("xarray_dask", "xarray")
FULL: dict[str, Any] = {"years": (5, 10, 20, 40), "grid": 0.25, "resolution": 2.0, "sampler_scales": (1.0, 4.0, 16.0)}
QUICK: dict[str, Any] = {"years": (1, 2), "grid": 5.0, "resolution": 10.0, "sampler_scales": (0.05,)}
TRAIN_MODEL = TINY_MODEL


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
    """Samples this process's RSS every 5 ms while open: the peak of an in-process measurement."""

    def __init__(self) -> None:
        self.start = self.peak = _rss_mb()
        self._stop = threading.Event()
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


def _memory(rss: PeakRSS, isolated: bool) -> dict[str, Any]:
    # ru_maxrss (KiB on Linux) is exact for a fresh process; in-process the sampled peak is what we have
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if isolated else rss.peak
    return {
        "peak_rss_mb": peak,
        "start_rss_mb": rss.start,
        "rss_above_start_mb": peak - rss.start,
        "peak_source": "ru_maxrss of a fresh process" if isolated else "RSS sampled every 5 ms (in-process)",
    }


# ------------------------------------------------------------------------------------------ measurements
def measure_build(spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    """plainloop's cache, built from scratch into an empty directory."""
    from datasets.era5 import ERA5SSTMonthlyDataset

    out = Path(spec["out_dir"])
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        ds = ERA5SSTMonthlyDataset(lon=AREA["lon"], lat=AREA["lat"], resolution=spec["resolution"],
                                   data_path=spec["file"], split=None, cache_dir=out, device_cache=False)  # fmt: skip
        seconds = time.perf_counter() - t0
    files = [p for p in out.iterdir() if p.name.startswith("era5_")]
    return {
        "seconds": seconds,
        "cache_bytes": sum(p.stat().st_size for p in files),
        "months": int(ds.months.size),
        "grid": [ds.height, ds.width],
        "npy": str(ds._npy),
        **_memory(rss, isolated),
    }


def xarray_area_mean(file: str, resolution: float, dask: bool) -> Any:
    """The peer: the same area mean as plainloop's cache, the way an xarray user writes it. Returns (T, H, W)
    float32 °C with latitudes ascending (plainloop's orientation) and land NaN at every month."""
    import numpy as np
    import xarray as xr

    if dask:
        with xr.open_dataset(file) as probe:  # metadata only: which name the time axis has in this layout
            tdim = "valid_time" if "valid_time" in probe.dims else "time"
        # chunks given at open: each task reads 12 months (rechunking after open would read the whole field
        # first, since netCDF3 and contiguous netCDF4 files have a single native chunk)
        ds = xr.open_mfdataset([file], chunks={tdim: 12}, combine="by_coords")
    else:
        ds = xr.open_dataset(file)
    sst = ds["sst"]
    lat, lon = sst["latitude"].values, sst["longitude"].values
    rows = np.flatnonzero((lat >= AREA["lat"][0]) & (lat < AREA["lat"][1]))  # cells [edge, edge + res)
    sst = sst.isel(latitude=rows).roll(longitude=-int((lon < 180).sum()), roll_coords=True)  # start at 180°E
    step = np.abs(np.diff(lat)).min()
    f = int(round(resolution / step))
    if sst.attrs.get("units", "K") == "K":
        sst = sst - 273.15
    w = np.cos(np.deg2rad(sst["latitude"]))
    num = (sst * w).coarsen(latitude=f, longitude=f).sum()
    den = w.where(sst.notnull()).coarsen(latitude=f, longitude=f).sum()
    mean = (num / den.where(den > 0)).astype("float32")
    tdim = mean.dims[0]
    mean = mean.where(~mean.isnull().any(tdim))  # land: missing in any month -> missing in every month
    out = mean.values  # computes (dask) or is already in memory (eager)
    return out[:, ::-1] if lat[rows[0]] > lat[rows[-1]] else out


def measure_xarray(spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    import numpy as np

    with PeakRSS() as rss:
        t0 = time.perf_counter()
        arr = xarray_area_mean(spec["file"], spec["resolution"], spec["peer"] == "xarray_dask")
        np.save(Path(spec["out_dir"]) / "xarray.npy", arr)
        seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "shape": list(arr.shape),
        "npy": str(Path(spec["out_dir"]) / "xarray.npy"),
        **_memory(rss, isolated),
    }


def measure_train(spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    """First and steady epochs of plainloop's Trainer on the (already built) cache, small model."""
    import torch

    from tasks.era5 import build_era5_task
    from trainer import TrainConfig, Trainer

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    with PeakRSS() as rss, tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        task = build_era5_task(data_path=spec["file"], resolution=spec["resolution"], cache_dir=spec["cache_dir"],
                               seq_len=2, seed=0, **TRAIN_MODEL)  # fmt: skip
        task_s = time.perf_counter() - t0  # datasets from the cache, the LIM prior fitted on the training months
        t_start = time.time()  # metrics.jsonl "time" is wall clock
        cfg = TrainConfig(
            epochs=spec["epochs"], batch_size=spec["batch"], output_dir=tmp, device="cpu", progress_bar=False
        )
        summary = Trainer(cfg, task, log=lambda _s: None).fit()
        rows = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    ends: dict[int, float] = {}
    for r in rows:
        if r["kind"] == "train":
            ends[r["epoch"]] = max(ends.get(r["epoch"], 0.0), r["time"])
    epochs = [ends[e] - (ends[e - 1] if e > 1 else t_start) for e in sorted(ends)]
    steady = sorted(epochs[1:])
    n = len(task.train_set)  # type: ignore[arg-type]
    med = steady[len(steady) // 2] if steady else None
    return {
        "task_build_s": task_s,
        "train_samples": n,
        "epochs_s": epochs,
        "first_epoch_s": epochs[0],
        "steady_epoch_s": med,
        "steady_ms_per_sample": 1e3 * med / n if med else None,
        **_memory(rss, isolated),
    }


MEASURES = {"build": measure_build, "xarray": measure_xarray, "train": measure_train}


def run_measure(kind: str, spec: dict[str, Any], isolated: bool, timeout: float = 3600.0) -> dict[str, Any]:
    """Run one measurement in a fresh process (isolated) or here; errors come back as {"error": ...}."""
    if not isolated:
        try:
            return MEASURES[kind](spec, False)
        except Exception as e:  # a peer failing (memory, missing module) is a result, not a crash
            return {"error": f"{type(e).__name__}: {e}"}
    cmd = [sys.executable, "-m", "benchmarks.scaling", "--child", kind, json.dumps(spec)]
    root = Path(__file__).resolve().parent.parent
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def child(kind: str, spec_json: str) -> None:
    res = MEASURES[kind](json.loads(spec_json), True)
    print("RESULT " + json.dumps(res), flush=True)


# ------------------------------------------------------------------------------------------ the grid
def era5_grid(a: argparse.Namespace, sizes: dict[str, Any], cache_dir: Path, work: Path) -> dict[str, Any]:
    from datasets.era5_sample import ensure_sample_file, grid_coords

    out: dict[str, Any] = {"rows": [], "train": []}
    from benchmarks.common import wait_for_quiet

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
                    row[peer] = {
                        "skipped": f"needs the whole field decoded in memory (~{decoded_gb:.1f} GB as "
                        f"float64) > --eager-max-gb {a.eager_max_gb:g}"
                    }
                    continue
                row[peer] = run_measure("xarray", {**spec, "peer": peer}, not a.quick)
                if a.quick and "npy" in row[peer] and "npy" in row["build"]:
                    row[peer]["max_abs_diff_c"] = _compare(row["build"]["npy"], row[peer]["npy"])
            if layout == a.layouts[0] and not a.no_train:
                tspec = {"file": str(f), "resolution": sizes["resolution"], "cache_dir": str(d), "epochs": a.epochs,
                         "batch": a.batch, "threads": a.threads}  # fmt: skip
                out["train"].append({"years": years, **run_measure("train", tspec, not a.quick)})
            out["rows"].append(row)
            print(
                f"[scaling] {layout} {years}y: " + ", ".join(f"{k} {_short(row.get(k))}" for k in ("build", *a.peers)),
                flush=True,
            )
            if not a.keep_caches:
                for p in d.glob("*.npy"):
                    p.unlink()
    return out


def _compare(a_npy: str, b_npy: str) -> float | None:
    """Largest |difference| in °C between two (T, H, W) arrays, None if their shapes or land differ."""
    import numpy as np

    a, b = np.load(a_npy), np.load(b_npy)
    if a.shape != b.shape or not (np.isnan(a) == np.isnan(b)).all():
        return None
    return float(np.nanmax(np.abs(a - b))) if np.isfinite(a).any() else 0.0


def _short(m: dict[str, Any] | None) -> str:
    if not m:
        return "-"
    if "error" in m or "skipped" in m:
        return m.get("error") or "skipped"
    return f"{m['seconds']:.1f} s, peak {m['peak_rss_mb']:.0f} MB"


def sampler_grid(scales: tuple[float, ...], reps: int) -> list[dict[str, Any]]:
    """CachedModalAwarePKSampler at k x SYSU-MM01 (k x 395 identities, SYSU's per-identity sizes)."""
    import logging

    import numpy as np

    from benchmarks.sampler import PathMeta, before_epoch, split_counts, time_sampler

    logging.getLogger("datasets.cached_sampler").setLevel(logging.WARNING)
    out = []
    for k in scales:
        rng = np.random.default_rng(0)
        ids = max(8, int(round(395 * k)))
        rgb = split_counts(int(round(22258 * k)), ids, rng, 10)
        ir = split_counts(int(round(11909 * k)), ids, rng, 4)
        t0 = time.perf_counter()
        meta = PathMeta(f"sysu_x{k:g}", rgb, ir, 0)
        make_s = time.perf_counter() - t0
        kw = {"batch_size": 32, "num_instances": 4, "seed": 42}
        before = []
        with PeakRSS() as rss:
            cons, epoch, s, batches = time_sampler(meta, reps, **kw)
            t0 = time.perf_counter()
            before_epoch(meta, s, 0, "per-sample")
            before.append(time.perf_counter() - t0)
        out.append({"scale": k, "samples": len(meta), "ids": ids, "batches": len(batches), "metadata_s": make_s,
                    "construction_s": cons, "epoch_s": epoch, "before_per_sample_s": before,
                    "construction_median_s": float(np.median(cons)), "epoch_median_s": float(np.median(epoch)),
                    "rss_above_start_mb": rss.peak - rss.start})  # fmt: skip
        print(
            f"[scaling] sampler x{k:g}: {len(meta)} samples, construction {np.median(cons) * 1e3:.1f} ms, "
            f"epoch {np.median(epoch) * 1e3:.1f} ms, before {before[0] * 1e3:.0f} ms",
            flush=True,
        )
    return out


# ------------------------------------------------------------------------------------------ report
def growth(rows: list[dict[str, Any]], key: str, what: str) -> dict[str, Any] | None:
    """How `what` of measurement `key` grows from the smallest to the largest size: ratio, and per year."""
    pts = [(r["years"], r[key][what]) for r in rows if isinstance(r.get(key), dict) and what in r[key]]
    if len(pts) < 2:
        return None
    (y0, v0), (y1, v1) = min(pts), max(pts)
    return {
        "from_years": y0,
        "to_years": y1,
        "ratio": v1 / v0 if v0 else None,
        "years_ratio": y1 / y0,
        "per_year_ratio": (v1 / y1) / (v0 / y0) if v0 else None,
    }


def _peer_cell(m: dict[str, Any] | None) -> str:
    if not m:
        return "n/a"
    if "skipped" in m or "error" in m:
        return "skipped (memory)" if "skipped" in m else "failed: " + m["error"][:60]
    return f"{m['seconds']:.1f} s / {m['peak_rss_mb']:.0f} MB"


def render(result: dict[str, Any]) -> str:
    from benchmarks.common import fmt, md_table

    env, cfg = result["environment"], result["config"]
    parts = [
        f"Scaling on {env['device_name']}, torch {env['torch']}, commit `{env['commit'][:12]}`, {env['time_utc']}, "
        f"load average {fmt((result['loadavg_start'] or [None])[0], '.2f')} at the start. Files: ERA5-format, "
        f"{cfg['grid']:g}° grid, coarsened to {cfg['resolution']:g}° over lon {AREA['lon']}, lat {AREA['lat']}. "
        f"Command: `{result['command']}`."
    ]
    rows = []
    for r in result["era5"]["rows"]:
        b = r["build"]
        ok = "error" not in b
        cells = [f"{b['seconds']:.1f}", f"{b['seconds'] / r['years']:.2f}", f"{b['peak_rss_mb']:.0f}",
                 f"{b['rss_above_start_mb']:.0f}", f"{b['cache_bytes'] / 1e6:.1f}"] if ok else ["failed", "", "", "", ""]  # fmt: skip
        rows.append([r["layout"], r["years"], f"{r['file_bytes'] / 1e9:.2f}", *cells,
                     *(_peer_cell(r.get(p)) for p in cfg["peers"])])  # fmt: skip
    header = ["layout", "years", "file GB", "build s", "build s/year", "peak RSS MB", "RSS above start MB", "cache MB",
              *(f"{p} (time / peak RSS)" for p in cfg["peers"])]  # fmt: skip
    parts.append(
        "**Cache build** (plainloop) and the xarray peer doing the same area mean:\n\n" + md_table(header, rows)
    )
    parts.append("\n".join(
        f"- {layout} {key} {what}: {x['from_years']} -> {x['to_years']} years (x{x['years_ratio']:g}) grew "
        f"x{x['ratio']:.2f} (per year x{x['per_year_ratio']:.2f})"
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
                     f"{cfg['batch']}, model {TRAIN_MODEL}:\n\n" + md_table(head, trows))  # fmt: skip
    if result.get("sampler"):
        srows = [[f"x{s['scale']:g}", s["samples"], s["ids"], s["batches"], f"{s['construction_median_s'] * 1e3:.1f}",
                  f"{s['epoch_median_s'] * 1e3:.1f}", f"{s['before_per_sample_s'][0] * 1e3:.0f}",
                  f"{s['rss_above_start_mb']:.0f}"] for s in result["sampler"]]  # fmt: skip
        head = ["size", "samples", "ids", "batches", "construction ms", "epoch ms", "before (per-sample inference) ms",
                "RSS above start MB"]  # fmt: skip
        parts.append("**Sampler** (CachedModalAwarePKSampler, batch 32 = 8 x 4) at k x SYSU-MM01:\n\n"
                     + md_table(head, srows))  # fmt: skip
    return "\n\n".join(parts + [f"- {n}" for n in result["notes"]]) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # argparse here, not common.base_parser: a --child process must not import torch before it measures memory
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = ap.add_argument
    add("--years", default=None, help="comma list of file lengths (default: 5,10,20,40)")
    add("--layouts", default="legacy,cds2024", help="comma list (default: legacy,cds2024)")
    add("--peers", default=None, help=f"comma list from {','.join(PEERS)} (default: those installed)")
    add("--eager-max-gb", type=float, default=1.5, help="largest decoded field (GB, float64) the eager xarray peer "
        "is given (default: 1.5)")  # fmt: skip
    add("--epochs", type=int, default=4, help="training epochs, the first one cold (default: 4)")
    add("--batch", type=int, default=16, help="training batch (default: 16: 5 years have 47 samples)")
    add("--threads", type=int, default=0, help="torch threads in training, 0 = default (default: 0)")
    add("--no-train", action="store_true", help="skip the training epochs")
    add("--sampler-scales", default=None, help="comma list of SYSU multiples (default: 1,4,16)")
    add("--sampler-reps", type=int, default=5, help="sampler repetitions (default: 5)")
    add("--parts", default="era5,sampler", help="what to run: era5, sampler (default: both)")
    add("--cache-dir", default=None, help="where the generated files go (default: ~/.cache/plainloop)")
    add("--keep-caches", action="store_true", help="keep the built caches (default: deleted after use)")
    add("--quick", action="store_true", help="tiny files, in-process, 2 sizes (a test)")
    add("--wait-load", type=float, default=0.0, help="before each size, wait for a 1-minute load average below "
        "this, at most an hour in all (default: 0 = do not wait)")  # fmt: skip
    add("--out", default=None, help="JSON path (default: benchmarks/results/scaling_cpu.json)")
    add("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return {}
    from benchmarks.common import RESULTS_DIR, environment, loadavg, write_result

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
    a.layouts = [x for x in a.layouts.split(",") if x]
    bad = [x for x in a.layouts if x not in LAYOUTS]
    if bad or not a.layouts:
        ap.error(f"--layouts {bad or a.layouts}: choose from {','.join(LAYOUTS)}")
    notes: list[str] = []
    a.peers = _peers(ap, a.peers, notes)
    parts = set(a.parts.split(","))
    if parts - {"era5", "sampler"}:
        ap.error(f"--parts {a.parts}: choose from era5, sampler")
    from datasets.era5 import default_cache_dir

    cache_dir = Path(a.cache_dir).expanduser() if a.cache_dir else default_cache_dir()
    import torch

    env = environment(torch.device("cpu"))  # at the start: the commit that is measured
    a.waited, a.deadline = [], time.monotonic() + 3600.0
    load_start = loadavg()
    with tempfile.TemporaryDirectory(dir=cache_dir if not a.quick else None) as work:
        era5 = era5_grid(a, sizes, cache_dir, Path(work)) if "era5" in parts else {"rows": [], "train": []}
    sampler = sampler_grid(sizes["sampler_scales"], a.sampler_reps) if "sampler" in parts else []
    result = {
        "schema": "plainloop-bench-scaling-1",
        "command": "python -m benchmarks.scaling " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": env,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "waited_for_quiet": a.waited,
        "config": {
            "years": list(sizes["years"]),
            "grid": sizes["grid"],
            "resolution": sizes["resolution"],
            "layouts": a.layouts,
            "peers": a.peers,
            "epochs": a.epochs,
            "batch": a.batch,
            "isolated": not a.quick,
            "sampler_scales": list(sizes["sampler_scales"]),
            "train_model": TRAIN_MODEL,
            "area": AREA,
        },
        "era5": era5,
        "growth": {
            layout: {
                f"{k}.{w}": growth([r for r in era5["rows"] if r["layout"] == layout], k, w)
                for k in ("build", *a.peers)
                for w in ("seconds", "peak_rss_mb", "rss_above_start_mb")
            }
            for layout in a.layouts
        },
        "sampler": sampler,
        "notes": notes,
    }
    out = Path(a.out) if a.out else RESULTS_DIR / "scaling_cpu.json"
    write_result(out, result, render(result))
    return result


def _peers(ap: argparse.ArgumentParser, arg: str | None, notes: list[str]) -> list[str]:
    import importlib.util

    have_xr = importlib.util.find_spec("xarray") is not None
    have_dask = importlib.util.find_spec("dask") is not None
    if arg is None:
        peers = [p for p in PEERS if have_xr and (p != "xarray_dask" or have_dask)]
        if not have_xr:
            notes.append("xarray is not installed: no peer rows (pip install -r requirements-bench.txt)")
        elif not have_dask:
            notes.append("dask is not installed: only the eager xarray peer (pip install 'dask[array]')")
        return peers
    peers = [p for p in arg.split(",") if p]
    bad = [p for p in peers if p not in PEERS]
    if bad:
        ap.error(f"--peers: unknown {bad}; choose from {','.join(PEERS)}")
    if peers and not have_xr:
        ap.error("--peers: xarray is not installed (pip install -r requirements-bench.txt)")
    if "xarray_dask" in peers and not have_dask:
        ap.error("--peers xarray_dask: dask is not installed (pip install 'dask[array]')")
    return peers


if __name__ == "__main__":
    main()
