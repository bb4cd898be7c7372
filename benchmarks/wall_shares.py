"""Wall-time shares (summary.json's wall_time) at the default validation cadence (auto) and validating every epoch
(the before), one command-line run each: the figure is the shares, not a speed.

    .venv/bin/python -m benchmarks.wall_shares --threads 1     # ~4 min on 2 CPU cores

Jobs: sst = the demo (`python train_optimized.py`, its CPU preset); big-val = a user's task (`--task
benchmarks.wall_shares:big_val`): an MLP whose validation set is 10x its training set, 60 epochs of batch 250.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks import common as bc
from trainer import Task

JOBS = {"sst": [], "big-val": ["--task", "benchmarks.wall_shares:big_val", "--epochs", "60", "--batch_size", "250"]}
PARTS = ("steps_s", "validation_s", "checkpoints_s", "rest_s")


def big_val(train: int = 4000) -> Task:
    """An MLP regression whose validation set is 10x its training set.

    Args:
        train: training samples"""
    x = torch.randn(11 * train, 128, generator=torch.Generator().manual_seed(0))
    y = x[:, :8].sum(1, keepdim=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    return Task("bigval", model, TensorDataset(x[:train], y[:train]), TensorDataset(x[train:], y[train:]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    flags = [("--jobs", ",".join(JOBS), "jobs to run"), ("--extra", "", "more flags for every run"),
             ("--out", str(bc.RESULTS_DIR / "wall_shares_cpu.json"), "JSON path")]  # fmt: skip
    ap = bc.parser(__doc__, flags, timing=(1, 1))
    a = ap.parse_args(argv)
    runs: dict[str, Any] = {}
    for job in bc.comma_list(ap, "--jobs", a.jobs, JOBS):
        for every in ([], ["--validation_interval", "1"]):
            with tempfile.TemporaryDirectory() as tmp:
                run = [*JOBS[job], *every, *a.extra.split(), "--num_threads", str(a.threads), "--output_dir", tmp]
                cmd = [sys.executable, "train_optimized.py", *run, "--run_name", "r", "--no-progress_bar", "--no-plots"]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=Path(__file__).parents[1])
                s = json.loads((Path(tmp) / "r" / "summary.json").read_text())
                rows = map(json.loads, (Path(tmp) / "r" / "metrics.jsonl").read_text().splitlines())
                runs[f"{job} {'every epoch' if every else 'auto'}"] = r = {
                    **{k: s[k] for k in ("wall_time", "train_time_s", "steps", "epochs", "final_metrics")},
                    "val_epochs": [r["epoch"] for r in rows if r["kind"] == "val"], "command": " ".join(cmd[1:]),
                    "cadence": [n for n in s["notes"] if n.startswith("validation: ")],
                    "closing_lines": out.stdout.splitlines()[-2:]}  # fmt: skip
            print(f"[wall] {job}{' every epoch' if every else ''}: {r['closing_lines'][0]}")
    env = bc.environment(torch.device("cuda" if torch.cuda.is_available() else "cpu"))  # the runs' device
    walls = {name: r["wall_time"] for name, r in runs.items()}
    table = [[name, len(runs[name]["val_epochs"]), f"{w['wall_s']:.1f}", *(f"{100 * w[k] / w['wall_s']:.0f}%"
              for k in PARTS)] for name, w in walls.items()]  # fmt: skip
    md = (f"Wall-time shares on {env['device_name']}, torch {env['torch']}, commit `{env['commit'][:12]}`, one run "
          f"each.\n\n{bc.md_table(['job, cadence', 'validations', 'wall s', *PARTS], table)}\n")  # fmt: skip
    result = {"schema": "plainloop-bench-wall-shares-1", "command": bc.command("wall_shares", argv),
              "environment": env, "config": ap.config(a), "runs": runs}  # fmt: skip
    print(f"[wall] wrote {bc.write_result(a.out, result, md)}")
    return result


if __name__ == "__main__":
    main()
