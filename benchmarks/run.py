"""The speed claim as a table anyone can regenerate: before vs plainloop vs Lightning, one run, one machine.

    .venv/bin/python -m benchmarks.run --preset cpu            # this 2-core box: ~ a few minutes
    bash benchmarks/run_gpu.sh                                 # H100/H200: the seed's SST configuration

Configurations (same model, same data, same optimizer AdamW(lr 1e-3, wd 0.01)):
  before      the seed guides' unoptimised loop (benchmarks/before_loop.py): fp32, batch 50, num_workers 0,
              no pinning, netCDF read per sample, loss.item() every step, validation every epoch
  defaults    plainloop's Trainer with TrainConfig() defaults: batch 150, precision auto (bf16 on a GPU that
              has it, fp16 on older GPUs, fp32 on a CPU), data cached and held on the device, throttled logging
  tuned       defaults + torch.compile (--compile-mode) + a batch size found by utils.autotune
  lightning   lightning.Trainer as seed 000's BaseTrainer (benchmarks/lightning_peer.py) on the cached dataset
  lightning_fp32   the same with precision "32" (CPU preset only: there Lightning turns 16-mixed into bf16)
Repetitions are interleaved (A B C A B C ...). Each repetition builds the configuration afresh, runs warm-up
epochs that are not timed, then times whole epochs: training, validation (at the configuration's own
interval) and checkpoint writes included. samples/s = training samples of the timed epochs / their wall time.
Writes raw JSON (environment, config, every repetition) and a Markdown table to --out / its .md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    RESULTS_DIR,
    environment,
    fmt,
    matmul_peak_flops,
    md_table,
    stats,
    sync,
    write_result,
)

ALL_CONFIGS = ("before", "defaults", "tuned", "lightning", "lightning_fp32")

# file_grid: the generated ERA5-format file's grid (0.25 = ERA5 native 1440 x 721); months of data;
# resolution: the training grid. Batch sizes follow the seeds (50 before, 150 after) except in `tiny`,
# whose few samples need smaller batches to have several steps per epoch.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "file_grid": 5.0,
        "years": 25,
        "resolution": 10.0,
        "model": {
            "d_model": 32,
            "num_heads": 2,
            "num_layers": 1,
            "dim_feedforward": 64,
            "recursion_depth": 1,
            "dropout": 0.0,
        },
        "before_batch": 20,
        "batch": 60,
        "reps": 2,
        "warmup_epochs": 1,
        "epochs": 1,
        "before_epochs": 1,
        "lightning_workers": 2,
        "configs": ("before", "defaults", "lightning"),
    },
    "cpu": {
        "file_grid": 1.0,
        "years": 50,
        "resolution": 5.0,
        "model": {
            "d_model": 128,
            "num_heads": 4,
            "num_layers": 2,
            "dim_feedforward": 256,
            "recursion_depth": 2,
            "dropout": 0.0,
        },
        "before_batch": 50,
        "batch": 150,
        "reps": 3,
        "warmup_epochs": 1,
        "epochs": 2,
        "before_epochs": 1,
        "lightning_workers": 8,
        "configs": ("before", "defaults", "lightning", "lightning_fp32"),
    },
    "seed": {
        "file_grid": 0.25,
        "years": 50,
        "resolution": 2.0,
        "model": {
            "d_model": 512,
            "num_heads": 8,
            "num_layers": 3,
            "dim_feedforward": 1024,
            "recursion_depth": 2,
            "dropout": 0.1,
        },
        "before_batch": 50,
        "batch": 150,
        "reps": 3,
        "warmup_epochs": 2,
        "epochs": 20,
        "before_epochs": 1,
        "lightning_workers": 8,
        "configs": ("before", "defaults", "tuned", "lightning"),
    },
}
# The seed's whole job: 500 epochs over 252 months (seq_len 2, split 0.8/0.1/0.1 -> 200 training samples).
JOB_EPOCHS, JOB_MONTHS = 500, 252
GUIDE_ESTIMATE = {"before_h": 83.0, "after_h": "12–20", "gpu": "RTX 4060 Ti"}
TARGETS = {
    "gpu": {
        "tuned_vs_before": 20.0,
        "tuned_vs_lightning": 1.5,
        "mfu": 0.5,
        "gpu_util": 95.0,
        "data_wait_frac": 0.01,
        "job_s": 60.0,
    },
    "cpu": {"defaults_vs_before": 5.0, "defaults_vs_lightning": 1.3},
}


def _job_train_samples() -> int:
    from datasets.era5 import _split_counts

    return _split_counts(JOB_MONTHS - 1, (0.8, 0.1, 0.1))[0]


def _build_task(
    data_path: Path, p: dict[str, Any], cache_dir: Path, device_cache: bool | None, seed: int
) -> Any:
    from tasks.era5 import build_era5_task

    return build_era5_task(
        data_path=str(data_path),
        resolution=p["resolution"],
        seq_len=2,
        device_cache=device_cache,
        seed=seed,
        cache_dir=str(cache_dir),
        learning_rate=1e-3,
        **p["model"],
    )


def _peak_memory_mb(device: torch.device, mon: dict[str, Any] | None) -> tuple[float, str]:
    """Allocator peak on CUDA; on a CPU the process's peak RSS (whole harness process, an upper bound)."""
    if device.type == "cuda":
        v = (mon or {}).get("peak_gpu_mem_mb") or torch.cuda.max_memory_allocated(device) / 2**20
        return float(v), "cuda max_memory_allocated"
    rss = (mon or {}).get("process_rss_gb_max")
    if rss:
        return float(rss) * 1024, "process RSS max (harness process)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process ru_maxrss (harness process)"


def _monitor(device: torch.device, batch: int) -> Any:
    try:
        from utils.performance_monitor import TrainingMonitor

        return TrainingMonitor(interval=0.2, device=device, batch_size=batch, warmup_iters=0)
    except ImportError as e:  # psutil missing on a bare GPU box: timings still work, telemetry does not
        print(
            f"[bench] TrainingMonitor unavailable ({e}); GPU utilisation and RSS not recorded",
            file=sys.stderr,
        )
        return None


def _rep_record(
    name: str,
    wall: float,
    samples: int,
    steps: int,
    data_s: float,
    step_s: float,
    device: torch.device,
    mon: dict[str, Any] | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    peak, peak_src = _peak_memory_mb(device, mon)
    return {
        "config": name,
        "wall_s": wall,
        "samples": samples,
        "steps": steps,
        "samples_per_s": samples / wall,
        "step_time_s": step_s / max(steps, 1),
        "data_wait_frac": data_s / step_s if step_s > 0 else 0.0,
        "compute_frac": 1.0 - data_s / step_s if step_s > 0 else 1.0,
        "outside_steps_frac": max(0.0, 1.0 - step_s / wall),  # validation, checkpoints, epoch start-up
        "gpu_util_mean": (mon or {}).get("gpu_util_mean"),
        "peak_memory_mb": peak,
        "peak_memory_source": peak_src,
        "loadavg_1m": os.getloadavg()[0],  # the machine is shared: high load explains a slow repetition
        **extra,
    }


# ------------------------------------------------------------------------------------------ the four runners
def run_before_config(
    data_path: Path, p: dict[str, Any], cache_dir: Path, device: torch.device, seed: int
) -> dict[str, Any]:
    from benchmarks.before_loop import NetCDFPerSampleDataset, run_before

    task = _build_task(data_path, p, cache_dir, False, seed)
    train = NetCDFPerSampleDataset(task.train_set, data_path)
    val = NetCDFPerSampleDataset(task.val_set, data_path)
    mon = _monitor(device, p["before_batch"])
    r = run_before(
        task.model,
        train,
        val,
        device,
        epochs=p["before_epochs"],
        batch_size=p["before_batch"],
        monitor=mon,
        seed=seed,
    )
    ms = mon.get_summary() if mon is not None else None
    return _rep_record(
        "before",
        r["wall_s"],
        r["samples"],
        r["steps"],
        r["data_wait_s"],
        r["step_s"],
        device,
        ms,
        {
            "batch_size": p["before_batch"],
            "precision": "32",
            "epochs_timed": p["before_epochs"],
            "val_s": r["val_s"],
        },
    )


def run_plainloop_config(
    name: str,
    data_path: Path,
    p: dict[str, Any],
    cache_dir: Path,
    device: torch.device,
    seed: int,
    batch: int,
    compile_mode: str | None,
) -> dict[str, Any]:
    from trainer.config import TrainConfig
    from trainer.loop import Trainer

    task = _build_task(data_path, p, cache_dir, None, seed)
    W, E = p["warmup_epochs"], p["epochs"]
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            epochs=W + E,
            batch_size=batch,
            output_dir=tmp,
            run_name=name,
            seed=seed,
            monitor_interval=0.2,
            device=str(device),
            compile_model=compile_mode is not None,
            compile_mode=compile_mode or "default",
        )
        trainer = Trainer(cfg, task, log=notes.append)
        summary = trainer.fit()
        rows = [
            json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        ]
    train_rows = [r for r in rows if r["kind"] == "train"]
    ends = {}
    for r in train_rows:
        ends[r["epoch"]] = max(ends.get(r["epoch"], -math.inf), r["time"])
    if len(ends) < W + E:
        raise RuntimeError(f"{name}: plainloop logged {len(ends)} epochs, expected {W + E}")
    wall = ends[W + E] - ends[W]
    # per-interval step time and data wait from the log rows of the timed epochs; every epoch ends in a row
    step_s = data_s = 0.0
    steps = 0
    prev_step = None
    for r in train_rows:
        n_steps = r["step"] - (prev_step or 0)
        prev_step = r["step"]
        if r["epoch"] <= W:
            continue
        elapsed = n_steps * batch / r["samples_per_s"]
        step_s += elapsed
        data_s += r["data_wait_frac"] * elapsed
        steps += n_steps
    mon = summary.get("monitor")
    return _rep_record(
        name,
        wall,
        steps * batch,
        steps,
        data_s,
        step_s,
        device,
        mon,
        {
            "batch_size": batch,
            "precision": summary["precision"],
            "epochs_timed": E,
            "compile_mode": compile_mode,
            "notes": summary.get("notes", []),
        },
    )


def run_lightning_config(
    name: str,
    data_path: Path,
    p: dict[str, Any],
    cache_dir: Path,
    device: torch.device,
    seed: int,
    precision: str,
) -> dict[str, Any]:
    from benchmarks.lightning_peer import SEED_LOADER, run_lightning

    task = _build_task(data_path, p, cache_dir, False, seed)
    loader = dict(SEED_LOADER, num_workers=p["lightning_workers"])
    mon = _monitor(device, p["batch"])
    r = run_lightning(
        task.model,
        task.train_set,
        task.val_set,
        device,
        epochs=p["epochs"],
        warmup_epochs=p["warmup_epochs"],
        batch_size=p["batch"],
        precision=precision,
        loader=loader,
        monitor=mon,
        seed=seed,
    )
    ms = mon.get_summary() if mon is not None else None
    steps = math.ceil(len(task.train_set) / p["batch"]) * p["epochs"]  # Lightning keeps the short last batch
    return _rep_record(
        name,
        r["wall_s"],
        r["samples"],
        steps,
        r["data_wait_s"],
        r["step_s"],
        device,
        ms,
        {
            "batch_size": p["batch"],
            "precision": r["precision_resolved"],
            "precision_requested": precision,
            "epochs_timed": p["epochs"],
            "loader": r["loader"],
        },
    )


def autotune_batch(
    data_path: Path, p: dict[str, Any], cache_dir: Path, device: torch.device, seed: int
) -> dict:
    """Largest batch that fits (utils.autotune), capped so an epoch still has at least two steps."""
    from trainer.setup import resolve_runtime
    from utils.autotune import find_max_batch_size

    task = _build_task(data_path, p, cache_dir, False, seed)
    rt = resolve_runtime("auto", str(device))
    model = copy.deepcopy(task.model).to(device)
    x1, y1 = task.train_set[0]
    cap = max(p["batch"], len(task.train_set) // 2)

    def try_batch(bs: int) -> None:
        x = x1.expand(bs, *x1.shape).contiguous().to(device)
        y = y1.expand(bs, *y1.shape).contiguous().to(device)
        with rt.autocast():
            loss = model.loss(model(x), y)
        loss.backward()
        model.zero_grad(set_to_none=True)
        sync(device)

    res = find_max_batch_size(try_batch, start=p["batch"], max_batch=cap)
    model.cpu()  # free the trial model's GPU memory before the timed runs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch_size": int(res["batch_size"]), "cap": cap, "tried": res.get("tried")}


# ------------------------------------------------------------------------------------------ report
def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarise(
    reps: dict[str, list[dict[str, Any]]], flops_per_sample: float, peak_flops: float, job_samples: int
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, rs in reps.items():
        if not rs:
            continue
        sps = stats([r["samples_per_s"] for r in rs])
        util = [r["gpu_util_mean"] for r in rs if r.get("gpu_util_mean") is not None]
        out[name] = {
            "samples_per_s": sps,
            "step_time_s": stats([r["step_time_s"] for r in rs])["median"],
            "data_wait_frac": stats([r["data_wait_frac"] for r in rs])["median"],
            "compute_frac": stats([r["compute_frac"] for r in rs])["median"],
            "outside_steps_frac": stats([r["outside_steps_frac"] for r in rs])["median"],
            "gpu_util_mean": stats(util)["median"] if util else None,
            "peak_memory_mb": max(r["peak_memory_mb"] for r in rs),
            "mfu": flops_per_sample * sps["median"] / peak_flops,
            "job_s": job_samples / sps["median"],
            "batch_size": rs[0]["batch_size"],
            "precision": rs[0]["precision"],
        }
    base = out.get("before", {}).get("samples_per_s", {}).get("median")
    peer = out.get("lightning", {}).get("samples_per_s", {}).get("median")
    for name, s in out.items():
        s["vs_before"] = _ratio(s["samples_per_s"]["median"], base)
        s["vs_lightning"] = _ratio(s["samples_per_s"]["median"], peer)
        # paired: the ratio within each interleaved repetition, then the median; robust to a slow patch of
        # the shared machine that hits every configuration of one repetition
        s["vs_before_paired"] = _paired(reps[name], reps.get("before"))
        s["vs_lightning_paired"] = _paired(reps[name], reps.get("lightning"))
    return out


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]] | None) -> float | None:
    if not b:
        return None
    by_rep = {r["rep"]: r["samples_per_s"] for r in b}
    ratios = [r["samples_per_s"] / by_rep[r["rep"]] for r in a if r["rep"] in by_rep]
    return stats(ratios)["median"] if ratios else None


def _where(name: str, s: dict[str, Any]) -> str:
    """One config's time split, per step and per sample: the profile behind a missed target."""
    step_ms, bs = s["step_time_s"] * 1e3, s["batch_size"]
    return (
        f"{name}: {step_ms:.1f} ms/step of {bs} = {step_ms / bs:.2f} ms/sample, of which data wait "
        f"{100 * s['data_wait_frac']:.1f}% ({step_ms * s['data_wait_frac'] / bs:.2f} ms/sample) and compute "
        f"{100 * s['compute_frac']:.1f}% ({step_ms * s['compute_frac'] / bs:.2f} ms/sample); outside the steps "
        f"(validation, checkpoints, epoch start-up) {100 * s['outside_steps_frac']:.1f}% of the wall time"
    )


def check_targets(summary: dict[str, dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    """Each target with the measured value, met or missed, and where the time went when missed."""
    checks: list[dict[str, Any]] = []

    def add(
        what: str,
        cfg: str,
        value: float | None,
        goal: float,
        higher: bool,
        unit: str = "",
        paired: float | None = None,
    ) -> None:
        # a ratio target counts as met only when the paired (per-repetition) ratio meets it too
        met = value is not None and (value >= goal if higher else value <= goal)
        met = met and (paired is None or paired >= goal)
        s = summary.get(cfg, {})
        why = None
        if not met and s:
            why = _where(cfg, s)
            for peer in ("before", "lightning"):
                ps = summary.get(peer)
                if peer != cfg and ps and peer in what:
                    why += "; " + _where(peer, ps)
        checks.append(
            {
                "target": what,
                "config": cfg,
                "value": value,
                "goal": goal,
                "direction": ">=" if higher else "<=",
                "unit": unit,
                "paired": paired,
                "met": met,
                "explanation": why,
            }
        )

    if device.type == "cuda":
        t = TARGETS["gpu"]
        s = summary.get("tuned", {})
        add(
            "tuned vs before",
            "tuned",
            s.get("vs_before"),
            t["tuned_vs_before"],
            True,
            "x",
            s.get("vs_before_paired"),
        )
        add(
            "tuned vs lightning",
            "tuned",
            s.get("vs_lightning"),
            t["tuned_vs_lightning"],
            True,
            "x",
            s.get("vs_lightning_paired"),
        )
        add("MFU of the measured bf16 peak", "tuned", s.get("mfu"), t["mfu"], True)
        add("GPU utilisation", "tuned", s.get("gpu_util_mean"), t["gpu_util"], True, "%")
        add("data wait of step time", "tuned", s.get("data_wait_frac"), t["data_wait_frac"], False)
        add("seed job (500 epochs)", "tuned", s.get("job_s"), t["job_s"], False, "s")
    else:
        t = TARGETS["cpu"]
        s = summary.get("defaults", {})
        add(
            "defaults vs before",
            "defaults",
            s.get("vs_before"),
            t["defaults_vs_before"],
            True,
            "x",
            s.get("vs_before_paired"),
        )
        add(
            "defaults vs lightning",
            "defaults",
            s.get("vs_lightning"),
            t["defaults_vs_lightning"],
            True,
            "x",
            s.get("vs_lightning_paired"),
        )
    return checks


LABELS = {
    "before": "before (seed loop)",
    "defaults": "plainloop defaults",
    "tuned": "plainloop tuned",
    "lightning": "Lightning (seed BaseTrainer)",
    "lightning_fp32": "Lightning, precision 32",
}


def render(result: dict[str, Any]) -> str:
    s, env = result["summary"], result["environment"]
    peak = result["peak"]
    head = (
        f"**{result['preset']}** preset on {env['device_name']} ({env['device']}), torch {env['torch']}, "
        f"commit `{env['commit'][:12]}`, {env['time_utc']}. Grid {result['grid']}, {result['train_samples']} "
        f"training samples, {result['reps']} interleaved repetitions (ratios: of the medians, and in brackets "
        f"the median of the per-repetition ratios); measured {peak['dtype']} matmul peak "
        f"{peak['tflops']:.2f} TFLOP/s (best of {len(peak.get('measurements_tflops', [1]))} measurements); model {result['flops_per_sample'] / 1e9:.2f} GFLOP/sample (training)."
    )
    rows = []
    for name in ALL_CONFIGS:
        if name not in s:
            continue
        x = s[name]
        sp = x["samples_per_s"]
        rows.append(
            [
                LABELS[name],
                x["batch_size"],
                x["precision"],
                f"{sp['median']:.1f} ({sp['min']:.1f}–{sp['max']:.1f})",
                f"{fmt(x['vs_before'], '.2f', '×')} ({fmt(x['vs_before_paired'], '.2f', '×')})",
                f"{fmt(x['vs_lightning'], '.2f', '×')} ({fmt(x['vs_lightning_paired'], '.2f', '×')})",
                fmt(x["step_time_s"] * 1e3, ".1f"),
                fmt(100 * x["data_wait_frac"], ".1f", "%"),
                fmt(100 * x["outside_steps_frac"], ".1f", "%"),
                fmt(x["gpu_util_mean"], ".0f", "%") if x["gpu_util_mean"] is not None else "n/a (CPU)",
                fmt(x["peak_memory_mb"], ".0f"),
                fmt(100 * x["mfu"], ".2f", "%"),
                _dur(x["job_s"]),
            ]
        )
    table = md_table(
        [
            "config",
            "batch",
            "precision",
            "samples/s median (min–max)",
            "× before (paired)",
            "× Lightning (paired)",
            "ms/step",
            "data wait",
            "outside steps",
            "GPU util",
            "peak MB",
            "MFU",
            "seed job (500 ep)",
        ],
        rows,
    )
    guide = (
        f"Seed guide's estimate of the 500-epoch job on an {GUIDE_ESTIMATE['gpu']}: "
        f"{GUIDE_ESTIMATE['before_h']:.0f} h before, {GUIDE_ESTIMATE['after_h']} h after (never measured). "
        f"The last column extrapolates {JOB_EPOCHS} epochs × {result['job_train_samples']} training samples "
        f"({JOB_MONTHS} months) from each measured rate"
        + (
            " — this preset's model is smaller than the seed's, so it is not the seed's job time."
            if result["preset"] != "seed"
            else "."
        )
    )
    checks = result["targets"]
    trows = [
        [
            c["target"],
            c["config"],
            fmt(c["value"], ".3g")
            + (c["unit"] if c["value"] is not None else "")
            + (f" (paired {c['paired']:.3g}{c['unit']})" if c.get("paired") is not None else ""),
            f"{c['direction']} {c['goal']:g}{c['unit']}",
            "met" if c["met"] else ("not measured" if c["value"] is None else "**missed**"),
            c["explanation"] or "",
        ]
        for c in checks
    ]
    ttable = md_table(["target", "config", "measured", "goal", "", "where the time goes (if missed)"], trows)
    return "\n\n".join([head, table, guide, ttable] + [f"- {n}" for n in result["notes"]]) + "\n"


def _dur(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def rerender(path: Path) -> dict[str, Any]:
    """Summary, targets and Markdown recomputed from the raw repetitions stored in `path` (rewritten in place)."""
    if not path.is_file():
        sys.exit(f"--rerender {path}: no such file")
    result = json.loads(path.read_text(encoding="utf-8"))
    summary = summarise(
        result["repetitions"], result["flops_per_sample"], result["peak"]["flops"], result["job_samples"]
    )
    result["summary"] = summary
    result["targets"] = check_targets(summary, torch.device(result["environment"]["device"]))
    write_result(path, result, render(result))
    return result


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="problem size (default: cpu)")
    ap.add_argument(
        "--file-grid",
        type=float,
        default=None,
        help="grid (degrees) of the generated ERA5-format file, e.g. 0.25 = ERA5's native 1440 x 721 "
        "(default: the preset's)",
    )
    ap.add_argument(
        "--configs",
        default=None,
        help=f"comma list from {','.join(ALL_CONFIGS)} (default: the preset's list)",
    )
    ap.add_argument("--reps", type=int, default=None, help="repetitions, interleaved (default: the preset's)")
    ap.add_argument(
        "--epochs", type=int, default=None, help="timed epochs per repetition (default: the preset's)"
    )
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument(
        "--cache-dir",
        default=None,
        help="where the generated netCDF and the coarse cache go (default: $PLAINLOOP_CACHE or "
        "~/.cache/plainloop)",
    )
    ap.add_argument(
        "--data-path",
        default=None,
        help="an existing ERA5-format netCDF file instead of the generated one (default: generate)",
    )
    ap.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "reduce-overhead", "max-autotune"),
        help="torch.compile mode of the tuned config (default: default)",
    )
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/run_<cpu|gpu>.json)")
    ap.add_argument("--seed", type=int, default=0, help="model/data-order seed (default: 0)")
    ap.add_argument(
        "--rerender",
        default=None,
        metavar="JSON",
        help="recompute the summary, targets and table of an earlier result from its raw repetitions (no run)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads; 0 = torch's default, as users run (default: 0)",
    )
    args = ap.parse_args(argv)

    if args.rerender:
        return rerender(Path(args.rerender))
    p = dict(PRESETS[args.preset])
    if args.file_grid is not None:
        p["file_grid"] = args.file_grid
    configs = tuple(args.configs.split(",")) if args.configs else p["configs"]
    unknown = [c for c in configs if c not in ALL_CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; choose from {ALL_CONFIGS}")
    if args.reps is not None:
        if args.reps < 1:
            ap.error(f"--reps {args.reps}: must be >= 1")
        p["reps"] = args.reps
    if args.epochs is not None:
        if args.epochs < 1:
            ap.error(f"--epochs {args.epochs}: must be >= 1")
        p["epochs"] = args.epochs
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available here; drop --device or use cpu")
    if args.threads < 0:
        ap.error(f"--threads {args.threads}: must be >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    notes: list[str] = []

    from benchmarks.lightning_peer import lightning_available

    if any(c.startswith("lightning") for c in configs) and lightning_available() is None:
        configs = tuple(c for c in configs if not c.startswith("lightning"))
        notes.append("lightning is not installed: the Lightning rows are skipped (pip install lightning)")
    try:
        import netCDF4  # noqa: F401
    except ImportError:
        sys.exit(
            "benchmarks.run: netCDF4 is missing; the ERA5 data (and the 'before' loop) need it: "
            "pip install netCDF4"
        )

    from datasets.era5_sample import ensure_sample_file

    cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else None
    if cache_dir is None:
        from datasets.era5 import default_cache_dir

        cache_dir = default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.data_path:
        data_path = Path(args.data_path)
        if not data_path.is_file():
            ap.error(f"--data-path {data_path}: no such file")
    else:
        data_path = ensure_sample_file(cache_dir, years=p["years"], grid=p["file_grid"])
    print(
        f"[bench] data {data_path} ({data_path.stat().st_size / 1e6:.0f} MB, "
        f"{time.perf_counter() - t0:.0f} s to make/find)",
        flush=True,
    )

    probe = _build_task(data_path, p, cache_dir, False, args.seed)
    flops = float(probe.flops_per_sample)
    n_train = len(probe.train_set)
    source = f"a {p['file_grid']:g}° file" if not args.data_path else f"{data_path.name}"
    grid = (
        f"{probe.train_set.height} x {probe.train_set.width} at {p['resolution']:g}° from "
        f"{source} ({probe.train_set.info['months']})"
    )
    del probe
    peak = matmul_peak_flops(device)
    print(
        f"[bench] {n_train} training samples, grid {grid}; measured {peak['dtype']} matmul peak "
        f"{peak['tflops']:.2f} TFLOP/s",
        flush=True,
    )
    if device.type == "cpu":
        notes.append(
            "CPU: plainloop's precision 'auto' resolves to fp32 (CPU autocast is slower), so 'defaults' "
            "here = fp32 + data held in RAM + throttled logging; MFU is of the measured fp32 matmul peak"
        )
        if "lightning" in configs:
            notes.append(
                "CPU: Lightning's seed precision '16-mixed' is impossible on a CPU; Lightning itself "
                "switches to bf16-mixed (row 'Lightning (seed BaseTrainer)')"
                + (
                    "; 'Lightning, precision 32' is the like-for-like fp32 row"
                    if "lightning_fp32" in configs
                    else ""
                )
            )
    if p["lightning_workers"] != 8 and any(c.startswith("lightning") for c in configs):
        notes.append(f"Lightning uses {p['lightning_workers']} workers in this preset (seed: 8)")

    tuned_batch = None
    if "tuned" in configs:
        at = autotune_batch(data_path, p, cache_dir, device, args.seed)
        tuned_batch = at["batch_size"]
        notes.append(
            f"tuned: batch {tuned_batch} from utils.autotune (capped at {at['cap']} so an epoch has >= 2 "
            f"steps), torch.compile mode {args.compile_mode!r}"
        )

    reps: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    peaks = [peak]
    for rep in range(p["reps"]):
        if rep:  # the peak is re-measured every repetition; the best is this device's peak (a shared
            peaks.append(matmul_peak_flops(device))  # machine can be slowed at any one moment)
        for c in configs:  # interleaved: A B C A B C ...
            t = time.perf_counter()
            if c == "before":
                r = run_before_config(data_path, p, cache_dir, device, args.seed)
            elif c == "defaults":
                r = run_plainloop_config(c, data_path, p, cache_dir, device, args.seed, p["batch"], None)
            elif c == "tuned":
                r = run_plainloop_config(
                    c, data_path, p, cache_dir, device, args.seed, tuned_batch, args.compile_mode
                )
            elif c == "lightning":
                r = run_lightning_config(c, data_path, p, cache_dir, device, args.seed, "16-mixed")
            else:
                r = run_lightning_config(c, data_path, p, cache_dir, device, args.seed, "32")
            r["rep"] = rep
            reps[c].append(r)
            print(
                f"[bench] rep {rep + 1}/{p['reps']} {c:15s} {r['samples_per_s']:9.1f} samples/s "
                f"({r['samples']} samples in {r['wall_s']:.2f} s; harness {time.perf_counter() - t:.0f} s)",
                flush=True,
            )

    peak = dict(max(peaks, key=lambda q: q["flops"]), measurements_tflops=[q["tflops"] for q in peaks])
    job_samples = JOB_EPOCHS * _job_train_samples()
    summary = summarise(reps, flops, peak["flops"], job_samples)
    result = {
        "schema": "plainloop-bench-run-1",
        "preset": args.preset,
        "environment": environment(device),
        "config": {
            **{k: v for k, v in p.items() if k != "configs"},
            "configs": list(configs),
            "data_path": str(data_path),
            "compile_mode": args.compile_mode,
            "seed": args.seed,
            "optimizer": "AdamW(lr=1e-3, weight_decay=0.01)",
            "tuned_batch": tuned_batch,
            "torch_threads": torch.get_num_threads(),
        },
        "grid": grid,
        "train_samples": n_train,
        "reps": p["reps"],
        "flops_per_sample": flops,
        "flops_source": "RecursiveAttentionTransformer.flops_per_sample(training=True): matmul FLOPs x 3",
        "peak": peak,
        "job_train_samples": _job_train_samples(),
        "job_samples": job_samples,
        "guide_estimate": GUIDE_ESTIMATE,
        "repetitions": reps,
        "summary": summary,
        "notes": notes,
    }
    result["targets"] = check_targets(summary, device)
    out = (
        Path(args.out) if args.out else RESULTS_DIR / f"run_{'gpu' if device.type == 'cuda' else 'cpu'}.json"
    )
    write_result(out, result, render(result))
    print(f"[bench] wrote {out} and {out.with_suffix('.md')} ({time.perf_counter() - t0:.0f} s)")
    return result


if __name__ == "__main__":
    main()
