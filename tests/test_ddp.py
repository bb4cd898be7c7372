"""torchrun --nproc_per_node 2 on CPU with gloo: one epoch, equal weights on both ranks, rank 0 writes alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_torchrun_two_processes_gloo(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "ddp_script.py"), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "ddp"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["ddp_max_weight_diff"] == 0.0  # DDP kept both replicas identical
    # 512 samples / 2 ranks / 16 per batch = 16 batches per rank, 2 per optimizer step
    assert summary["steps"] == 8
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps)) == [2, 4, 6, 8]  # one writer: no duplicated rows
    assert len([r for r in rows if r["kind"] == "val"]) == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert proc.stdout.count("[plainloop] toy:") == 1  # only rank 0 prints the run line


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "ddp_script.py"), str(tmp_path), "signal"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0  # the workers exit with 143: stopped, resumable
    run = tmp_path / "ddp"
    import torch

    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    # rank 1's 5th batch is in step 3; the ranks agree at the next log point (log_every 2): step 4
    assert ck["step"] == 4 and ck["batches_done"] == 8
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["signal"] for r in rows if r["kind"] == "event"] == ["SIGTERM"]  # rank 0 wrote once
    assert "Resume with" in proc.stdout + proc.stderr
