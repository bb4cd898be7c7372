"""What the loop itself costs: a tiny model where the per-step Python overhead dominates.

    .venv/bin/python -m benchmarks.loop_overhead                 # ~1 min on 2 CPU cores
    .venv/bin/python -m benchmarks.loop_overhead --profile       # + cProfile of plainloop's steps

Three loops train the same MLP on the same in-memory tensors, same batch, same AdamW, same data order
source (indices gathered from tensors held in memory, no DataLoader workers):
  hand       the 10-line loop below (`hand_loop`): gather, forward, backward, step
  plainloop  trainer.loop.Trainer with TrainConfig defaults (max_steps), a dataset exposing gather()
  plain_model  the same Trainer with a user's own model (no `loss` method, default loss) and a TensorDataset
  basetrainer  BaseTrainer (seed 000's door) with the user's own model class and TensorDataset class, no area
  lightning  lightning.Trainer, defaults except logger=False; a DataLoader yielding whole gathered batches
Repetitions are interleaved (hand, plainloop, lightning, hand, ...) because the machine is shared; samples/s
is timed between step `--warmup` and the last step; the table reports medians. Target: plainloop, plain_model and basetrainer >= 0.97x hand.
The loops' own console output (plainloop's epoch lines, Lightning's progress bar, which stays on as by
default) is written to a buffer (`quiet`): the output shows the [overhead] lines and the table only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import (
    RESULTS_DIR,
    base_parser,
    environment,
    lightning_available,
    md_table,
    paired,
    quiet,
    stats,
    target_check,
    write_result,
)

TARGET_VS_HAND = 0.97


def make_data(n: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = x[:, :1] * 0.5 + torch.randn(n, 1, generator=g) * 0.1
    return x, y


def make_model(dim: int, hidden: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


class TensorPairs(torch.utils.data.Dataset):
    """(x, y) rows held in memory; `gather(idx)` serves a whole batch (plainloop's device-resident path), and
    indexing with a list of indices does the same for a DataLoader with batch_size=None (Lightning)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, idx: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]

    def maybe_to_device(self, device: torch.device) -> bool:
        self.x, self.y = self.x.to(device), self.y.to(device)
        return True

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


def mse_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1])


# --------------------------------------------------------------------------------------------- the three loops
def hand_loop(x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace) -> float:
    """The 10-line loop. Returns samples/s after the warm-up steps."""
    model, bs = make_model(a.dim, a.hidden, a.seed), a.batch_size
    opt = make_optimizer(model, a.lr)
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(a.seed))
    for step in range(a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        idx = order[step * bs : (step + 1) * bs]
        loss = F.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (a.steps - a.warmup) * bs / (time.perf_counter() - t0)


def plainloop_loop(x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace, plain: bool = False) -> float:
    """plain=False: a dataset with gather() and an explicit loss; plain=True: a user's own model without a
    `loss` method and a torch TensorDataset, everything else left to plainloop's defaults."""
    from torch.utils.data import TensorDataset

    from trainer import Task, TrainConfig, Trainer

    # the default LOG_EVERY, or less when the timed window's ends are not log points (tiny test runs)
    log_every = math.gcd(TrainConfig.log_every, a.warmup, a.steps)
    model = make_model(a.dim, a.hidden, a.seed)
    task = (
        Task("overhead", model, TensorDataset(x, y))
        if plain
        else Task("overhead", model, TensorPairs(x, y), loss_fn=mse_loss)
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            max_steps=a.steps,
            batch_size=a.batch_size,
            lr=a.lr,
            seed=a.seed,
            output_dir=tmp,
            run_name="overhead",
            device="cpu" if a.device == "cpu" else None,
            log_every=log_every,
        )
        with quiet():  # the epoch line goes to the bar's write when a bar exists, not to `log`
            summary = Trainer(cfg, task, log=lambda _s: None).fit()
        rows = [json.loads(r) for r in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if r["kind"] == "train"}  # one row every log_every=50 steps
    return (a.steps - a.warmup) * a.batch_size / (times[a.steps] - times[a.warmup])


def lightning_loop(x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace) -> float:
    import lightning as L

    model = make_model(a.dim, a.hidden, a.seed)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return F.mse_loss(self.model(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return make_optimizer(self.model, a.lr)

    marks: dict[int, float] = {}

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            if trainer.global_step in (a.warmup, a.steps):
                marks[trainer.global_step] = time.perf_counter()

    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(range(x.shape[0]), generator=torch.Generator().manual_seed(a.seed)),
        a.batch_size,
        drop_last=True,
    )
    loader = torch.utils.data.DataLoader(TensorPairs(x, y), batch_size=None, sampler=sampler)
    # quiet(): its progress bar runs, as by default, but its redraws (and start-up notes) go nowhere
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), quiet():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            accelerator="cpu" if a.device == "cpu" else "auto",
            devices=1,
            max_steps=a.steps,
            logger=False,
            default_root_dir=tmp,
            enable_model_summary=False,
            callbacks=[Clock()],
        )
        trainer.fit(Module(), loader)
    return (a.steps - a.warmup) * a.batch_size / (marks[a.steps] - marks[a.warmup])


def plain_model_loop(x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace) -> float:
    return plainloop_loop(x, y, a, plain=True)


def basetrainer_loop(x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace) -> float:
    """The seed guides' door with a user's own model class and dataset class (no area, no `loss` method)."""
    from torch.utils.data import TensorDataset

    from trainer import BaseTrainer, TrainConfig

    class Pairs(TensorDataset):  # the user's own dataset class
        def __init__(self) -> None:
            super().__init__(x, y)

    class MLP(nn.Sequential):  # the user's own model class
        def __init__(self) -> None:
            torch.manual_seed(a.seed)
            super().__init__(nn.Linear(a.dim, a.hidden), nn.GELU(), nn.Linear(a.hidden, 1))

    with tempfile.TemporaryDirectory() as tmp:
        tp = {
            "max_steps": a.steps,
            "batch_size": a.batch_size,
            "lr": a.lr,
            "seed": a.seed,
            "output_dir": tmp,
            "log_every": math.gcd(TrainConfig.log_every, a.warmup, a.steps),
            "split_ratio": [1.0, 0.0],
            "device": "cpu" if a.device == "cpu" else None,
        }
        bt = BaseTrainer("overhead", "bt", None, MLP, Pairs, Path(tmp) / "model.pt", trainer_params=tp,
                         log=lambda _s: None)  # fmt: skip
        with quiet():
            bt.train()
        assert bt.trainer is not None and bt.trainer.run_dir is not None
        rows = [json.loads(r) for r in (bt.trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if r["kind"] == "train"}
    return (a.steps - a.warmup) * a.batch_size / (times[a.steps] - times[a.warmup])


LOOPS = {
    "hand": hand_loop,
    "plainloop": plainloop_loop,
    "plain_model": plain_model_loop,
    "basetrainer": basetrainer_loop,
    "lightning": lightning_loop,
}


def profile_plainloop(x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace, top: int = 25) -> str:
    """cProfile of one plainloop run: the functions with the most own time, for the per-step overhead hunt."""
    prof = cProfile.Profile()
    prof.enable()
    plainloop_loop(x, y, a)
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf).sort_stats("tottime")
    st.print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # One intra-op thread for every loop: on a tiny model threading buys nothing, and on a shared machine a
    # descheduled second OpenMP thread stalls every op (ms per step) and buries the loop cost in noise.
    ap = base_parser(__doc__, RESULTS_DIR / "loop_overhead_cpu.json", reps=7, threads=1)
    add = ap.add_argument
    add("--steps", type=int, default=600, help="optimizer steps per run (default: 600)")
    add("--warmup", type=int, default=100, help="untimed leading steps (default: 100)")
    add("--batch-size", type=int, default=64, help="batch size (default: 64)")
    add("--dim", type=int, default=32, help="input features (default: 32)")
    add("--hidden", type=int, default=64, help="hidden units (default: 64)")
    add("--lr", type=float, default=1e-3, help="AdamW learning rate (default: 1e-3)")
    add("--seed", type=int, default=0, help="seed (default: 0)")
    add("--device", default="cpu", help="device (default: cpu: the loop's overhead is host-side)")
    add("--loops", default=",".join(LOOPS), help=f"comma list (default: {','.join(LOOPS)})")
    add("--profile", action="store_true", help="also cProfile one plainloop run and print it")
    a = ap.parse_args(argv)
    if a.warmup < 1 or a.steps <= a.warmup:
        ap.error(f"--warmup {a.warmup} / --steps {a.steps}: need 1 <= warmup < steps")
    loops = a.loops.split(",")
    if bad := [n for n in loops if n not in LOOPS]:
        ap.error(f"--loops: unknown {bad}; choose from {list(LOOPS)}")
    notes = []
    if "lightning" in loops and lightning_available() is None:
        loops.remove("lightning")
        notes.append("lightning is not installed: its row is skipped")
    x, y = make_data(a.steps * a.batch_size, a.dim, a.seed)  # one epoch holds every step: no epoch boundary
    reps: dict[str, list[float]] = {n: [] for n in loops}
    for r in range(a.reps):
        a.wait(r)
        for n in loops:  # interleaved
            reps[n].append(LOOPS[n](x, y, a))
            print(f"[overhead] rep {r + 1}/{a.reps} {n:10s} {reps[n][-1]:10.0f} samples/s", flush=True)
    summ = {n: stats(v) for n, v in reps.items()}
    hand = summ.get("hand", {}).get("median")
    vs_hand = {n: summ[n]["median"] / hand for n in loops} if hand else {}
    vs_paired = {n: paired(reps[n], reps["hand"]) for n in loops} if hand else {}
    result: dict[str, Any] = {
        "schema": "plainloop-bench-loop-overhead-1", "environment": environment(torch.device(a.device)),
        "command": "python -m benchmarks.loop_overhead " + " ".join(a.argv),
        "config": {k: v for k, v in ap.config(a).items() if k != "profile"}, "torch_threads": torch.get_num_threads(),
        "model": f"Linear({a.dim},{a.hidden}) GELU Linear({a.hidden},1), AdamW, MSE", "repetitions": reps,
        "summary": summ, "vs_hand": vs_hand, "vs_hand_paired": vs_paired, "target_vs_hand": TARGET_VS_HAND,
        "notes": notes,
    }  # fmt: skip
    if hand:  # met only when both the ratio of the medians and the paired ratio reach the target
        engine = [n for n in ("plainloop", "plain_model", "basetrainer") if n in summ]
        result["target_met_by"] = {n: target_check(n, vs_hand[n], vs_paired[n], TARGET_VS_HAND)["met"] for n in engine}
        result["target_met"] = all(result["target_met_by"].values())
    rows = [[n, f"{summ[n]['median']:.0f}", f"{summ[n]['min']:.0f}–{summ[n]['max']:.0f}",
             f"{1e6 * a.batch_size / summ[n]['median']:.0f}",
             f"{vs_hand[n]:.3f}× ({vs_paired[n]:.3f}×)" if hand else "n/a",
             f"{1e6 * a.batch_size / summ[n]['median'] - 1e6 * a.batch_size / hand:+.0f}" if hand else "n/a"]
            for n in loops]  # fmt: skip
    table = md_table(["loop", "samples/s (median)", "min–max", "µs/step", "× hand (paired)", "µs/step vs hand"], rows)
    env = result["environment"]
    verdict = "".join(
        f"\n\nTarget {n} ≥ {TARGET_VS_HAND}× hand: **{'met' if ok else 'missed'}** ({vs_hand[n]:.3f}× of the "
        f"medians, {vs_paired[n]:.3f}× paired; both must reach it)."
        for n, ok in result.get("target_met_by", {}).items()
    )
    md = (
        f"Loop overhead on {env['device_name']} ({a.device}), torch {env['torch']}, commit `{env['commit'][:12]}`: "
        f"{result['model']}, batch {a.batch_size}, {a.steps} steps ({a.warmup} untimed), {a.reps} interleaved "
        f"repetitions, {torch.get_num_threads()} torch thread(s).\n\n{table}{verdict}\n"
    )
    if a.profile:
        result["profile_plainloop"] = prof = profile_plainloop(x, y, a)
        print(prof)
    out = write_result(a.out, result, md)
    print(f"[overhead] wrote {out} and {out.with_suffix('.md')}")
    return result


if __name__ == "__main__":
    main()
