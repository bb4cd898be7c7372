"""The speed claim as a table anyone can regenerate: before vs plainloop vs Lightning, one run, one machine.

    .venv/bin/python -m benchmarks.run --preset cpu            # this 2-core box: ~10 minutes
    bash benchmarks/run_gpu.sh                                 # H100/H200: the seed's SST configuration

The rows (same model, data and AdamW) are LABELS below; docs/benchmarks/index.md, "The rows", says what each is.
Repetitions are interleaved (A B C A B C ...). Each builds its row afresh, runs untimed warm-up epochs, then times
whole epochs: training, validation (at the row's own interval) and checkpoint writes included. samples/s = training
samples of the timed epochs / their wall time. Writes raw JSON (environment, config, every repetition) and a
Markdown table to --out and its .md.
"""

from __future__ import annotations

import copy
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import common as bc
from benchmarks.common import fmt, md_table, stats

LABELS = {
    "before": "before (seed loop)", "defaults": "plainloop defaults", "seed_loader": "plainloop, seed's loader",
    "tuned": "plainloop tuned", "user_trainer": "user model, Trainer", "user_base": "user model, BaseTrainer",
    "lightning": "Lightning (seed BaseTrainer)", "lightning_data": "Lightning, plainloop's data path",
    "lightning_fp32": "Lightning, precision 32",
}  # fmt: skip
ALL_CONFIGS = tuple(LABELS)
_CPU_ROWS = ("before", "defaults", "seed_loader", "user_trainer", "user_base", "lightning", "lightning_data")
_KEYS = ("file_grid", "years", "resolution", "before_batch", "batch", "reps", "warmup_epochs", "epochs",
         "before_epochs", "lightning_workers")  # fmt: skip
# file_grid: the generated ERA5-format file's grid (0.25 = ERA5 native 1440 x 721); years of data; resolution: the
# training grid. Batches follow the seeds (50 before, 150 after) except in `tiny`, whose few samples need smaller ones.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {**dict(zip(_KEYS, (5.0, 25, 10.0, 20, 60, 2, 1, 1, 1, 2))), "model": bc.MODEL_SIZES["tiny"],
             "configs": ("before", "defaults", "lightning")},
    "cpu": {**dict(zip(_KEYS, (1.0, 50, 5.0, 50, 150, 3, 1, 2, 1, 8))), "model": bc.MODEL_SIZES["cpu"],
            "configs": (*_CPU_ROWS, "lightning_fp32")},
    "seed": {**dict(zip(_KEYS, (0.25, 50, 2.0, 50, 150, 3, 2, 20, 1, 8))), "model": bc.MODEL_SIZES["seed"],
             "configs": (*_CPU_ROWS[:3], "tuned", *_CPU_ROWS[3:])},
}  # fmt: skip
FLAGS = [("--preset", "cpu", "problem size", {"choices": sorted(PRESETS)}),
         ("--file-grid", None, "grid (degrees) of the generated ERA5-format file, e.g. 0.25 = ERA5's native 1440 x 721 "
          "(default: the preset's)", {"type": float}),
         ("--configs", None, f"comma list from {','.join(ALL_CONFIGS)} (default: the preset's list)"),
         ("--epochs", None, "timed epochs per repetition (default: the preset's)", {"type": int}),
         ("--device", None, "cuda or cpu (default: cuda when available)"),
         ("--cache-dir", None, "the generated netCDF and the coarse cache (default: $PLAINLOOP_CACHE or "
          "~/.cache/plainloop)"),
         ("--compile-mode", "default", "torch.compile mode of the tuned row; none = autotuned batch without compile",
          {"choices": ("default", "reduce-overhead", "max-autotune", "none")}),
         ("--seed", 0, "model/data-order seed"),
         ("--out", None, "JSON path (default: benchmarks/results/run_<cpu|gpu>.json)")]  # fmt: skip
# The seed's whole job: 500 epochs over 252 months (seq_len 2, split 0.8/0.1/0.1 -> 200 training samples).
JOB_EPOCHS, JOB_MONTHS = 500, 252
GUIDE_ESTIMATE = {"before_h": 83.0, "after_h": "12–20", "gpu": "RTX 4060 Ti"}
TARGETS = {
    "gpu": {"tuned_vs_before": 20.0, "tuned_vs_lightning": 1.5, "mfu": 0.5, "gpu_util": 95.0, "data_wait_frac": 0.01,
            "job_s": 60.0},
    "cpu": {"defaults_vs_before": 5.0, "defaults_vs_lightning": 1.3},
}  # fmt: skip
AREA = {"lon": (-180, 180), "lat": (-80, 80)}  # build_era5_task's default area, used by every row
PLAINLOOP_ROWS: dict[str, dict[str, Any]] = {  # per-row TrainConfig overrides of plainloop's defaults
    "defaults": {}, "user_trainer": {}, "tuned": {"compile_model": True},
    "seed_loader": {"device_cache": False, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2},
}  # fmt: skip


@dataclass
class Bench:
    """What every configuration of one harness run shares."""

    data_path: Path
    p: dict[str, Any]
    cache_dir: Path
    device: torch.device
    seed: int
    compile_mode: str = "default"
    tuned_batch: int | None = None


def _job_train_samples() -> int:
    from datasets.era5 import _split_counts

    return int(_split_counts(JOB_MONTHS - 1, (0.8, 0.1, 0.1))[0])


def _build_task(b: Bench, device_cache: bool | None) -> Any:
    from tasks.era5 import build_era5_task

    # calendar planes off: the seed's inputs, as the recorded results had them
    return build_era5_task(data_path=str(b.data_path), resolution=b.p["resolution"], seq_len=2,
                           device_cache=device_cache, seed=b.seed, cache_dir=str(b.cache_dir), learning_rate=1e-3,
                           calendar=False, **b.p["model"])  # fmt: skip


class UserSSTModel(nn.Module):
    """A user's own model as they would bring it: the seed's network, forward only. No `loss` method (so plainloop
    picks its default MSE), no ocean mask, no FLOP count: nothing plainloop-specific."""

    def __init__(self, **kw: Any) -> None:
        super().__init__()
        from models.ratransformer import RecursiveAttentionTransformer

        self.net = RecursiveAttentionTransformer(**kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def _user_model_params(b: Bench, width: int, height: int) -> dict[str, Any]:
    return dict(width=width, height=height, seq_len=2, lon_range=AREA["lon"], lat_range=AREA["lat"], **b.p["model"])


def _monitor(device: torch.device, batch: int) -> Any:
    try:
        from utils.performance_monitor import TrainingMonitor

        return TrainingMonitor(interval=0.2, device=device, batch_size=batch, warmup_iters=0)
    except ImportError as e:  # psutil missing on a bare GPU box: timings still work, telemetry does not
        print(f"[bench] TrainingMonitor unavailable ({e}); GPU utilisation and RSS not recorded", file=sys.stderr)
        return None


def _rep_record(name: str, r: dict[str, Any], device: torch.device, mon: dict[str, Any] | None,
                extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """One repetition from its raw timing `r` (wall_s, samples, steps, data_wait_s, step_s)."""
    mon = mon or {}
    if device.type == "cuda":  # the allocator's peak; on a CPU the harness process's peak RSS (an upper bound)
        peak, src = float(mon.get("peak_gpu_mem_mb") or torch.cuda.max_memory_allocated(device) / 2**20), "cuda"
    elif mon.get("process_rss_gb_max"):
        peak, src = float(mon["process_rss_gb_max"]) * 1024, "process RSS max (harness process)"
    else:
        peak, src = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process ru_maxrss (harness process)"
    wall, data_s, step_s, steps, la = r["wall_s"], r["data_wait_s"], r["step_s"], r["steps"], bc.loadavg()
    return {
        "config": name, "wall_s": wall, "samples": r["samples"], "steps": steps,
        "samples_per_s": r["samples"] / wall, "step_time_s": step_s / max(steps, 1),
        "data_wait_frac": data_s / step_s if step_s > 0 else 0.0,
        "compute_frac": 1.0 - data_s / step_s if step_s > 0 else 1.0,
        "outside_steps_frac": max(0.0, 1.0 - step_s / wall),  # validation, checkpoints, epoch start-up
        "gpu_util_mean": mon.get("gpu_util_mean"), "peak_memory_mb": peak, "peak_memory_source": src,
        "loadavg_1m": la[0] if la else None, **extra,  # the machine is shared: high load explains a slow repetition
    }  # fmt: skip


def epochs_from_metrics(metrics: Path, warmup: int, epochs: int, batch: int, name: str) -> dict[str, Any]:
    """Timing of epochs warmup+1 .. warmup+epochs from a run's metrics.jsonl: wall time between the last rows of
    epoch `warmup` and of the final epoch; step time and data wait summed from the timed epochs' rows."""
    rows, ends = bc.epoch_ends(metrics)
    if len(ends) < warmup + epochs:
        raise RuntimeError(f"{name}: plainloop logged {len(ends)} epochs, expected {warmup + epochs}")
    step_s = data_s = 0.0
    steps = prev = 0
    for r in rows:
        n, prev = r["step"] - prev, r["step"]
        if r["epoch"] > warmup:
            elapsed = n * batch / r["samples_per_s"]
            step_s, data_s, steps = step_s + elapsed, data_s + r["data_wait_frac"] * elapsed, steps + n
    wall = ends[warmup + epochs] - ends[warmup]
    return {"wall_s": wall, "samples": steps * batch, "steps": steps, "data_wait_s": data_s, "step_s": step_s}


# ------------------------------------------------------------------------------------------ the runners
def run_before_config(b: Bench, name: str) -> dict[str, Any]:
    from benchmarks.before_loop import NetCDFPerSampleDataset, run_before

    task, batch = _build_task(b, False), b.p["before_batch"]
    train, val = (NetCDFPerSampleDataset(s, b.data_path) for s in (task.train_set, task.val_set))
    mon = _monitor(b.device, batch)
    r = run_before(task.model, train, val, b.device, epochs=b.p["before_epochs"], batch_size=batch, monitor=mon,
                   seed=b.seed)  # fmt: skip
    extra = {"batch_size": batch, "precision": "32", "epochs_timed": b.p["before_epochs"], "val_s": r["val_s"]}
    return _rep_record(name, r, b.device, mon.get_summary() if mon else None, extra)


def run_plainloop_config(b: Bench, name: str) -> dict[str, Any]:
    from trainer import Task, TrainConfig, Trainer
    from utils.callbacks import VerdictCallback

    over = dict(PLAINLOOP_ROWS[name])
    batch = b.tuned_batch if name == "tuned" and b.tuned_batch else b.p["batch"]
    if name == "seed_loader":
        over["num_workers"] = b.p["lightning_workers"]
    if name == "tuned":
        over.update(compile_model=b.compile_mode != "none", compile_mode=b.compile_mode.replace("none", "default"))
    task = _build_task(b, False if name == "seed_loader" else None)
    if name == "user_trainer":
        torch.manual_seed(b.seed)
        model = UserSSTModel(**_user_model_params(b, task.train_set.width, task.train_set.height))
        task = Task("user_model", model, task.train_set, task.val_set)
    W, E = b.p["warmup_epochs"], b.p["epochs"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(epochs=W + E, batch_size=batch, output_dir=tmp, run_name=name, seed=b.seed,
                          device=str(b.device), **over)  # fmt: skip
        trainer = Trainer(cfg, task, log=lambda _s: None, monitor=_monitor(b.device, batch),
                          callbacks=[VerdictCallback()])  # fmt: skip
        s = trainer.fit()
        r = epochs_from_metrics(Path(s["run_dir"]) / "metrics.jsonl", W, E, batch, name)
    extra = {
        "batch_size": batch, "precision": s["precision"], "epochs_timed": E,
        "compile_mode": over.get("compile_mode") if over.get("compile_model") else None,
        "data_path": "held on the device" if trainer.data.on_device else f"DataLoader {trainer.data.loader_kw}",
        "verdict": (s.get("verdict") or {}).get("verdict"), "notes": s.get("notes", []),
    }  # fmt: skip
    return _rep_record(name, r, b.device, s.get("monitor"), extra)


def run_base_trainer_config(b: Bench, name: str) -> dict[str, Any]:
    """The user model through the seed guides' door: seed-style dicts in, `.train()`, nothing else."""
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset
    from trainer import BaseTrainer

    probe = _build_task(b, False).train_set
    W, E, batch = b.p["warmup_epochs"], b.p["epochs"], b.p["batch"]
    mon = _monitor(b.device, batch)
    data = {"data_path": str(b.data_path), "resolution": b.p["resolution"], "seq_len": 2, "cache_dir": str(b.cache_dir)}
    with tempfile.TemporaryDirectory() as tmp:
        train = {"epochs": W + E, "batch_size": batch, "output_dir": tmp, "seed": b.seed, "device": str(b.device),
                 "split_ratio": (0.8, 0.1, 0.1)}  # fmt: skip
        bt = BaseTrainer("user_model", "bench", Area("global", lon=list(AREA["lon"]), lat=list(AREA["lat"])),
                         UserSSTModel, ERA5SSTMonthlyDataset, Path(tmp) / "user_model.pt", dataset_params=data,
                         trainer_params=train, model_params=_user_model_params(b, probe.width, probe.height),
                         monitor=mon, log=lambda _s: None)  # fmt: skip
        bt.train()
        assert bt.trainer is not None and bt.trainer.run_dir is not None and bt.summary is not None
        r = epochs_from_metrics(Path(bt.trainer.run_dir) / "metrics.jsonl", W, E, batch, name)
    extra = {"batch_size": batch, "precision": bt.summary["precision"], "epochs_timed": E}
    return _rep_record(name, r, b.device, mon.get_summary() if mon else None, extra)


def run_lightning_config(b: Bench, name: str) -> dict[str, Any]:
    same = name == "lightning_data"  # plainloop's own resolved precision; the seed's 16-mixed or 32 otherwise
    precision = bc.lightning_precision(b.device) if same else "32" if name == "lightning_fp32" else "16-mixed"
    task, mon = _build_task(b, None if same else False), _monitor(b.device, b.p["batch"])
    r = bc.run_lightning(task.model, task.train_set, task.val_set, b.device, epochs=b.p["epochs"],
                         warmup_epochs=b.p["warmup_epochs"], batch_size=b.p["batch"], precision=precision,
                         loader=dict(bc.SEED_LOADER, num_workers=b.p["lightning_workers"]), monitor=mon, seed=b.seed,
                         peer=dict(bc.SAME_DATA_PEER, evaluate=task.evaluate_fn) if same else bc.SEED_PEER)  # fmt: skip
    extra = {"batch_size": b.p["batch"], "precision": r["precision_resolved"], "precision_requested": precision,
             "epochs_timed": b.p["epochs"], "loader": r["loader"]}  # fmt: skip
    return _rep_record(name, r, b.device, mon.get_summary() if mon else None, extra)


RUNNERS = {
    "before": run_before_config, **{k: run_plainloop_config for k in PLAINLOOP_ROWS}, "user_base": run_base_trainer_config,
    **{k: run_lightning_config for k in ("lightning", "lightning_data", "lightning_fp32")},
}  # fmt: skip


def autotune_batch(b: Bench) -> dict[str, Any]:
    """Largest batch that fits (trainer.extras.autobatch's search, from the preset's batch up), capped so an epoch
    still has at least two steps."""
    from trainer.extras.autobatch import find_max_batch_size
    from trainer.runtime import resolve_runtime

    task, rt = _build_task(b, False), resolve_runtime("auto", str(b.device))
    model = copy.deepcopy(task.model).to(b.device)
    (x1, y1), cap = task.train_set[0], max(b.p["batch"], len(task.train_set) // 2)

    def try_batch(bs: int) -> None:
        x, y = (t.expand(bs, *t.shape).contiguous().to(b.device) for t in (x1, y1))
        with rt.autocast():
            loss = model.loss(model(x), y)
        loss.backward()
        model.zero_grad(set_to_none=True)
        bc.sync(b.device)

    res = find_max_batch_size(try_batch, start=b.p["batch"], max_batch=cap)
    model.cpu()  # free the trial model's GPU memory before the timed runs
    if b.device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch_size": int(res["batch_size"]), "cap": cap, "tried": res.get("tried")}


# ------------------------------------------------------------------------------------------ report
def _rates(rs: list[dict[str, Any]] | None) -> list[float]:
    return [r["samples_per_s"] for r in sorted(rs or [], key=lambda r: r["rep"])]


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]] | None) -> float | None:
    """The median of the per-repetition ratios of two rows (matched by repetition)."""
    by_rep = {r["rep"]: r["samples_per_s"] for r in b or []}
    both = [(r["samples_per_s"], by_rep[r["rep"]]) for r in a if r["rep"] in by_rep]
    return bc.paired([x for x, _ in both], [y for _, y in both])


def summarise(reps: dict[str, list[dict[str, Any]]], flops_per_sample: float, peak_flops: float,
              job_samples: int) -> dict[str, dict[str, Any]]:  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for name, rs in ((n, rs) for n, rs in reps.items() if rs):
        sps, util = stats(_rates(rs)), [r["gpu_util_mean"] for r in rs if r.get("gpu_util_mean") is not None]
        med = {k: stats([r[k] for r in rs])["median"]
               for k in ("step_time_s", "data_wait_frac", "compute_frac", "outside_steps_frac")}  # fmt: skip
        out[name] = {
            "samples_per_s": sps, **med, "gpu_util_mean": stats(util)["median"] if util else None,
            "peak_memory_mb": max(r["peak_memory_mb"] for r in rs), "mfu": flops_per_sample * sps["median"] / peak_flops,
            "job_s": job_samples / sps["median"], "batch_size": rs[0]["batch_size"], "precision": rs[0]["precision"],
        }  # fmt: skip
    for name, s in out.items():
        for peer in ("before", "lightning", "lightning_data"):
            other = out.get(peer, {}).get("samples_per_s", {}).get("median")
            s[f"vs_{peer}"] = s["samples_per_s"]["median"] / other if other else None
            s[f"vs_{peer}_paired"] = _paired(reps[name], reps.get(peer))
    return out


# Each share of plainloop defaults over Lightning (seed) is a ratio of two rows; what differs between them is named.
SPLIT = {
    "total": ("defaults", "lightning", "plainloop defaults / Lightning (seed BaseTrainer)"),
    "loop": ("defaults", "lightning_data", "the loop: both on plainloop's data path, precision and validation interval"),
    "lightning_data_path_and_precision": ("lightning_data", "lightning", "Lightning's seed set-up: 8-worker loader, "
        "validation every epoch, progress bar, torch's AdamW and 16-mixed (bf16 on a CPU) vs plainloop's data path, "
        "validation interval, AdamW and precision"),
    "lightning_data_path": ("lightning_data", "lightning_fp32", "the same without precision (both fp32): the seed's "
        "loader, validation every epoch, progress bar and torch's AdamW vs plainloop's"),
    "lightning_precision": ("lightning_fp32", "lightning", "precision alone, in Lightning with the seed's set-up: 32 vs "
        "the seed's 16-mixed (bf16 on a CPU)"),
    "data_path": ("defaults", "seed_loader", "the data path alone, in plainloop: held in memory vs the seed's loader "
        "(8 workers, pinned, persistent)"),
}  # fmt: skip


def speedup_split(reps: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """plainloop defaults over Lightning (seed) as a product of shares: total = loop x Lightning's seed set-up,
    and the set-up = its data path and schedule x its precision; each of the medians and paired."""
    return {key: {"ratio": stats(_rates(reps[a]))["median"] / stats(_rates(reps[b]))["median"],
                  "paired": _paired(reps[a], reps[b]), "rows": [a, b], "what": what}
            for key, (a, b, what) in SPLIT.items() if reps.get(a) and reps.get(b)}  # fmt: skip


def _where(name: str, s: dict[str, Any]) -> str:
    """One config's time split, per step and per sample: the profile behind a missed target."""
    step_ms, bs, dw = s["step_time_s"] * 1e3, s["batch_size"], s["data_wait_frac"]
    return (f"{name}: {step_ms:.1f} ms/step of {bs} = {step_ms / bs:.2f} ms/sample, of which data wait "
            f"{100 * dw:.1f}% ({step_ms * dw / bs:.2f} ms/sample) and compute {100 * s['compute_frac']:.1f}% "
            f"({step_ms * s['compute_frac'] / bs:.2f} ms/sample); outside the steps (validation, checkpoints, "
            f"epoch start-up) {100 * s['outside_steps_frac']:.1f}% of the wall time")  # fmt: skip


def check_targets(summary: dict[str, dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    """Each target with the measured value, met or missed (a ratio also paired), and where the time went if missed."""
    if device.type == "cuda":
        t = TARGETS["gpu"]
        wanted = [("tuned vs before", "vs_before", t["tuned_vs_before"], True, "x"),
                  ("tuned vs lightning", "vs_lightning", t["tuned_vs_lightning"], True, "x"),
                  ("MFU of the measured bf16 peak", "mfu", t["mfu"], True, ""),
                  ("GPU utilisation", "gpu_util_mean", t["gpu_util"], True, "%"),
                  ("data wait of step time", "data_wait_frac", t["data_wait_frac"], False, ""),
                  ("seed job (500 epochs)", "job_s", t["job_s"], False, "s")]  # fmt: skip
    else:
        t = TARGETS["cpu"]
        wanted = [("defaults vs before", "vs_before", t["defaults_vs_before"], True, "x"),
                  ("defaults vs lightning", "vs_lightning", t["defaults_vs_lightning"], True, "x")]  # fmt: skip
    checks, cfg = [], "tuned" if device.type == "cuda" else "defaults"
    for what, key, goal, higher, unit in wanted:
        s = summary.get(cfg, {})
        c = bc.target_check(what, s.get(key), s.get(key + "_paired"), goal, higher, unit, cfg)
        why = None
        if not c["met"] and s:
            why = "; ".join([_where(cfg, s)] + [_where(p, summary[p]) for p in ("before", "lightning")
                                                if p != cfg and p in summary and p in what])  # fmt: skip
        checks.append({**c, "explanation": why})
    return checks


def headline(summary: dict[str, dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The figures docs/benchmarks/index.md quotes, from the summary: plainloop's best row against every peer."""
    best = "tuned" if "tuned" in summary else "defaults"
    s = summary.get(best, {})
    keys = ("vs_before", "vs_lightning", "vs_lightning_data", "mfu", "gpu_util_mean", "data_wait_frac", "job_s")
    return {"config": best, "samples_per_s": (s.get("samples_per_s") or {}).get("median"),
            **{k: s.get(k) for k in keys}, **{k + "_paired": s.get(k + "_paired") for k in keys[:3]},
            "job_s_source": f"{JOB_EPOCHS} epochs x {_job_train_samples()} samples at the {best} row's median rate",
            "gpu_util_mean_note": None if device.type == "cuda" else "n/a: no GPU in this run"}  # fmt: skip


def _dur(s: float | None) -> str:
    if s is None:
        return "n/a"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def render(result: dict[str, Any]) -> str:
    s, env, peak = result["summary"], result["environment"], result["peak"]
    loads = [r["loadavg_1m"] for rs in result["repetitions"].values() for r in rs if r.get("loadavg_1m") is not None]
    load = f"1-minute load average {min(loads):.1f}–{max(loads):.1f} after the rows" if loads else "load not recorded"
    head = (
        f"**{result['preset']}** preset on {env['device_name']} ({env['device']}), torch {env['torch']}, commit "
        f"`{env['commit'][:12]}`, {env['time_utc']}, {load}. Grid {result['grid']}, {result['train_samples']} training "
        f"samples, {result['reps']} interleaved repetitions (ratios: of the medians, and in brackets the median of the "
        f"per-repetition ratios); measured {peak['dtype']} matmul peak {peak['tflops']:.2f} TFLOP/s (best of "
        f"{len(peak.get('measurements_tflops', [1]))} measurements); model "
        f"{result['flops_per_sample'] / 1e9:.2f} GFLOP/sample (training)."
    )  # fmt: skip

    def ratio(x: dict[str, Any], key: str) -> str:
        return f"{fmt(x[key], '.2f', '×')} ({fmt(x[key + '_paired'], '.2f', '×')})"

    rows = [[LABELS[n], x["batch_size"], x["precision"],
             f"{x['samples_per_s']['median']:.1f} ({x['samples_per_s']['min']:.1f}–{x['samples_per_s']['max']:.1f})",
             ratio(x, "vs_before"), ratio(x, "vs_lightning"), ratio(x, "vs_lightning_data"),
             fmt(x["step_time_s"] * 1e3, ".1f"), fmt(100 * x["data_wait_frac"], ".1f", "%"),
             fmt(100 * x["outside_steps_frac"], ".1f", "%"),
             fmt(x["gpu_util_mean"], ".0f", "%") if x["gpu_util_mean"] is not None else "n/a (CPU)",
             fmt(x["peak_memory_mb"], ".0f"), fmt(100 * x["mfu"], ".2f", "%"), _dur(x["job_s"])]
            for n in ALL_CONFIGS if (x := s.get(n))]  # fmt: skip
    table = md_table(["config", "batch", "precision", "samples/s median (min–max)", "× before (paired)",
                      "× Lightning seed (paired)", "× Lightning same data (paired)", "ms/step", "data wait",
                      "outside steps", "GPU util", "peak MB", "MFU", "seed job (500 ep)"], rows)  # fmt: skip
    split = [f"- {v['what']}: {fmt(v['ratio'], '.2f', '×')} (paired {fmt(v['paired'], '.2f', '×')}; "
             f"{LABELS[v['rows'][0]]} / {LABELS[v['rows'][1]]})" for v in (result.get("split") or {}).values()]  # fmt: skip
    guide = (
        f"Seed guide's estimate of the 500-epoch job on an {GUIDE_ESTIMATE['gpu']}: {GUIDE_ESTIMATE['before_h']:.0f} h "
        f"before, {GUIDE_ESTIMATE['after_h']} h after (never measured). The last column extrapolates {JOB_EPOCHS} epochs "
        f"× {result['job_train_samples']} training samples ({JOB_MONTHS} months) from each measured rate"
        + (" — this preset's model is smaller than the seed's, so it is not the seed's job time."
           if result["preset"] != "seed" else ".")
    )  # fmt: skip
    trows = [[c["target"], c["config"], fmt(c["value"], ".3g") + (c["unit"] if c["value"] is not None else "")
              + (f" (paired {c['paired']:.3g}{c['unit']})" if c.get("paired") is not None else ""),
              f"{c['direction']} {c['goal']:g}{c['unit']}",
              "met" if c["met"] else ("not measured" if c["value"] is None else "**missed**"), c["explanation"] or ""]
             for c in result["targets"]]  # fmt: skip
    parts = [head, table]
    if split:
        parts.append("Where the speed-up over Lightning comes from (each a ratio of two rows; what differs is named):"
                     "\n\n" + "\n".join(split))  # fmt: skip
    parts += [guide, md_table(["target", "config", "measured", "goal", "", "where the time goes (if missed)"], trows)]
    return "\n\n".join(parts + [f"- {n}" for n in result["notes"]]) + "\n"


# ------------------------------------------------------------------------------------------ main
def prepare_data(cache_dir_arg: str | None, p: dict[str, Any]) -> tuple[Path, Path]:
    """(cache_dir, data_path): the generated ERA5-format file of the preset, made once."""
    try:
        import netCDF4  # noqa: F401
    except ImportError:
        sys.exit("benchmarks: netCDF4 is missing; the ERA5 data (and the 'before' loop) need it: pip install netCDF4")
    from datasets.era5_sample import ensure_sample_file

    cache_dir = bc.cache_dir_of(cache_dir_arg)
    t0 = time.perf_counter()
    data_path = ensure_sample_file(cache_dir, years=p["years"], grid=p["file_grid"])
    print(f"[bench] data {data_path} ({data_path.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.0f} s to "
          "make/find)", flush=True)  # fmt: skip
    return cache_dir, data_path


def setup_notes(b: Bench, configs: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """Drop the rows that cannot run here (Lightning missing) and say what each preset choice means."""
    notes: list[str] = []
    if any(c.startswith("lightning") for c in configs) and bc.lightning_available() is None:
        configs = tuple(c for c in configs if not c.startswith("lightning"))
        notes.append("lightning is not installed: the Lightning rows are skipped (pip install lightning)")
    if b.device.type == "cpu":
        notes.append("CPU: plainloop's precision 'auto' resolves to fp32 (CPU autocast is slower), so 'defaults' here "
                     "= fp32 + data held in RAM + throttled logging; MFU is of the measured fp32 matmul peak")  # fmt: skip
        if "lightning" in configs:
            notes.append("CPU: Lightning's seed precision '16-mixed' is impossible on a CPU; Lightning itself switches "
                         "to bf16-mixed (row 'Lightning (seed BaseTrainer)')")  # fmt: skip
    if b.p["lightning_workers"] != 8 and {"lightning", "lightning_fp32", "seed_loader"} & set(configs):
        notes.append(f"the seed's loader uses {b.p['lightning_workers']} workers in this preset (seed: 8)")
    if {"user_trainer", "user_base"} & set(configs):
        notes.append("user model: the seed's network wrapped in a plain nn.Module with no loss method (plainloop's "
                     "default MSE over every cell, land included, where the built-in task masks land)")  # fmt: skip
    if "lightning_data" in configs:
        notes.append("Lightning, plainloop's data path (common.SAME_DATA_PEER): the same split gathered by index in "
                     "the same order, plainloop's precision and AdamW (not its schedule), validation as often as "
                     "plainloop's default and with the task's own scoring")  # fmt: skip
    if "tuned" in configs:
        at = autotune_batch(b)
        b.tuned_batch = at["batch_size"]
        notes.append(f"tuned: batch {b.tuned_batch} from trainer.extras.autobatch (capped at {at['cap']} so an epoch "
                     f"has >= 2 steps), torch.compile mode {b.compile_mode!r}")  # fmt: skip
    return configs, notes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = bc.parser(__doc__, FLAGS, timing=(None, 0))
    args = ap.parse_args(argv)
    p = dict(PRESETS[args.preset], **({"file_grid": args.file_grid} if args.file_grid is not None else {}))
    configs = tuple(bc.comma_list(ap, "--configs", args.configs, ALL_CONFIGS)) if args.configs else p["configs"]
    for key in ("reps", "epochs"):
        if (v := getattr(args, key)) is not None:
            if v < 1:
                ap.error(f"--{key} {v}: must be >= 1")
            p[key] = v
    device = bc.device_of(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available here; drop --device or use cpu")
    env = bc.environment(device)  # at the start: the commit that is measured, not one edited meanwhile
    t0 = time.perf_counter()
    cache_dir, data_path = prepare_data(args.cache_dir, p)
    b = Bench(data_path, p, cache_dir, device, args.seed, args.compile_mode)
    probe = _build_task(b, False)
    flops, ds = float(probe.flops_per_sample), probe.train_set
    grid = f"{ds.height} x {ds.width} at {p['resolution']:g}° from a {p['file_grid']:g}° file ({ds.info['months']})"
    n_train = len(ds)
    del probe, ds
    peaks = [bc.matmul_peak_flops(device)]
    print(f"[bench] {n_train} training samples, grid {grid}; measured {peaks[0]['dtype']} matmul peak "
          f"{peaks[0]['tflops']:.2f} TFLOP/s", flush=True)  # fmt: skip
    configs, notes = setup_notes(b, configs)
    load_start = bc.loadavg()
    reps: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for rep in range(p["reps"]):  # interleaved; the peak is re-measured each time and the best one kept
        args.wait(rep)
        if rep:
            peaks.append(bc.matmul_peak_flops(device))
        for c in configs:
            t = time.perf_counter()
            r = {**RUNNERS[c](b, c), "rep": rep}
            reps[c].append(r)
            print(f"[bench] rep {rep + 1}/{p['reps']} {c:15s} {r['samples_per_s']:9.1f} samples/s ({r['samples']} "
                  f"samples in {r['wall_s']:.2f} s; harness {time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
    peak = dict(max(peaks, key=lambda q: q["flops"]), measurements_tflops=[q["tflops"] for q in peaks])
    job = _job_train_samples()
    result: dict[str, Any] = {
        "schema": "plainloop-bench-run-2", "preset": args.preset, "command": bc.command("run", args.argv),
        "environment": env, "loadavg_start": load_start, "loadavg_end": bc.loadavg(), "waited_for_quiet": args.waits,
        "config": {**{k: v for k, v in p.items() if k != "configs"}, "configs": list(configs),
                   "data_path": str(b.data_path), "compile_mode": args.compile_mode, "seed": args.seed,
                   "optimizer": "AdamW(lr=1e-3, weight_decay=0.01)", "tuned_batch": b.tuned_batch,
                   "torch_threads": torch.get_num_threads()},
        "grid": grid, "train_samples": n_train, "reps": p["reps"], "flops_per_sample": flops,
        "flops_source": "RecursiveAttentionTransformer.flops_per_sample(training=True): matmul FLOPs x 3",
        "peak": peak, "job_train_samples": job, "job_samples": JOB_EPOCHS * job, "guide_estimate": GUIDE_ESTIMATE,
        "repetitions": reps, "notes": notes,
    }  # fmt: skip
    result["summary"] = summary = summarise(reps, flops, peak["flops"], result["job_samples"])
    result["split"] = speedup_split(reps)
    result["targets"] = check_targets(summary, device)
    result["headline"] = headline(summary, device)
    out = Path(args.out) if args.out else bc.RESULTS_DIR / f"run_{'gpu' if device.type == 'cuda' else 'cpu'}.json"
    bc.write_result(out, result, render(result))
    print(f"[bench] wrote {out} and {out.with_suffix('.md')} ({time.perf_counter() - t0:.0f} s)")
    return result


if __name__ == "__main__":
    main()
