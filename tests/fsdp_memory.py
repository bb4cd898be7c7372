"""Bytes of parameters + gradients + optimizer state per rank, and CPU step time, for DDP and FSDP.

python -m tests.fsdp_memory [--ranks 1,2,3] [--width 256] [--depth 8] [--steps 20] [--out JSON]
Each (strategy, ranks) runs under torchrun with gloo on the CPU: a stack of `depth` residual blocks
(Linear width x width), AdamW, batch 64, one thread per rank. FSDP shards with plainloop's own
`shard_model` (the units: the blocks). Counted are the tensors each rank holds: its parameters (an
FSDP rank: its shards), their .grad after backward and the optimizer's state (AdamW: 2 per
parameter). DDP's gradient buckets and activations are not counted. It lives beside the tests (as
fault_campaign.py does) because benchmarks/ is at its line budget; it uses benchmarks/common.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import environment, md_table, parser, stats, write_result

ROOT = Path(__file__).resolve().parents[1]


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def _bytes(tensors: Any) -> int:
    local = [getattr(t, "_local_tensor", t) for t in tensors if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in local)


def worker(strategy: str, width: int, depth: int, steps: int) -> None:
    """One rank: train `steps` steps; write what this rank holds and its step times (FSDP_MEMORY_DIR)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.config import TrainConfig
    from trainer.extras.fsdp import shard_model
    from trainer.runtime import resolve_runtime

    torch.set_num_threads(1)
    rt = resolve_runtime("32", "cpu")  # joins torchrun's process group (gloo)
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(*(Block(width) for _ in range(depth)))  # FSDP's units: Block
    if strategy == "fsdp":
        shard_model(model, TrainConfig(strategy="fsdp"), rt, [])
    elif rt.distributed:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(rt.rank))
    times, grads = [], 0
    for _ in range(steps):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        grads = _bytes(p.grad for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    params = _bytes(model.parameters())
    optim = _bytes(v for s in opt.state.values() for v in s.values() if v.dim() > 0)
    row = {
        "strategy": strategy,
        "ranks": rt.world_size,
        "rank": rt.rank,
        "param_bytes": params,
        "grad_bytes": grads,
        "optim_bytes": optim,
        "total_bytes": params + grads + optim,
        "step_s": stats(times[len(times) // 4 :]),
    }  # the first quarter: warm-up
    Path(os.environ["FSDP_MEMORY_DIR"], f"{strategy}-{rt.world_size}-{rt.rank}.json").write_text(json.dumps(row))


def launch(strategy: str, ranks: int, a: Any) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
           "-m", "tests.fsdp_memory", "--worker", strategy, "--width", str(a.width), "--depth",
           str(a.depth), "--steps", str(a.steps)]  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "FSDP_MEMORY_DIR": d}
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=900, check=True)
        return [json.loads(f.read_text()) for f in sorted(Path(d).glob("*.json"))]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, [
        ("--ranks", "1,2,3", "numbers of processes"), ("--width", 256, "block width"),
        ("--depth", 8, "blocks"), ("--steps", 20, "steps per run"),
        ("--worker", None, "internal: run one rank of this strategy"),
        ("--out", str(ROOT / "benchmarks/results/fsdp_memory_cpu.json"), "result JSON"),
    ])  # fmt: skip
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.width, a.depth, a.steps)
        return 0
    rows = [r for n in map(int, a.ranks.split(",")) for s in ("ddp", "fsdp") for r in launch(s, n, a)]
    ddp = {r["ranks"]: r["total_bytes"] for r in rows if r["strategy"] == "ddp" and r["rank"] == 0}
    table = [(r["strategy"], r["ranks"], r["rank"], f"{r['param_bytes'] / 2**20:.2f}",
              f"{r['grad_bytes'] / 2**20:.2f}", f"{r['optim_bytes'] / 2**20:.2f}",
              f"{r['total_bytes'] / 2**20:.2f}", f"{r['total_bytes'] / ddp[r['ranks']]:.3f}",
              f"{r['step_s']['median'] * 1e3:.2f}") for r in rows]  # fmt: skip
    md = md_table(["strategy", "ranks", "rank", "params MiB", "grads MiB", "optimizer MiB", "total MiB",
                   "of DDP", "step ms (median)"], table)  # fmt: skip
    config = {"width": a.width, "depth": a.depth, "steps": a.steps, "batch": 64, "optimizer": "AdamW"}
    write_result(a.out, {"environment": environment(torch.device("cpu")), "config": config, "rows": rows}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
