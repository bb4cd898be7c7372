"""Scores with and without an EMA of the weights, on the SST and re-ID demos (CPU), through the CLI.

    .venv/bin/python -m benchmarks.ema                            # ~10 min on 2 shared CPU cores
    .venv/bin/python -m benchmarks.ema --tasks sst --seeds 1 2 3 --decay 0.999

For each task and seed, two runs of `train_optimized.py` with the same settings: one without EMA, one with
`--ema_decay D`. The EMA run reports the EMA weights' scores under the usual names and the trained weights' scores
as raw_<name>; best.pt (and --test_with_best, on for re-ID) follows the EMA score. The table gives the test scores
of both runs and the EMA run's raw scores. Each command is recorded with its results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS_DIR, environment, loadavg, md_table, write_result

ROOT = Path(__file__).resolve().parents[1]
# the demos as the CLI runs them on a CPU; re-ID shortened from 60 epochs to keep the benchmark small
TASKS: dict[str, dict[str, Any]] = {
    "sst": {"args": ["--task", "era5"], "metrics": ("test_rmse_c", "test_acc"), "better": {"test_acc": "max"}},
    "reid": {
        "args": ["--task", "reid"],
        "metrics": ("test_rgb2ir_mAP", "test_rgb2ir_rank1", "test_ir2rgb_mAP"),
        "better": {},
    },
}
COMMON = ["--no-progress_bar", "--no-plots"]


def run_cli(args: list[str], out_dir: Path, name: str) -> dict[str, Any]:
    cmd = [sys.executable, "train_optimized.py", *args, *COMMON, "--output_dir", str(out_dir), "--run_name", name]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    shown = "python train_optimized.py " + " ".join(args + COMMON)
    if proc.returncode != 0:
        raise RuntimeError(f"{shown} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary = json.loads((out_dir / name / "summary.json").read_text(encoding="utf-8"))
    return {
        "command": shown,
        "wall_s": wall,
        "steps": summary["steps"],
        "final_metrics": summary["final_metrics"],
        "best": summary.get("best"),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["sst", "reid"], choices=tuple(TASKS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="SST seeds (default: 1 2)")
    p.add_argument("--reid_seeds", nargs="+", type=int, default=[1], help="re-ID seeds (default: 1)")
    p.add_argument("--reid_epochs", type=int, default=15, help="re-ID epochs (default: 15; the demo runs 60)")
    p.add_argument("--decay", type=float, default=0.999, help="--ema_decay of the EMA runs (default: 0.999)")
    p.add_argument("--out", default=str(RESULTS_DIR / "ema_cpu.json"))
    args = p.parse_args(argv)
    runs: list[dict[str, Any]] = []
    load_start = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            spec = TASKS[task]
            seeds = args.seeds if task == "sst" else args.reid_seeds
            extra = ["--epochs", str(args.reid_epochs)] if task == "reid" else []
            for seed in seeds:
                base = [*spec["args"], "--seed", str(seed), *extra]
                for ema in (False, True):
                    a = base + (["--ema_decay", f"{args.decay:g}"] if ema else [])
                    name = f"{task}-s{seed}-{'ema' if ema else 'plain'}"
                    r = run_cli(a, Path(tmp), name)
                    r.update(task=task, seed=seed, ema=ema)
                    runs.append(r)
                    print(f"[ema] {r['command']}: {r['steps']} steps, {r['wall_s']:.0f} s", flush=True)
    rows = []
    for task in args.tasks:
        for m in TASKS[task]["metrics"]:
            for seed in args.seeds if task == "sst" else args.reid_seeds:
                plain = next(r for r in runs if r["task"] == task and r["seed"] == seed and not r["ema"])
                with_ema = next(r for r in runs if r["task"] == task and r["seed"] == seed and r["ema"])
                a, b = plain["final_metrics"].get(m), with_ema["final_metrics"].get(m)
                raw = with_ema["final_metrics"].get(f"raw_{m}")
                rows.append(
                    [task, seed, m, _f(a), _f(b), _f(raw), _f(b - a if a is not None and b is not None else None)]
                )
    table = md_table(["task", "seed", "test metric", "no EMA", "EMA", "EMA run, raw weights", "EMA - no EMA"], rows)
    commands = "\n".join(f"    {r['command']}" for r in runs)
    md = (
        f"# EMA of the weights on the CPU demos\n\nEMA runs: `--ema_decay {args.decay:g}` (timm warm-up, power "
        f"0.75). re-ID runs {args.reid_epochs} epochs (the demo: 60). One machine with "
        f"{environment(torch.device('cpu'))['cpu_count']} shared cores, load average {load_start} at the start; "
        f"torch {torch.__version__}.\n\n{table}\n\nRMSE: lower is better; ACC, mAP and rank-1: higher is better. "
        f"Commands (each with --output_dir and --run_name):\n\n{commands}\n"
    )
    result = {
        "environment": environment(torch.device("cpu")),
        "config": vars(args),
        "load": {"start": load_start, "end": loadavg()},
        "runs": runs,
    }
    write_result(args.out, result, md)


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


if __name__ == "__main__":
    main()
