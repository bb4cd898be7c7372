"""What the loop itself costs: a tiny model where the per-step Python overhead dominates.

    .venv/bin/python -m benchmarks.loop_overhead                 # ~1 min on 2 CPU cores

The same MLP on the same in-memory tensors, batch, AdamW and data order (no DataLoader workers), trained by
`hand_loop` (the 10-line loop below), plainloop's Trainer (a gather() dataset and its own loss), the same with a
user's own model and a TensorDataset (plain_model), BaseTrainer with the user's own classes (basetrainer) and
lightning.Trainer; docs/benchmarks/index.md ("The loop's own cost") has the rows. Repetitions are interleaved;
samples/s is timed from step --warmup to the last; the table reports medians. Target: plainloop, plain_model and
basetrainer >= 0.97x hand. The loops' own console output goes to a buffer (`quiet`).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import common as bc

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
    data, loss = (TensorDataset(x, y), None) if plain else (TensorPairs(x, y), mse_loss)
    task = Task("overhead", make_model(a.dim, a.hidden, a.seed), data, loss_fn=loss)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(max_steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, output_dir=tmp,
                          run_name="overhead", device="cpu" if a.device == "cpu" else None, log_every=log_every)  # fmt: skip
        with bc.quiet():  # the epoch line goes to the bar's write when a bar exists, not to `log`
            times = bc.step_times(Trainer(cfg, task, log=lambda _s: None).fit()["run_dir"])  # one row every log_every
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

    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(x.shape[0]),
                                            generator=torch.Generator().manual_seed(a.seed)), a.batch_size, True)  # fmt: skip
    loader = torch.utils.data.DataLoader(TensorPairs(x, y), batch_size=None, sampler=sampler)
    # quiet(): its progress bar runs, as by default, but its redraws (and start-up notes) go nowhere
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), bc.quiet():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(accelerator="cpu" if a.device == "cpu" else "auto", devices=1, max_steps=a.steps,
                            logger=False, default_root_dir=tmp, enable_model_summary=False, callbacks=[Clock()])  # fmt: skip
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
        tp = {"max_steps": a.steps, "batch_size": a.batch_size, "lr": a.lr, "seed": a.seed, "output_dir": tmp,
              "log_every": math.gcd(TrainConfig.log_every, a.warmup, a.steps), "split_ratio": [1.0, 0.0],
              "device": "cpu" if a.device == "cpu" else None}  # fmt: skip
        bt = BaseTrainer("overhead", "bt", None, MLP, Pairs, Path(tmp) / "model.pt", trainer_params=tp,
                         log=lambda _s: None)  # fmt: skip
        with bc.quiet():
            bt.train()
        assert bt.trainer is not None and bt.trainer.run_dir is not None
        times = bc.step_times(bt.trainer.run_dir)
    return (a.steps - a.warmup) * a.batch_size / (times[a.steps] - times[a.warmup])


LOOPS = {"hand": hand_loop, "plainloop": plainloop_loop, "plain_model": plain_model_loop,
         "basetrainer": basetrainer_loop, "lightning": lightning_loop}  # fmt: skip
FLAGS = [("--steps", 600, "optimizer steps per run"), ("--warmup", 100, "untimed leading steps"),
         ("--batch-size", 64, "batch size"), ("--dim", 32, "input features"), ("--hidden", 64, "hidden units"),
         ("--lr", 1e-3, "AdamW learning rate"), ("--seed", 0, "seed"),
         ("--device", "cpu", "device (the loop's overhead is host-side)"),
         ("--loops", ",".join(LOOPS), "comma list"),
         ("--out", str(bc.RESULTS_DIR / "loop_overhead_cpu.json"), "JSON path")]  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # One intra-op thread for every loop: on a tiny model threading buys nothing, and on a shared machine a
    # descheduled second OpenMP thread stalls every op (ms per step) and buries the loop cost in noise.
    ap = bc.parser(__doc__, FLAGS, timing=(7, 1))
    a = ap.parse_args(argv)
    if a.warmup < 1 or a.steps <= a.warmup:
        ap.error(f"--warmup {a.warmup} / --steps {a.steps}: need 1 <= warmup < steps")
    loops = bc.comma_list(ap, "--loops", a.loops, LOOPS)
    notes = []
    if "lightning" in loops and bc.lightning_available() is None:
        loops.remove("lightning")
        notes.append("lightning is not installed: its row is skipped")
    x, y = make_data(a.steps * a.batch_size, a.dim, a.seed)  # one epoch holds every step: no epoch boundary
    reps: dict[str, list[float]] = {n: [] for n in loops}
    for r in range(a.reps):
        a.wait(r)
        for n in loops:  # interleaved
            reps[n].append(LOOPS[n](x, y, a))
            print(f"[overhead] rep {r + 1}/{a.reps} {n:10s} {reps[n][-1]:10.0f} samples/s", flush=True)
    summ = {n: bc.stats(v) for n, v in reps.items()}
    hand = summ.get("hand", {}).get("median")
    vs_hand = {n: summ[n]["median"] / hand for n in loops} if hand else {}
    vs_paired = {n: bc.paired(reps[n], reps["hand"]) for n in loops} if hand else {}
    result: dict[str, Any] = {
        "schema": "plainloop-bench-loop-overhead-1", "environment": bc.environment(torch.device(a.device)),
        "command": "python -m benchmarks.loop_overhead " + " ".join(a.argv),
        "config": ap.config(a), "torch_threads": torch.get_num_threads(),
        "model": f"Linear({a.dim},{a.hidden}) GELU Linear({a.hidden},1), AdamW, MSE", "repetitions": reps,
        "summary": summ, "vs_hand": vs_hand, "vs_hand_paired": vs_paired, "target_vs_hand": TARGET_VS_HAND,
        "notes": notes,
    }  # fmt: skip
    if hand:  # met only when both the ratio of the medians and the paired ratio reach the target
        engine = [n for n in ("plainloop", "plain_model", "basetrainer") if n in summ]
        result["target_met_by"] = {
            n: bc.target_check(n, vs_hand[n], vs_paired[n], TARGET_VS_HAND)["met"] for n in engine
        }
        result["target_met"] = all(result["target_met_by"].values())
    rows = [[n, f"{summ[n]['median']:.0f}", f"{summ[n]['min']:.0f}–{summ[n]['max']:.0f}",
             f"{1e6 * a.batch_size / summ[n]['median']:.0f}",
             f"{vs_hand[n]:.3f}× ({vs_paired[n]:.3f}×)" if hand else "n/a",
             f"{1e6 * a.batch_size / summ[n]['median'] - 1e6 * a.batch_size / hand:+.0f}" if hand else "n/a"]
            for n in loops]  # fmt: skip
    table = bc.md_table(
        ["loop", "samples/s (median)", "min–max", "µs/step", "× hand (paired)", "µs/step vs hand"], rows
    )
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
    out = bc.write_result(a.out, result, md)
    print(f"[overhead] wrote {out} and {out.with_suffix('.md')}")
    return result


if __name__ == "__main__":
    main()
