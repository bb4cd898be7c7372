"""Scores with and without an EMA of the weights, on the SST and re-ID demos (CPU), through the CLI.

    .venv/bin/python -m benchmarks.ema                            # ~10 min on 2 shared CPU cores
    .venv/bin/python -m benchmarks.ema --tasks sst --seeds 1 2 3 --decay 0.999

For each task and seed, two runs of `train_optimized.py` with the same settings, one with `--ema_decay D`. The EMA
run reports the EMA weights' scores under the usual names and the trained weights' as raw_<name>; best.pt (and
--test_with_best, on for re-ID) follows the EMA score. Each command is recorded with its results.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS_DIR, environment, loadavg, md_table, parser, write_result

ROOT = Path(__file__).resolve().parents[1]
METRICS = {"sst": ("test_rmse_c", "test_acc"), "reid": ("test_rgb2ir_mAP", "test_rgb2ir_rank1", "test_ir2rgb_mAP")}
FLAGS = [("--tasks", ["sst", "reid"], "demos", {"nargs": "+", "choices": tuple(METRICS)}),
         ("--seeds", [1, 2], "SST seeds", {"nargs": "+", "type": int}),
         ("--reid_seeds", [1], "re-ID seeds", {"nargs": "+", "type": int}),
         ("--reid_epochs", 15, "re-ID epochs (the demo runs 60)"), ("--decay", 0.999, "--ema_decay of the EMA runs"),
         ("--out", str(RESULTS_DIR / "ema_cpu.json"), "raw JSON (and .md beside it)")]  # fmt: skip


def run_cli(args: list[str], out_dir: Path, name: str) -> dict[str, Any]:
    args = [*args, "--no-progress_bar", "--no-plots"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "train_optimized.py", *args, "--output_dir", str(out_dir), "--run_name",
                           name], cwd=ROOT, capture_output=True, text=True, timeout=3600)  # fmt: skip
    shown = "python train_optimized.py " + " ".join(args)
    if proc.returncode != 0:
        raise RuntimeError(f"{shown} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    s = json.loads((out_dir / name / "summary.json").read_text(encoding="utf-8"))
    return {"command": shown, "wall_s": time.perf_counter() - t0, "steps": s["steps"],
            "final_metrics": s["final_metrics"], "best": s.get("best")}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    a = parser(__doc__, FLAGS).parse_args(argv)
    seeds = {"sst": a.seeds, "reid": a.reid_seeds}
    runs: dict[tuple[str, int, bool], dict[str, Any]] = {}
    load_start = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for task in a.tasks:
            extra = ["--epochs", str(a.reid_epochs)] if task == "reid" else []
            for seed in seeds[task]:
                for ema in (False, True):
                    args = ["--task", "era5" if task == "sst" else task, "--seed", str(seed), *extra]
                    r = run_cli(args + (["--ema_decay", f"{a.decay:g}"] if ema else []), Path(tmp),
                                f"{task}-s{seed}-{'ema' if ema else 'plain'}")  # fmt: skip
                    runs[task, seed, ema] = {**r, "task": task, "seed": seed, "ema": ema}
                    print(f"[ema] {r['command']}: {r['steps']} steps, {r['wall_s']:.0f} s", flush=True)

    def f(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    rows = []
    for task in a.tasks:
        for m in METRICS[task]:
            for seed in seeds[task]:
                plain, ema = runs[task, seed, False]["final_metrics"], runs[task, seed, True]["final_metrics"]
                x, y = plain.get(m), ema.get(m)
                d = None if x is None or y is None else y - x
                rows.append([task, seed, m, f(x), f(y), f(ema.get(f"raw_{m}")), f(d)])
    env = environment(torch.device("cpu"))
    table = md_table(["task", "seed", "test metric", "no EMA", "EMA", "EMA run, raw weights", "EMA - no EMA"], rows)
    commands = "\n".join(f"    {r['command']}" for r in runs.values())
    md = (f"# EMA of the weights on the CPU demos\n\nEMA runs: `--ema_decay {a.decay:g}` (timm warm-up, power 0.75). "
          f"re-ID runs {a.reid_epochs} epochs (the demo: 60). One machine with {env['cpu_count']} shared cores, load "
          f"average {load_start} at the start; torch {torch.__version__}.\n\n{table}\n\nRMSE: lower is better; ACC, "
          "mAP and rank-1: higher is better. Commands (each with --output_dir and --run_name):\n\n"
          f"{commands}\n")  # fmt: skip
    result = {"environment": env, "config": vars(a), "load": {"start": load_start, "end": loadavg()},
              "runs": list(runs.values())}  # fmt: skip
    write_result(a.out, result, md)


if __name__ == "__main__":
    main()
